"""The block drafter's bookkeeping of its cached context, shared by both backends (no torch or mlx
here). The models and their K/V buffers live in engine/drafters/block/torch.py (PyTorch) and
engine/drafters/block/mlx.py (MLX); both read the same config.json (config.py) and model.safetensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.drafters.block.config import BlockConfig
from engine.sampling import Sampling, draw


class BlockDrafterBase:
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

    def propose_sampled(
        self, last: int, k: int, sampling: Sampling, rng: np.random.Generator
    ) -> tuple[list[int], np.ndarray]:
        """Speculative sampling (engine.speculative's `SamplingDrafter`): block row j's draft drawn from q_j,
        its logits under `sampling`. One forward predicts every row from [last, MASK x block_size], so row
        j's distribution does not depend on the drafts before it: q_j is what draft j was drawn from, given
        them, as the rejection rule needs. The whole block is fed whatever k (its first k rows are the
        drafts): the drafter is trained on full blocks, and its first rows come out closer to the
        verifier's distribution so (zoo pair at temperature 0.7, k = 4: acceptance length 2.55 against
        2.43 with k mask slots; benchmarks/results/speculative_sampling-cpu.json)."""
        k = min(k, self.config.block_size)
        if k == 0:
            return [], np.zeros((0, self.config.vocab_size))
        q = sampling.probs(self._logits(last, self.config.block_size)[:k])
        return [int(t) for t in draw(q, rng)], q

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

    def _logits(self, last: int, k: int) -> Any:
        """The block forward's logits [k, vocab] at the k mask slots (computed, on the device)."""
        raise NotImplementedError

    def _draft(self, last: int, k: int) -> list[int]:
        """The k argmax tokens of one block forward attending to the last `window` buffered positions."""
        raise NotImplementedError
