"""The masked-diffusion drafter's config.json (`DiffusionConfig`, model_type "kakeya-dlm") and the options
of its drafter spec (`diffusion:REF:steps=N`); no torch or mlx here."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

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


def read_config(path: Path) -> DiffusionConfig:
    raw = json.loads((path / "config.json").read_text())
    if raw.get("model_type") != MODEL_TYPE:
        raise ValueError(
            f"{path} is not a masked-diffusion drafter (config model_type {raw.get('model_type')!r}, "
            f"expected {MODEL_TYPE!r}); train one with python -m engine.zoo.dlm"
        )
    return DiffusionConfig.model_validate(raw)
