"""Where each position's K/V lives in a layer's buffer: the backend-agnostic half of the cache.

This module owns the cache bookkeeping: `Layout` plans each forward of one layer spec; `Group` (one
per spec and layer type) owns the layout and the absolute position each slot holds, and hands the
backends a `Forward` (slots to write, rows to keep, query and key positions, mask) to apply to their
per-layer K/V state. No torch or mlx here.

Buffer: slots [0, sink) hold positions [0, sink); after them a ring of R = window - 1 + max_block
slots holds position p at slot sink + (p - sink) % R. An unbounded spec (window=None) is a plain
growing buffer, slot = position.

Soundness. Let n be the positions fed and hw the highest position ever written + 1. Positions lost
to the ring are <= hw - 1 - R; a future query (>= n) needs those > n - window. So every state keeps
hw - n <= max_block: a forward feeds at most max_block tokens into the ring (a bigger block, e.g. a
prefill chunk, is attended as old buffer + new block and only its last R positions are written), and
a rollback drops at most max_block tokens. Trimmed slots are marked EMPTY so the mask hides them until
they are rewritten; evicted positions are never needed again, so rollback is a cheap truncation.

`Group` keeps, next to a layout, the absolute position each slot holds (a numpy table);
`visible_mask` builds a forward's mask from it: query positions qp, key positions kp
(EMPTY hides a slot):
    kp <= qp  and  (kp < sink or kp > qp - window)  and  kp > qp - native_window
with the window terms only for bounded specs and the native term only when the spec has one.
The backends turn the boolean mask and the slot indices into their own tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.policy import LayerSpec

EMPTY = 1 << 62  # position of a slot that holds nothing: greater than every query position


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How one forward of `m` tokens at positions [start, start + m) touches one layout's buffers."""

    start: int
    m: int
    concat: bool = False  # attend over buffer[:old_view] + the new block; write only `keep` rows of it
    old_view: int = 0  # concat: buffer slots prepended to the new block
    view: int = 0  # direct: buffer slots attended (after the write)
    slots: tuple[int, ...]  # slot of each written row, in order
    keep: tuple[int, ...] | None = None  # concat: rows of the new block that are written (None: all)
    capacity: int  # buffer slots needed for this forward
    mask: bool = True  # False when every slot attended is visible to the (single) query
    sinks_hidden: bool = False  # the mask hides exactly the sink slots (the same mask every such step)

    @property
    def slot_range(self) -> tuple[int, int] | None:
        """(a, b) when the written slots are the contiguous range [a, b)."""
        s = self.slots
        return (s[0], s[0] + len(s)) if s and s[-1] - s[0] == len(s) - 1 else None


