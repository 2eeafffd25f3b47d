"""Mamba hybrids on MLX (mlx-lm's falcon_h1, nemotron_h, granitemoehybrid; jamba with Mamba v1 mixers):
one Mamba(-2) mixer's state (`Mamba2State`), a Falcon-H1 layer's attention K/V beside its Mamba-2 state
(`ParallelState`), the per-layer states and the cache list such a model is called with (`mixer_states`),
and Jamba's expert routing as transformers computes it (`transformers_routing`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.jamba import JambaSparseMoeBlock

from engine.backends.base import NoState, ParallelLayer
from engine.backends.mlx.linear import DeltaNetState
from engine.geometry import MAMBA, MAMBA2, PARALLEL_MAMBA2, STATELESS


class Mamba2State(DeltaNetState):
    """One Mamba-2 mixer's state as mlx-lm's mixers read it (`ArraysCache(size=2)`): [0] the last
    kernel - 1 inputs of its causal convolution over x, B and C [batch, kernel - 1, channels], [1] the SSM
    state [batch, heads, head_dim, d_state]. A Mamba (v1) mixer's (mlx-lm's jamba) is the same two entries:
    [0] the last kernel - 1 inputs of its convolution over x, [1] the SSM state [batch, channels, d_state];
    its multi-token forward starts from both (no one-token rule as on torch). Exact rollback by the rule of `engine.backends.base`
    (a snapshot before every forward, restore + feed the kept tokens again). mlx-lm's mixers assign new
    arrays to both entries (`cache[0] = padded[:, -keep:]`, `cache[1] = state` from `ssm_update`), never
    write into them, so a snapshot is a copy of the list of references (torch's one-token step writes the
    SSM state in place and copies it). Batch 1, as on torch (`engine.backends.base.batch_unsupported`)."""


class ParallelState(ParallelLayer):
    """A Falcon-H1 layer (`engine.backends.base.ParallelLayer`): mlx-lm calls it as its
    `CacheList(ArraysCache(size=2), KVCache())`, `cache[0]` the Mamba-2 mixer's state and `cache[1]` the
    attention layer's (`KV` or `QuantizedKV`)."""

    def __getitem__(self, i: int) -> Any:
        return (self.mamba, self.kv)[i]

    @property
    def state(self) -> list[mx.array]:
        return [*self.mamba.state, *self.kv.state]


def mixer_states(layer_types: Sequence[str], states: list[Any]) -> tuple[list[Any], list[Any]]:
    """The per-layer states with each Mamba-2 layer's made (`states[i]`: what the session made for an
    attention layer, a `DeltaNetState` for a layer with no K/V), and the cache list the mlx-lm model is
    called with: Nemotron-H's blocks without a token mixer (mlp / moe) get a `NoState` and no entry in
    that list (its mlx-lm code hands cache entries to its Mamba-2 and attention blocks only)."""
    out = []
    for t, s in zip(layer_types, states, strict=True):
        if t in (MAMBA, MAMBA2):
            s = Mamba2State()
        elif t == PARALLEL_MAMBA2:
            s = ParallelState(s, Mamba2State())
        elif t in STATELESS:
            s = NoState()
        out.append(s)
    return out, [s for t, s in zip(layer_types, out, strict=True) if t not in STATELESS]


class _TransformersRouting(JambaSparseMoeBlock):
    """Jamba's mixture of experts routed as transformers does: the top k of the softmax over all the
    router's logits, weights left unnormalized (mlx-lm's jamba takes the softmax over the top k logits,
    which sums to 1: other logits, and other tokens, whenever k < experts)."""

    def __call__(self, x: mx.array) -> mx.array:
        probs = mx.softmax(self.router(x).astype(mx.float32), axis=-1, precise=True)
        k = self.num_experts_per_tok
        inds = mx.stop_gradient(mx.argpartition(-probs, kth=k - 1, axis=-1)[..., :k])
        weights = mx.take_along_axis(probs, inds, axis=-1).astype(x.dtype)
        return (self.switch_mlp(x, inds) * weights[..., None]).sum(axis=-2)


def transformers_routing(model: nn.Module) -> None:
    """Route every Jamba mixture-of-experts block of `model` as transformers does (`_TransformersRouting`)."""
    for layer in getattr(model, "layers", []):
        if type(getattr(layer, "feed_forward", None)) is JambaSparseMoeBlock:
            layer.feed_forward.__class__ = _TransformersRouting
