"""The block drafter's bookkeeping of its cached context, shared by both backends (no torch or mlx
here). The models and their K/V buffers live in engine/drafters/block/torch.py (PyTorch) and
engine/drafters/block/mlx.py (MLX); both read the same config.json (config.py) and model.safetensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engine.drafters.block.config import BlockConfig
from engine.sampling import Sampling, draw, host


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


class BlockRowsBase:
    """The engine.speculative `FeatureRows` bookkeeping of the block drafter for every row of a batched
    verifier at once (`BatchedBlockDrafter` on each backend): the same context as one `BlockDrafterBase`
    per row (the last `window` observed positions of each row, at its own positions), held in buffers
    [rows, heads, capacity, head_dim] per layer. Each block's observed features are projected in one
    forward for all rows, and all rows draft in one block forward: row r attends to its own window
    (a mask hides the other rows' spans) and to its own first 1 + k[r] block slots, so each row proposes
    what its own `BlockDrafterBase` would (up to float rounding of the masked attention)."""

    def __init__(self, config: BlockConfig, rows: int) -> None:
        self.config = config
        self.layers = tuple(config.target_layers)
        self.window = config.window
        self.rows = rows
        self.length = [0] * rows  # context positions held in the buffers, per row
        self.position = [0] * rows  # context positions observed, per row

    def begin_rows(self, prompts: Sequence[Sequence[int]]) -> None:
        if len(prompts) != self.rows:
            raise ValueError(f"this drafter drafts for {self.rows} rows (got {len(prompts)} prompts)")
        self._reset()
        self.length = [0] * self.rows
        self.position = [0] * self.rows

    def observe_rows(
        self, hidden: dict[int, Any], counts: Sequence[int], which: Sequence[int] | None = None
    ) -> None:
        rows = list(range(len(counts))) if which is None else list(which)
        picked = [(i, r, n) for i, (r, n) in enumerate(zip(rows, counts, strict=True)) if n]
        if not picked:
            return
        if max(self.length[r] + n for _, r, n in picked) > self._capacity():
            keep = [min(n, self.window) for n in self.length]  # drop what no block attends to any more
            most = max(n for _, _, n in picked)
            self._compact(
                [n - m for n, m in zip(self.length, keep, strict=True)], keep, max(2 * (max(keep) + most), 64)
            )
            self.length = keep
        self._observe(hidden, picked)
        for _, r, n in picked:
            self.length[r] += n
            self.position[r] += n

    def propose_rows(self, lasts: Sequence[int], ks: Sequence[int | None]) -> list[list[int]]:
        ks = [min(k or 0, self.config.block_size) for k in ks]
        if not any(ks):
            return [[] for _ in ks]
        drafts = self._draft(list(lasts), ks)
        return [d[:k] for d, k in zip(drafts, ks, strict=True)]

    def propose_rows_sampled(
        self,
        lasts: Sequence[int],
        ks: Sequence[int | None],
        samplings: Sequence[Sampling | None],
        rngs: Sequence[np.random.Generator | None],
    ) -> tuple[list[list[int]], list[np.ndarray | None]]:
        """Speculative sampling in a batch (engine.speculative's `SamplingRows`): as `propose_sampled` at
        batch 1, for every row in one forward. Each row is fed the whole block (the batch-1 rule), row r's
        drafts drawn from q_r (its first ks[r] block rows under samplings[r]) with rngs[r]; a row without
        sampling (greedy) takes the argmax and q None (one-hot)."""
        ks = [min(k or 0, self.config.block_size) for k in ks]
        if not any(ks):
            return [[] for _ in ks], [None for _ in ks]
        logits = host(self._block_logits(list(lasts), [self.config.block_size if k else 0 for k in ks]))
        drafts: list[list[int]] = []
        qs: list[np.ndarray | None] = []
        for row, k, s, rng in zip(logits, ks, samplings, rngs, strict=True):
            if s is None or rng is None or k == 0:
                drafts.append([int(t) for t in row[:k].argmax(-1)])
                qs.append(None)
            else:
                q = s.probs(row[:k])
                drafts.append([int(t) for t in draw(q, rng)])
                qs.append(q)
        return drafts, qs

    def accept_rows(self, ns: Sequence[int], committed: Sequence[Sequence[int] | None]) -> None:
        """Nothing to roll back: only committed positions reach the context (through `observe_rows`)."""

    def keep_rows(self, rows: Sequence[int]) -> None:
        rows = list(rows)
        self._keep(rows)
        self.length = [self.length[r] for r in rows]
        self.position = [self.position[r] for r in rows]
        self.rows = len(rows)

    def block_mask(self, ks: Sequence[int]) -> tuple[int, int, np.ndarray | None]:
        """The buffer range [a, b) a block forward of max(ks) slots reads (every row's window lies within
        it) and its mask [rows, 1 + max(ks), b - a + 1 + max(ks)]: row r sees its own window and its
        first 1 + ks[r] block slots (None: every row sees everything)."""
        length = np.array(self.length)
        lo = np.maximum(length - self.window, 0)
        a, b, k = int(lo.min()), int(length.max()), max(ks)
        if lo.max() == a and length.min() == b and min(ks) == k:
            return a, b, None
        at = np.arange(a, b)
        seen = np.concatenate(
            ((at >= lo[:, None]) & (at < length[:, None]), np.arange(1 + k) <= np.array(ks)[:, None]), 1
        )
        return a, b, np.repeat(seen[:, None], 1 + k, 1)

    def writes(
        self, picked: Sequence[tuple[int, int, int]]
    ) -> tuple[list[int], list[int], list[int], list[int]]:
        """Where `_observe` writes the K/V of the picked rows' features [len(picked), m, ...]: (destination
        row, buffer position, source row among the picked, source position) per observed position."""
        rows: list[int] = []
        at: list[int] = []
        src: list[int] = []
        j: list[int] = []
        for p, (_, r, n) in enumerate(picked):
            rows += [r] * n
            at += range(self.length[r], self.length[r] + n)
            src += [p] * n
            j += range(n)
        return rows, at, src, j

    # backend hooks
    def _reset(self) -> None:
        """Empty K/V buffers of `rows` rows."""
        raise NotImplementedError

    def _capacity(self) -> int:
        raise NotImplementedError

    def _compact(self, starts: list[int], keep: list[int], size: int) -> None:
        """New buffers of `size` positions, row r starting with its positions starts[r]..+keep[r]."""
        raise NotImplementedError

    def _observe(self, hidden: dict[int, Any], picked: list[tuple[int, int, int]]) -> None:
        """Project the features of (index i in hidden, row r, count n) and write their K/V (`writes`)."""
        raise NotImplementedError

    def _draft(self, lasts: list[int], ks: list[int]) -> list[list[int]]:
        """Per row, max(ks) argmax tokens of one batched block forward (row r: its window, 1 + ks[r] slots)."""
        raise NotImplementedError

    def _block_logits(self, lasts: list[int], ks: list[int]) -> Any:
        """[rows, max(ks), vocab]: the logits of that forward at the mask slots."""
        raise NotImplementedError

    def _keep(self, rows: list[int]) -> None:
        """Keep only these rows of the buffers."""
        raise NotImplementedError
