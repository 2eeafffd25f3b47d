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

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.backends.base import BaseSession, Tokenized
from engine.cache import Forward, Group, buffer_size
from engine.decode import Step
from engine.geometry import LINEAR_ATTENTION, Geometry
from engine.policy import Policy

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class GroupTensors:
    """One group's current `Forward` as torch index tensors, shared by the group's layers."""

    def __init__(self, group: Group) -> None:
        self.group = group
        self.slots: torch.Tensor | None = None  # written slots, when not a contiguous range
        self.keep: torch.Tensor | None = None  # concat: rows of the block that are written

    def load(self, fwd: Forward) -> None:
        self.slots = None if fwd.slots is None else torch.from_numpy(fwd.slots)
        self.keep = None if fwd.keep is None else torch.from_numpy(fwd.keep)


class KV:
    """One attention layer's K/V buffers [batch, kv_heads, slots, head_dim]: sinks + ring, or a growing
    buffer for unbounded layers, written where its group's `Forward` says."""

    def __init__(self, tensors: GroupTensors) -> None:
        self.group = tensors.group
        self.tensors = tensors
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def update(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fwd = self.group.forward
        assert fwd is not None, "the cache was used outside a planned forward"
        plan = fwd.plan
        if self.k is None or self.v is None or self.k.shape[2] < plan.capacity:
            self._grow(key, value, plan.capacity)
        kb, vb = self.k, self.v
        assert kb is not None and vb is not None
        if plan.concat:
            ko = torch.cat((kb[:, :, : plan.old_view], key), dim=2)
            vo = torch.cat((vb[:, :, : plan.old_view], value), dim=2)
            if (keep := self.tensors.keep) is not None:
                key, value = key.index_select(2, keep), value.index_select(2, keep)
            self._write(key, value, fwd)
            return ko, vo
        self._write(key, value, fwd)
        return kb[:, :, : plan.view], vb[:, :, : plan.view]

    def _write(self, key: torch.Tensor, value: torch.Tensor, fwd: Forward) -> None:
        assert self.k is not None and self.v is not None
        if rng := fwd.plan.slot_range:
            self.k[:, :, rng[0] : rng[1]] = key
            self.v[:, :, rng[0] : rng[1]] = value
        else:
            assert self.tensors.slots is not None
            self.k.index_copy_(2, self.tensors.slots, key)
            self.v.index_copy_(2, self.tensors.slots, value)

    def _grow(self, key: torch.Tensor, value: torch.Tensor, need: int) -> None:
        have = 0 if self.k is None else self.k.shape[2]
        size = buffer_size(have, need, self.group.limit)
        b, h, _, d = key.shape
        kb = key.new_empty((b, h, size, d))
        vb = value.new_empty((b, h, size, value.shape[3]))
        if self.k is not None and self.v is not None:
            kb[:, :, :have] = self.k
            vb[:, :, :have] = self.v
        self.k, self.v = kb, vb

    def trim(self, n: int) -> None:
        """Nothing to drop: the group marks the trimmed slots EMPTY and the next writes reuse them."""

    @property
    def nbytes(self) -> int:
        if self.k is None or self.v is None:
            return 0
        slot = (self.k[0, :, 0].numel() + self.v[0, :, 0].numel()) * self.k.element_size() * self.k.shape[0]
        return self.group.held() * slot

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
    *lead, d = x.shape
    w = x.unflatten(-1, (d // group, group)).float()
    n_bins = (1 << bits) - 1
    w_min, w_max = torch.aminmax(w, dim=-1, keepdim=True)
    neg = w_min.abs() > w_max.abs()  # anchor the larger-magnitude edge exactly on a code
    scales = ((w_max - w_min) / n_bins).clamp_min_(1e-7)
    scales = torch.where(neg, scales, scales.neg())
    edge = torch.where(neg, w_min, w_max)
    q0 = (edge / scales).round_()
    scales = torch.where(q0 != 0, edge / q0, scales)
    biases = edge.masked_fill(q0 == 0, 0.0)
    codes = ((w - biases) / scales).round_().clamp_(0, n_bins).to(torch.uint8).flatten(-2)
    if bits == 4:
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return codes, scales.squeeze(-1).to(x.dtype), biases.squeeze(-1).to(x.dtype)


def dequantize(
    codes: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, bits: int, group: int
) -> torch.Tensor:
    """The values `quantize` stored: scale * code + bias, in the scales' dtype."""
    if bits == 4:
        codes = torch.stack((codes & 15, codes >> 4), dim=-1).flatten(-2)
    w = codes.unflatten(-1, (codes.shape[-1] // group, group)).to(scales.dtype)
    return w.mul_(scales[..., None]).add_(biases[..., None]).flatten(-2)


class QuantizedKV:
    """One attention layer's K/V stored affine-quantized (`quantize`: codes, scales and biases per slot,
    in the same sinks + ring / growing slot layout as `KV`). Attention dequantizes the attended slots
    each forward: simple, and exact with respect to the stored values (the new block is quantized
    before it is attended, so step-by-step and block decoding see the same K/V); rollback is a trim.

    With one width for K and V of one head dimension (q8, q4), K and V are stored side by side, [K | V]
    along the last axis of one set of buffers: a step quantizes, writes and dequantizes once per layer
    instead of twice (the groups never straddle K and V, so the values are the same as apart). kXvY keeps
    one set of buffers for K and one for V."""

    def __init__(self, tensors: GroupTensors, bits: tuple[int, int], group: int) -> None:
        self.group = tensors.group
        self.tensors = tensors
        self.bits = bits
        self.group_size = group
        self.parts: list[list[torch.Tensor]] = []  # per part: codes, scales, biases [batch, heads, slots, *]
        self.joint = False  # one part [K | V] (else two: K, V)
        self.key_dim = 0

    def update(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        fwd = self.group.forward
        assert fwd is not None, "the cache was used outside a planned forward"
        plan = fwd.plan
        if not self.parts:
            self.joint = self.bits[0] == self.bits[1] and key.shape[-1] == value.shape[-1]
            self.key_dim = key.shape[-1]
        blocks = [torch.cat((key, value), dim=-1)] if self.joint else [key, value]
        new = [quantize(x, b, self.group_size) for x, b in zip(blocks, self.bits, strict=False)]
        if not self.parts or self.parts[0][0].shape[2] < plan.capacity:
            self._grow(new, plan.capacity)
        if plan.concat:
            out = [
                torch.cat((self._read(buf, b, plan.old_view), self._deq(n, b)), dim=2)
                for buf, n, b in zip(self.parts, new, self.bits, strict=False)
            ]
            if (keep := self.tensors.keep) is not None:
                new = [[t.index_select(2, keep) for t in n] for n in new]
            self._write(new, fwd)
        else:
            self._write(new, fwd)
            out = [self._read(buf, b, plan.view) for buf, b in zip(self.parts, self.bits, strict=False)]
        if self.joint:
            d = self.key_dim
            return out[0].narrow(-1, 0, d), out[0].narrow(-1, d, out[0].shape[-1] - d)
        return out[0], out[1]

    def _deq(self, q: Sequence[torch.Tensor], bits: int) -> torch.Tensor:
        return dequantize(q[0], q[1], q[2], bits, self.group_size)

    def _read(self, buf: list[torch.Tensor], bits: int, view: int) -> torch.Tensor:
        return self._deq([t.narrow(2, 0, view) for t in buf], bits)

    def _write(self, new: Sequence[Sequence[torch.Tensor]], fwd: Forward) -> None:
        rng = fwd.plan.slot_range
        for buf, n in zip(self.parts, new, strict=True):
            for b, t in zip(buf, n, strict=True):
                if rng:
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
                b, h, _, d = t.shape
                buf = t.new_zeros((b, h, size, d))
                if self.parts:
                    buf[:, :, :have] = self.parts[i][j]
                out.append(buf)
            grown.append(out)
        self.parts = grown

    def trim(self, n: int) -> None:
        """Nothing to drop: the group marks the trimmed slots EMPTY and the next writes reuse them."""

    @property
    def nbytes(self) -> int:
        """Codes, scales and biases of the positions held."""
        slot = sum(t[:, :, 0].numel() * t.element_size() for part in self.parts for t in part)
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
    """A transformers causal LM (batch 1) with its tokenizer; makes policy-cached sessions."""

    def __init__(self, model: Any, tokenizer: Any = None, path: Path | None = None) -> None:
        self.model = model.eval()
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

    def session(self, policy: Policy, max_block: int = 1, prefill_chunk: int = 512) -> TorchSession:
        return TorchSession(self, policy, max_block, prefill_chunk)


class TorchSession(BaseSession):
    """One policy cache on a TorchModel: the `engine.decode.Session` interface."""

    def __init__(
        self, model: TorchModel, policy: Policy, max_block: int = 1, prefill_chunk: int = 512
    ) -> None:
        super().__init__(model.geometry, policy, max_block, prefill_chunk)
        self.owner = model
        self.tensors = [GroupTensors(g) for g in self.groups]
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

    @torch.inference_mode()
    def _run(
        self, ids: list[int], forwards: list[Forward], last_only: bool, logits: bool, hidden: tuple[int, ...]
    ) -> Step:
        m = len(ids)
        start = forwards[0].start
        by_type: dict[str, torch.Tensor | None] = {}
        for g, t, fwd in zip(self.groups, self.tensors, forwards, strict=True):
            t.load(fwd)
            mask = fwd.mask()
            by_type[g.layer_type] = None if mask is None else self._mask(torch.from_numpy(mask)[None, None])
        if self.linear:
            by_type[LINEAR_ATTENTION] = None  # no padding: the linear layers take no mask
        if len(by_type) == 1:
            attention_mask: Any = next(iter(by_type.values()))
            if attention_mask is None:  # a model without dict masks needs some prepared 4-D mask
                attention_mask = self._mask(_all_visible(forwards[0].keys.size))
        else:
            attention_mask = by_type
        out = self.owner.model(
            input_ids=torch.tensor([ids]),
            position_ids=torch.arange(start, start + m)[None],
            past_key_values=self.cache,
            attention_mask=attention_mask,
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
            output_hidden_states=bool(hidden),
        )
        rows = out.logits[0]
        states = {i: out.hidden_states[i][0, -rows.shape[0] :] for i in hidden}
        return Step(rows.argmax(-1).tolist(), rows if logits else None, states)

    def _mask(self, mask: torch.Tensor) -> torch.Tensor:
        return _additive(mask, self.owner.dtype) if self.owner.additive_masks else mask


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)


_ONES = torch.ones((1, 1, 1, 0), dtype=torch.bool)


def _all_visible(n: int) -> torch.Tensor:
    """A prepared all-True mask for one query over n slots (models without a dict mask need a 4-D mask)."""
    global _ONES
    if _ONES.shape[-1] < n:
        _ONES = torch.ones((1, 1, 1, max(n, 2 * _ONES.shape[-1], 1024)), dtype=torch.bool)
    return _ONES[..., :n]


def load_torch(path: Path, dtype: str = "float32") -> TorchModel:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype])
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return TorchModel(model, tokenizer, path)
