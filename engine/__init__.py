"""Kakeya inference engine: bounded-KV cache policies and exact speculative decoding.

    import engine
    model = engine.load("zoo:tiny-hybrid")                 # or a Hugging Face model directory
    seq = model.sequence(engine.sink_window(4, 64), max_block=k + 1)
    gen = engine.speculative_generate(seq, engine.PromptLookupDrafter(), model.encode(text), k,
                                      engine.Stop(64, model.eos_ids))

Backend-agnostic modules (no torch or mlx): policy, cache (slot layout), decode, speculative, models.
Backends (engine/backends/) provide a model object with `sequence(policy, max_block)`.
"""

from engine.decode import Generation, Sequence, Stop, generate
from engine.models import ModelNotFoundError, load, resolve, zoo_models
from engine.policy import LayerSpec, Policy, full, hybrid, parse_policy, sink_window
from engine.speculative import Drafter, ModelDrafter, PromptLookupDrafter, speculative_generate

__all__ = [
    "Drafter",
    "Generation",
    "LayerSpec",
    "ModelDrafter",
    "ModelNotFoundError",
    "Policy",
    "PromptLookupDrafter",
    "Sequence",
    "Stop",
    "full",
    "generate",
    "hybrid",
    "load",
    "parse_policy",
    "resolve",
    "sink_window",
    "speculative_generate",
    "zoo_models",
]
