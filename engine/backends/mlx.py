"""MLX backend: an mlx-lm model plus the policy cache (the same slot layout as the PyTorch backend).

mlx-lm models take a list of per-layer cache objects with a tiny interface, and this backend plugs its
own in without forking any model code:

- `offset`: the absolute position of the forward's first token; every attention layer passes it to
  RoPE, so each position keeps its original rotary position whatever slot it lands in.
- `update_and_fetch(k, v)`: writes the new K/V (after RoPE) into the layer's buffer following the
  `engine.cache.Forward` of this forward (sinks + ring, or a growing buffer) and returns the slots to
  attend (or old slots + the new block for a prefill chunk larger than the ring's slack).
- `make_mask(N, window_size=...)`: mlx-lm's `create_attention_mask` asks the cache for the mask; ours
  returns a boolean [N, slots] mask built from the absolute position each slot holds: causal, the
  policy's sink + window, and the model's native sliding window (from the transformers config, the
  same `layer_types` / `sliding_window` the PyTorch backend reads, so e.g. a Mistral without
  `layer_types` slides on MLX too). Models compute one mask per layer type from a representative
  layer's cache (Gemma-3: layer 0 for the sliding layers, layer `sliding_window_pattern - 1` for the
  global ones; Llama/Qwen: layer 0) and share it; all layers of a type share one `Layout`, so that
  mask is right for each of them. Two checks make a model whose mlx-lm code groups its layers
  differently fail loudly instead of attending to the wrong positions: a window the model asks for
  must be that layer's native window, and every layer type must have been asked for its own mask.

Owns the mlx side of a session: `KV` (one attention layer's K/V buffers and mlx-lm cache object),
`GroupArrays` (a group's `engine.cache.Forward` as mlx arrays and mask), `hidden_states` (recording the
layers' hidden states, which mlx-lm models do not return) and `MLXSession._run`. Each group plans its
forward once before the model runs (engine/backends/base.py), as in the PyTorch backend. Nothing here
imports torch.

Linear-attention layers (mlx-lm's qwen3_5 / qwen3_next gated delta-net) use an `ArraysCache(size=2)`-like
object: `DeltaNetState` ([0] convolution state, [1] recurrent state, `lengths`, `advance`, `make_mask`);
rollback is `engine.backends.base`'s (snapshots + recomputation). mlx-lm builds those models' layer
kinds from `full_attention_interval`, which `mlx_config` derives from `layer_types`.
"""

from __future__ import annotations

import functools
import json
import platform
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.utils import load_config, load_model
from transformers import AutoConfig, AutoTokenizer

from engine.backends.base import BaseSession, Tokenized
from engine.cache import EMPTY, Forward, Group, buffer_size, visible_mask
from engine.decode import Step
from engine.geometry import FULL_ATTENTION, LINEAR_ATTENTION, SLIDING_ATTENTION, Geometry
from engine.policy import Policy

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
# Model types whose mlx-lm `Model.__call__` is `head(model.model(...))`: prefill computes the head for
# the last position only. Others get the full logits (correct, slower for large vocabularies).
PLAIN_HEAD = frozenset({"gemma3_text", "qwen3", "qwen2", "llama", "mistral"})
# Model types whose mlx-lm attention calls `base.scaled_dot_product_attention(..., cache=cache)` on what
# `update_and_fetch` returned: a quantized cache with `bits` / `group_size` is attended quantized there.
QUANTIZED_SDPA = frozenset({"gemma3_text", "qwen3", "qwen2", "llama", "mistral", "qwen3_5", "qwen3_next"})


def pick_device(device: str = "auto") -> mx.Device:
    """`auto` (MLX's default device: the Metal GPU on Apple Silicon), `gpu` or `cpu`; one that is not
    here fails naming those that are."""
    have = {"cpu": mx.cpu} | ({"gpu": mx.gpu} if mx.is_available(mx.gpu) else {})
    if device == "auto":
        return mx.default_device()
    if device not in have:
        raise ValueError(f"device {device!r} is not available here; mlx devices here: {', '.join(have)}")
    return mx.Device(have[device])


