"""PyTorch backend: a transformers causal LM plus the policy cache.

Owns the torch side of a session: `KV` (one attention layer's K/V buffers), `PolicyCache` (the
`past_key_values` container: each attention layer calls `update(k, v, layer_idx)` after RoPE, which
hands the layer's `KV` the new K/V to write where its group's `engine.cache.Forward` says and returns
the slots to attend), and `TorchSession._run` (one forward answering a `Step`). The per-query masks
are built once per forward per layer group (engine/cache.py) and handed to the model as a prepared 4-D boolean mask (a dict keyed by layer type for models
with several layer types), which transformers passes through untouched. `position_ids` are explicit,
so every position keeps its original RoPE position.

Linear-attention layers (Qwen3.5, Qwen3-Next gated delta-net) call `get_conv_state` /
`get_recurrent_state` / `update_conv_state` / `update_recurrent_state` / `is_recording_past` on the same
container (as on transformers' `DynamicCache`); `DeltaNetState` holds the layer's state, and rollback is
`engine.backends.base`'s (snapshots + recomputation). transformers picks the kernel by block size: one
token with a state runs the recurrent step (and updates the convolution state in place), a longer block
(a prefill chunk or a verify block) the chunked kernel from the state, exactly as in `generate`.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.backends import kv_kernels
from engine.backends.base import BaseSession, Tokenized
from engine.cache import EMPTY, Forward, Group, buffer_size, visible_mask
from engine.decode import Step
from engine.geometry import LINEAR_ATTENTION, Geometry
from engine.policy import Policy

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def devices() -> list[str]:
    """The torch devices present here."""
    out = ["cpu"]
    if torch.cuda.is_available():
        out += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        out.append("mps")
    return out


def pick_device(device: str = "auto") -> torch.device:
    """`auto` (cuda, else mps, else cpu), `cpu`, `cuda`, `cuda:N` or `mps`; one that is not here fails
    naming those that are."""
    have = devices()
    if device == "auto":
        name = "cuda:0" if "cuda:0" in have else "mps" if "mps" in have else "cpu"
    else:
        name = "cuda:0" if device == "cuda" else device
    if name not in have:
        raise ValueError(f"device {device!r} is not available here; torch devices here: {', '.join(have)}")
    return torch.device(name)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto`: bfloat16 on cuda, float16 on mps, float32 on the cpu; else one of DTYPES."""
    if dtype == "auto":
        return {"cuda": torch.bfloat16, "mps": torch.float16}.get(device.type, torch.float32)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use auto or one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"{device.type} ({platform.processor() or platform.machine()})"


