"""The plain steps' features for a drafter that reads the verifier's hidden states (`Backlog`): the server
runs k = 0 (engine/draft_length.py `DraftLength` chose it) as a true plain step, no drafter forward, and
the drafter catches up on those steps' features in one batched pass before it next drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class Backlog:
    """A drafter that reads the verifier's hidden states (`layers`), skipped by plain steps: each plain
    step's features of every row are stashed (torch: per-layer buffers [rows, capacity, hidden], the rows
    following the batch's as they join and leave) and the drafter observes them all in one batched
    `observe_rows` before it next drafts (`flush`), or when a row's backlog fills the buffer. The drafter's
    context ends exactly as if it had observed every step; a plain step costs no drafter forward.

    Hidden states that are not torch tensors (MLX) are observed at once, each step (no stash)."""

    def __init__(self, drafter: Any, capacity: int = 64) -> None:
        self.drafter = drafter
        self.layers: tuple[int, ...] = tuple(drafter.layers)
        self.capacity = capacity
        self.bufs: dict[int, Any] = {}
        self.counts: list[int] = [0] * drafter.rows
        # seconds a flush takes per stashed position (the latest flushes, smoothed): a plain step's share of
        # the catch-up, which the scheduler charges to plain steps (a block's time leaves the flush out)
        self.per_position = 0.0

    def stash(self, hidden: dict[int, Any], counts: Sequence[int]) -> None:
        """The features of the next counts[i] (0 or 1) fed positions of row i: hidden[layer][i, 0]."""
        first = hidden[self.layers[0]]
        if not _is_torch(first):
            self.drafter.observe_rows(hidden, counts)
            return
        import torch

        rows = len(counts)
        if len(self.counts) != rows:
            raise ValueError(f"the backlog follows {len(self.counts)} rows, the step fed {rows}")
        if max(self.counts, default=0) >= self.capacity:
            self.flush()
        if not self.bufs:
            self.bufs = {j: first.new_zeros((rows, self.capacity, hidden[j].shape[-1])) for j in self.layers}
        go = [i for i, n in enumerate(counts) if n]
        if not go:
            return
        with torch.inference_mode():
            index = torch.tensor(go, device=first.device)
            at = torch.tensor([self.counts[i] for i in go], device=first.device)
            for j in self.layers:
                self.bufs[j][index, at] = hidden[j][index, 0].to(self.bufs[j].dtype)
        for i in go:
            self.counts[i] += 1

    def flush(self, clock: Any = None) -> None:
        """The drafter observes every stashed position (one `observe_rows`); timed with `clock` if given."""
        if n := sum(self.counts):
            started = clock() if clock else 0.0
            m = max(self.counts)
            self.drafter.observe_rows({j: b[:, :m] for j, b in self.bufs.items()}, list(self.counts))
            if clock:
                seconds = (clock() - started) / n
                self.per_position = (
                    seconds if not self.per_position else 0.7 * self.per_position + 0.3 * seconds
                )
        self.counts = [0] * len(self.counts)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Only these rows go on (the drafter's `keep_rows` is the caller's)."""
        rows = list(rows)
        self.counts = [self.counts[r] for r in rows]
        if self.bufs:
            import torch

            index = torch.tensor(rows, device=next(iter(self.bufs.values())).device)
            self.bufs = {j: b.index_select(0, index) for j, b in self.bufs.items()}

    def add_rows(self, n: int) -> None:
        """n rows joined the batch (after its rows), with nothing stashed."""
        self.counts += [0] * n
        if self.bufs:
            import torch

            self.bufs = {j: torch.cat((b, b.new_zeros((n, *b.shape[1:])))) for j, b in self.bufs.items()}


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")
