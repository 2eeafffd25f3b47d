"""The block drafter's config.json (model_type "kakeya_block_drafter"); no torch or mlx here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

MODEL_TYPE = "kakeya_block_drafter"


class BlockConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model_type: Literal["kakeya_block_drafter"] = MODEL_TYPE
    verifier: str  # the model whose features it was trained on, e.g. zoo:tiny-hybrid
    vocab_size: int
    target_layers: list[int]  # verifier hidden states read (0 = embeddings, n = after the final norm)
    target_hidden_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    block_size: int  # the largest k it was trained for
    window: int  # context positions attended
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6


def layer_modules(nn: Any, rms_norm: Callable[[int, float], Any], c: BlockConfig) -> dict[str, Any]:
    """One drafter layer's modules by their safetensors names, built with a backend's `nn` (torch.nn or
    mlx.nn: their Linear takes the same arguments) and its `RMSNorm(dim, eps)`: the one layout that
    torch.py saves and both twins load."""
    inner = c.num_heads * c.head_dim
    h, i = c.hidden_size, c.intermediate_size
    return {
        "attn_norm": rms_norm(h, c.rms_norm_eps),
        "q": nn.Linear(h, inner, bias=False),
        "k": nn.Linear(h, inner, bias=False),
        "v": nn.Linear(h, inner, bias=False),
        "o": nn.Linear(inner, h, bias=False),
        "mlp_norm": rms_norm(h, c.rms_norm_eps),
        "gate": nn.Linear(h, i, bias=False),
        "up": nn.Linear(h, i, bias=False),
        "down": nn.Linear(i, h, bias=False),
    }


def read_config(path: Path) -> BlockConfig:
    cfg = json.loads((path / "config.json").read_text())
    if cfg.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{path} is not a block drafter (model_type {cfg.get('model_type')!r})")
    return BlockConfig.model_validate(cfg)
