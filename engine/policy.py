"""Cache policies: which past positions a query attends to, and what that costs in K/V bytes.

Backend-agnostic (no torch, no mlx): the PyTorch and MLX backends and the workloads share these rules.

Policies
    full()                  the oracle: every layer keeps every position (the model's own sliding layers
                            keep their native window, exactly as transformers does).
    sink_window(sink, W)    every layer keeps the first `sink` positions plus the last `W` (StreamingLLM).
    hybrid(sink, W)         exact K/V in the model's full-attention layers, sink + window in its
                            sliding layers (Gemma-style hybrids; on a model without sliding layers it
                            keeps everything, like `full`).

Window semantics (the convention of transformers' `sliding_window`): a query at absolute position p
attends to key position j iff

    j <= p  and  (j < sink  or  j > p - window)                       # the policy
            and  j > p - native_window                                 # only on native sliding layers

so `window` counts the query itself (window=1: the sinks and the token itself). On the model's native
sliding layers the visible set is the intersection of the native window and the policy's sink+window;
hence a policy whose window covers the whole sequence reproduces full-cache greedy decoding exactly.
Positions keep their original RoPE positions: nothing is re-encoded when older positions are evicted.

Physical layout (engine/cache.py): `sink` slots plus a ring of `window - 1 + max_block` slots, where
max_block is the largest block fed in one forward and the largest rollback (k + 1 for speculative
decoding with k drafted tokens, 1 for plain greedy). Each query is masked to its own sink + window, so
a verified block sees exactly what step-by-step decoding would have seen, and dropping rejected
tokens is a cheap truncation that never needs evicted K/V back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from engine.geometry import FULL_ATTENTION, LAYER_KINDS, LINEAR_ATTENTION, SLIDING_ATTENTION

PolicyKind = Literal["full", "sink_window", "hybrid"]


@dataclass(frozen=True)
class Policy:
    kind: PolicyKind
    sink: int = 0
    window: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("full", "sink_window", "hybrid"):
            raise ValueError(f"unknown cache policy {self.kind!r}: use full, sink_window or hybrid")
        if self.kind == "full":
            if self.sink or self.window is not None:
                raise ValueError("the full policy takes no sink or window")
            return
        if self.window is None or self.window < 1:
            raise ValueError(f"{self.kind} needs a window >= 1 (got {self.window})")
        if self.sink < 0:
            raise ValueError(f"{self.kind} needs sink >= 0 (got {self.sink})")

    def __str__(self) -> str:
        return "full" if self.kind == "full" else f"{self.kind}:{self.sink}:{self.window}"


def full() -> Policy:
    return Policy("full")


def sink_window(sink: int = 4, window: int = 1024) -> Policy:
    return Policy("sink_window", sink, window)


def hybrid(sink: int = 4, window: int = 1024) -> Policy:
    return Policy("hybrid", sink, window)


def parse_policy(text: str) -> Policy:
    """`full`, `sink_window:SINK:WINDOW` or `hybrid:SINK:WINDOW` (the form `str(policy)` prints)."""
    parts = text.strip().split(":")
    try:
        if parts == ["full"]:
            return full()
        if len(parts) == 3 and parts[0] in ("sink_window", "hybrid"):
            return Policy(parts[0], int(parts[1]), int(parts[2]))  # type: ignore[arg-type]
    except ValueError as exc:
        raise ValueError(f"bad cache policy {text!r}: {exc}") from None
    raise ValueError(f"bad cache policy {text!r}: use full, sink_window:SINK:WINDOW or hybrid:SINK:WINDOW")


@dataclass(frozen=True)
class LayerSpec:
    """What one layer keeps. window=None: unbounded. native_window is set only when it still matters
    next to the policy (a sliding layer with sinks and a policy window narrower than its own)."""

    sink: int = 0
    window: int | None = None
    native_window: int | None = None

    @property
    def bounded(self) -> bool:
        return self.window is not None

    def visible(self, q: int, j: int) -> bool:
        """The reference rule: may a query at position q attend to key position j?"""
        if j > q:
            return False
        if self.window is not None and not (j < self.sink or j > q - self.window):
            return False
        return self.native_window is None or j > q - self.native_window

    def ring_size(self, max_block: int) -> int | None:
        """Ring slots after the sinks: the window minus the query, plus one block of slack."""
        return None if self.window is None else self.window - 1 + max_block

    def held_slots(self, n: int, max_block: int) -> int:
        """Positions held once n positions are committed (no rejected block pending)."""
        ring = self.ring_size(max_block)
        return n if ring is None else min(n, self.sink + ring)


def layer_spec(policy: Policy, layer_type: str, native_window: int | None) -> LayerSpec:
    """What a layer of `layer_type` keeps under `policy`. The policy applies to attention layers only: a
    linear-attention layer keeps its constant-size state, which summarizes the whole past (unbounded
    reach, no K/V)."""
    if layer_type == LINEAR_ATTENTION:
        return LayerSpec()
    if layer_type == FULL_ATTENTION:
        native = None
    elif layer_type == SLIDING_ATTENTION:
        if not native_window:
            raise ValueError("a sliding_attention layer needs the model's sliding_window in its config")
        native = native_window
    else:
        raise ValueError(f"layer kind {layer_type!r} is not supported (supported: {', '.join(LAYER_KINDS)})")
    keep_exact = policy.kind == "full" or (policy.kind == "hybrid" and native is None)
    sink, window = (0, None) if keep_exact else (policy.sink, policy.window)
    if native is None:
        return LayerSpec(sink, window)
    if window is None or window >= native or sink == 0:
        return LayerSpec(0, native if window is None else min(window, native))
    return LayerSpec(sink, window, native)


def layer_specs(policy: Policy, layer_types: Sequence[str], native_window: int | None) -> list[LayerSpec]:
    return [layer_spec(policy, t, native_window) for t in layer_types]


def drafter_policy(policy: Policy) -> Policy:
    """A model drafter's cache under `policy`: sink_window with its sink and window (full for full);
    a drafter only needs recent context."""
    return full() if policy.kind == "full" else sink_window(policy.sink, policy.window or 1)


def oldest_visible(specs: Sequence[LayerSpec], q: int) -> int:
    """The attention reach: the farthest-back key position a query at q still attends to in some layer,
    sinks aside (the start of the contiguous span [j, q] a layer attends to; 0 when some layer sees the
    whole prefix)."""
    best = q
    for s in specs:
        lo = max(
            0,
            q - s.window + 1 if s.window is not None else 0,
            q - s.native_window + 1 if s.native_window is not None else 0,
        )
        if lo <= s.sink:  # the window reaches the sinks: the span runs on down through them
            lo = max(0, q - s.native_window + 1) if s.native_window is not None else 0
        assert s.visible(q, lo) and (lo == 0 or lo - 1 < s.sink or not s.visible(q, lo - 1))
        best = min(best, lo)
    return best


def kv_bytes_per_slot(kv_heads: int, head_dim: int, itemsize: int) -> int:
    """K and V of one position in one layer (batch 1)."""
    return 2 * kv_heads * head_dim * itemsize


def expected_kv_bytes(
    specs: Sequence[LayerSpec], n: int, max_block: int, slot_bytes: Sequence[int]
) -> list[int]:
    """Per-layer K/V bytes a cache holds after n committed positions: the formula both backends meet."""
    return [s.held_slots(n, max_block) * b for s, b in zip(specs, slot_bytes, strict=True)]
