"""What every backend shares, with no torch or mlx: the tokenizer half of a model (`Tokenized`), the
per-layer state protocol (`LayerState`) and the session logic (`BaseSession`: layers grouped by spec and
layer type into `engine.cache.Group`s, chunked prefill, trim fan-out, K/V byte accounting).

A backend adds only: one `LayerState` class per layer kind (K/V buffers; a linear-attention or Mamba-2
layer's `RecurrentState`), the cache container its model is called with, turning each group's `Forward` into
its own tensors, and `_run` (one model forward answering a `Step`).

Linear-attention layers (gated delta-net), Mamba-2 mixers (`engine.geometry.STATEFUL`) and exact rollback. Their state (a convolution state and a
recurrent state) has no positions to hide, so `trim` must put it back as it was after the last kept
token. Method: a snapshot of each linear layer's state before every forward (a reference to the state
arrays, which the models' kernels replace rather than mutate, plus a copy of the small convolution
state where a kernel updates it in place), and on `trim(n)`: restore the snapshot taken before the
forward that fed the first dropped position, roll every attention group back to that forward's start,
and feed the kept tokens of that forward again (`RecurrentRollback`). Why recomputation and not
per-position snapshots: neither transformers' nor mlx-lm's multi-token gated delta-net kernel returns
the states inside a block (the chunked kernel yields only the final state), so per-position snapshots
would need a fork of the models' layer code; recomputation runs the models' own code, so it is exact
by construction. Cost: nothing for a fully accepted or a fully rejected block; one forward of the kept
tokens (at most max_block - 1) for a partly rejected one (benchmarks/engine_linear.py measures it).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from engine.cache import Forward, Group
from engine.decode import BatchStep, Step
from engine.geometry import RECURRENT, STATEFUL, STATELESS, Geometry, attention_kind
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

    def trim(self, n: int) -> None: ...

    def keep_rows(self, index: Any) -> None:
        """Keep only the batch rows `index` (a backend index array) of the buffers."""
        ...

    @property
    def nbytes(self) -> int: ...

    @property
    def allocated_bytes(self) -> int: ...


class RecurrentState(Protocol):
    """One linear-attention layer's state (convolution + recurrent) on one backend. It holds no K/V
    (`nbytes` and `allocated_bytes` are 0); `state_bytes` is what its state costs; `snapshot` /
    `restore` save and put back the state (rollback: module docstring)."""

    def snapshot(self) -> Any: ...

    def restore(self, snapshot: Any) -> None: ...

    def trim(self, n: int) -> None: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def allocated_bytes(self) -> int: ...

    @property
    def state_bytes(self) -> int: ...


class NoState:
    """A layer with no token mixer (Nemotron-H's `mlp` / `moe` layers): nothing cached, nothing to trim."""

    nbytes = 0
    allocated_bytes = 0
    state_bytes = 0

    def trim(self, n: int) -> None:
        pass

    def keep_rows(self, index: Any) -> None:
        pass


class ParallelLayer:
    """A layer with attention beside a recurrent mixer reading the same input (Falcon-H1): `kv` its K/V
    state (in its group under the policy), `mamba` the mixer's `RecurrentState`. Rollback trims the K/V
    (the group hides the slots) and restores the mixer's snapshot; K/V bytes are the attention's,
    `state_bytes` the mixer's. Each backend's `ParallelState` adds how its models reach the two."""

    def __init__(self, kv: Any, mamba: Any) -> None:
        self.kv, self.mamba = kv, mamba

    def snapshot(self) -> Any:
        return self.mamba.snapshot()

    def restore(self, snapshot: Any) -> None:
        self.mamba.restore(snapshot)

    def trim(self, n: int) -> None:
        self.kv.trim(n)

    @property
    def nbytes(self) -> int:
        return int(self.kv.nbytes)

    @property
    def allocated_bytes(self) -> int:
        return int(self.kv.allocated_bytes)

    @property
    def state_bytes(self) -> int:
        return int(self.mamba.state_bytes)


def batch_unsupported(geometry: Geometry, policy: Policy) -> str | None:
    """Why sessions of this model and policy cannot hold several rows yet (None: they can). Attention
    layers (plain or quantized K/V) take rows; linear-attention states are batch 1."""
    if kinds := sorted({t.replace("_", "-") for t in geometry.layer_types if t in STATEFUL}):
        return f"does not support {' or '.join(kinds)} layers yet (their states are batch 1)"
    return None


class BaseSession(ABC):
    """The backend-free half of a session (engine.decode.Session)."""

    states: Sequence[Any]  # one per layer, set by the backend: LayerState, or RecurrentState (linear)

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
        for i, key in enumerate(zip(self.specs, map(attention_kind, geometry.layer_types), strict=True)):
            if key[1] not in RECURRENT and key[1] not in STATELESS:  # no positions held: no group
                by_key.setdefault(key, []).append(i)
        if not by_key:
            raise ValueError(
                "a model needs at least one attention layer (this one has only linear_attention)"
            )
        if geometry.alibi and any(s.bounded for s in self.specs):
            raise ValueError(
                f"cache policy {policy} bounds the K/V of a model with ALiBi position biases, which transformers "
                "computes from each key's index in the cache, not its position: a ring buffer would change "
                "the model's output; use the full policy (or hybrid, which keeps full-attention layers whole)"
            )
        self.groups = [Group(s, t, max_block, layers, rows) for (s, t), layers in by_key.items()]
        # The group of each layer; None for a linear-attention layer (the backend gives it a RecurrentState).
        self.group_of: list[Group | None] = [
            next((g for g in self.groups if i in g.layers), None) for i in range(len(self.specs))
        ]
        self.linear = [i for i, t in enumerate(geometry.layer_types) if t in STATEFUL]
        self.rollback = RecurrentRollback(max_block)
        if rows > 1 and (why := batch_unsupported(geometry, policy)):
            raise ValueError(
                f"batched decoding (rows={rows}) {why}: decode these rows one at a time (rows=1)"
            )

    @property
    def on_cpu(self) -> bool:
        """The model runs on the CPU (timings of its forwards: CPU time of the process is theirs)."""
        return False

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

    def forward(
        self, ids: Sequence[int], *, logits: bool = False, hidden: Iterable[int] = (), row: int | None = None
    ) -> Step:
        if row is None and self.rows > 1:
            raise ValueError(
                f"this session decodes {self.rows} rows: feed them with forward_rows (or one with row=)"
            )
        return self._forward(list(ids), False, logits, tuple(hidden), row)

    def forward_rows(
        self, ids: Sequence[Sequence[int]], *, logits: bool = False, hidden: Iterable[int] = ()
    ) -> BatchStep:
        """Feed every row m <= max_block tokens at its own next positions in one batched forward; per row
        the greedy token after each fed position (the one host copy of the forward), and on request the
        logits [rows, m, vocab] and hidden states {layer: [rows, m, hidden]} on the device."""
        rows = [list(r) for r in ids]
        if len(rows) != self.rows or len({len(r) for r in rows}) != 1 or not rows[0]:
            raise ValueError(f"forward_rows takes {self.rows} rows of the same length >= 1")
        layers = self._hidden(hidden)
        return self._run_rows(rows, [g.advance(len(rows[0])) for g in self.groups], logits, layers)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Keep only these batch rows, renumbered 0.. in the given order: every group forgets the others'
        positions and each layer state drops their K/V (`keep_rows` of the backend's states, with the
        device index of the kept rows), so a finished row costs later forwards nothing."""
        rows = list(rows)
        if not rows or len(set(rows)) != len(rows) or not all(0 <= r < self.rows for r in rows):
            raise ValueError(f"keep_rows takes distinct rows among 0..{self.rows - 1} (got {rows})")
        if rows == list(range(self.rows)):
            return
        for g in self.groups:
            g.keep_rows(rows)
        self.rows = len(rows)
        self._kept(rows)

    def join_refusal(self) -> str | None:
        """Why rows cannot join this session (`join`), in one line; None: they can."""
        if self.linear:
            return "linear-attention / recurrent layers keep batch-1 states (no batched decoding)"
        return self._join_refusal()

    def join(self, other: BaseSession) -> None:
        """Append the rows of `other` (a session of the same model, policy and max_block, fed on its own:
        a prompt prefilled while this one decoded) after this session's rows, at a step boundary: per group
        the row counters and table rows (`Group.join`), per layer the K/V buffers [rows, heads, slots, dim]
        concatenated along the rows (the narrower padded: slots the row never wrote, which its mask hides,
        as in a batch prefilled together). Nothing is recomputed and every row keeps its own positions,
        sinks and ring, so each row's tokens stay exactly those of decoding it alone. `other` must not be
        used afterwards. Raises ValueError (`join_refusal`'s line) where rows cannot join."""
        if (why := self.join_refusal()) or (why := other.join_refusal()):
            raise ValueError(f"cannot join rows: {why}")
        if (
            type(other) is not type(self)
            or getattr(other, "owner", None) is not getattr(self, "owner", None)
            or other.policy != self.policy
            or other.max_block != self.max_block
        ):
            raise ValueError("cannot join rows: the sessions differ in model, policy or max_block")
        if not all(self.positions) or not all(other.positions):
            raise ValueError("cannot join rows: a session was never fed")
        for g, h in zip(self.groups, other.groups, strict=True):
            g.join(h)
        self._joined(other)
        self.rows += other.rows

    def _join_refusal(self) -> str | None:
        """The backend's reasons rows cannot join (its layer states, its model)."""
        return f"rows join no {type(self).__name__}"

    def _joined(self, other: BaseSession) -> None:
        """The backend's half of `join`: its group mirrors and each layer state append `other`'s rows."""
        raise NotImplementedError

    def _hidden(self, hidden: Iterable[int]) -> tuple[int, ...]:
        layers = tuple(hidden)
        if bad := [i for i in layers if not 0 <= i <= len(self.specs)]:
            raise ValueError(f"no hidden state {bad[0]}: layers are 0 (embeddings) to {len(self.specs)}")
        return layers

    def _forward(
        self, ids: list[int], last_only: bool, logits: bool, hidden: tuple[int, ...], row: int | None
    ) -> Step:
        hidden = self._hidden(hidden)
        if self.linear:
            self.rollback.record(self.position, ids, [self.states[i].snapshot() for i in self.linear])
        return self._run(ids, [g.advance(len(ids), row or 0) for g in self.groups], last_only, logits, hidden)

    @abstractmethod
    def _run(
        self, ids: list[int], forwards: list[Forward], last_only: bool, logits: bool, hidden: tuple[int, ...]
    ) -> Step:
        """One model forward of `ids` with each group's planned `Forward` (in `self.groups` order)."""

    @abstractmethod
    def _run_rows(
        self, ids: list[list[int]], forwards: list[Forward], logits: bool, hidden: tuple[int, ...]
    ) -> BatchStep:
        """One batched model forward of `ids` [rows, m], each group's `Forward` covering every row."""

    @abstractmethod
    def _kept(self, rows: list[int]) -> None:
        """The backend's half of `keep_rows`: its group mirrors and each layer state keep these rows."""

    def trim(self, n: int | Sequence[int]) -> None:
        """Forget the last n positions fed (a sequence: n[r] of batch row r, each row on its own)."""
        if not isinstance(n, int):
            n = list(n)
            if self.rows == 1 and len(n) == 1:
                n = n[0]
        if self.linear and n:
            assert isinstance(n, int)  # linear-attention sessions are batch 1 (batch_unsupported)
            self._trim_recurrent(n)
            return
        self._dropped([g.trim(n) for g in self.groups])
        if isinstance(n, int):
            for s in self.states:
                s.trim(n)

    @abstractmethod
    def _dropped(self, slots: list[list[list[int]] | None]) -> None:
        """Each group's slots a rollback marked EMPTY (per row; None: none), for the backend's device copy."""

    def _trim_recurrent(self, n: int) -> None:
        """Rollback with linear-attention layers (module docstring): restore, rewind, feed the kept tokens."""
        if not 0 <= n <= self.position:
            raise ValueError(f"cannot trim {n} of {self.position} positions")
        k, start, replay, snapshots = self.rollback.find(self.position - n)
        if any(g.layout.hw - start > self.max_block for g in self.groups):
            raise ValueError(
                f"cannot roll back {n} positions: the forward that fed them was longer than this session's "
                f"max_block ({self.max_block}); create the session with a larger max_block"
            )
        del self.rollback.entries[k:]
        r = self.position - start
        self._dropped([g.trim(r) for g in self.groups])
        for i, s in enumerate(self.states):
            if i not in self.linear:
                s.trim(r)
        for i, snap in zip(self.linear, snapshots, strict=True):
            self.states[i].restore(snap)
        if replay:
            self._forward(replay, False, False, (), None)

    def kv_bytes(self) -> list[int]:
        return [s.nbytes for s in self.states]

    def state_bytes(self) -> list[int]:
        """Linear-attention state bytes (convolution + recurrent) held now, per layer (0: attention)."""
        return [getattr(s, "state_bytes", 0) for s in self.states]

    def kv_allocated_bytes(self) -> list[int]:
        return [s.allocated_bytes for s in self.states]

    def kv_row_bytes(self) -> list[int]:
        """K/V bytes held now, per batch row (all layers)."""
        out = [0] * self.rows
        for state, g in zip(self.states, self.group_of, strict=True):
            if g is None:  # a linear-attention layer: no K/V
                continue
            held = g.held_rows()
            if total := sum(held):
                for r, h in enumerate(held):
                    out[r] += state.nbytes * h // total
        return out


class RecurrentRollback:
    """The recent forwards of a session with linear-attention layers: (start, ids, snapshots of the linear
    layers' states before it), kept while a rollback of up to max_block positions may land in them."""

    def __init__(self, max_block: int) -> None:
        self.max_block = max_block
        self.entries: list[tuple[int, list[int], list[Any]]] = []

    def record(self, start: int, ids: list[int], snapshots: list[Any]) -> None:
        self.entries.append((start, list(ids), snapshots))
        lowest = start + len(ids) - self.max_block  # the lowest position a rollback may go back to
        while len(self.entries) > 1 and self.entries[1][0] <= lowest:
            self.entries.pop(0)

    def find(self, target: int) -> tuple[int, int, list[int], list[Any]]:
        """Back to position `target`: the index of the forward that fed it, its start, the tokens from that
        start to `target` (to feed again), and the snapshots taken before that forward."""
        for k in range(len(self.entries) - 1, -1, -1):
            start, _, snapshots = self.entries[k]
            if start <= target:
                replay = [t for _, ids, _ in self.entries[k:] for t in ids][: target - start]
                return k, start, replay, snapshots
        raise ValueError(
            f"cannot roll back to position {target}: a linear-attention layer keeps snapshots for the last "
            f"{self.max_block} positions only (the session's max_block)"
        )
