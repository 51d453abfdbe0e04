#!/usr/bin/env python3
"""A Qwen2 GGUF -> a bf16 model folder that from_pretrained loads, two ways that give the same files:

    python3 plots/gpu-h200/dequant.py FILE.gguf DEST_DIR --hf-files DIR     # fast: the run's way
    python3 plots/gpu-h200/dequant.py FILE.gguf DEST_DIR --transformers     # tests/build_qwen_coder.py's way

--transformers: build_qwen_coder.py's steps in bf16: AutoTokenizer / AutoModelForCausalLM.from_pretrained(...,
gguf_file=...), a fresh model from its config (a GGUF-loaded model refuses save_pretrained) given its weights,
generation_config.json beside this file (= build_qwen_coder.GENERATION_CONFIG), save_pretrained. Transformers
parses the GGUF's 300k-string tokenizer metadata three times (~10 s each on this repository's CPU) and
dequantizes 1.78 B weights in one thread (~25 s).

Fast (the default): the same numbers without that cost. The tokenizer files and config.json come from DIR, which
prepare.py wrote on a CPU with transformers from the same GGUF (AutoTokenizer / AutoConfig, gguf_file=...); the
tensors are read with a small GGUF header parser and dequantized by gguf's own `dequantize` (the function
transformers calls) in parallel processes, cast to bf16 and written as safetensors shards with an index, under
transformers' names for Qwen2 (qwen2 has no tensor processor in transformers: no permutation). The dry run
(dry_run.sh) builds both from a tiny cut of the real GGUF and checks them equal, tensor for tensor, bit for bit.

DEST_DIR is written beside itself and renamed into place: an interrupted build leaves no folder that looks whole.
"""
import argparse
import json
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}    # GGUF scalar value types
STRING, ARRAY = 8, 9
LAYER = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
         "attn_q.weight": "self_attn.q_proj.weight", "attn_q.bias": "self_attn.q_proj.bias",
         "attn_k.weight": "self_attn.k_proj.weight", "attn_k.bias": "self_attn.k_proj.bias",
         "attn_v.weight": "self_attn.v_proj.weight", "attn_v.bias": "self_attn.v_proj.bias",
         "attn_output.weight": "self_attn.o_proj.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
         "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight"}
TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
       "output.weight": "lm_head.weight"}


def hf_name(name: str) -> str:
    if name in TOP:
        return TOP[name]
    _, layer, rest = name.split(".", 2)
    return f"model.layers.{int(layer)}.{LAYER[rest]}"      # KeyError: a tensor this mapping does not know


def read_index(path: Path) -> tuple[list[dict], int]:
    """The GGUF's tensor table (name, numpy shape, type, absolute offset, bytes), skipping the metadata's values."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
    with open(path, "rb") as f:
        head = f.read(64 << 20)           # header, metadata and tensor table: ~6 MB for Qwen2.5's tokenizer
    pos = 0

    def take(fmt):
        nonlocal pos
        values = struct.unpack_from("<" + fmt, head, pos)
        pos += struct.calcsize("<" + fmt)
        return values if len(values) > 1 else values[0]

    def string() -> str:
        nonlocal pos
        n = take("Q")
        pos += n
        return head[pos - n:pos].decode("utf-8", "replace")

    def skip(kind: int):
        nonlocal pos
        if kind == STRING:
            n = take("Q")           # read first: `pos += take(...)` would add to pos as it was before the read
            pos += n
        elif kind == ARRAY:
            sub, count = take("IQ")
            if sub in SIZES:
                pos += SIZES[sub] * count
            else:
                for _ in range(count):
                    skip(sub)
        else:
            pos += SIZES[kind]

    magic, version, n_tensors, n_kv = take("4sIQQ")
    if magic != b"GGUF" or version < 2:
        raise ValueError(f"{path} is not a GGUF v2+ file")
    alignment = 32
    for _ in range(n_kv):
        key, kind = string(), take("I")
        if key == "general.alignment":
            alignment = take("I")
        else:
            skip(kind)
    tensors = []
    for _ in range(n_tensors):
        name, n_dims = string(), take("I")
        dims = [take("Q") for _ in range(n_dims)]
        qtype, offset = take("I"), take("Q")
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        count = 1
        for d in dims:
            count *= d
        tensors.append({"name": name, "shape": tuple(reversed(dims)), "type": qtype, "offset": offset,
                        "bytes": count // block * size})
    start = (pos + alignment - 1) // alignment * alignment
    for t in tensors:
        t["offset"] += start
    return tensors, start


def write_shard(job: tuple) -> list[str]:
    """Dequantize one shard's tensors (gguf.dequantize, as transformers does), cast to bf16, save them."""
    path, tensors, shard = job
    import numpy as np
    import torch
    from gguf import GGMLQuantizationType, dequantize
    from safetensors.torch import save_file
    torch.set_num_threads(1)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for t in tensors:
        raw = data[t["offset"]:t["offset"] + t["bytes"]]
        qtype = GGMLQuantizationType(t["type"])
        rows = raw.reshape(-1, t["bytes"] // max(1, int(np.prod(t["shape"][:-1])))) if len(t["shape"]) > 1 else raw
        values = dequantize(np.array(rows), qtype).reshape(t["shape"])
        out[hf_name(t["name"])] = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)).to(torch.bfloat16)
    save_file(out, shard, metadata={"format": "pt"})
    return list(out)


