"""`load_drafter(spec, verifier)`: the one place that turns a `DrafterSpec` into drafters, and the only one
that branches on a drafter's kind or backend. The kinds' own modules (engine/drafters/<kind>/) import
nothing above them: a backend's module is imported here, on use, so neither backend is required.

It loads the weights once and returns a factory: called with the verifier's session of one generation, it
gives a fresh drafter for that generation (on the same weights; Gemma 4's assistant reads that session's
K/V, the others ignore it).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.decode import Session
from engine.drafters.diffusion.config import GEMMA_MODEL_TYPE, read_config
from engine.drafters.diffusion.drafter import DiffusionDrafter, DiffusionModel
from engine.drafters.lookup.drafter import PromptLookupDrafter
from engine.drafters.model.drafter import BatchedModelDrafter, ModelDrafter
from engine.drafters.spec import NOT_YET, DrafterSpec, model_type
from engine.models import Backend, Model, load
from engine.policy import Policy, full
from engine.speculative import Drafter, RowsDrafter

# verifier session -> its drafter; a model or block drafter on a batched session (rows > 1): one RowsDrafter
# for all rows
DrafterFactory = Callable[[Session], Drafter | RowsDrafter]
PROBE = "def count_vowels(text: str) -> int:\n    return sum(c in 'aeiou' for c in text.lower())\n"


def load_drafter(
    spec: DrafterSpec,
    verifier: Model,
    *,
    k: int = 4,
    policy: Policy | None = None,
    dtype: str = "auto",
    device: str = "auto",
    probe: str = PROBE,
) -> DrafterFactory:
    """Drafters of `spec` for `verifier`, on the verifier's backend. A model drafter loads in `dtype` on
    `device` (the verifier's flags), holds its cache under `policy` (default full) with room for blocks of k,
    and must encode `probe` as the verifier does; a block drafter must share the verifier's vocabulary."""
    backend: Backend = verifier.backend
    if why := NOT_YET.get((spec.kind, backend)):
        raise ValueError(f"drafter {spec}: {why}")
    if spec.kind == "lookup":
        return lambda session: PromptLookupDrafter()
    if spec.kind == "model":
        dm = load(str(spec.path()), backend, dtype, device)
        if dm.encode(probe) != verifier.encode(probe):
            raise ValueError(f"the drafter {spec.ref} does not share the verifier's tokenizer")
        cache = policy or full()
        # a batched verifier gets one drafter session of as many rows, drafting in batched forwards
        return lambda session: (
            ModelDrafter(dm.session(cache, max_block=k + 1))
            if session.rows == 1
            else BatchedModelDrafter(dm.session(cache, max_block=k + 1, rows=session.rows))
        )
    if spec.kind == "block":
        make = block_drafters(spec.path(), backend, getattr(verifier, "device", None))
        if (vocab := make().config.vocab_size) != verifier.geometry.vocab_size:
            raise ValueError(
                f"the drafter {spec.ref} does not share the verifier's vocabulary ({vocab} tokens, "
                f"the verifier has {verifier.geometry.vocab_size})"
            )
        return lambda session: make(session.rows)
    if spec.kind == "diffusion":
        model = diffusion_model(spec.path(), backend)
        steps = spec.option("steps")
        return lambda session: DiffusionDrafter(model, steps=steps)
    if spec.kind == "gemma4-assistant":
        from engine.drafters.gemma4_assistant.torch import Gemma4AssistantDrafter, load_assistant_model

        owner: Any = verifier
        assistant = load_assistant_model(spec.path(), owner.device, owner.dtype)
        return lambda session: Gemma4AssistantDrafter(assistant, session)  # type: ignore[arg-type]
    raise ValueError(f"unknown drafter kind {spec.kind!r}")


def block_drafters(path: Path, backend: Backend, device: Any = None) -> Callable[..., Any]:
    """Fresh block drafters on one set of weights loaded from `path` on `backend` (torch: on `device`,
    default cpu; MLX: its default device): called with `rows` (default 1), one drafter
    (engine.drafters.block.base.BlockDrafterBase) or, for rows > 1, one for all rows of a batched
    verifier (BlockRowsBase)."""
    if backend == "torch":
        from engine.drafters.block.torch import BatchedBlockDrafter, BlockDrafter, BlockDrafterModel

        weights = BlockDrafterModel.load(path, device or "cpu")
        return lambda rows=1: BlockDrafter(weights) if rows == 1 else BatchedBlockDrafter(weights, rows)
    try:
        from engine.drafters.block.mlx import MLXBatchedBlockDrafter, MLXBlockDrafter, MLXBlockDrafterModel
    except ImportError as exc:
        raise ValueError(f"the mlx backend is not available here: {exc}") from exc
    mlx_weights = MLXBlockDrafterModel.load(path)
    return lambda rows=1: (
        MLXBlockDrafter(mlx_weights) if rows == 1 else MLXBatchedBlockDrafter(mlx_weights, rows)
    )


def load_block_drafter(ref: str, backend: Backend = "torch", device: Any = None, rows: int = 1) -> Any:
    """One block drafter from a model reference (tests, benchmarks, the trainer's card); rows > 1: one
    for every row of a batched verifier."""
    return block_drafters(DrafterSpec("block", ref).path(), backend, device)(rows)


def diffusion_model(path: Path, backend: Backend) -> DiffusionModel:
    """The masked-diffusion drafter's model in `path`: the zoo's TinyDLM on either backend, or a
    transformers DiffusionGemma (torch)."""
    if model_type(path) == GEMMA_MODEL_TYPE:
        if why := NOT_YET.get((GEMMA_MODEL_TYPE, backend)):
            raise ValueError(f"{path}: {why}")
        from engine.drafters.diffusion.gemma import load_model as load_gemma

        return load_gemma(path)
    config = read_config(path)
    if backend == "torch":
        from engine.drafters.diffusion.torch import load_model

        return load_model(path, config)
    try:
        from engine.drafters.diffusion.mlx import load_model as load_mlx_model
    except ImportError as exc:
        raise ValueError(f"the mlx backend is not available here: {exc}") from exc
    return load_mlx_model(path, config)


def load_diffusion_model(ref: str, backend: Backend = "torch") -> DiffusionModel:
    """A masked-diffusion drafter's model from a model reference (tests, benchmarks); refuses another kind."""
    return diffusion_model(DrafterSpec("diffusion", ref).path(), backend)
