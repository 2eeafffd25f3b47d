"""Kakeya inference engine: bounded-KV cache policies and exact speculative decoding.

    import engine
    model = engine.load("zoo:tiny-hybrid")                 # or a Hugging Face model directory
    session = model.session(engine.sink_window(4, 64), max_block=k + 1)
    gen = engine.speculative_generate(session, engine.PromptLookupDrafter(), model.encode(text), k,
                                      engine.Stop(64, model.eos_ids))

Backend-agnostic modules (no torch or mlx): geometry, policy, cache (slot bookkeeping), decode (Session,
Step, generate), speculative (Drafter, the verify loop), drafters/ (DrafterSpec, load_drafter and one folder
a kind), models (resolve, load, Model).
Backends (engine/backends/: base, torch, mlx) provide a `Model` with `session(policy, max_block)`.
"""

from engine.decode import BatchStep, Generation, Session, Step, Stop, generate, generate_batch
from engine.drafters import DrafterSpec, ModelDrafter, PromptLookupDrafter, load_drafter
from engine.geometry import Geometry
from engine.models import Model, ModelNotFoundError, load, resolve, zoo_models
from engine.policy import LayerSpec, Policy, full, hybrid, parse_policy, sink_window
from engine.sampling import Sampling
from engine.speculative import Drafter, FeatureDrafter, speculative_generate, speculative_generate_batch

__all__ = [
    "Drafter",
    "DrafterSpec",
    "FeatureDrafter",
    "Generation",
    "Geometry",
    "LayerSpec",
    "Model",
    "ModelDrafter",
    "ModelNotFoundError",
    "Policy",
    "PromptLookupDrafter",
    "Sampling",
    "Session",
    "Step",
    "BatchStep",
    "Stop",
    "full",
    "generate",
    "generate_batch",
    "hybrid",
    "load",
    "load_drafter",
    "parse_policy",
    "resolve",
    "sink_window",
    "speculative_generate",
    "speculative_generate_batch",
    "zoo_models",
]
