"""The masked-diffusion drafter's config.json (`DiffusionConfig`, model_type "kakeya-dlm") and the options
of its drafter spec (`diffusion:REF:steps=N`); no torch or mlx here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MODEL_TYPE = "kakeya-dlm"
GEMMA_MODEL_TYPE = (
    "diffusion_gemma"  # transformers' DiffusionGemmaForBlockDiffusion (engine/drafters/diffusion/gemma.py)
)


class DiffusionOptions(BaseModel):
    """`diffusion:REF:steps=N`: denoising forwards per block at most."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    steps: int = Field(default=4, ge=1)


class DiffusionConfig(BaseModel):
    """A small bidirectional transformer: token + learned position embeddings, pre-norm blocks, an LM
    head tied to the token embedding (over the `vocab_size` real tokens; `mask_id` = vocab_size)."""

    model_config = ConfigDict(extra="forbid")
    model_type: Literal["kakeya-dlm"] = MODEL_TYPE
    vocab_size: int
    hidden: int
    layers: int
    heads: int
    intermediate: int
    max_positions: int  # context tail + mask slots fed at once
    context: int  # default tail of committed tokens the drafter feeds

    @property
    def mask_id(self) -> int:
        return self.vocab_size

    def check_positions(self, n: int) -> None:
        """Refuses a forward over more than `max_positions` positions (the learned position table)."""
        if n > self.max_positions:
            raise ValueError(f"{n} positions fed; this model has {self.max_positions}")


def build_block(block: Any, nn: Any, cfg: DiffusionConfig) -> None:
    """Gives a backend's pre-norm `Block` its head count and its layers, built with that backend's `nn`
    (torch.nn or mlx.nn: their LayerNorm and Linear take the same sizes), under the safetensors names
    that torch.py writes and mlx.py loads."""
    h, i = cfg.hidden, cfg.intermediate
    block.heads = cfg.heads
    block.ln1, block.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
    block.qkv, block.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
    block.fc1, block.fc2 = nn.Linear(h, i), nn.Linear(i, h)


def build_model(model: Any, nn: Any, cfg: DiffusionConfig) -> None:
    """Gives a backend's `TinyDLM` its config, embeddings and final norm (as `build_block`); its blocks
    are the backend's own list."""
    model.config = cfg
    model.embed = nn.Embedding(cfg.vocab_size + 1, cfg.hidden)  # + the mask token
    model.pos = nn.Embedding(cfg.max_positions, cfg.hidden)
    model.norm = nn.LayerNorm(cfg.hidden)


def read_config(path: Path) -> DiffusionConfig:
    raw = json.loads((path / "config.json").read_text())
    if raw.get("model_type") != MODEL_TYPE:
        raise ValueError(
            f"{path} is not a masked-diffusion drafter (config model_type {raw.get('model_type')!r}, "
            f"expected {MODEL_TYPE!r}); train one with python -m engine.zoo.dlm"
        )
    return DiffusionConfig.model_validate(raw)
