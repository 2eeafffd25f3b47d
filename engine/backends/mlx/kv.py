"""One attention layer's K/V and mlx-lm cache object (`KV`) and its group's `engine.cache.Forward` as
mlx arrays and mask (`GroupArrays`)."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

from engine.cache import EMPTY, Forward, Group, buffer_size, visible_mask
from engine.geometry import SLIDING_ATTENTION


class GroupArrays:
    """One group's current `Forward` as mlx arrays and the mask mlx-lm asks for, shared by its layers.
    The mask is built from a device copy of the group's slot -> position table, to which a decode step
    writes only its new positions and a trim only the slots it empties (the whole table is copied after
    a prefill chunk that concatenates, or a growth)."""

    def __init__(self, group: Group, native_window: int | None) -> None:
        self.group = group
        self.native_window = native_window if group.layer_type == SLIDING_ATTENTION else None
        self.mask: mx.array | str | None = None
        self.asked = False  # make_mask was called for this forward
        self.slots: mx.array | None = None  # written slots, when not a contiguous range
        self.keep: mx.array | None = None  # concat: rows of the block that are written
        self.queries = mx.zeros((0,), dtype=mx.int64)  # positions fed ([rows, m] when batched)
        self.table = mx.full((group.rows, 0), EMPTY, dtype=mx.int64)
        self.stale = False  # the host table changed in a way not mirrored here

    def drop(self, slots: list[list[int]] | None) -> None:
        """Mark the slots of a rollback ([rows, n]) EMPTY, as the group did in the host table."""
        if not slots or not any(slots):
            return
        if len({len(s) for s in slots}) == 1 and tuple(self.table.shape) == self.group.table.shape:
            self.table = mx.put_along_axis(self.table, mx.array(slots), mx.array(EMPTY, mx.int64), axis=1)
        else:  # rows rolled back by different counts (batched speculative decoding): copy the table
            self.stale = True

    def keep_rows(self, index: mx.array) -> None:
        """The group kept the rows `index` (`Group.keep_rows`): keep their table rows."""
        self.table = self.table[index]

    def load(self, fwd: Forward) -> None:
        self.asked = False
        plan, host = fwd.plan, self.group.table
        self.slots = None if fwd.slots is None else mx.array(fwd.slots, dtype=mx.int32)
        self.keep = None if fwd.keep is None else mx.array(fwd.keep, dtype=mx.int32)
        if fwd.row is None:
            self.queries = mx.array(fwd.queries)
        else:
            self.queries = mx.arange(plan.start, plan.start + plan.m, dtype=mx.int64)
        if self.stale or plan.concat or tuple(self.table.shape) != host.shape:
            self.table, self.stale = mx.array(host), False
        elif fwd.row is None:
            assert self.slots is not None
            self.table = mx.put_along_axis(self.table, self.slots, self.queries, axis=1)
        elif rng := plan.slot_range:
            self.table[fwd.row, rng[0] : rng[1]] = self.queries
        else:
            self.table[fwd.row, self.slots] = self.queries
        if fwd.causal:
            self.mask = "causal"  # slots are positions 0..end-1: mlx's bottom-right aligned causal mask
        elif not plan.mask:
            self.mask = None
        elif plan.concat:
            self.mask = visible_mask(fwd.spec, self.queries, mx.array(fwd.keys))
        elif fwd.row is None:  # [rows, 1, m, view]
            self.mask = visible_mask(fwd.spec, self.queries, self.table[:, : plan.view])[:, None]
        else:
            self.mask = visible_mask(fwd.spec, self.queries, self.table[fwd.row, : plan.view])


class KV:
    """One attention layer's K/V buffers, and the per-layer cache object an mlx-lm model is called with
    (see the module docstring): written where its group's `Forward` says."""

    def __init__(self, arrays: GroupArrays, layer: int) -> None:
        self.group = arrays.group
        self.arrays = arrays
        self.layer = layer
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    @property
    def offset(self) -> int | mx.array:
        """RoPE offset: the first position fed (per row, as an array, in a batched forward)."""
        fwd = self.group.forward
        if fwd is not None and fwd.row is None:
            return self.arrays.queries[:, 0]
        return 0 if fwd is None else fwd.start

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> Any:
        a, g = self.arrays, self.group
        if window_size is not None and window_size != a.native_window:
            raise ValueError(
                f"mlx-lm asked layer {self.layer} ({g.layer_type}, sliding_window={a.native_window}) for a "
                f"mask with window_size={window_size}: the model's mlx-lm code and its config's layer_types "
                "disagree; this model is not supported by the mlx backend"
            )
        fwd = g.forward
        assert fwd is not None and fwd.plan.m == n, "make_mask outside a planned forward"
        a.asked = True
        if return_array and isinstance(a.mask, str):
            return mx.array(visible_mask(g.spec, fwd.queries, np.arange(fwd.start + n)))
        return a.mask

    def update(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        fwd = self.group.planned()
        plan = fwd.plan
        if self.keys is None or self.values is None or self.keys.shape[2] < plan.capacity:
            self._grow(keys, values, plan.capacity)
        assert self.keys is not None and self.values is not None
        if fwd.row is None:  # every row at its own slots
            assert self.arrays.slots is not None
            index = self.arrays.slots[:, None, :, None]
            self.keys = mx.put_along_axis(self.keys, index, keys, axis=2)
            self.values = mx.put_along_axis(self.values, index, values, axis=2)
            return self.keys[:, :, : plan.view], self.values[:, :, : plan.view]
        r = slice(fwd.row, fwd.row + 1)  # the row fed (all of an unbatched cache)
        if plan.concat:
            ko = mx.concatenate((self.keys[r, :, : plan.old_view], keys), axis=2)
            vo = mx.concatenate((self.values[r, :, : plan.old_view], values), axis=2)
            if (keep := self.arrays.keep) is not None:
                keys, values = keys[:, :, keep], values[:, :, keep]
            self._write(r, keys, values, fwd)
            return ko, vo
        self._write(r, keys, values, fwd)
        return self.keys[r, :, : plan.view], self.values[r, :, : plan.view]

    update_and_fetch = update  # the name mlx-lm models call

    def _write(self, r: slice, keys: mx.array, values: mx.array, fwd: Forward) -> None:
        assert self.keys is not None and self.values is not None
        if rng := fwd.plan.slot_range:
            self.keys[r, :, rng[0] : rng[1]] = keys
            self.values[r, :, rng[0] : rng[1]] = values
        else:
            self.keys[r, :, self.arrays.slots] = keys
            self.values[r, :, self.arrays.slots] = values

    def _grow(self, keys: mx.array, values: mx.array, need: int) -> None:
        have = 0 if self.keys is None else self.keys.shape[2]
        size = buffer_size(have, need, self.group.limit)
        _, h, _, d = keys.shape
        kb = mx.zeros((self.group.rows, h, size, d), keys.dtype)
        vb = mx.zeros((self.group.rows, h, size, values.shape[3]), values.dtype)
        if self.keys is not None and self.values is not None:
            kb[:, :, :have] = self.keys
            vb[:, :, :have] = self.values
        self.keys, self.values = kb, vb

    def trim(self, n: int) -> None:
        """Nothing to drop: the group marks the trimmed slots EMPTY and the next writes reuse them."""

    def keep_rows(self, index: mx.array) -> None:
        """Keep the batch rows `index` of the buffers (the others' K/V are freed)."""
        if self.keys is not None and self.values is not None:
            self.keys, self.values = self.keys[index], self.values[index]

    def join(self, other: KV) -> None:
        """Append the rows of `other`'s buffers (`Session.join`), the narrower padded with zeros (slots its
        row never wrote: EMPTY in its table, hidden by its mask)."""
        if self.keys is None or self.values is None or other.keys is None or other.values is None:
            raise ValueError("cannot join rows: a session was never fed")
        size = max(self.keys.shape[2], other.keys.shape[2])
        self.keys = mx.concatenate((_padded(self.keys, size), _padded(other.keys, size)))
        self.values = mx.concatenate((_padded(self.values, size), _padded(other.values, size)))

    @property
    def state(self) -> list[mx.array]:
        return [] if self.keys is None or self.values is None else [self.keys, self.values]

    def is_trimmable(self) -> bool:
        return False  # rollback goes through MLXSession.trim, which keeps every layer in step

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        """K/V bytes of the positions held."""
        if self.keys is None or self.values is None:
            return 0
        _, h, _, d = self.keys.shape
        return self.group.held() * h * (d + self.values.shape[3]) * self.keys.itemsize  # held: all rows

    @property
    def allocated_bytes(self) -> int:
        return 0 if self.keys is None or self.values is None else self.keys.nbytes + self.values.nbytes


def _padded(x: mx.array, size: int) -> mx.array:
    """x [rows, heads, slots, dim] with `size` slots (zeros after its own)."""
    if x.shape[2] == size:
        return x
    pad = mx.zeros((x.shape[0], x.shape[1], size - x.shape[2], x.shape[3]), x.dtype)
    return mx.concatenate((x, pad), axis=2)
