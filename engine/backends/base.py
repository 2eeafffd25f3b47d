"""What every backend shares, with no torch or mlx: the tokenizer half of a model (`Tokenized`), the
per-layer state protocol (`LayerState`) and the session logic (`BaseSession`: layers grouped by spec and
layer type into `engine.cache.Group`s, chunked prefill, trim fan-out, K/V byte accounting).

A backend adds only: one `LayerState` class per layer kind (K/V buffers today; quantized K/V or a
linear-attention recurrent state later), the cache container its model is called with, turning each
group's `Forward` into its own tensors, and `_run` (one model forward answering a `Step`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from engine.cache import Forward, Group
from engine.decode import Step
from engine.geometry import Geometry
from engine.policy import LayerSpec, Policy, layer_specs


class Tokenized:
    """`encode` / `decode` through the model's Hugging Face tokenizer, and the model's geometry."""

    tokenizer: Any
    geometry: Geometry
    eos_ids: frozenset[int]

    @property
    def layer_types(self) -> list[str]:
        return list(self.geometry.layer_types)

    @property
    def sliding_window(self) -> int | None:
        return self.geometry.sliding_window

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError("this model was loaded without a tokenizer")
        return list(self.tokenizer.encode(text, add_special_tokens=True))

    def decode(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            raise ValueError("this model was loaded without a tokenizer")
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))


class LayerState(Protocol):
    """One layer's cache state on one backend (mlx-lm style). `update` takes the forward's new K/V and
    returns what the layer attends to; `trim` forgets the last n positions (K/V: nothing to do, the
    group hides the slots); `nbytes` is what the positions held cost, `allocated_bytes` the buffers."""

    def update(self, keys: Any, values: Any) -> tuple[Any, Any]: ...

    @abstractmethod
    def _run_rows(self, ids: list[list[int]], forwards: list[Forward]) -> list[list[int]]:
        """One batched model forward of `ids` [rows, m], each group's `Forward` covering every row."""

    def trim(self, n: int) -> None: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def allocated_bytes(self) -> int: ...


class BaseSession(ABC):
    """The backend-free half of a session (engine.decode.Session)."""

    states: Sequence[LayerState]  # one per layer, set by the backend

    def __init__(
        self, geometry: Geometry, policy: Policy, max_block: int, prefill_chunk: int, rows: int = 1
    ) -> None:
        if prefill_chunk < 1:
            raise ValueError("prefill_chunk must be >= 1")
        self.rows = rows
        self.policy = policy
        self.max_block = max_block
        self.prefill_chunk = prefill_chunk
        self.specs: list[LayerSpec] = layer_specs(policy, geometry.layer_types, geometry.sliding_window)
        by_key: dict[tuple[LayerSpec, str], list[int]] = {}
        for i, key in enumerate(zip(self.specs, geometry.layer_types, strict=True)):
            by_key.setdefault(key, []).append(i)
        self.groups = [Group(s, t, max_block, layers, rows) for (s, t), layers in by_key.items()]
        self.group_of = [g for i in range(len(self.specs)) for g in self.groups if i in g.layers]

    @property
    def position(self) -> int:
        return self.groups[0].position

    @property
    def positions(self) -> list[int]:
        """Positions fed, per batch row."""
        return self.groups[0].positions

    def prefill(
        self, ids: Sequence[int], *, logits: bool = False, hidden: Iterable[int] = (), row: int | None = None
    ) -> Step:
        """Feed a prompt (chunked); a batched session (rows > 1) prefills one `row` at a time."""
        ids = list(ids)
        if not ids:
            raise ValueError("nothing to prefill")
        if row is None and self.rows > 1:
            raise ValueError(
                f"this session decodes {self.rows} rows: prefill each with row=0..{self.rows - 1}"
            )
        chunks = [ids[i : i + self.prefill_chunk] for i in range(0, len(ids), self.prefill_chunk)]
        for chunk in chunks[:-1]:
            self._forward(chunk, True, False, (), row)
        return self._forward(chunks[-1], True, logits, tuple(hidden), row)

    def forward(self, ids: Sequence[int], *, logits: bool = False, hidden: Iterable[int] = ()) -> Step:
        if self.rows > 1:
            raise ValueError(f"this session decodes {self.rows} rows: feed them with forward_rows")
        return self._forward(list(ids), False, logits, tuple(hidden), None)

    def forward_rows(self, ids: Sequence[Sequence[int]]) -> list[list[int]]:
        """Feed every row m <= max_block tokens at its own next positions in one batched forward; the
        greedy token after each fed position, per row (the one host copy of the forward)."""
        rows = [list(r) for r in ids]
        if len(rows) != self.rows or len({len(r) for r in rows}) != 1 or not rows[0]:
            raise ValueError(f"forward_rows takes {self.rows} rows of the same length >= 1")
        return self._run_rows(rows, [g.advance(len(rows[0])) for g in self.groups])

    def _forward(
        self, ids: list[int], last_only: bool, logits: bool, hidden: tuple[int, ...], row: int | None
    ) -> Step:
        if bad := [i for i in hidden if not 0 <= i <= len(self.specs)]:
            raise ValueError(f"no hidden state {bad[0]}: layers are 0 (embeddings) to {len(self.specs)}")
        return self._run(ids, [g.advance(len(ids), row or 0) for g in self.groups], last_only, logits, hidden)

    @abstractmethod
    def _run(
        self, ids: list[int], forwards: list[Forward], last_only: bool, logits: bool, hidden: tuple[int, ...]
    ) -> Step:
        """One model forward of `ids` with each group's planned `Forward` (in `self.groups` order)."""

    @abstractmethod
    def _run_rows(self, ids: list[list[int]], forwards: list[Forward]) -> list[list[int]]:
        """One batched model forward of `ids` [rows, m], each group's `Forward` covering every row."""

    def trim(self, n: int) -> None:
        for g in self.groups:
            g.trim(n)
        for s in self.states:
            s.trim(n)

    def kv_bytes(self) -> list[int]:
        return [s.nbytes for s in self.states]

    def kv_allocated_bytes(self) -> list[int]:
        return [s.allocated_bytes for s in self.states]

    def kv_row_bytes(self) -> list[int]:
        """K/V bytes held now, per batch row (all layers)."""
        out = [0] * self.rows
        for state, g in zip(self.states, self.group_of, strict=True):
            held = g.held_rows()
            if total := sum(held):
                for r, h in enumerate(held):
                    out[r] += state.nbytes * h // total
        return out