def pick_dtype(dtype: str, device: mx.Device) -> mx.Dtype:
    """`auto`: float16 on the Metal GPU, float32 on the cpu; else one of DTYPES."""
    if dtype == "auto":
        return mx.float16 if device.type == mx.gpu else mx.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use auto or one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


class GroupArrays:
    """One group's current `Forward` as mlx arrays and the mask mlx-lm asks for, shared by its layers.
    The mask is built from a device copy of the group's slot -> position table, to which a decode step
    writes only its new positions and a trim only the slots it empties (the whole table is copied after
    a prefill chunk that concatenates, or a growth)."""

    def __init__(self, group: Group, native_window: int | None) -> None:
        self.group = group
        self.native_window = native_window if group.layer_type == SLIDING_ATTENTION else None
        self.mask: mx.array | str | None = None
        self.asked = False  # make_mask was called for this forward
        self.slots: mx.array | None = None  # written slots, when not a contiguous range
        self.keep: mx.array | None = None  # concat: rows of the block that are written
        self.queries = mx.zeros((0,), dtype=mx.int64)  # positions fed ([rows, m] when batched)
        self.table = mx.full((group.rows, 0), EMPTY, dtype=mx.int64)
        self.stale = False  # the host table changed in a way not mirrored here

    def drop(self, slots: list[list[int]] | None) -> None:
        """Mark the slots of a rollback ([rows, n]) EMPTY, as the group did in the host table."""
        if slots and slots[0] and tuple(self.table.shape) == self.group.table.shape:
            self.table = mx.put_along_axis(self.table, mx.array(slots), mx.array(EMPTY, mx.int64), axis=1)
        elif slots and slots[0]:
            self.stale = True

    def load(self, fwd: Forward) -> None:
        self.asked = False
        plan, host = fwd.plan, self.group.table
        self.slots = None if fwd.slots is None else mx.array(fwd.slots, dtype=mx.int32)
        self.keep = None if fwd.keep is None else mx.array(fwd.keep, dtype=mx.int32)
        if fwd.row is None:
            self.queries = mx.array(fwd.queries)
        else:
            self.queries = mx.arange(plan.start, plan.start + plan.m, dtype=mx.int64)
        if self.stale or plan.concat or tuple(self.table.shape) != host.shape:
            self.table, self.stale = mx.array(host), False
        elif fwd.row is None:
            assert self.slots is not None
            self.table = mx.put_along_axis(self.table, self.slots, self.queries, axis=1)
        elif rng := plan.slot_range:
            self.table[fwd.row, rng[0] : rng[1]] = self.queries
        else:
            self.table[fwd.row, self.slots] = self.queries
        if fwd.causal:
            self.mask = "causal"  # slots are positions 0..end-1: mlx's bottom-right aligned causal mask
        elif not plan.mask:
            self.mask = None
        elif plan.concat:
            self.mask = visible_mask(fwd.spec, self.queries, mx.array(fwd.keys))
        elif fwd.row is None:  # [rows, 1, m, view]
            self.mask = visible_mask(fwd.spec, self.queries, self.table[:, : plan.view])[:, None]
        else:
            self.mask = visible_mask(fwd.spec, self.queries, self.table[fwd.row, : plan.view])


