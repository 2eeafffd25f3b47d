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

Storage precision (an optional suffix on every policy: `full:q8`, `sink_window:4:64:q4`,
`hybrid:4:64:k8v4`, and `:gN` for a group size other than 64): K and V are stored affine-quantized
per group of `group` values along the head dimension (mlx's `mx.quantize` / QuantizedKVCache format:
packed `bits`-bit codes plus one scale and one bias per group, in the model dtype), with `q8` / `q4`
for both and `kXvY` for X-bit keys and Y-bit values. No suffix: the model dtype, as before. A group
larger than the head dimension is clamped to it; one that does not divide it is refused.

Physical layout (engine/cache.py): `sink` slots plus a ring of `window - 1 + max_block` slots, where
max_block is the largest block fed in one forward and the largest rollback (k + 1 for speculative
decoding with k drafted tokens, 1 for plain greedy). Each query is masked to its own sink + window, so
a verified block sees exactly what step-by-step decoding would have seen, and dropping rejected
tokens is a cheap truncation that never needs evicted K/V back.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from engine.geometry import (
    FULL_ATTENTION,
    ITEMSIZE,
    LAYER_KINDS,
    RECURRENT,
    SLIDING_ATTENTION,
    STATELESS,
    Geometry,
    attention_kind,
)

PolicyKind = Literal["full", "sink_window", "hybrid"]
BITS = (4, 8)  # supported quantized K/V widths
PRECISIONS = "q8, q4 or kXvY with X, Y in 4, 8 (e.g. k8v4)"
DEFAULT_GROUP = 64
_PRECISION = re.compile(r"^(?:q(\d+)|k(\d+)v(\d+))$")


@dataclass(frozen=True)
class Policy:
    kind: PolicyKind
    sink: int = 0
    window: int | None = None
    precision: str = ""  # "": the model dtype; q8, q4, kXvY: affine-quantized K/V (module docstring)
    group: int = DEFAULT_GROUP  # quantization group along the head dimension

    def __post_init__(self) -> None:
        if self.kind not in ("full", "sink_window", "hybrid"):
            raise ValueError(f"unknown cache policy {self.kind!r}: use full, sink_window or hybrid")
        if self.precision:
            m = _PRECISION.match(self.precision)
            bits = [int(b) for b in (m.groups() if m else ()) if b is not None]
            if not bits or any(b not in BITS for b in bits):
                raise ValueError(f"unknown K/V precision {self.precision!r}: use {PRECISIONS}")
        if self.group < 1 or self.group & (self.group - 1):
            raise ValueError(f"quantization group {self.group} must be a power of two")
        if self.kind == "full":
            if self.sink or self.window is not None:
                raise ValueError("the full policy takes no sink or window")
            return
        if self.window is None or self.window < 1:
            raise ValueError(f"{self.kind} needs a window >= 1 (got {self.window})")
        if self.sink < 0:
            raise ValueError(f"{self.kind} needs sink >= 0 (got {self.sink})")

    @property
    def bits(self) -> tuple[int, int] | None:
        """(key bits, value bits) of quantized storage; None for the model dtype."""
        m = _PRECISION.match(self.precision)
        if m is None:
            return None
        q, k, v = m.groups()
        return (int(q), int(q)) if q else (int(k), int(v))

    def group_for(self, head_dim: int) -> int:
        """The group size used at this head dimension: clamped to it, refused if it does not divide it."""
        group = min(self.group, head_dim)
        if head_dim % group:
            raise ValueError(
                f"quantization group {self.group} does not divide head_dim {head_dim} of this model: "
                f"use a group (:gN) that divides {head_dim}"
            )
        return group

    def __str__(self) -> str:
        base = "full" if self.kind == "full" else f"{self.kind}:{self.sink}:{self.window}"
        suffix = f":{self.precision}" if self.precision else ""
        return base + suffix + (f":g{self.group}" if self.precision and self.group != DEFAULT_GROUP else "")


def full() -> Policy:
    return Policy("full")


def sink_window(sink: int = 4, window: int = 1024) -> Policy:
    return Policy("sink_window", sink, window)


def hybrid(sink: int = 4, window: int = 1024) -> Policy:
    return Policy("hybrid", sink, window)


def parse_policy(text: str) -> Policy:
    """`full`, `sink_window:SINK:WINDOW` or `hybrid:SINK:WINDOW`, each with an optional precision
    (`:q8`, `:q4`, `:k8v4`) and group (`:g32`) suffix (the form `str(policy)` prints)."""
    parts = text.strip().split(":")
    extra: dict[str, object] = {}
    try:
        if len(parts) > 1 and parts[-1].startswith("g") and parts[-1][1:].isdigit():
            extra["group"] = int(parts.pop()[1:])
        n = 1 if parts[0] == "full" else 3
        if len(parts) == n + 1 and parts[0] in ("full", "sink_window", "hybrid"):
            extra["precision"] = parts.pop()
        elif "group" in extra:
            raise ValueError("a group (:gN) goes with a precision (:q8, :q4, :k8v4)")
        if parts == ["full"]:
            return Policy("full", **extra)  # type: ignore[arg-type]
        if len(parts) == 3 and parts[0] in ("sink_window", "hybrid"):
            return Policy(parts[0], int(parts[1]), int(parts[2]), **extra)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ValueError(f"bad cache policy {text!r}: {exc}") from None
    raise ValueError(
        f"bad cache policy {text!r}: use full, sink_window:SINK:WINDOW or hybrid:SINK:WINDOW, "
        "optionally followed by :q8, :q4 or :k8v4"
    )


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
    if layer_type in RECURRENT or layer_type in STATELESS:
        return LayerSpec()
    layer_type = attention_kind(layer_type)
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


def with_precision(policy: Policy, precision: str, group: int = DEFAULT_GROUP) -> Policy:
    """The same policy with another storage precision ("" for the model dtype)."""
    return Policy(policy.kind, policy.sink, policy.window, precision, group)


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


def quantized_bytes(n: int, bits: int, group: int, itemsize: int) -> int:
    """`n` values stored as `bits`-bit codes plus a scale and a bias (model dtype) per group."""
    return n * bits // 8 + 2 * (n // group) * itemsize


def policy_slot_bytes(
    policy: Policy, kv_heads: int, head_dim: int, itemsize: int, v_head_dim: int = 0
) -> int:
    """K and V of one position in one layer (batch 1) under the policy's storage precision; `v_head_dim`:
    V's head size where it differs from K's (multi-head latent attention)."""
    dims = (head_dim, v_head_dim or head_dim)
    if (bits := policy.bits) is None:
        return kv_heads * sum(dims) * itemsize
    group = policy.group_for(math.gcd(*dims))
    return sum(kv_heads * quantized_bytes(d, b, group, itemsize) for d, b in zip(dims, bits, strict=True))


def layer_slot_bytes(policy: Policy, geo: Geometry, dtype: str) -> list[int]:
    """K and V bytes of one position per layer (batch 1) under the policy's storage precision; 0 for a
    linear-attention layer, which holds no K/V."""
    slot = policy_slot_bytes(policy, geo.kv_heads, geo.head_dim, ITEMSIZE[dtype], geo.v_head_dim)
    return [0 if t in RECURRENT or t in STATELESS else slot for t in geo.layer_types]


def expected_kv_bytes(
    specs: Sequence[LayerSpec], n: int, max_block: int, slot_bytes: Sequence[int]
) -> list[int]:
    """Per-layer K/V bytes a cache holds after n committed positions: the formula both backends meet."""
    return [s.held_slots(n, max_block) * b for s, b in zip(specs, slot_bytes, strict=True)]