def peak_memory_bytes() -> int | None:
    """Peak accelerator memory allocated by torch in this process (None without an accelerator)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(max(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())))
    if torch.backends.mps.is_available():
        return int(torch.mps.driver_allocated_memory())
    return None


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
        if slots and slots[0] and self.table.shape == self.group.table.shape:
            self.table.scatter_(1, torch.tensor(slots, device=self.device), EMPTY)
        elif slots and slots[0]:
            self.stale = True

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
        fwd = self.group.forward
        assert fwd is not None, "the cache was used outside a planned forward"
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

    @property
    def nbytes(self) -> int:
        if self.k is None or self.v is None:
            return 0
        slot = (self.k[0, :, 0].numel() + self.v[0, :, 0].numel()) * self.k.element_size()
        return self.group.held() * slot  # held: summed over the rows

    @property
    def allocated_bytes(self) -> int:
        return 0 if self.k is None or self.v is None else self.k.nbytes + self.v.nbytes


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


def quantize(x: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Affine quantization of the last axis in groups of `group` values, as `mx.quantize` does it: codes
    (uint8; 4-bit codes packed two per byte, low nibble first: byte for byte mlx's packed uint32 words
    on a little-endian host) and per-group scales and biases in x's dtype; x ~ scale * code + bias."""
    codes, scales, biases = _quantize(x, bits, group)
    return codes.flatten(-2), scales.squeeze(-1), biases.squeeze(-1)


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int, group: int
) -> torch.Tensor:
    """The values `quantize` stored: scale * code + bias, in the scales' dtype."""
    per_group = group // 2 if bits == 4 else group
    grouped = codes.unflatten(-1, (codes.shape[-1] // per_group, per_group))
    return _dequantize(grouped, scales[..., None], biases[..., None], bits).flatten(-2)


def _quantize(
    x: torch.Tensor, bits: int, group: int, out: Sequence[torch.Tensor] | None = None
) -> Sequence[torch.Tensor]:
    """`quantize` in the grouped layout the cache stores (codes [..., groups, group or group / 2], scales
    and biases [..., groups, 1]); with `out` (three such tensors, slices of the buffers) the results are
    written there (a decode step writes its token without an intermediate copy). A float32 block on a cpu
    goes through the C kernel where it is built (engine/backends/kv_kernels.py): the same bytes."""
    if x.dtype == torch.float32 and x.device.type == "cpu" and kv_kernels.library() is not None:
        if out is None:
            per = group // 2 if bits == 4 else group
            lead, groups = x.shape[:-1], x.shape[-1] // group
            out = [
                torch.empty((*lead, groups, per), dtype=torch.uint8),
                torch.empty((*lead, groups, 1), dtype=torch.float32),
                torch.empty((*lead, groups, 1), dtype=torch.float32),
            ]
        if kv_kernels.quantize_into(x, bits, group, *out):
            return out
    w = x.unflatten(-1, (x.shape[-1] // group, group))
    if w.dtype != torch.float32:
        w = w.float()
    n_bins = (1 << bits) - 1
    w_min, w_max = torch.aminmax(w, dim=-1, keepdim=True)
    neg = w_min.abs() > w_max.abs()  # anchor the larger-magnitude edge exactly on a code
    scales = ((w_max - w_min) / n_bins).clamp_min_(1e-7)
    scales = torch.where(neg, scales, scales.neg())
    edge = torch.where(neg, w_min, w_max)
    q0 = (edge / scales).round_()
    kept = q0 != 0  # a group of zeros keeps its scale and a zero bias
    direct = out is not None and out[1].dtype == torch.float32  # else the codes need the float32 values
    if direct:
        assert out is not None
        scales = torch.where(kept, edge / q0, scales, out=out[1])
        biases = torch.where(kept, edge, _zero(edge), out=out[2])
    else:
        scales = torch.where(kept, edge / q0, scales)
        biases = torch.where(kept, edge, 0.0)
    codes = (w - biases).div_(scales).round_().clamp_(0, n_bins)
    if out is not None and bits == 8:
        out[0].copy_(codes)  # copy_ casts the integral float codes to the uint8 buffer: one op
    else:
        codes = codes.to(torch.uint8)
        if bits == 4:
            codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
        if out is not None:
            out[0].copy_(codes)
    if out is not None:
        if not direct:
            out[1].copy_(scales)
            out[2].copy_(biases)
        return out
    if x.dtype != torch.float32:
        scales, biases = scales.to(x.dtype), biases.to(x.dtype)
    return codes, scales, biases


_ZEROS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _zero(like: torch.Tensor) -> torch.Tensor:
    """A 0-d zero on like's device and dtype (`torch.where(..., out=)` takes no Python scalar), made once."""
    key = (like.device, like.dtype)
    if (z := _ZEROS.get(key)) is None:
        z = _ZEROS[key] = torch.zeros((), device=like.device, dtype=like.dtype)
    return z


def _dequantize(codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int) -> torch.Tensor:
    """scale * code + bias in the grouped layout ([..., groups, group]), in the scales' dtype (float32 on a
    cpu: the C kernel where it is built, one pass instead of three)."""
    if (
        scales.dtype == torch.float32
        and (out := kv_kernels.dequantize(codes, scales, biases, bits)) is not None
    ):
        return out
    if bits == 4:
        codes = torch.stack((codes & 15, codes >> 4), dim=-1).flatten(-2)
    return codes.to(scales.dtype).mul_(scales).add_(biases)


class QuantizedKV:
    """One attention layer's K/V stored affine-quantized (`quantize`: codes, scales and biases per slot,
    in the same sinks + ring / growing slot layout as `KV`). Attention dequantizes the attended slots
    each forward: simple, and exact with respect to the stored values (the new block is quantized
    before it is attended, so step-by-step and block decoding see the same K/V); rollback is a trim.

    With one width for K and V of one head dimension (q8, q4), K and V are stored side by side, [K | V]
    along the last axis of one set of buffers: a step quantizes, writes and dequantizes once per layer
    instead of twice (the groups never straddle K and V, so the values are the same as apart). kXvY keeps
    one set of buffers for K and one for V. The buffers keep the groups as an axis ([batch, heads, slots,
    groups, group] codes, [..., groups, 1] scales and biases), so reading and writing need no reshapes;
    a decode step (one contiguous slot range) quantizes straight into them."""

    def __init__(self, tensors: GroupTensors, bits: tuple[int, int], group: int) -> None:
        self.group = tensors.group
        self.tensors = tensors
        self.bits = bits
        self.group_size = group
        self.parts: list[list[torch.Tensor]] = []  # per part: codes, scales, biases [rows, heads, slots, ...]
        self.joint = False  # one part [K | V] (else two: K, V)
        self.key_dim = 0
        self.kernels: list[kv_kernels.Buffers | None] = []  # per part, where the C kernels address it

    def update(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fwd = self.group.forward
        assert fwd is not None, "the cache was used outside a planned forward"
        plan = fwd.plan
        if not self.parts:
            self.joint = self.bits[0] == self.bits[1] and key.shape[-1] == value.shape[-1]
            self.key_dim = key.shape[-1]
        blocks = [torch.cat((key, value), dim=-1)] if self.joint else [key, value]
        parts = self.parts
        if parts and self.group.rows > 1 and fwd.row is not None:  # one row's prefill
            parts = [[t.narrow(0, fwd.row, 1) for t in buf] for buf in parts]
        rng = plan.slot_range
        if (
            parts
            and fwd.row is not None
            and not plan.concat
            and rng
            and parts[0][0].shape[2] >= plan.capacity
        ):
            if all(self.kernels):  # a decode step on a cpu: write and read through the C kernels
                out = [
                    k.step(x, fwd.row, rng[0], plan.view) for k, x in zip(self.kernels, blocks, strict=True)
                ]
                if all(o is not None for o in out):
                    return self._split([o.flatten(-2) for o in out if o is not None])
            for x, b, buf in zip(blocks, self.bits, parts, strict=False):
                _quantize(x, b, self.group_size, [t.narrow(2, rng[0], rng[1] - rng[0]) for t in buf])
        else:
            new = [_quantize(x, b, self.group_size) for x, b in zip(blocks, self.bits, strict=False)]
            if not self.parts or self.parts[0][0].shape[2] < plan.capacity:
                self._grow(new, plan.capacity)
                parts = self.parts
                if self.group.rows > 1 and fwd.row is not None:
                    parts = [[t.narrow(0, fwd.row, 1) for t in buf] for buf in parts]
            if plan.concat:
                out = [
                    torch.cat((self._read(buf, b, plan.old_view), _dequantize(*n, b).flatten(-2)), dim=2)
                    for buf, n, b in zip(parts, new, self.bits, strict=False)
                ]
                if (keep := self.tensors.keep) is not None:
                    new = [[t.index_select(2, keep) for t in n] for n in new]
                self._write(parts, new, fwd)
                return self._split(out)
            self._write(parts, new, fwd)
        return self._split([self._read(buf, b, plan.view) for buf, b in zip(parts, self.bits, strict=False)])

    def _split(self, out: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if self.joint:
            d = self.key_dim
            return out[0].narrow(-1, 0, d), out[0].narrow(-1, d, out[0].shape[-1] - d)
        return out[0], out[1]

    @staticmethod
    def _read(buf: list[torch.Tensor], bits: int, view: int) -> torch.Tensor:
        return _dequantize(*(t.narrow(2, 0, view) for t in buf), bits).flatten(-2)

    def _write(
        self, parts: list[list[torch.Tensor]], new: Sequence[Sequence[torch.Tensor]], fwd: Forward
    ) -> None:
        """Write the quantized block: at a slot range, at slots, or (batched) every row at its own slots."""
        rng = fwd.plan.slot_range
        for buf, n in zip(parts, new, strict=True):
            for b, t in zip(buf, n, strict=True):
                if fwd.row is None:  # [rows * heads * slots, ...] rows of the flat buffer
                    index = self.tensors.flat_index(b.shape[1], b.shape[2])
                    b.view(-1, *b.shape[3:]).index_copy_(0, index, t.reshape(-1, *t.shape[3:]))
                elif rng:
                    b.narrow(2, rng[0], rng[1] - rng[0]).copy_(t)
                else:
                    assert self.tensors.slots is not None
                    b.index_copy_(2, self.tensors.slots, t)

    def _grow(self, new: Sequence[Sequence[torch.Tensor]], need: int) -> None:
        have = self.parts[0][0].shape[2] if self.parts else 0
        size = buffer_size(have, need, self.group.limit)
        grown: list[list[torch.Tensor]] = []
        for i, n in enumerate(new):
            out = []
            for j, t in enumerate(n):
                # zeros: a batch row shorter than the view attends (masked) slots it never wrote
                buf = t.new_zeros((self.group.rows, t.shape[1], size, *t.shape[3:]))
                if self.parts:
                    buf[:, :, :have] = self.parts[i][j]
                out.append(buf)
            grown.append(out)
        self.parts = grown
        # one part [K | V] has the one width; two parts K and V have theirs
        self.kernels = [
            kv_kernels.Buffers.of(*buf, b, self.group_size) for buf, b in zip(grown, self.bits, strict=False)
        ]

    def trim(self, n: int) -> None:
        """Nothing to drop: the group marks the trimmed slots EMPTY and the next writes reuse them."""

    @property
    def nbytes(self) -> int:
        """Codes, scales and biases of the positions held."""
        slot = sum(t[0, :, 0].numel() * t.element_size() for part in self.parts for t in part)  # one row
        return self.group.held() * slot

    @property
    def allocated_bytes(self) -> int:
        return sum(t.nbytes for part in self.parts for t in part)


class PolicyCache:
    """The `past_key_values` object a transformers model is called with: one state per layer."""

    is_compileable = False

    def __init__(self, session: TorchSession, states: list[Any]) -> None:
        self.session = session
        self.states = states

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.session.position

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.states[layer_idx].update(key, value)

    # Linear-attention layers (the names transformers' gated delta-net layers call; state_idx is always 0).
    def get_conv_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self.states[layer_idx].conv

    def get_recurrent_state(self, layer_idx: int, state_idx: int = 0) -> torch.Tensor | None:
        return self.states[layer_idx].recurrent

    def is_recording_past(self, layer_idx: int) -> bool:
        return False

    def has_previous_state(self, layer_idx: int | None = None, state_idx: int | None = None) -> bool:
        return self.session.position > 0

    def update_conv_state(
        self, x: torch.Tensor, layer_idx: int, state_idx: int = 0, **_: Any
    ) -> torch.Tensor:
        return self.states[layer_idx].update_conv(x)

    def update_recurrent_state(
        self, state: torch.Tensor, layer_idx: int, state_idx: int = 0, **_: Any
    ) -> torch.Tensor:
        self.states[layer_idx].recurrent = state
        return state


class TorchModel(Tokenized):
    """A transformers causal LM with its tokenizer, on one device; makes policy-cached sessions.

    `compile`: run the model's forwards through `torch.compile` (True: inductor, or a torch.compile
    backend name) with dynamic shapes (the attended view grows; the cache's bookkeeping runs eagerly
    between graphs). Outputs stay exact in float32 (tests/engine/test_batch.py, with dynamo's `eager`
    backend: on a cpu inductor compiles for minutes, for no gain at these sizes)."""

    backend = "torch"

    def __init__(
        self, model: Any, tokenizer: Any = None, path: Path | None = None, compile: bool | str = False
    ) -> None:
        self.model = model.eval()
        self.device: torch.device = next(model.parameters()).device
        self.compiled = compile
        backend = "inductor" if compile is True else compile
        self.run = torch.compile(self.model, dynamic=True, backend=backend) if backend else self.model
        self.tokenizer = tokenizer
        self.path = path
        config = model.config
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        eos = model.generation_config.eos_token_id if model.generation_config else None
        self.geometry = Geometry.from_config({**text.to_dict(), "dtype": str(config.dtype)}, eos)
        self.eos_ids = self.geometry.eos_ids
        impl = config._attn_implementation
        if impl not in ("sdpa", "eager"):
            raise ValueError(
                f"attention implementation {impl!r} is not supported: load the model with sdpa or eager"
            )
        self.additive_masks = impl == "eager"  # eager adds the mask to the scores; sdpa takes booleans
        self.dtype: torch.dtype = next(model.parameters()).dtype

    @property
    def device_name(self) -> str:
        return device_name(self.device)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def peak_memory_bytes(self) -> int | None:
        return peak_memory_bytes()

    def session(
        self, policy: Policy, max_block: int = 1, prefill_chunk: int = 512, rows: int = 1
    ) -> TorchSession:
        return TorchSession(self, policy, max_block, prefill_chunk, rows)


class TorchSession(BaseSession):
    """One policy cache on a TorchModel: the `engine.decode.Session` interface. Every tensor it makes
    (K/V buffers, masks, slot and position tensors) lives on the model's device."""

    def __init__(
        self, model: TorchModel, policy: Policy, max_block: int = 1, prefill_chunk: int = 512, rows: int = 1
    ) -> None:
        super().__init__(model.geometry, policy, max_block, prefill_chunk, rows)
        self.owner = model
        self.device = model.device
        self.tensors = [GroupTensors(g, model.device) for g in self.groups]
        tensors_of = {id(t.group): t for t in self.tensors}
        kernel = model.geometry.linear_conv_kernel
        bits = policy.bits
        group = policy.group_for(model.geometry.head_dim) if bits else 0
        self.states = [
            DeltaNetState(kernel)
            if g is None
            else KV(tensors_of[id(g)])
            if bits is None
            else QuantizedKV(tensors_of[id(g)], bits, group)
            for g in self.group_of
        ]
        self.cache = PolicyCache(self, self.states)
        self._ones = torch.ones((1, 1, 1, 0), dtype=torch.bool, device=self.device)

    @torch.inference_mode()
    def trim(self, n: int) -> None:
        # The slots the groups mark EMPTY (bounded layouts), to mark on the device copies as well.
        dropped = [
            [[lay.slot(p) for p in range(lay.n - n, lay.n)] for lay in g.layouts]
            if g.limit is not None
            else None
            for g in self.groups
        ]
        super().trim(n)
        for t, slots in zip(self.tensors, dropped, strict=True):
            t.drop(slots)

    def _call(self, ids: torch.Tensor, forwards: list[Forward], last_only: bool, hidden: bool) -> Any:
        by_type: dict[str, torch.Tensor | None] = {}
        for g, t, fwd in zip(self.groups, self.tensors, forwards, strict=True):
            t.load(fwd)
            if fwd.plan.sinks_hidden:
                by_type[g.layer_type] = t.sinks_hidden_mask(fwd, self._mask)
                continue
            mask = t.mask(fwd)
            by_type[g.layer_type] = None if mask is None else self._mask(mask)
        if self.linear:
            by_type[LINEAR_ATTENTION] = None  # no padding: the linear layers take no mask
        if len(by_type) == 1:
            attention_mask: Any = next(iter(by_type.values()))
            if attention_mask is None:  # a model without dict masks needs some prepared 4-D mask
                attention_mask = self._mask(self._all_visible(forwards[0].plan.view))
        else:
            attention_mask = by_type
        queries = self.tensors[0].queries
        return self.owner.run(
            input_ids=ids,
            position_ids=queries if queries.dim() == 2 else queries[None],
            past_key_values=self.cache,
            attention_mask=attention_mask,
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
            output_hidden_states=hidden,
        )

    @torch.inference_mode()
    def _run(
        self, ids: list[int], forwards: list[Forward], last_only: bool, logits: bool, hidden: tuple[int, ...]
    ) -> Step:
        out = self._call(self._ids([ids]), forwards, last_only, bool(hidden))
        rows = out.logits[0]
        states = {i: out.hidden_states[i][0, -rows.shape[0] :] for i in hidden}
        return Step(_greedy(rows), rows if logits else None, states)

    @torch.inference_mode()
    def _run_rows(self, ids: list[list[int]], forwards: list[Forward]) -> list[list[int]]:
        return _greedy(self._call(self._ids(ids), forwards, False, False).logits)

    def _ids(self, ids: list[list[int]]) -> torch.Tensor:
        return torch.from_numpy(np.array(ids, dtype=np.int64)).to(self.device, non_blocking=True)

    def _mask(self, mask: torch.Tensor) -> torch.Tensor:
        return _additive(mask, self.owner.dtype) if self.owner.additive_masks else mask

    def _all_visible(self, n: int) -> torch.Tensor:
        """A prepared all-True mask for one query over n slots (models without a dict mask need a 4-D
        mask; only an unbatched direct forward has no mask of its own)."""
        if self._ones.shape[-1] < n:
            self._ones = torch.ones(
                (1, 1, 1, max(n, 2 * self._ones.shape[-1], 1024)), dtype=torch.bool, device=self.device
            )
        return self._ones[..., :n]


def _greedy(logits: torch.Tensor) -> Any:
    """The argmax of the last axis as host ints: the one host copy of a forward. On a cpu numpy's argmax
    of the same memory (first maximum, as torch's) costs a fraction of torch's on these small rows."""
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64):
        return logits.numpy().argmax(-1).tolist()
    return logits.argmax(-1).tolist()


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
        ~mask, torch.finfo(dtype).min
    )


def load_torch(
    path: Path, dtype: str = "auto", device: str = "auto", compile: bool | str = False
) -> TorchModel:
    """Load a transformers model on `device` (checked before the weights load) in `dtype`."""
    dev = pick_device(device)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=pick_dtype(dtype, dev)).to(dev)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return TorchModel(model, tokenizer, path, compile)
