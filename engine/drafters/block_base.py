"""The block drafter's backend-free parts (no torch or mlx here): its config, the bookkeeping of its
cached context, and `load_block_drafter`, which picks the backend. The models and their K/V buffers live
in engine/drafters/block.py (PyTorch) and engine/drafters/block_mlx.py (MLX); both read the same
config.json and model.safetensors.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from engine.drafters import BLOCK_MODEL_TYPE as MODEL_TYPE
from engine.models import Backend


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


def read_config(path: Path) -> BlockConfig:
    cfg = json.loads((path / "config.json").read_text())
    if cfg.get("model_type") != MODEL_TYPE:
        raise ValueError(f"{path} is not a block drafter (model_type {cfg.get('model_type')!r})")
    return BlockConfig.model_validate(cfg)


class BlockContext:
    """The engine.speculative `FeatureDrafter` bookkeeping shared by both backends: per-layer context K/V
    in growing buffers holding `length` positions (the last `window` attended, compacted in amortized O(1)
    per position), `position` context positions observed. A backend supplies the four array hooks."""

    def __init__(self, config: BlockConfig) -> None:
        self.config = config
        self.layers = tuple(config.target_layers)
        self.window = config.window
        self.length = 0  # context positions held in the buffers
        self.position = 0  # context positions observed

    def begin(self, prompt: Sequence[int]) -> None:
        self._reset()
        self.length = self.position = 0

    def observe(self, hidden: dict[int, Any], rows: int) -> None:
        if rows == 0:
            return
        new = self._context_kv(hidden, rows)
        if self.length + rows > self._capacity():
            keep = min(self.length, self.window)  # drop what no block attends to any more
            self._compact(self.length - keep, keep, max(2 * (keep + rows), 64))
            self.length = keep
        self._write(new, self.length)
        self.length += rows
        self.position += rows

    def propose(self, last: int, k: int) -> list[int]:
        k = min(k, self.config.block_size)
        if k == 0:
            return []
        return self._draft(last, k)

    def accept(self, n: int, committed: Sequence[int]) -> None:
        """Nothing to roll back: only committed positions reach the context (through `observe`)."""

    # backend hooks
    def _reset(self) -> None:
        """Empty K/V buffers."""
        raise NotImplementedError

    def _capacity(self) -> int:
        """Positions the buffers hold."""
        raise NotImplementedError

    def _context_kv(self, hidden: dict[int, Any], rows: int) -> Any:
        """Each drafter layer's K/V of the first `rows` rows of the verifier's features."""
        raise NotImplementedError

    def _compact(self, start: int, n: int, size: int) -> None:
        """New buffers of `size` positions starting with positions start..start + n of the old ones."""
        raise NotImplementedError

    def _write(self, new: Any, at: int) -> None:
        """Store `_context_kv`'s K/V at buffer positions at.."""
        raise NotImplementedError

    def _draft(self, last: int, k: int) -> list[int]:
        """The k argmax tokens of one block forward attending to the last `window` buffered positions."""
        raise NotImplementedError


def load_block_drafter(name: str, backend: Backend = "torch", device: Any = None) -> BlockContext:
    """A block drafter from a model reference (zoo:NAME or a directory; engine.models.resolve) on one
    backend (device: torch's, default cpu; MLX runs on its default device)."""
    from engine.models import resolve

    path = resolve(name)
    if backend == "torch":
        from engine.drafters.block import BlockDrafter, BlockDrafterModel

        return BlockDrafter(BlockDrafterModel.load(path, device or "cpu"))
    if backend == "mlx":
        try:
            from engine.drafters.block_mlx import MLXBlockDrafter, MLXBlockDrafterModel
        except ImportError as exc:
            raise ValueError(f"the mlx backend is not available here: {exc}") from exc
        return MLXBlockDrafter(MLXBlockDrafterModel.load(path))
    raise ValueError(f"unknown backend {backend!r}: use torch or mlx")
