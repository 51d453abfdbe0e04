#!/usr/bin/env python3
"""A tiny GGUF for the dry run, cut from the real one: the real file's metadata (Qwen2.5's tokenizer, chat
template, rope, eps) with 2 layers, hidden 256, 4 query / 2 key-value heads, FFN 512, and each tensor the first
rows and the first 256-wide blocks of the real tensor of that name, raw bytes in the real file's types (Q4_K,
Q6_K, F32): the dry run dequantizes the same block formats as the real run, and in seconds.

    python plots/gpu-h200/make_tiny_gguf.py REAL.gguf TINY.gguf
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN = 2, 256, 4, 2, 512
OVERRIDE = {"qwen2.block_count": LAYERS, "qwen2.embedding_length": HIDDEN, "qwen2.feed_forward_length": FFN,
            "qwen2.attention.head_count": HEADS, "qwen2.attention.head_count_kv": KV_HEADS,
            "general.name": "tiny cut of Qwen2.5 Coder 1.5B Instruct GGUF (dry run)"}


def shape_of(name: str, vocab: int) -> tuple[int, ...]:
    """HF (rows, cols) of a tensor of the tiny model."""
    kv = HIDDEN // HEADS * KV_HEADS
    base = name.split(".", 2)[-1] if name.startswith("blk.") else name
    return {"token_embd.weight": (vocab, HIDDEN), "output.weight": (vocab, HIDDEN), "output_norm.weight": (HIDDEN,),
            "attn_norm.weight": (HIDDEN,), "ffn_norm.weight": (HIDDEN,), "attn_q.weight": (HIDDEN, HIDDEN),
            "attn_q.bias": (HIDDEN,), "attn_k.weight": (kv, HIDDEN), "attn_k.bias": (kv,),
            "attn_v.weight": (kv, HIDDEN), "attn_v.bias": (kv,), "attn_output.weight": (HIDDEN, HIDDEN),
            "ffn_gate.weight": (FFN, HIDDEN), "ffn_up.weight": (FFN, HIDDEN), "ffn_down.weight": (HIDDEN, FFN)}[base]


def main(real_path: str, tiny_path: str) -> None:
    real = GGUFReader(real_path)
    writer = GGUFWriter(tiny_path, "qwen2")
    for key, field in real.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = OVERRIDE.get(key, field.contents())
        if field.types[0] == GGUFValueType.ARRAY:
            writer.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=field.types[1])
        else:
            writer.add_key_value(key, value, field.types[0])
    vocab = len(real.fields["tokenizer.ggml.tokens"].data)
    for tensor in real.tensors:
        if tensor.name.startswith("blk.") and int(tensor.name.split(".")[1]) >= LAYERS:
            continue
        shape, qtype = shape_of(tensor.name, vocab), tensor.tensor_type
        if qtype == GGMLQuantizationType.F32:
            data = np.ascontiguousarray(np.asarray(tensor.data).reshape(-1)[:shape[0]])
            writer.add_tensor(tensor.name, data.astype(np.float32))
        else:     # quantized: rows x bytes; keep the first rows and each row's first blocks, as raw bytes
            block, size = GGML_QUANT_SIZES[qtype]
            rows = np.asarray(tensor.data).reshape(int(tensor.shape[1]), -1)
            data = np.ascontiguousarray(rows[:shape[0], :shape[1] // block * size])
            writer.add_tensor(tensor.name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {tiny_path}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