def fast(gguf: Path, partial: Path, hf_files: Path, workers: int) -> None:
    import multiprocessing
    tensors, _ = read_index(gguf)
    for t in tensors:
        hf_name(t["name"])
    shards = [[] for _ in range(max(1, min(workers, len(tensors))))]
    weight = [0] * len(shards)
    for t in sorted(tensors, key=lambda t: -t["bytes"] * (1 if t["type"] else 0.25)):   # balance the work
        i = weight.index(min(weight))
        shards[i].append(t)
        weight[i] += t["bytes"]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    jobs = [(str(gguf), s, str(partial / n)) for s, n in zip(shards, names)]
    with multiprocessing.get_context("fork").Pool(len(jobs)) as pool:
        written = pool.map(write_shard, jobs, chunksize=1)
    weight_map = {k: n for keys, n in zip(written, names) for k in keys}
    total = sum(2 * int(__import__("math").prod(t["shape"])) for t in tensors)
    (partial / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2) + "\n")
    for f in hf_files.iterdir():
        shutil.copy(f, partial / f.name)
    from transformers import GenerationConfig
    GenerationConfig(**json.loads((HERE / "generation_config.json").read_text())).save_pretrained(partial)


def check_folder(folder: Path) -> None:
    """The folder's tensors are exactly the parameters its config's model has, in shape (a meta model: no memory)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(folder)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    want = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    got = {}
    for shard in folder.glob("*.safetensors"):
        with safe_open(shard, "pt") as f:
            got.update({k: tuple(f.get_slice(k).get_shape()) for k in f.keys()})
    if got != want:
        missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
        wrong = sorted(k for k in set(want) & set(got) if want[k] != got[k])
        raise SystemExit(f"error: {folder} does not match its config: missing {missing[:5]}, extra {extra[:5]}, "
                         f"wrong shape {wrong[:5]}")
    print(f"checked: {len(got)} tensors, {sum(__import__('math').prod(s) for s in got.values()) / 1e9:.3f} B "
          f"parameters, the names and shapes {config.architectures[0]} expects (tied {config.tie_word_embeddings})")


def with_transformers(gguf: Path, partial: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    config = loaded.config
    if hasattr(config, "quantization_config"):      # dequantized already: save as a plain model
        del config.quantization_config
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):     # random init: fast on a GPU
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = GenerationConfig(**json.loads((HERE / "generation_config.json").read_text()))
    model.save_pretrained(partial)
    tokenizer.save_pretrained(partial)


def hf_files(gguf: Path, dest: Path) -> None:
    """Tokenizer files and config.json from the GGUF, with transformers (prepare.py runs this on a CPU)."""
    from transformers import AutoConfig, AutoTokenizer
    dest.mkdir(parents=True, exist_ok=True)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(dest)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = "bfloat16"
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    config.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[config.model_type]]     # as a saved model has it
    config.save_pretrained(dest)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("gguf", type=Path)
    parser.add_argument("dest", type=Path)
    how = parser.add_mutually_exclusive_group(required=True)
    how.add_argument("--hf-files", type=Path, help="tokenizer files and config.json to use (the fast way)")
    how.add_argument("--transformers", action="store_true", help="build_qwen_coder.py's way, in bf16")
    how.add_argument("--write-hf-files", action="store_true", help="write DEST's tokenizer files and config.json")
    parser.add_argument("--workers", type=int, default=int(os.environ.get("DEQUANT_WORKERS", os.cpu_count() or 1)))
    args = parser.parse_args()
    t0, dest = time.time(), args.dest
    if args.write_hf_files:
        hf_files(args.gguf.resolve(), dest)
        print(f"wrote {dest}: {', '.join(sorted(p.name for p in dest.iterdir()))} ({time.time() - t0:.1f} s)")
        return
    if (dest / "config.json").is_file():
        print(f"{dest} already holds a model")
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{dest.name}.partial-", dir=dest.parent))
    partial.chmod(0o755)
    try:
        if args.transformers:
            with_transformers(args.gguf.resolve(), partial)
        else:
            fast(args.gguf.resolve(), partial, args.hf_files, args.workers)
        check_folder(partial)
        os.replace(partial, dest)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    size = sum(p.stat().st_size for p in dest.iterdir())
    print(f"wrote {dest} ({size / 1e9:.2f} GB, {len(list(dest.iterdir()))} files) in {time.time() - t0:.1f} s "
          f"({'transformers' if args.transformers else f'fast, {args.workers} processes'})")


if __name__ == "__main__":
    main()
