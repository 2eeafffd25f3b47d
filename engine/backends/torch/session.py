"""The PyTorch session: a transformers causal LM (`TorchModel`, `load_torch`) plus the policy cache.

The torch side of a session: `KV` (kv.py, one attention layer's K/V buffers), `PolicyCache` (the
`past_key_values` container: each attention layer calls `update(k, v, layer_idx)` after RoPE, which
hands the layer's `KV` the new K/V to write where its group's `engine.cache.Forward` says and returns
the slots to attend), and `TorchSession._run` (one forward answering a `Step`). The per-query masks
are built once per forward per layer group (engine/cache.py) and handed to the model as a prepared 4-D boolean mask (a dict keyed by layer type for models
with several layer types), which transformers passes through untouched. `position_ids` are explicit,
so every position keeps its original RoPE position.

Linear-attention layers (Qwen3.5, Qwen3-Next gated delta-net) and Mamba-2 mixers (Bamba, Granite-4.0-H,
Falcon-H1 beside its attention: `ParallelState`) call `get_conv_state` /
`get_recurrent_state` / `update_conv_state` / `update_recurrent_state` / `is_recording_past` on the same
container (as on transformers' `DynamicCache`); `DeltaNetState` / `Mamba2State` hold the state, and rollback is
`engine.backends.base`'s (snapshots + recomputation). transformers picks the kernel by block size: one
token with a state runs the recurrent step (and updates the convolution state in place), a longer block
(a prefill chunk or a verify block) the chunked kernel from the state, exactly as in `generate`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.backends.base import BaseSession, NoState, Tokenized
from engine.backends.torch.device import device_name, peak_memory_bytes, pick_device, pick_dtype
from engine.backends.torch.kv import KV, GroupTensors
from engine.backends.torch.linear import DeltaNetState, Mamba2State, MambaState, ParallelState
from engine.backends.torch.quant import QuantizedKV
from engine.cache import Forward, Group, visible_mask
from engine.decode import BatchStep, Step
from engine.geometry import (
    ALIBI_MASK,
    LINEAR_ATTENTION,
    MAMBA,
    MAMBA2,
    OWN_CACHE,
    PARALLEL,
    PARALLEL_MAMBA,
    PARALLEL_MAMBA2,
    STATELESS,
    STEPWISE,
    Geometry,
    UnsupportedModelError,
    config_dict,
)
from engine.policy import Policy

# The recurrent state of each kind of layer with a Mamba mixer (alone, or beside attention); else gated delta-net.
_STATE = {MAMBA2: Mamba2State, PARALLEL_MAMBA2: Mamba2State, MAMBA: MambaState, PARALLEL_MAMBA: MambaState}


class PolicyCache:
    """The `past_key_values` object a transformers model is called with: one state per layer."""

    is_compileable = False

    def __init__(self, session: TorchSession, states: list[Any], restorer: Restorer | None = None) -> None:
        self.session = session
        self.states = states
        self.restorer = restorer

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Positions fed before this forward, as transformers' caches count them before their update (models
        with learned absolute positions, BART / TrOCR / ..., number the new tokens from it)."""
        return self.session.groups[0].planned().start

    @property
    def is_initialized(self) -> bool:  # HRM-Text asks whether this is the first forward
        return self.get_seq_length() > 0

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = self.states[layer_idx].update(key, value)
        if (
            self.restorer is not None
            and (extra := self.restorer.kv(layer_idx, self.session.group_of[layer_idx])) is not None
        ):
            return torch.cat((k, extra[0].to(k)), dim=2), torch.cat((v, extra[1].to(v)), dim=2)
        return k, v

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
        self.geometry = Geometry.from_config({**config_dict(text), "dtype": str(config.dtype)}, eos)
        forward = inspect.signature(model.forward).parameters
        if why := _own_cache(forward):
            raise UnsupportedModelError(str(text.model_type), OWN_CACHE, why)
        if self.geometry.alibi and hasattr(inspect.getmodule(type(model)), "build_alibi_tensor"):
            raise UnsupportedModelError(  # MPT builds its biases from positions: it decodes under full
                str(text.model_type),
                ALIBI_MASK,
                ": its modeling code builds them from the 2-D padding mask, where the engine hands every model "
                "a prepared 4-D mask",
            )
        if self.geometry.v_head_dim:
            _one_kv_group(model)
        # BART, TrOCR, BLOOM, ...: the model numbers the new tokens itself (from the cache's length)
        self.own_positions = "position_ids" not in forward
        self.eos_ids = self.geometry.eos_ids
        impl = config._attn_implementation
        if impl not in ("sdpa", "eager"):
            raise ValueError(
                f"attention implementation {impl!r} is not supported: load the model with sdpa or eager"
            )
        self.additive_masks = impl == "eager"  # eager adds the mask to the scores; sdpa takes booleans
        self.dtype: torch.dtype = next(model.parameters()).dtype

    @property
    def text_config(self) -> Any:
        """The transformers config of the language model (a multimodal model's text config)."""
        config = self.model.config
        return config.get_text_config() if hasattr(config, "get_text_config") else config

    def input_embeddings(self) -> Any:
        return self.model.get_input_embeddings()

    def attention_modules(self) -> list[Any]:
        """Each decoder layer's attention module (`self_attn`), for studies that hook them."""
        layers = getattr(getattr(self.model, "model", None), "layers", None)
        if layers is None or len(layers) != len(self.layer_types):
            raise ValueError("this needs a transformers decoder with model.model.layers")
        return [layer.self_attn for layer in layers]

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


