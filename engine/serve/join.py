"""Rows joining a running batch: a freshly prefilled session's rows appended to a batched session.

The engine's batched sessions can drop rows (`Session.keep_rows`) but not take new ones, so the server
prefills each joining request in a session of its own (rows=1, the same policy and max_block) and, at a
step boundary, moves that session's rows into the running batch (`join`): per layer group the row
counters (`Layout`s) and slot-table rows are appended (tables padded to the wider one with EMPTY), and per
layer the K/V buffers [rows, heads, slots, dim] are concatenated along the rows (the narrower padded with
zeros: slots a row never wrote, which its mask hides, exactly as in `generate_batch`). Nothing is
recomputed; every row keeps its own positions, so each row's tokens stay those of decoding it alone.

This reaches into the torch session's internals (engine/cache.py `Group`, engine/backends/torch/kv.py
`KV`, `GroupTensors`); it belongs in the backends as a `Session.join` once they settle. Where it does not
apply (`joinable` says why: MLX, quantized K/V, linear-attention layers, models numbering their own
positions) the scheduler steps each request's session as a batch of its own instead (correct, slower).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.cache import EMPTY


def joinable(session: Any) -> str | None:
    """Why rows cannot join this kind of session (None: they can)."""
    try:
        from engine.backends.torch.kv import KV
        from engine.backends.torch.session import TorchSession
    except ImportError:
        return "the torch backend is not installed"
    if not isinstance(session, TorchSession):
        return f"rows join torch sessions only (this is {type(session).__name__})"
    if session.linear:
        return "linear-attention / recurrent layers keep batch-1 states"
    if session.owner.own_positions:
        return "the model numbers its own positions (no batched decoding)"
    if session.restorer is not None:
        return "a session with a restorer"
    if not all(isinstance(s, KV) for s in session.states):
        return "quantized K/V (:qN policies) or layers without K/V"
    return None


def join(batch: Any, new: Any) -> None:
    """Append the rows of `new` (a session of the same model, policy and max_block, fed on its own) to
    `batch` (renumbered after its rows); `new` must not be used afterwards."""
    import torch

    if (why := joinable(batch)) or (why := joinable(new)):
        raise ValueError(f"cannot join rows: {why}")
    if batch.owner is not new.owner or batch.policy != new.policy or batch.max_block != new.max_block:
        raise ValueError("cannot join rows: the sessions differ in model, policy or max_block")
    for g, h in zip(batch.groups, new.groups, strict=True):
        width = max(g.table.shape[1], h.table.shape[1])
        g.table = np.concatenate((_pad_table(g.table, width), _pad_table(h.table, width)))
        g.layouts = g.layouts + h.layouts
        g.rows += h.rows
        g._row_index = np.arange(g.rows)[:, None]
        g.forward = None
    for t in batch.tensors:  # the device mirror is copied from the host table on the next forward
        t.stale = True
        t._bases.clear()
        t._constant.clear()
        t._flat = None
    with torch.inference_mode():
        for a, b in zip(batch.states, new.states, strict=True):
            if b.k is None or b.v is None:
                raise ValueError("cannot join rows: the joining session was never fed")
            if a.k is None or a.v is None:
                raise ValueError("cannot join rows: the batch was never fed")
            size = max(a.k.shape[2], b.k.shape[2])
            a.k = torch.cat((_pad_kv(a.k, size), _pad_kv(b.k, size)))
            a.v = torch.cat((_pad_kv(a.v, size), _pad_kv(b.v, size)))
            a._flat = a.k.view(-1, a.k.shape[3]), a.v.view(-1, a.v.shape[3])
    batch.rows += new.rows


def _pad_table(table: np.ndarray, width: int) -> np.ndarray:
    if table.shape[1] == width:
        return table
    out = np.full((table.shape[0], width), EMPTY, dtype=table.dtype)
    out[:, : table.shape[1]] = table
    return out


def _pad_kv(x: Any, size: int) -> Any:
    if x.shape[2] == size:
        return x
    out = x.new_zeros((x.shape[0], x.shape[1], size, x.shape[3]))
    out[:, :, : x.shape[2]] = x
    return out


def rows_drafter(drafter: Any) -> Any | None:
    """A one-row `RowsDrafter` twin of a batch-1 drafter whose rows can join a running batch's drafter
    (`join_drafter`): the torch block drafter's `BatchedBlockDrafter` on the same weights; None for any
    other kind (those draft one instance per row, `engine.speculative.PerRow`)."""
    try:
        from engine.drafters.block.torch import BatchedBlockDrafter, BlockDrafter
    except ImportError:
        return None
    return BatchedBlockDrafter(drafter.model, 1) if isinstance(drafter, BlockDrafter) else None


def join_drafter(batch: Any, new: Any) -> None:
    """Append the rows of `new` (a `BatchedBlockDrafter` that observed its own rows' prompts) to `batch`'s:
    each row's context buffers [rows, heads, slots, head_dim] concatenated along the rows (the narrower
    padded: slots past a row's own length, which its mask hides), and its lengths and positions."""
    import torch

    with torch.inference_mode():
        size = max(batch.kv[0][0].shape[2], new.kv[0][0].shape[2])
        batch.kv = [
            (
                torch.cat((_pad_kv(ka, size), _pad_kv(kb, size))),
                torch.cat((_pad_kv(va, size), _pad_kv(vb, size))),
            )
            for (ka, va), (kb, vb) in zip(batch.kv, new.kv, strict=True)
        ]
    batch.length = batch.length + new.length
    batch.position = batch.position + new.position
    batch.rows += new.rows
