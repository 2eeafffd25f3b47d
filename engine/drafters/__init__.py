"""Drafters for engine.speculative (each behind its `Drafter` protocol): prompt lookup, a model, a
masked-diffusion proposer (engine.drafters.diffusion, loaded with `load_dlm`)."""

from engine.drafters.model import ModelDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter

__all__ = ["ModelDrafter", "PromptLookupDrafter"]
