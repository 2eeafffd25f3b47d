"""Rows joining a running batch: the sessions' `join` (engine/backends/base.py `BaseSession.join`, with
torch and mlx halves), and the block drafter's rows joining its batched twin.

The engine's batched sessions drop rows (`keep_rows`) and take new ones (`join`): the server prefills each
joining request in a session of its own (rows=1, the same policy and max_block) and, at a step boundary,
appends that session's rows to the running batch. Nothing is recomputed; every row keeps its own
positions, so each row's tokens stay those of decoding it alone. Where a session cannot take rows
(`joinable` says why in one line: quantized `:qN` K/V, linear-attention layers, models numbering their
own positions) the scheduler steps each request's session as a batch of its own (exact, no batching gain)
and says so at startup.
"""

from __future__ import annotations

from typing import Any


def joinable(session: Any) -> str | None:
    """Why rows cannot join this kind of session, in one line (None: they can)."""
    refusal = getattr(session, "join_refusal", None)
    if refusal is None:
        return f"rows join no {type(session).__name__}"
    return refusal()


def join(batch: Any, new: Any) -> None:
    """Append the rows of `new` (a session of the same model, policy and max_block, fed on its own) to
    `batch` (renumbered after its rows); `new` must not be used afterwards."""
    batch.join(new)


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
