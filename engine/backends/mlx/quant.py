"""Quantized K/V on MLX: `QuantizedKV` (mx.quantize's format), one attention layer's K/V stored quantized."""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from engine.backends.mlx.kv import KV, GroupArrays
from engine.cache import Forward, buffer_size

MLX_GROUPS = (32, 64, 128)  # the group sizes mx.quantize supports


class QuantizedKV(KV):
    """One attention layer's K/V stored with `mx.quantize` (affine codes packed in uint32, scales and
    biases per group: mlx-lm's QuantizedKVCache format) in the same sinks + ring / growing slot layout
    as `KV`. The new block is quantized before it is attended, so step-by-step and block decoding see the
    same K/V; rollback is a trim. The PyTorch backend's `QuantizedKV` stores the same codes, scales and
    biases.

    Attention: with one width for K and V (q8, q4) on a model whose mlx-lm attention is
    `base.scaled_dot_product_attention` (`QUANTIZED_SDPA`), the layer returns the attended slots' (codes,
    scales, biases) and has `bits` / `group_size`, which route mlx-lm to its quantized attention
    (`mx.quantized_matmul` on the codes, nothing dequantized); otherwise (k8v4, other models) it
    returns the slots dequantized (`mx.dequantize`). Both compute with exactly the stored values."""

    def __init__(
        self, arrays: GroupArrays, layer: int, bits: tuple[int, int], group: int, quantized_sdpa: bool
    ) -> None:
        if group not in MLX_GROUPS:
            raise ValueError(
                f"mx.quantize takes groups of {', '.join(map(str, MLX_GROUPS))} values, not {group} "
                "(the group is clamped to the K and V head sizes, which it must divide): use the torch "
                "backend for this model"
            )
        super().__init__(arrays, layer)
        self.kv_bits = bits
        self.kv_group = group
        if quantized_sdpa and bits[0] == bits[1]:  # mlx-lm attends through mx.quantized_matmul
            self.bits, self.group_size = bits[0], group
        self.k: list[mx.array] = []  # codes, scales, biases: each [batch, kv_heads, slots, *]
        self.v: list[mx.array] = []

    def update(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        fwd = self.group.planned()
        plan = fwd.plan
        qk = mx.quantize(keys, group_size=self.kv_group, bits=self.kv_bits[0])
        qv = mx.quantize(values, group_size=self.kv_group, bits=self.kv_bits[1])
        if not self.k or self.k[0].shape[2] < plan.capacity:
            self._grow_q(qk, qv, plan.capacity)
        if fwd.row is None:  # every row at its own slots
            assert self.arrays.slots is not None
            index = self.arrays.slots[:, None, :, None]
            self.k = [mx.put_along_axis(b, index, n, axis=2) for b, n in zip(self.k, qk, strict=True)]
            self.v = [mx.put_along_axis(b, index, n, axis=2) for b, n in zip(self.v, qv, strict=True)]
            self.keys = self.k[0]
            r = slice(None)
        else:
            r = slice(fwd.row, fwd.row + 1)  # the row fed (all of an unbatched cache)
            if plan.concat:
                ko = self._joined(self.k, qk, 0, r, plan.old_view)
                vo = self._joined(self.v, qv, 1, r, plan.old_view)
                if (keep := self.arrays.keep) is not None:
                    qk = tuple(t[:, :, keep] for t in qk)
                    qv = tuple(t[:, :, keep] for t in qv)
                self._write_q(r, qk, qv, fwd)
                return ko, vo
            self._write_q(r, qk, qv, fwd)
        return self._read(self.k, 0, r, plan.view), self._read(self.v, 1, r, plan.view)

    update_and_fetch = update

    def _joined(self, buf: list[mx.array], new: Any, which: int, r: slice, view: int) -> Any:
        """Row r's first `view` slots followed by the new block (a prefill chunk larger than the slack)."""
        if hasattr(self, "bits"):
            return tuple(mx.concatenate((b[r, :, :view], n), axis=2) for b, n in zip(buf, new, strict=True))
        return mx.concatenate((self._read(buf, which, r, view), self._deq(new, which)), axis=2)

    def _deq(self, q: Any, which: int) -> mx.array:
        return mx.dequantize(q[0], q[1], q[2], group_size=self.kv_group, bits=self.kv_bits[which])

    def _read(self, buf: list[mx.array], which: int, r: slice, view: int) -> Any:
        """What attention gets for rows r' first `view` slots: (codes, scales, biases) or dequantized."""
        if hasattr(self, "bits"):
            return tuple(t[r, :, :view] for t in buf)
        if view == 0:  # mx.dequantize cannot reshape an empty array
            _, h, _, w = buf[0].shape
            b = buf[0][r].shape[0]
            return mx.zeros((b, h, 0, w * 32 // self.kv_bits[which]), buf[1].dtype)
        return self._deq([t[r, :, :view] for t in buf], which)

    def _write_q(self, r: slice, qk: Any, qv: Any, fwd: Forward) -> None:
        for buf, new in ((self.k, qk), (self.v, qv)):
            for b, n in zip(buf, new, strict=True):
                if rng := fwd.plan.slot_range:
                    b[r, :, rng[0] : rng[1]] = n
                else:
                    b[r, :, self.arrays.slots] = n

    def _grow_q(self, qk: Any, qv: Any, need: int) -> None:
        have = self.k[0].shape[2] if self.k else 0
        size = buffer_size(have, need, self.group.limit)
        grown: list[list[mx.array]] = []
        for buf, new in ((self.k, qk), (self.v, qv)):
            out = []
            for i, n in enumerate(new):
                _, h, _, d = n.shape
                t = mx.zeros((self.group.rows, h, size, d), n.dtype)  # zeros: slots a short row never wrote
                if buf:
                    t[:, :, :have] = buf[i]
                out.append(t)
            grown.append(out)
        self.k, self.v = grown
        self.keys = self.k[0]  # `empty()` and mlx-lm read `keys`

    def keep_rows(self, index: mx.array) -> None:
        """Keep the batch rows `index` of every buffer (the others' codes are freed)."""
        if self.k:
            self.k, self.v = [t[index] for t in self.k], [t[index] for t in self.v]
            self.keys = self.k[0]

    @property
    def state(self) -> list[mx.array]:
        return [*self.k, *self.v]

    @property
    def nbytes(self) -> int:
        """Codes, scales and biases of the positions held."""
        return self.group.held() * sum(t[0, :, 0].nbytes for t in (*self.k, *self.v))  # held: all rows

    @property
    def allocated_bytes(self) -> int:
        return sum(t.nbytes for t in (*self.k, *self.v))
