"""Drafters for engine.speculative (each behind its `Drafter` protocol): prompt lookup, a model, a
masked-diffusion proposer (engine.drafters.diffusion, loaded with `load_dlm`), the block drafter on the
verifier's hidden states (engine.drafters.block_base.load_block_drafter picks engine.drafters.block, PyTorch,
or engine.drafters.block_mlx, MLX; imported on use), and Gemma 4's assistant on a Gemma 4 verifier's hidden
state and K/V (engine.drafters.gemma4_assistant, PyTorch, imported on use)."""

import json
from pathlib import Path

from engine.drafters.model import ModelDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter

BLOCK_MODEL_TYPE = "kakeya_block_drafter"


def is_block_drafter(path: Path) -> bool:
    """A block drafter directory (engine/drafters/block.py): its config.json's model_type says so."""
    try:
        return json.loads((path / "config.json").read_text()).get("model_type") == BLOCK_MODEL_TYPE
    except (OSError, ValueError):
        return False


__all__ = ["BLOCK_MODEL_TYPE", "ModelDrafter", "PromptLookupDrafter", "is_block_drafter"]