class KV:
    """One attention layer's K/V buffers, and the per-layer cache object an mlx-lm model is called with
    (see the module docstring): written where its group's `Forward` says."""

    def __init__(self, arrays: GroupArrays, layer: int) -> None:
        self.group = arrays.group
        self.arrays = arrays
        self.layer = layer
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    @property
    def offset(self) -> int | mx.array:
        """RoPE offset: the first position fed (per row, as an array, in a batched forward)."""
        fwd = self.group.forward
        if fwd is not None and fwd.row is None:
            return self.arrays.queries[:, 0]
        return 0 if fwd is None else fwd.start

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> Any:
        a, g = self.arrays, self.group
        if window_size is not None and window_size != a.native_window:
            raise ValueError(
                f"mlx-lm asked layer {self.layer} ({g.layer_type}, sliding_window={a.native_window}) for a "
                f"mask with window_size={window_size}: the model's mlx-lm code and its config's layer_types "
                "disagree; this model is not supported by the mlx backend"
            )
        fwd = g.forward
        assert fwd is not None and fwd.plan.m == n, "make_mask outside a planned forward"
        a.asked = True
        if return_array and isinstance(a.mask, str):
            return mx.array(visible_mask(g.spec, fwd.queries, np.arange(fwd.start + n)))
        return a.mask

    def update(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        fwd = self.group.forward
        assert fwd is not None, "the cache was used outside a planned forward"
        plan = fwd.plan
        if self.keys is None or self.values is None or self.keys.shape[2] < plan.capacity:
            self._grow(keys, values, plan.capacity)
        assert self.keys is not None and self.values is not None
        if fwd.row is None:  # every row at its own slots
            assert self.arrays.slots is not None
            index = self.arrays.slots[:, None, :, None]
            self.keys = mx.put_along_axis(self.keys, index, keys, axis=2)
            self.values = mx.put_along_axis(self.values, index, values, axis=2)
            return self.keys[:, :, : plan.view], self.values[:, :, : plan.view]
        r = slice(fwd.row, fwd.row + 1)  # the row fed (all of an unbatched cache)
        if plan.concat:
            ko = mx.concatenate((self.keys[r, :, : plan.old_view], keys), axis=2)
            vo = mx.concatenate((self.values[r, :, : plan.old_view], values), axis=2)
            if (keep := self.arrays.keep) is not None:
                keys, values = keys[:, :, keep], values[:, :, keep]
            self._write(r, keys, values, fwd)
            return ko, vo
        self._write(r, keys, values, fwd)
        return self.keys[r, :, : plan.view], self.values[r, :, : plan.view]

    update_and_fetch = update  # the name mlx-lm models call

    def _write(self, r: slice, keys: mx.array, values: mx.array, fwd: Forward) -> None:
        assert self.keys is not None and self.values is not None
        if rng := fwd.plan.slot_range:
            self.keys[r, :, rng[0] : rng[1]] = keys
            self.values[r, :, rng[0] : rng[1]] = values
        else:
            self.keys[r, :, self.arrays.slots] = keys
            self.values[r, :, self.arrays.slots] = values

    def _grow(self, keys: mx.array, values: mx.array, need: int) -> None:
        have = 0 if self.keys is None else self.keys.shape[2]
        size = buffer_size(have, need, self.group.limit)
        _, h, _, d = keys.shape
        kb = mx.zeros((self.group.rows, h, size, d), keys.dtype)
        vb = mx.zeros((self.group.rows, h, size, values.shape[3]), values.dtype)
        if self.keys is not None and self.values is not None:
            kb[:, :, :have] = self.keys
            vb[:, :, :have] = self.values
        self.keys, self.values = kb, vb

    def trim(self, n: int) -> None:
        """Nothing to drop: the group marks the trimmed slots EMPTY and the next writes reuse them."""

    @property
    def state(self) -> list[mx.array]:
        return [] if self.keys is None or self.values is None else [self.keys, self.values]

    def is_trimmable(self) -> bool:
        return False  # rollback goes through MLXSession.trim, which keeps every layer in step

    def empty(self) -> bool:
        return self.keys is None

    @property
    def nbytes(self) -> int:
        """K/V bytes of the positions held."""
        if self.keys is None or self.values is None:
            return 0
        _, h, _, d = self.keys.shape
        return self.group.held() * h * (d + self.values.shape[3]) * self.keys.itemsize  # held: all rows

    @property
    def allocated_bytes(self) -> int:
        return 0 if self.keys is None or self.values is None else self.keys.nbytes + self.values.nbytes


class DeltaNetState:
    """One linear-attention layer's state as mlx-lm's gated delta-net reads it (`ArraysCache(size=2)`):
    [0] the last kernel - 1 convolution inputs [batch, kernel - 1, channels], [1] the recurrent state
    [batch, heads, v_dim, k_dim]. mlx arrays are immutable, so a snapshot is a pair of references."""

    lengths = None  # no padded batches
    nbytes = 0
    allocated_bytes = 0

    def __init__(self) -> None:
        self.cache: list[mx.array | None] = [None, None]

    def __getitem__(self, i: int) -> mx.array | None:
        return self.cache[i]

    def __setitem__(self, i: int, value: mx.array) -> None:
        self.cache[i] = value

    def advance(self, n: int) -> None:
        """Nothing to count: the session owns positions."""

    def make_mask(self, n: int, **_: Any) -> None:
        return None  # no padding

    @property
    def state(self) -> list[mx.array]:
        return [a for a in self.cache if a is not None]

    def empty(self) -> bool:
        return self.cache[0] is None

    def is_trimmable(self) -> bool:
        return False  # rollback goes through MLXSession.trim

    def snapshot(self) -> list[mx.array | None]:
        return list(self.cache)

    def restore(self, snapshot: list[mx.array | None]) -> None:
        self.cache = list(snapshot)

    def trim(self, n: int) -> None:
        """Nothing here: the session restores a snapshot and feeds the kept tokens again."""

    @property
    def state_bytes(self) -> int:
        return sum(a.nbytes for a in self.state)


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
                "(the group is clamped to head_dim): use the torch backend for this model"
            )
        super().__init__(arrays, layer)
        self.kv_bits = bits
        self.kv_group = group
        if quantized_sdpa and bits[0] == bits[1]:  # mlx-lm attends through mx.quantized_matmul
            self.bits, self.group_size = bits[0], group
        self.k: list[mx.array] = []  # codes, scales, biases: each [batch, kv_heads, slots, *]
        self.v: list[mx.array] = []

    def update(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        fwd = self.group.forward
        assert fwd is not None, "the cache was used outside a planned forward"
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


class MLXModel(Tokenized):
    """An mlx-lm causal LM with its tokenizer, run on one device; makes policy-cached sessions."""

    backend = "mlx"

    def __init__(
        self, model: nn.Module, config: dict[str, Any], tokenizer: Any = None, path: Path | None = None
    ):
        """`config`: the config.json keys; `layer_types` and `sliding_window` as transformers reads them
        (`load_mlx` takes them from `AutoConfig`; without `layer_types` every layer slides when there
        is a `sliding_window`, as in the PyTorch backend)."""
        self.model = model
        self.config = config
        self.tokenizer = tokenizer
        self.path = path
        self.model_type = str(config.get("model_type", ""))
        n_layers = len(model.layers)
        self.geometry = Geometry.from_config({**config, "num_hidden_layers": n_layers})
        self.eos_ids = self.geometry.eos_ids
        _check_layer_types(model, self.layer_types)

    @property
    def dtype(self) -> mx.Dtype:
        return self.model.model.embed_tokens.weight.dtype if hasattr(self.model, "model") else mx.float32

    device: mx.Device = mx.default_device()  # where the forwards run (load_mlx sets it)

    @property
    def device_name(self) -> str:
        info = mx.device_info() if self.device.type == mx.gpu else {}
        name = info.get("device_name") or platform.processor() or platform.machine()
        return f"{'gpu' if self.device.type == mx.gpu else 'cpu'} ({name})"

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("mlx.core.")

    def peak_memory_bytes(self) -> int | None:
        """MLX's peak memory (the Metal GPU's; None on the cpu)."""
        return int(mx.get_peak_memory()) if self.device.type == mx.gpu else None

    def session(
        self, policy: Policy, max_block: int = 1, prefill_chunk: int = 512, rows: int = 1
    ) -> MLXSession:
        return MLXSession(self, policy, max_block, prefill_chunk, rows)

    def logits(self, ids: mx.array, cache: list[Any] | None = None, keep: int | None = None) -> mx.array:
        """Logits [1, keep or m, vocab] of one forward of `ids` [1, m] (keep: only the last rows).

        cache=None is the model's own cache-free forward (its native sliding windows included)."""
        if keep is not None and self.model_type in PLAIN_HEAD and hasattr(self.model, "model"):
            h = self.model.model(ids, cache=cache)[:, -keep:]
            if "lm_head" in self.model:
                return self.model.lm_head(h)
            return self.model.model.embed_tokens.as_linear(h)
        out = self.model(ids, cache=cache)
        return out if keep is None else out[:, -keep:]


_RECORDING: dict[int, tuple[dict[int, mx.array], int, bool]] = {}  # id(module) -> (into, index, input?)


@functools.cache
def _recording(cls: type) -> type:
    """A subclass of an mlx-lm layer (or norm) class that records its input (or output) while it runs."""

    def __call__(self: Any, x: mx.array, *args: Any, **kwargs: Any) -> Any:
        into, index, on_input = _RECORDING[id(self)]
        if on_input:
            into[index] = x
        y = cls.__call__(self, x, *args, **kwargs)
        if not on_input:
            into[index] = y
        return y

    return type(f"Recording{cls.__name__}", (cls,), {"__call__": __call__})


@contextmanager
def hidden_states(model: nn.Module, wanted: tuple[int, ...]) -> Iterator[dict[int, mx.array]]:
    """Hidden states of the forwards run inside, as transformers' output_hidden_states numbers them:
    i < n_layers is the input of layer i (0: the embeddings as the layers see them), n_layers the final
    norm's output. mlx-lm models expose none, so the layers' classes are swapped for recording ones."""
    into: dict[int, mx.array] = {}
    inner = getattr(model, "model", None) or getattr(getattr(model, "language_model", None), "model", None)
    layers, norm = getattr(inner, "layers", None), getattr(inner, "norm", None)
    if wanted and (layers is None or norm is None):
        raise NotImplementedError(
            f"the mlx backend cannot return hidden states of {type(model).__module__}: its mlx-lm code has "
            "no model.layers and model.norm to record"
        )
    mods = [(m, i, True) for i, m in enumerate(layers or []) if i in wanted]
    if norm is not None and len(layers or []) in wanted:
        mods.append((norm, len(layers), False))
    try:
        for mod, index, on_input in mods:
            _RECORDING[id(mod)] = (into, index, on_input)
            mod.__class__ = _recording(type(mod))
        yield into
    finally:
        for mod, _, _ in mods:
            mod.__class__ = mod.__class__.__bases__[0]
            _RECORDING.pop(id(mod), None)


def _check_layer_types(model: nn.Module, layer_types: list[str]) -> None:
    """Where the mlx-lm model says which layers slide (Gemma-3: `is_sliding`), it must match the config."""
    for i, layer in enumerate(model.layers):
        attn = getattr(layer, "self_attn", None)
        sliding = getattr(attn, "is_sliding", None)
        if sliding is not None and bool(sliding) != (layer_types[i] == SLIDING_ATTENTION):
            raise ValueError(
                f"layer {i} is {layer_types[i]} in config.json but mlx-lm built it "
                f"{'sliding' if sliding else 'global'}: check sliding_window_pattern in config.json"
            )
        linear = getattr(layer, "is_linear", layer_types[i] == LINEAR_ATTENTION)
        if bool(linear) != (layer_types[i] == LINEAR_ATTENTION):
            raise ValueError(
                f"layer {i} is {layer_types[i]} in config.json but mlx-lm built it "
                f"{'linear' if linear else 'attention'}: check full_attention_interval in config.json"
            )


class MLXSession(BaseSession):
    """One policy cache on an MLXModel: the `engine.decode.Session` interface."""

    def __init__(
        self, model: MLXModel, policy: Policy, max_block: int = 1, prefill_chunk: int = 512, rows: int = 1
    ) -> None:
        super().__init__(model.geometry, policy, max_block, prefill_chunk, rows)
        self.owner = model
        self.arrays = [GroupArrays(g, model.sliding_window) for g in self.groups]
        arrays_of = {id(a.group): a for a in self.arrays}
        bits = policy.bits
        group = policy.group_for(model.geometry.head_dim) if bits else 0
        self.states = self.cache = [
            DeltaNetState()
            if g is None
            else KV(arrays_of[id(g)], i)
            if bits is None
            else QuantizedKV(arrays_of[id(g)], i, bits, group, model.model_type in QUANTIZED_SDPA)
            for i, g in enumerate(self.group_of)
        ]

    def trim(self, n: int) -> None:
        # The slots the groups mark EMPTY (bounded layouts), to mark on the device tables as well.
        dropped = [
            [[lay.slot(p) for p in range(lay.n - n, lay.n)] for lay in g.layouts]
            if g.limit is not None
            else None
            for g in self.groups
        ]
        super().trim(n)
        for a, slots in zip(self.arrays, dropped, strict=True):
            a.drop(slots)

    def _call(self, ids: list[list[int]], forwards: list[Forward], keep: int | None) -> mx.array:
        for a, fwd in zip(self.arrays, forwards, strict=True):
            a.load(fwd)
        out = self.owner.logits(mx.array(ids), self.cache, keep)
        if missed := [a.group.layer_type for a in self.arrays if not a.asked]:
            raise ValueError(
                f"the mlx-lm code of this model applies another layer's mask to its {missed[0]} layers: "
                "it groups its layers differently from the config's layer_types; not supported by the mlx backend"
            )
        return out

    def _run(
        self, ids: list[int], forwards: list[Forward], last_only: bool, logits: bool, hidden: tuple[int, ...]
    ) -> Step:
        with mx.stream(self.owner.device), hidden_states(self.owner.model, hidden) as states:
            rows = self._call([ids], forwards, 1 if last_only else None)[0]
            tokens = mx.argmax(rows, axis=-1)
            kept = {i: states[i][0, -rows.shape[0] :] for i in hidden}
            mx.eval(tokens, [c.state for c in self.cache], list(kept.values()), rows if logits else [])
        return Step([int(t) for t in tokens.tolist()], rows if logits else None, kept)  # type: ignore[union-attr]

    def _run_rows(self, ids: list[list[int]], forwards: list[Forward]) -> list[list[int]]:
        with mx.stream(self.owner.device):
            tokens = mx.argmax(self._call(ids, forwards, None), axis=-1)
            mx.eval(tokens, [c.state for c in self.cache])
        return tokens.tolist()  # type: ignore[return-value]


def mlx_config(path: Path) -> dict[str, Any]:
    """Keys mlx-lm needs that a transformers 5 config.json may lack, derived from the keys it has.

    Gemma-3 (`gemma3_text`): mlx-lm ignores `layer_types` and `rope_parameters`; it reads the integer
    `sliding_window_pattern` (layer i is global iff (i + 1) % pattern == 0; default 6) and the flat
    `rope_theta`, `rope_local_base_freq` and `rope_scaling`.
    """
    config = json.loads((path / "config.json").read_text())
    extra: dict[str, Any] = {}
    if config.get("model_type") in LINEAR_HYBRIDS:
        return _linear_hybrid_config(path, config)
    if config.get("model_type") != "gemma3_text":
        return extra
    types = config.get("layer_types")
    if types:
        pattern = _pattern(types)
        given = config.get("sliding_window_pattern")
        if given is not None and given != pattern:
            raise ValueError(
                f"{path}/config.json: sliding_window_pattern={given} contradicts layer_types "
                f"(which follow pattern {pattern})"
            )
        extra["sliding_window_pattern"] = pattern
    rope = config.get("rope_parameters") or {}
    full, local = rope.get(FULL_ATTENTION) or {}, rope.get(SLIDING_ATTENTION) or {}
    if "rope_theta" not in config and "rope_theta" in full:
        extra["rope_theta"] = full["rope_theta"]
    if "rope_local_base_freq" not in config and "rope_theta" in local:
        extra["rope_local_base_freq"] = local["rope_theta"]
    if config.get("rope_scaling") is None and full.get("rope_type", "default") != "default":
        extra["rope_scaling"] = {k: v for k, v in full.items() if k != "rope_theta"}
    if local.get("rope_type", "default") != "default":
        raise ValueError(f"{path}: mlx-lm's gemma3_text has no rope scaling on sliding layers")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if config.get(key) is not None:
            raise ValueError(f"{path}: {key} is set but mlx-lm's gemma3_text does not implement it")
    return extra


# transformers model type -> mlx-lm module, for linear-attention hybrids (mlx-lm has no qwen3_5_text).
LINEAR_HYBRIDS = {"qwen3_5_text": "qwen3_5", "qwen3_next": "qwen3_next"}


def _linear_hybrid_config(path: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Qwen3.5 / Qwen3-Next: mlx-lm builds layer i as linear iff (i + 1) % full_attention_interval != 0;
    derive that interval from `layer_types` (transformers derives `layer_types` from the interval)."""
    extra: dict[str, Any] = {"model_type": LINEAR_HYBRIDS[config["model_type"]]}
    types = config.get("layer_types")
    if types:
        if set(types) - {FULL_ATTENTION, LINEAR_ATTENTION}:
            raise ValueError(
                f"{path}: mlx-lm's {extra['model_type']} has only linear and full attention layers"
            )
        extra["full_attention_interval"] = _pattern(types)
    # transformers 5 writes rope settings under `rope_parameters`; mlx-lm's qwen3_next reads them top level
    rope = config.get("rope_parameters") or {}
    for key in ("rope_theta", "partial_rotary_factor"):
        if key not in config and key in rope:
            extra[key] = rope[key]
    return extra


def _pattern(types: list[str]) -> int:
    """The p with layer i global iff (i + 1) % p == 0, as mlx-lm's gemma3_text (sliding_window_pattern)
    and qwen3_5 / qwen3_next (full_attention_interval) build their layers."""
    n = len(types)
    for p in range(1, n + 1):
        if all((t == FULL_ATTENTION) == ((i + 1) % p == 0) for i, t in enumerate(types)):
            return p
    raise ValueError(
        "mlx-lm needs layer_types that repeat (sliding or linear x (p-1), full) with at least one "
        f"full_attention layer; got {types}"
    )


def load_mlx(path: Path, dtype: str = "auto", device: str = "auto", compile: bool | str = False) -> MLXModel:
    """Load an mlx-lm model to run on `device` (checked before the weights load) in `dtype`."""
    if compile:
        raise ValueError(
            "compile is not supported on the mlx backend: the policy cache updates its buffers from Python "
            "inside the forward, which mx.compile cannot trace; run without compile"
        )
    dev = pick_device(device)
    want = pick_dtype(dtype, dev)
    extra = mlx_config(path)
    model, _ = load_model(path, model_config=extra)
    if want != mx.float32 or _weights_dtype(model) != mx.float32:
        model.set_dtype(want)
    config = {**load_config(path), **extra, **_transformers_view(path)}
    has_tokenizer = any(
        (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )
    tokenizer = AutoTokenizer.from_pretrained(str(path)) if has_tokenizer else None
    out = MLXModel(model, config, tokenizer, path)
    out.device = dev
    return out


def _transformers_view(path: Path) -> dict[str, Any]:
    """`layer_types` and `sliding_window` as transformers (and so the PyTorch backend) reads them: a
    config class may derive them (e.g. from `use_sliding_window`) rather than store them."""
    text = AutoConfig.from_pretrained(str(path)).get_text_config()
    return {
        "layer_types": getattr(text, "layer_types", None),
        "sliding_window": getattr(text, "sliding_window", None),
    }


def _weights_dtype(model: nn.Module) -> mx.Dtype:
    for _, p in tree_flatten(model.parameters()):
        if mx.issubdtype(p.dtype, mx.floating):
            return p.dtype
    return mx.float32