class Layout:
    def __init__(self, spec: LayerSpec, max_block: int) -> None:
        if max_block < 1:
            raise ValueError(f"max_block must be >= 1 (got {max_block})")
        self.spec = spec
        self.max_block = max_block
        self.sink = spec.sink
        self.ring = spec.ring_size(max_block)
        self.limit = None if self.ring is None else spec.sink + self.ring  # buffer slots at most
        self.n = 0  # positions fed
        self.hw = 0  # highest position ever written + 1

    def slot(self, p: int) -> int:
        if self.ring is None or p < self.sink:
            return p
        return self.sink + (p - self.sink) % self.ring

    def view_len(self, n: int, hw: int) -> int:
        """Buffer slots in use: before the ring wraps the slots are the positions [0, n)."""
        if self.limit is None or hw <= self.limit:
            return n
        return self.limit

    def plan(self, m: int) -> Plan:
        """Plan feeding m tokens at positions [n, n + m) and advance n (commit on return)."""
        if m < 1:
            raise ValueError("a forward needs at least one token")
        start, end = self.n, self.n + m
        if self.limit is None or m <= self.max_block:
            hw = max(self.hw, end)
            view = self.view_len(end, hw)
            slots = tuple(self.slot(p) for p in range(start, end))
            mask = m > 1 or self._needs_mask(start, hw, hw > end)
            hidden = mask and m == 1 and self._sinks_hidden(start, hw, hw > end)
            cap = max(view, max(slots) + 1)
            plan = Plan(
                start=start, m=m, view=view, slots=slots, capacity=cap, mask=mask, sinks_hidden=hidden
            )
        else:
            old_view = self.view_len(start, self.hw)
            keep = tuple(i for i in range(m) if start + i < self.sink or start + i >= end - self.ring)
            slots = tuple(self.slot(start + i) for i in keep)
            capacity = max(old_view, max(slots) + 1)
            kept = None if len(keep) == m else keep
            plan = Plan(
                start=start, m=m, concat=True, old_view=old_view, slots=slots, keep=kept, capacity=capacity
            )
            # Positions [end - m, end - R) were not written; those of [start, hw) (EMPTY slots) that
            # are not rewritten lie below end - R, so the ring holds nothing past `end`.
            hw = end
        self.n, self.hw = end, hw
        return plan

    def _needs_mask(self, p: int, hw: int, rolled_back: bool) -> bool:
        """Whether a single query at p, after its write (hw: the highest position written + 1;
        rolled_back: hw > p + 1, the slots of a rolled-back block are EMPTY), can see a slot it must not.
        Once the ring has wrapped, a ring with slack (max_block > 1) holds positions older than the
        window or EMPTY slots, one without slack only the EMPTY slot of a rolled-back token. Before the
        wrap the view is [0, p], out of the window once p >= sink + window (only possible with slack:
        without, p < hw <= sink + window). The sinks may lie outside a native window. A batched step
        asks for its rows at once with their largest p and hw and whether any row rolled back: exact
        but for a rolled-back row without slack, where it may answer True when no row needs a mask."""
        if self.limit is None:
            return False
        assert self.spec.window is not None  # bounded: a ring
        slack = self.max_block > 1
        if hw > self.limit and (slack or rolled_back):
            return True
        if slack and p >= self.sink + self.spec.window:
            return True
        return self.spec.native_window is not None and self.sink > 0 and p >= self.spec.native_window

    def _sinks_hidden(self, p: int, hw: int, rolled_back: bool) -> bool:
        """Whether a single query at p (p: the smallest of a batched step's rows) sees every slot but the
        sinks: a wrapped ring without slack or EMPTY slots holds exactly the window's positions, visible
        when the window fits the native one, and every sink lies outside the native window."""
        nw = self.spec.native_window
        return (
            self.limit is not None
            and nw is not None
            and self.sink > 0
            and self.max_block == 1
            and not rolled_back
            and hw > self.limit
            and self.spec.window is not None
            and self.spec.window <= nw
            and p >= nw + self.sink - 1
        )

    def trim(self, r: int) -> tuple[int, ...]:
        """Drop the last r positions fed; returns the slots to mark EMPTY."""
        if r < 0 or r > self.n:
            raise ValueError(f"cannot trim {r} of {self.n} positions")
        if r == 0:
            return ()
        if self.hw - (self.n - r) > self.max_block:
            raise ValueError(
                f"cannot roll back {r} positions: this cache only keeps a slack of {self.max_block} "
                "(create the sequence with a larger max_block)"
            )
        dropped = tuple(self.slot(p) for p in range(self.n - r, self.n))
        self.n -= r
        return dropped

    def held(self) -> int:
        """Slots in use (positions held, with EMPTY slots of a pending rollback counted)."""
        return self.view_len(self.n, self.hw)


@dataclass(frozen=True)
class Forward:
    """One forward of `plan.m` tokens as one group's buffers see it: what to write where, and what each
    query may see. Slot/row indices are None when the written slots are a contiguous range / all rows."""

    spec: LayerSpec
    plan: Plan
    queries: np.ndarray  # absolute positions of the fed tokens [m]
    keys: np.ndarray  # absolute position held by each attended slot (EMPTY: nothing)
    slots: np.ndarray | None  # slot of each written row, when not `plan.slot_range`
    keep: np.ndarray | None  # concat: rows of the block that are written (None: all)
    row: int | None = 0  # the batch row fed; None: every row (then queries, keys, slots are [rows, ...])

    @property
    def start(self) -> int:
        return self.plan.start

    @property
    def causal(self) -> bool:
        """The mask is plain causal over slots = positions [0, end) (an unbounded layer, no concat)."""
        return self.row is not None and self.plan.mask and not self.plan.concat and self.spec.window is None

    def mask(self) -> np.ndarray | None:
        """Boolean [m, keys] mask (`visible_mask`), or None when every attended slot is visible."""
        return visible_mask(self.spec, self.queries, self.keys) if self.plan.mask else None


