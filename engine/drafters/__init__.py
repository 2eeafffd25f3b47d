"""Drafters for engine.speculative, one kind a folder, each behind its `Drafter` protocol:

    lookup/            prompt lookup (no model)
    model/             a small causal LM sharing the verifier's tokenizer (any backend's Session)
    block/             the block drafter on the verifier's hidden states (config, base; torch, mlx)
    diffusion/         the masked-diffusion drafter (config, drafter; torch, mlx; gemma: DiffusionGemma)
    gemma4_assistant/  Gemma 4's assistant on a Gemma 4 verifier's hidden state and K/V (config; torch)

spec.py holds `DrafterSpec` (`lookup`, `model:REF`, `diffusion:REF:steps=4`, ...) and what is not
supported yet (`NOT_YET`); load.py's `load_drafter(spec, verifier)` is the one place that picks a kind's
module and backend. A kind's modules import only their own config (and base), never the loader.
"""

from engine.drafters.load import DrafterFactory, load_drafter
from engine.drafters.lookup.drafter import PromptLookupDrafter
from engine.drafters.model.drafter import BatchedModelDrafter, ModelDrafter
from engine.drafters.spec import KINDS, DrafterKind, DrafterSpec, parse_drafter

__all__ = [
    "BatchedModelDrafter",
    "KINDS",
    "DrafterFactory",
    "DrafterKind",
    "DrafterSpec",
    "ModelDrafter",
    "PromptLookupDrafter",
    "load_drafter",
    "parse_drafter",
]