class Restorer(Protocol):
    """A declared hook of `TorchSession` (engine/restoration.py's study): K/V for positions the cache does
    not hold, attended after each attention layer's cached slots. Nothing is written to the cache."""

    def plan(self, group: Group, fwd: Forward) -> tuple[Forward, np.ndarray | None]:
        """The forward to run for `group` (its `keys` may go on past the cache's slots) and, when they do,
        its boolean mask [queries, keys] (None: the group's own mask)."""
        ...

    def kv(self, layer: int, group: Group) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The K/V [1, kv_heads, n, head_dim] this forward appends to the attended slots of `layer` (of
        `group`), or None."""
        ...


class TorchSession(BaseSession):
    """One policy cache on a TorchModel: the `engine.decode.Session` interface. Every tensor it makes
    (K/V buffers, masks, slot and position tensors) lives on the model's device. `restorer`: the hook
    through which a study supplies K/V the cache does not hold (`Restorer`)."""

    def __init__(
        self,
        model: TorchModel,
        policy: Policy,
        max_block: int = 1,
        prefill_chunk: int = 512,
        rows: int = 1,
        restorer: Restorer | None = None,
    ) -> None:
        if rows > 1 and model.own_positions:
            raise ValueError(
                f"batched decoding (rows={rows}) needs a model that takes position_ids: this one numbers "
                "the new tokens itself from the cache's length, one count for every row; decode these rows "
                "one at a time (rows=1)"
            )
        super().__init__(model.geometry, policy, max_block, prefill_chunk, rows)
        self.owner = model
        self.restorer = restorer
        self.device = model.device
        self.tensors = [GroupTensors(g, model.device) for g in self.groups]
        tensors_of = {id(t.group): t for t in self.tensors}
        kernel = model.geometry.linear_conv_kernel
        bits = policy.bits
        geo = model.geometry
        group = policy.group_for(math.gcd(geo.head_dim, geo.value_dim)) if bits else 0  # divides K's and V's
        recurrent = [_STATE.get(t, DeltaNetState) for t in geo.layer_types]
        self.states = [
            recurrent[i](kernel)
            if g is None
            else KV(tensors_of[id(g)])
            if bits is None
            else QuantizedKV(tensors_of[id(g)], bits, group)
            for i, g in enumerate(self.group_of)
        ]
        for i, t in enumerate(geo.layer_types):
            if t in PARALLEL:  # Falcon-H1, Zamba(2): the layer's K/V beside its Mamba(-2) state
                self.states[i] = ParallelState(self.states[i], recurrent[i](kernel))
            elif t in STATELESS:  # Nemotron-H's mlp / moe layers
                self.states[i] = NoState()
        self.cache = PolicyCache(self, self.states, restorer)
        self._ones = torch.ones((1, 1, 1, 0), dtype=torch.bool, device=self.device)

    @property
    def on_cpu(self) -> bool:
        return self.device.type == "cpu"

    def _join_refusal(self) -> str | None:
        if self.owner.own_positions:
            return "the model numbers its own positions (no batched decoding)"
        if self.restorer is not None:
            return "a session with a restorer"
        if not all(isinstance(s, KV) for s in self.states):
            return "quantized K/V (:qN policies) or layers without K/V"
        return None

    @torch.inference_mode()
    def _joined(self, other: BaseSession) -> None:
        assert isinstance(other, TorchSession)
        for t in self.tensors:  # the device mirror is copied from the host table on the next forward
            t.stale = True
            t._bases.clear()
            t._constant.clear()
            t._flat = None
        for a, b in zip(self.states, other.states, strict=True):
            a.join(b)

    @torch.inference_mode()
    def _dropped(self, slots: list[list[list[int]] | None]) -> None:
        for t, dropped in zip(self.tensors, slots, strict=True):
            t.drop(dropped)

    def attended_kv(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The K/V [1, kv_heads, n, head_dim] (post-RoPE, as stored) of the positions that the newest fed
        position attended in attention layer `layer` under this session's policy, in position order (a
        ring buffer holds its slots out of order once it wraps). Unbatched sessions with K/V stored in the
        model dtype only (not a `:qN` policy)."""
        group, state = self.group_of[layer], self.states[layer]
        if group is None or not isinstance(state, KV):
            what = "a linear-attention layer" if group is None else f"{type(state).__name__} (a :qN policy)"
            raise ValueError(f"layer {layer} holds {what}: no K/V in the model dtype to read")
        if self.rows != 1:
            raise ValueError("attended_kv reads an unbatched session (rows=1)")
        assert state.k is not None and state.v is not None
        table = group.table[0, : group.layout.held()]
        seen = visible_mask(group.spec, np.array([self.position - 1]), table)[0]
        slots = np.flatnonzero(seen)
        slots = slots[np.argsort(table[slots], kind="stable")]
        if len(slots) and slots[-1] - slots[0] == len(slots) - 1:  # already in order: a view
            return state.k[:, :, slots[0] : slots[-1] + 1], state.v[:, :, slots[0] : slots[-1] + 1]
        index = torch.from_numpy(slots).to(self.device)
        return state.k.index_select(2, index), state.v.index_select(2, index)

    def _call(self, ids: torch.Tensor, forwards: list[Forward], last_only: bool, hidden: bool) -> Any:
        by_type: dict[str, torch.Tensor | None] = {}
        for g, t, fwd in zip(self.groups, self.tensors, forwards, strict=True):
            own = None
            if self.restorer is not None:
                fwd, own = self.restorer.plan(g, fwd)
            t.load(fwd)
            if own is not None:
                by_type[g.layer_type] = self._mask(torch.from_numpy(own).to(self.device)[None, None])
                continue
            if fwd.plan.sinks_hidden:
                by_type[g.layer_type] = t.sinks_hidden_mask(fwd, self._mask)
                continue
            mask = t.mask(fwd)
            by_type[g.layer_type] = None if mask is None else self._mask(mask)
        if self.linear:
            by_type[LINEAR_ATTENTION] = None  # no padding: linear / Mamba-2 layers (keyed so) take no mask
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

    def _forward(
        self, ids: list[int], last_only: bool, logits: bool, hidden: tuple[int, ...], row: int | None
    ) -> Step:
        """A block fed after the first forward of a model with Mamba-1 mixers (Jamba) runs one token per
        forward: transformers' multi-token Mamba-1 scan starts from a zero SSM state (it takes no initial
        state), so only its one-token step continues the state. Exact, at one forward per token."""
        if self.position == 0 or len(ids) == 1 or not set(STEPWISE) & set(self.owner.geometry.layer_types):
            return super()._forward(ids, last_only, logits, hidden, row)
        steps = [super(TorchSession, self)._forward([t], False, logits, hidden, row) for t in ids]
        if last_only:
            return steps[-1]
        return Step(
            [t for s in steps for t in s.tokens],
            torch.cat([s.logits for s in steps]) if logits else None,
            {i: torch.cat([s.hidden[i] for s in steps]) for i in hidden},
        )

    @torch.inference_mode()
    def _run(
        self, ids: list[int], forwards: list[Forward], last_only: bool, logits: bool, hidden: tuple[int, ...]
    ) -> Step:
        out = self._call(self._ids([ids]), forwards, last_only, bool(hidden))
        rows = out.logits[0, -1:] if last_only else out.logits[0]  # TrOCR ignores logits_to_keep
        states = {i: out.hidden_states[i][0, -rows.shape[0] :] for i in hidden}
        return Step(_greedy(rows), rows if logits else None, states)

    @torch.inference_mode()
    def _run_rows(
        self, ids: list[list[int]], forwards: list[Forward], logits: bool, hidden: tuple[int, ...]
    ) -> BatchStep:
        out = self._call(self._ids(ids), forwards, False, bool(hidden))
        states = {i: out.hidden_states[i] for i in hidden}
        return BatchStep(_greedy(out.logits), out.logits if logits else None, states)

    @torch.inference_mode()
    def _kept(self, rows: list[int]) -> None:
        index = torch.tensor(rows, device=self.device)
        for t in self.tensors:
            t.keep_rows(index)
        for s in self.states:
            s.keep_rows(index)

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