class Group:
    """The one owner of "which slot holds which position" for the layers sharing a spec and layer type:
    their `Layout` and the absolute position each slot holds. `advance(m)` plans a forward (the layer
    states of the group read `forward` while the model runs), `trim(n)` rolls back.

    Batched decoding: `rows` sequences share the buffers ([rows, ..., slots, ...]) and the table
    ([rows, slots]); each row has its own positions (its own `Layout` counters), so row r holds its
    position p at the slot `Layout.slot(p)` whatever the other rows' lengths: its sinks are its own
    first positions and its ring wraps on its own schedule. `advance(m, row=r)` feeds row r alone (a
    prompt's prefill); `advance(m)` on a batched group feeds m <= max_block tokens to every row at once
    (a decode step), the mask of each row built from its own row of the table."""

    def __init__(
        self, spec: LayerSpec, layer_type: str, max_block: int, layers: list[int], rows: int = 1
    ) -> None:
        if rows < 1:
            raise ValueError(f"a cache needs at least one row (got {rows})")
        self.spec = spec
        self.layer_type = layer_type
        self.layers = layers
        self.rows = rows
        self.layouts = [Layout(spec, max_block) for _ in range(rows)]  # each row's counters
        self.table = np.full((rows, 0), EMPTY, dtype=np.int64)
        self._row_index = np.arange(rows)[:, None]
        self.forward: Forward | None = None  # the forward being run

    @property
    def layout(self) -> Layout:
        return self.layouts[0]

    @property
    def position(self) -> int:
        return self.layout.n

    @property
    def positions(self) -> list[int]:
        """Positions fed, per row."""
        return [lay.n for lay in self.layouts]

    @property
    def limit(self) -> int | None:
        return self.layout.limit

    def _reserve(self, capacity: int) -> np.ndarray:
        table = self.table
        if table.shape[1] < capacity:
            size = buffer_size(table.shape[1], capacity, self.layout.limit)
            grown = np.full((self.rows, size), EMPTY, np.int64)
            grown[:, : table.shape[1]] = table
            self.table = table = grown
        return table

    def advance(self, m: int, row: int | None = None) -> Forward:
        """Plan feeding m tokens at the next positions of `row` (None: of every row; the one row of an
        unbatched group), record the positions written, advance."""
        if row is None and self.rows > 1:
            return self._advance_rows(m)
        row = row or 0
        if not 0 <= row < self.rows:
            raise ValueError(f"no row {row}: this cache has rows 0 to {self.rows - 1}")
        plan = self.layouts[row].plan(m)
        table = self._reserve(plan.capacity)[row]
        new_pos = np.arange(plan.start, plan.start + plan.m, dtype=np.int64)
        keep = None if plan.keep is None else np.array(plan.keep, dtype=np.int64)
        written = new_pos if keep is None else new_pos[keep]
        # Concat: the keys are the old buffer (read before the write) followed by the new block.
        keys = np.concatenate((table[: plan.old_view], new_pos)) if plan.concat else None
        rng = plan.slot_range
        slots = None if rng else np.array(plan.slots, dtype=np.int64)
        if rng:
            table[rng[0] : rng[1]] = written
        else:
            table[slots] = written
        # A direct forward's keys are a copy: the table changes on the next advance/trim.
        keys = table[: plan.view].copy() if keys is None else keys
        self.forward = Forward(self.spec, plan, new_pos, keys, slots, keep, row)
        return self.forward

    def _advance_rows(self, m: int) -> Forward:
        """Every row feeds m tokens at its own next positions (a decode step): one direct write per row,
        one view. Vectorized over the rows (numpy on the rows' counters): the same positions, slots,
        view and capacity as `Layout.plan` on each row (tests/engine/test_cache.py checks it), and no
        mask when every row sees every slot of the view (rows of equal lengths, or wrapped rings)."""
        lay = self.layout
        if self.limit is not None and m > lay.max_block:
            raise ValueError(
                f"a batched forward feeds at most max_block={lay.max_block} tokens per row (got {m})"
            )
        if m < 1:
            raise ValueError("a forward needs at least one token")
        n = np.fromiter((x.n for x in self.layouts), np.int64, self.rows)
        hw = np.fromiter((x.hw for x in self.layouts), np.int64, self.rows)
        queries = n[:, None] if m == 1 else n[:, None] + np.arange(m, dtype=np.int64)  # [rows, m]
        end = n + m
        rolled_back = bool((hw > end).any())
        np.maximum(hw, end, out=hw)
        if lay.ring is None:  # unbounded: slot = position
            slots, views = queries, end
        else:
            sink, ring = lay.sink, lay.ring
            slots = (queries - sink) % ring + sink
            if n.min() < sink:
                slots = np.where(queries < sink, queries, slots)
            views = np.where(hw <= lay.limit, end, lay.limit)
        view = int(views.max())
        # No mask when every row attends to exactly its own view and none needs one (`_needs_mask`).
        mask = m > 1 or int(views.min()) != view or lay._needs_mask(int(n.max()), int(hw.max()), rolled_back)
        # every row wrapped and past the native window: the rows' smallest position and hw decide
        hidden = mask and m == 1 and lay._sinks_hidden(int(n.min()), int(hw.min()), rolled_back)
        capacity = view if lay.ring is None else max(view, int(slots.max()) + 1)
        for x, e, h in zip(self.layouts, end.tolist(), hw.tolist(), strict=True):
            x.n, x.hw = e, h
        table = self._reserve(capacity)
        table[self._row_index, slots] = queries
        plan = Plan(
            start=int(n[0]), m=m, view=view, slots=(), capacity=capacity, mask=mask, sinks_hidden=hidden
        )
        self.forward = Forward(self.spec, plan, queries, table[:, :view].copy(), slots, None, None)
        return self.forward

    def planned(self) -> Forward:
        """The forward being run: a layer's cache is only used inside one."""
        assert self.forward is not None, "the cache was used outside a planned forward"
        return self.forward

    def trim(self, n: int | Sequence[int]) -> list[list[int]] | None:
        """Drop the last n positions fed (of every row; a sequence: n[r] of row r, each row rolls back on
        its own) and mark the slots they held EMPTY; returns those slots per row, for a backend's device
        copy of the table (None: an unbounded group marks none)."""
        per_row = [n] * self.rows if isinstance(n, int) else list(n)
        if len(per_row) != self.rows:
            raise ValueError(f"trim takes one count per row ({self.rows}), got {len(per_row)}")
        dropped = [list(lay.trim(r)) for lay, r in zip(self.layouts, per_row, strict=True)]
        if self.limit is None:
            return None
        for r, slots in enumerate(dropped):
            if slots:
                self.table[r, slots] = EMPTY
        return dropped

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only these rows (renumbered 0.. in this order), each with its own counters and table row."""
        self.layouts = [self.layouts[r] for r in rows]
        self.table = self.table[rows]
        self.rows = len(rows)
        self._row_index = np.arange(self.rows)[:, None]
        self.forward = None

    def join(self, other: Group) -> None:
        """Append the rows of `other` (a group of the same spec and max_block, fed on its own) after these:
        their counters and table rows (the tables padded to the wider with EMPTY, slots no row wrote)."""
        if other.spec != self.spec or other.layout.max_block != self.layout.max_block:
            raise ValueError("cannot join rows: the groups differ in policy or max_block")
        width = max(self.table.shape[1], other.table.shape[1])
        self.table = np.concatenate((_padded(self.table, width), _padded(other.table, width)))
        self.layouts = self.layouts + other.layouts
        self.rows += other.rows
        self._row_index = np.arange(self.rows)[:, None]
        self.forward = None

    def held(self) -> int:
        """Slots in use (positions held, with EMPTY slots of a pending rollback counted); all rows."""
        return sum(lay.held() for lay in self.layouts)

    def held_rows(self) -> list[int]:
        """Slots in use, per row."""
        return [lay.held() for lay in self.layouts]


def _padded(table: np.ndarray, width: int) -> np.ndarray:
    if table.shape[1] == width:
        return table
    out = np.full((table.shape[0], width), EMPTY, dtype=table.dtype)
    out[:, : table.shape[1]] = table
    return out


def buffer_size(have: int, need: int, limit: int | None) -> int:
    """Slots to allocate when a buffer of `have` slots must hold `need` (at most `limit`)."""
    size = max(need, 2 * have, 256)
    return size if limit is None else min(size, limit)


def visible_mask(spec: LayerSpec, qp: Any, kp: Any) -> Any:
    """Boolean [..., len(qp), len(kp)]: which key positions each query position attends (module
    docstring); leading dimensions are batch rows. Only operators: numpy, torch and mlx arrays alike,
    so a backend builds masks on its device from device-resident position tables."""
    q = qp[..., :, None]
    k = kp[..., None, :]
    allowed = k <= q
    if spec.window is not None:
        in_window = k > q - spec.window
        allowed &= (in_window | (k < spec.sink)) if spec.sink else in_window
    if spec.native_window is not None:
        allowed &= k > q - spec.native_window
    return allowed
