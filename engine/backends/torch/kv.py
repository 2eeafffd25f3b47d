"""One attention layer's K/V on the device (`KV`) and its group's device mirror of the slot table
(`GroupTensors`: the written slots, the query positions, the table the masks are built from)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from engine.cache import EMPTY, Forward, Group, buffer_size, visible_mask


class GroupTensors:
    """One group's current `Forward` as tensors on the model's device, shared by the group's layers: the
    written slots and rows, the query positions, and a device copy of the group's slot -> position
    table from which the mask is built on the device. A decode step copies only its new positions and
    slots ([rows, m]) to the device, a rollback the slots it empties; the whole table is copied after a
    prefill chunk or a growth."""

    def __init__(self, group: Group, device: torch.device) -> None:
        self.group = group
        self.device = device
        self.slots: torch.Tensor | None = None  # written slots, when not a contiguous range
        self.keep: torch.Tensor | None = None  # concat: rows of the block that are written
        self.queries = torch.zeros((0,), dtype=torch.int64, device=device)  # positions fed
        self.table = torch.full((group.rows, 0), EMPTY, dtype=torch.int64, device=device)
        self.stale = False  # the host table changed in a way not mirrored here
        self._bases: dict[tuple[int, int], torch.Tensor] = {}  # (heads, slots) -> [rows, heads, 1]
        self._flat: tuple[tuple[int, int], torch.Tensor] | None = None  # this step's `flat_index`
        self._constant: dict[tuple[int, int], torch.Tensor] = {}  # `sinks_hidden_mask`s

    def _dev(self, a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a).to(self.device, non_blocking=True)

    def load(self, fwd: Forward) -> None:
        host, plan = self.group.table, fwd.plan
        self._flat = None
        self.keep = None if fwd.keep is None else self._dev(fwd.keep)
        if fwd.row is None:
            self.queries = self._dev(fwd.queries)
            # unbounded layers write position p at slot p: one copy
            self.slots = self.queries if fwd.slots is fwd.queries else self._dev(fwd.slots)
        else:
            self.slots = None if fwd.slots is None else self._dev(fwd.slots)
            self.queries = torch.arange(plan.start, plan.start + plan.m, device=self.device)
        resync = self.stale or plan.concat or self.table.shape != host.shape
        if resync:
            self.table, self.stale = self._dev(host), False
        elif fwd.row is None:
            assert self.slots is not None
            self.table.scatter_(1, self.slots, self.queries)
        elif rng := plan.slot_range:
            self.table[fwd.row, rng[0] : rng[1]] = self.queries
        else:
            assert self.slots is not None
            self.table[fwd.row].index_copy_(0, self.slots, self.queries)

    def flat_index(self, heads: int, size: int) -> torch.Tensor:
        """A batched forward's written slots as row indices of a contiguous [rows, heads, size, d] buffer
        seen as [rows * heads * size, d], in the order of the new K/V [rows, heads, m, d]: one
        `index_copy_` writes every row (computed once per forward, shared by the group's layers)."""
        key = (heads, size)
        if self._flat is None or self._flat[0] != key:
            if (base := self._bases.get(key)) is None:
                rows = torch.arange(self.group.rows, device=self.device)[:, None] * heads
                base = self._bases[key] = ((rows + torch.arange(heads, device=self.device)) * size)[..., None]
            assert self.slots is not None
            self._flat = key, (base + self.slots[:, None, :]).reshape(-1)
        return self._flat[1]

    def drop(self, slots: list[list[int]] | None) -> None:
        """Mark the slots of a rollback ([rows, n]) EMPTY, as the group did in the host table."""
        if not slots or not any(slots):
            return
        if len({len(s) for s in slots}) == 1 and self.table.shape == self.group.table.shape:
            self.table.scatter_(1, torch.tensor(slots, device=self.device), EMPTY)
        else:  # rows rolled back by different counts (batched speculative decoding): copy the table
            self.stale = True

    def keep_rows(self, index: torch.Tensor) -> None:
        """The group kept the rows `index` (`Group.keep_rows`): keep their table rows, forget the per-rows
        caches."""
        self.table = self.table.index_select(0, index)
        self._bases.clear()
        self._constant.clear()
        self._flat = None

    def sinks_hidden_mask(self, fwd: Forward, convert: Any) -> torch.Tensor:
        """The mask of a step that sees every slot but the sinks (`Plan.sinks_hidden`): the same tensor
        every such step, made once per (rows, view) and passed through `convert` (additive or not)."""
        rows = self.group.rows if fwd.row is None else 1
        key = (rows, fwd.plan.view)
        if (mask := self._constant.get(key)) is None:
            ones = torch.ones((rows, 1, 1, fwd.plan.view), dtype=torch.bool, device=self.device)
            ones[..., : fwd.spec.sink] = False
            mask = self._constant[key] = convert(ones)
        return mask

    def mask(self, fwd: Forward) -> torch.Tensor | None:
        """Boolean mask [rows, 1, m, keys] on the device, or None when every attended slot is visible."""
        if not fwd.plan.mask:
            return None
        if fwd.plan.concat:
            keys = self._dev(fwd.keys)[None]
        elif fwd.row is None:
            keys = self.table[:, : fwd.plan.view]
        else:
            keys = self.table[fwd.row : fwd.row + 1, : fwd.plan.view]
        queries = self.queries if fwd.row is None else self.queries[None]
        return visible_mask(fwd.spec, queries, keys)[:, None]


class KV:
    """One attention layer's K/V buffers [batch, kv_heads, slots, head_dim]: sinks + ring, or a growing
    buffer for unbounded layers, written where its group's `Forward` says."""

    def __init__(self, tensors: GroupTensors) -> None:
        self.group = tensors.group
        self.tensors = tensors
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self._flat: tuple[torch.Tensor, torch.Tensor] | None = None  # k, v seen as [rows * heads * slots, d]

    def update(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fwd = self.group.planned()
        plan = fwd.plan
        if self.k is None or self.v is None or self.k.shape[2] < plan.capacity:
            self._grow(key, value, plan.capacity)
        kb, vb = self.k, self.v
        assert kb is not None and vb is not None
        if fwd.row is None:  # every row at its own slots
            assert self._flat is not None
            index = self.tensors.flat_index(kb.shape[1], kb.shape[2])
            self._flat[0].index_copy_(0, index, key.reshape(-1, kb.shape[3]))
            self._flat[1].index_copy_(0, index, value.reshape(-1, vb.shape[3]))
            return self._view(plan.view)
        if self.group.rows > 1:  # one row's prefill
            kb, vb = kb[fwd.row : fwd.row + 1], vb[fwd.row : fwd.row + 1]
        if plan.concat:
            ko = torch.cat((kb[:, :, : plan.old_view], key), dim=2)
            vo = torch.cat((vb[:, :, : plan.old_view], value), dim=2)
            if (keep := self.tensors.keep) is not None:
                key, value = key.index_select(2, keep), value.index_select(2, keep)
            self._write(kb, vb, key, value, fwd)
            return ko, vo
        self._write(kb, vb, key, value, fwd)
        if self.group.rows > 1:
            return kb.narrow(2, 0, plan.view), vb.narrow(2, 0, plan.view)
        return self._view(plan.view)

    def _view(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first n slots of the buffers (the buffers themselves when they hold exactly n)."""
        assert self.k is not None and self.v is not None
        if self.k.shape[2] == n:
            return self.k, self.v
        return self.k.narrow(2, 0, n), self.v.narrow(2, 0, n)

    def _write(
        self, kb: torch.Tensor, vb: torch.Tensor, key: torch.Tensor, value: torch.Tensor, fwd: Forward
    ) -> None:
        if rng := fwd.plan.slot_range:
            kb[:, :, rng[0] : rng[1]] = key
            vb[:, :, rng[0] : rng[1]] = value
        else:
            assert self.tensors.slots is not None
            kb.index_copy_(2, self.tensors.slots, key)
            vb.index_copy_(2, self.tensors.slots, value)

    def _grow(self, key: torch.Tensor, value: torch.Tensor, need: int) -> None:
        have = 0 if self.k is None else self.k.shape[2]
        size = buffer_size(have, need, self.group.limit)
        _, h, _, d = key.shape
        # zeros: a batch row shorter than the view attends (masked) slots it never wrote
        kb = key.new_zeros((self.group.rows, h, size, d))
        vb = value.new_zeros((self.group.rows, h, size, value.shape[3]))
        if self.k is not None and self.v is not None:
            kb[:, :, :have] = self.k
            vb[:, :, :have] = self.v
        self.k, self.v = kb, vb
        self._flat = kb.view(-1, d), vb.view(-1, vb.shape[3])

    def trim(self, n: int) -> None:
        """Nothing to drop: the group marks the trimmed slots EMPTY and the next writes reuse them."""

    def keep_rows(self, index: torch.Tensor) -> None:
        """Keep the batch rows `index` of the buffers (a copy: the others' K/V are freed)."""
        if self.k is None or self.v is None:
            return
        self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)
        self._flat = self.k.view(-1, self.k.shape[3]), self.v.view(-1, self.v.shape[3])

    def join(self, other: KV) -> None:
        """Append the rows of `other`'s buffers (`Session.join`), the narrower padded with zeros (slots its
        row never wrote: EMPTY in its table, hidden by its mask)."""
        if self.k is None or self.v is None or other.k is None or other.v is None:
            raise ValueError("cannot join rows: a session was never fed")
        size = max(self.k.shape[2], other.k.shape[2])
        self.k = torch.cat((_padded(self.k, size), _padded(other.k, size)))
        self.v = torch.cat((_padded(self.v, size), _padded(other.v, size)))
        self._flat = self.k.view(-1, self.k.shape[3]), self.v.view(-1, self.v.shape[3])

    @property
    def nbytes(self) -> int:
        if self.k is None or self.v is None:
            return 0
        slot = (self.k[0, :, 0].numel() + self.v[0, :, 0].numel()) * self.k.element_size()
        return self.group.held() * slot  # held: summed over the rows

    @property
    def allocated_bytes(self) -> int:
        return 0 if self.k is None or self.v is None else self.k.nbytes + self.v.nbytes


def _padded(x: torch.Tensor, size: int) -> torch.Tensor:
    """x [rows, heads, slots, dim] with `size` slots (zeros after its own)."""
    if x.shape[2] == size:
        return x
    out = x.new_zeros((x.shape[0], x.shape[1], size, x.shape[3]))
    out[:, :, : x.shape[2]] = x
    return out
