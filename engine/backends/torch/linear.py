"""One recurrent layer's state: `DeltaNetState` (gated delta-net), `Mamba2State` (a Mamba-2 mixer),
`MambaState` (a Mamba-1 mixer), and
`ParallelState` (Falcon-H1: attention K/V beside a Mamba-2 state in one layer)."""

from __future__ import annotations

import torch

from engine.backends.base import ParallelLayer


class DeltaNetState:
    """One linear-attention layer's state: `conv` the last kernel - 1 inputs of its causal convolution
    [batch, channels, kernel - 1] and `recurrent` the gated delta-net state [batch, heads, k_dim, v_dim]
    (None before the first forward). K/V bytes are 0; `state_bytes` is what the state costs."""

    def __init__(self, kernel: int) -> None:
        self.kernel = kernel
        self.conv: torch.Tensor | None = None
        self.recurrent: torch.Tensor | None = None

    def update_conv(self, x: torch.Tensor) -> torch.Tensor:
        """A block's convolution inputs [batch, channels, m] -> what the convolution runs over (the kept
        inputs + the block, or the block alone for the first forward); keeps the last kernel - 1."""
        full = x if self.conv is None else torch.cat((self.conv, x), dim=-1)
        keep = self.kernel - 1
        tail = full[..., -keep:]
        self.conv = (
            tail if tail.shape[-1] == keep else torch.nn.functional.pad(tail, (keep - tail.shape[-1], 0))
        )
        return full

    def snapshot(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        # A one-token step updates `conv` in place (causal_conv1d_update): copy it. The recurrent state is
        # replaced, never mutated, by both kernels: a reference is enough.
        return (None if self.conv is None else self.conv.clone()), self.recurrent

    def restore(self, snapshot: tuple[torch.Tensor | None, torch.Tensor | None]) -> None:
        self.conv, self.recurrent = snapshot

    def trim(self, n: int) -> None:
        """Nothing here: the session restores a snapshot and feeds the kept tokens again."""

    nbytes = 0
    allocated_bytes = 0

    @property
    def state_bytes(self) -> int:
        return sum(0 if t is None else t.nbytes for t in (self.conv, self.recurrent))


class Mamba2State(DeltaNetState):
    """One Mamba-2 mixer's state (Nemotron-H, Granite-4.0-H, Bamba): `conv` the last kernel - 1 inputs of
    its causal convolution over x, B and C [batch, channels, kernel - 1] and `recurrent` the SSM state
    [batch, heads, head_dim, d_state]. transformers' one-token step updates both in place
    (`causal_conv1d_update`, `mamba2_selective_state_update`'s `state.copy_`), so a snapshot copies both;
    a longer block (the chunked scan) replaces the SSM state. Rollback as for `DeltaNetState`."""

    def snapshot(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return tuple(None if t is None else t.clone() for t in (self.conv, self.recurrent))  # type: ignore[return-value]


class MambaState(Mamba2State):
    """One Mamba (v1) mixer's state (Jamba): `conv` the last kernel - 1 inputs of its causal convolution
    [batch, expand x hidden, kernel - 1] and `recurrent` the SSM state [batch, expand x hidden, d_state].
    transformers' one-token step updates both in place (`causal_conv1d_update`,
    `mamba_selective_state_update`'s `state.copy_`): the snapshot copies both, as `Mamba2State`'s."""


class ParallelState(ParallelLayer):
    """A Falcon-H1 layer (`engine.backends.base.ParallelLayer`): attention (its `KV` or `QuantizedKV`)
    beside a Mamba-2 mixer (`Mamba2State`). K/V calls go to `kv`, state calls to `mamba`."""

    mamba: Mamba2State

    def update(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.kv.update(key, value)  # type: ignore[no-any-return]

    @property
    def conv(self) -> torch.Tensor | None:
        return self.mamba.conv

    @property
    def recurrent(self) -> torch.Tensor | None:
        return self.mamba.recurrent

    @recurrent.setter
    def recurrent(self, state: torch.Tensor | None) -> None:
        self.mamba.recurrent = state

    def update_conv(self, x: torch.Tensor) -> torch.Tensor:
        return self.mamba.update_conv(x)
