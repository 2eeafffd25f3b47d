"""Quantized K/V on torch: affine `quantize` / `dequantize` (mlx's format), the dispatch to the C kernels
beside this module (kv_kernels.py, kv_kernels.c) for float32 on a cpu, and `QuantizedKV`, one attention
layer's K/V stored quantized."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.backends.torch import kv_kernels
from engine.backends.torch.kv import GroupTensors
from engine.cache import Forward, buffer_size


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
        fwd = self.group.planned()
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

    def keep_rows(self, index: torch.Tensor) -> None:
        """Keep the batch rows `index` of every buffer (a copy: the others' codes are freed)."""
        self.parts = [[t.index_select(0, index) for t in buf] for buf in self.parts]
        self.kernels = [
            kv_kernels.Buffers.of(*buf, b, self.group_size)
            for buf, b in zip(self.parts, self.bits, strict=False)
        ]

    @property
    def nbytes(self) -> int:
        """Codes, scales and biases of the positions held."""
        slot = sum(t[0, :, 0].numel() * t.element_size() for part in self.parts for t in part)  # one row
        return self.group.held() * slot

    @property
    def allocated_bytes(self) -> int:
        return sum(t.nbytes for part in self.parts for t in part)
