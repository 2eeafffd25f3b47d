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


def build_layer(layer: Any, nn: Any, rms_norm: Callable[[int, float], Any], c: BlockConfig) -> None:
    """Gives a backend's drafter `Layer` its modules, built with that backend's `nn` (torch.nn or mlx.nn:
    their Linear takes the same arguments) and `RMSNorm(dim, eps)`, under the safetensors names that
    torch.py saves and both twins load."""
    inner, h, i = c.num_heads * c.head_dim, c.hidden_size, c.intermediate_size
    layer.attn_norm, layer.mlp_norm = rms_norm(h, c.rms_norm_eps), rms_norm(h, c.rms_norm_eps)
    layer.q, layer.k, layer.v = (nn.Linear(h, inner, bias=False) for _ in range(3))
    layer.o = nn.Linear(inner, h, bias=False)
    layer.gate, layer.up = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False)
    layer.down = nn.Linear(i, h, bias=False)


def read_config(path: Path) -> BlockConfig:
    cfg = json.loads((path / "config.json").read_text())
    if cfg.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{path} is not a block drafter (model_type {cfg.get('model_type')!r})")
    return BlockConfig.model_validate(cfg)
