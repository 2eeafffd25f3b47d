"""Random-weight models in the shapes of real ones, built from their configs (no downloads), for the
engine benchmarks (`--shape`).

    qwen3-1.7b     the seed's verifier: Qwen3-1.7B (28 full-attention layers, GQA 16/8, head_dim 128)
    gemma3-hybrid  a Gemma-3 1B-style hybrid: 26 layers, 5 sliding (window 512) : 1 global, MQA

`build(shape, reduced)`: the full size (for a GPU, in bf16), or on a CPU the real layer count and
pattern, heads and head_dim ratios at a reduced width (hidden, MLP and vocabulary / 8, heads / 4)
that fits the machine. The model is saved to a temporary Hugging Face directory, so both backends load
the same weights (engine.load on the directory).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

SHAPES: dict[str, dict[str, Any]] = {
    "qwen3-1.7b": {
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    },
    "gemma3-hybrid": {
        "model_type": "gemma3_text",
        "vocab_size": 262144,
        "hidden_size": 1152,
        "intermediate_size": 6912,
        "num_hidden_layers": 26,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 256,
        "sliding_window": 512,
        "layer_types": ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(26)],
        "max_position_embeddings": 32768,
        "query_pre_attn_scalar": 256,
        "tie_word_embeddings": True,
    },
}


def config(shape: str, reduced: bool) -> dict[str, Any]:
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: use one of {', '.join(SHAPES)}")
    c = dict(SHAPES[shape])
    if reduced:  # the real depth and layer pattern, 1/8 of the width
        heads, kv = c["num_attention_heads"], c["num_key_value_heads"]
        c |= {
            "hidden_size": c["hidden_size"] // 8,
            "intermediate_size": c["intermediate_size"] // 8,
            "vocab_size": c["vocab_size"] // 32,
            "num_attention_heads": max(1, heads // 4),
            "num_key_value_heads": max(1, kv // 4),
            "head_dim": c["head_dim"] // 2,
            "initializer_range": 0.1,  # random weights with varied greedy output
        }
        if "query_pre_attn_scalar" in c:
            c["query_pre_attn_scalar"] = c["head_dim"]
    return c | {"eos_token_id": None, "bos_token_id": None, "pad_token_id": 0}


def build(shape: str, reduced: bool, seed: int = 0) -> Path:
    """Save a random-weight model of `shape` (float32) to a temporary directory; returns it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    c = config(shape, reduced)
    torch.manual_seed(seed)
    cfg = AutoConfig.for_model(**c)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():  # varied greedy output from random weights: random norm scales
        gemma = c["model_type"].startswith("gemma")  # Gemma scales by (1 + w), the others by w
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0 if gemma else 1.0, 0.5)
    model.generation_config.eos_token_id = None
    path = Path(tempfile.mkdtemp(prefix=f"kakeya-shape-{shape}-"))
    model.save_pretrained(path)
    return path