def _own_cache(forward: Mapping[str, inspect.Parameter]) -> str:
    """Why a model's forward (its parameters) cannot take the engine's `PolicyCache` ('' when it can): it
    takes no cache argument at all (GPT-1, XLNet's `mems`), or one typed as its own dict (XLM)."""
    name = next((k for k in ("past_key_values", "cache") if k in forward), None)
    if name is None:
        other = next((k for k in ("mems", "past", "cache_params", "state") if k in forward), None)
        return (
            f": its forward takes {other!r}, no past_key_values" if other else ": its forward takes no cache"
        )
    if "dict" in str(forward[name].annotation):
        return f": its forward's {name} is a dict of its own, not a transformers Cache"
    return ""


def _one_kv_group(model: Any) -> None:
    """Multi-head latent attention expands the latent to K and V for every query head (`kv_b_proj`), so it
    has no K/V head groups; transformers still reads `num_key_value_heads` into `num_key_value_groups`, and
    its sdpa then repeats the already expanded K/V per group: a crash whenever a mask is given (the engine
    always gives one), and with no mask (generate) `enable_gqa` over equal head counts, which is plain
    attention. One group is what such a model computes where it runs at all (issue 44)."""
    for module in model.modules():
        if hasattr(module, "kv_lora_rank") and getattr(module, "num_key_value_groups", 1) != 1:
            module.num_key_value_groups = 1


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
