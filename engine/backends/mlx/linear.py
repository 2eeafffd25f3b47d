"""One linear-attention (gated delta-net) layer's state, as mlx-lm's `ArraysCache(size=2)`: `DeltaNetState`."""

from __future__ import annotations

from typing import Any

import mlx.core as mx


class DeltaNetState:
    """One linear-attention layer's state as mlx-lm's gated delta-net reads it (`ArraysCache(size=2)`):
    [0] the last kernel - 1 convolution inputs [batch, kernel - 1, channels], [1] the recurrent state
    [batch, heads, v_dim, k_dim]. mlx arrays are immutable, so a snapshot is a pair of references."""

    lengths = None  # no padded batches
    nbytes = 0
    allocated_bytes = 0

    def __init__(self) -> None:
        self.cache: list[mx.array | None] = [None, None]

    def __getitem__(self, i: int) -> mx.array | None:
        return self.cache[i]

    def __setitem__(self, i: int, value: mx.array) -> None:
        self.cache[i] = value

    def advance(self, n: int) -> None:
        """Nothing to count: the session owns positions."""

    def make_mask(self, n: int, **_: Any) -> None:
        return None  # no padding

    @property
    def state(self) -> list[mx.array]:
        return [a for a in self.cache if a is not None]

    def empty(self) -> bool:
        return self.cache[0] is None

    def is_trimmable(self) -> bool:
        return False  # rollback goes through MLXSession.trim

    def snapshot(self) -> list[mx.array | None]:
        return list(self.cache)

    def restore(self, snapshot: list[mx.array | None]) -> None:
        self.cache = list(snapshot)

    def trim(self, n: int) -> None:
        """Nothing here: the session restores a snapshot and feeds the kept tokens again."""

    @property
    def state_bytes(self) -> int:
        return sum(a.nbytes for a in self.state)
