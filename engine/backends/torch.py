"""PyTorch backend: a transformers causal LM plus the policy cache.

`PolicyCache` is passed to the model as `past_key_values`: each attention layer calls
`update(k, v, layer_idx)` after RoPE; it writes the new K/V into preallocated buffers (sinks + ring,
or a growing buffer for unbounded layers, see engine/cache.py) and returns the slots to attend.
The per-query masks are built once per forward per layer group from the absolute position each slot
holds and handed to the model as a prepared 4-D boolean mask (a dict keyed by layer type for models
with several layer types), which transformers passes through untouched. `position_ids` are explicit,
so every position keeps its original RoPE position.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import torch

from engine.cache import Layout, Plan, Positions, buffer_size, visible_mask
from engine.decode import chunked_prefill
from engine.models import Tokenized
from engine.policy import LayerSpec, Policy, config_layer_types, layer_specs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _Group:
    """Layers sharing one LayerSpec: one layout, one position table, one mask per forward."""

    def __init__(self, spec: LayerSpec, max_block: int, layers: list[int]) -> None:
        self.spec = spec
        self.layout = Layout(spec, max_block)
        self.positions = Positions(self.layout)
        self.layers = layers
        self.plan: Plan | None = None
        self.slots: torch.Tensor | None = None  # written slots, when not a contiguous range
        self.keep: torch.Tensor | None = None  # concat: rows of the block that are written

    def begin(self, m: int) -> torch.Tensor | None:
        plan = self.plan = self.layout.plan(m)
        qp, kp = self.positions.apply(plan)
        self.slots = None if plan.slot_range else torch.tensor(plan.slots)
        self.keep = None if plan.keep is None else torch.tensor(plan.keep)
        return torch.from_numpy(visible_mask(self.spec, qp, kp))[None, None] if plan.mask else None

    def trim(self, r: int) -> None:
        self.positions.trim(r)


class PolicyCache:
    """A `past_key_values` object for transformers models, holding K/V under a cache policy."""

    is_compileable = False

    def __init__(self, specs: list[LayerSpec], max_block: int) -> None:
        by_spec: dict[LayerSpec, list[int]] = {}
        for i, s in enumerate(specs):
            by_spec.setdefault(s, []).append(i)
        self.groups = [_Group(s, max_block, layers) for s, layers in by_spec.items()]
        self.group_of = [g for i in range(len(specs)) for g in self.groups if i in g.layers]
        self.k: list[torch.Tensor | None] = [None] * len(specs)
        self.v: list[torch.Tensor | None] = [None] * len(specs)
        self.max_block = max_block

    @property
    def position(self) -> int:
        return self.groups[0].layout.n

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.position

    def begin(self, m: int) -> dict[LayerSpec, torch.Tensor | None]:
        return {g.spec: g.begin(m) for g in self.groups}

    def update(
        self, key: torch.Tensor, value: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        g = self.group_of[layer_idx]
        plan = g.plan
        assert plan is not None
        kb, vb = self.k[layer_idx], self.v[layer_idx]
        if kb is None or vb is None or kb.shape[2] < plan.capacity:
            kb, vb = self._grow(layer_idx, key, value, plan.capacity, g.layout.limit)
        if plan.concat:
            ko = torch.cat((kb[:, :, : plan.old_view], key), dim=2)
            vo = torch.cat((vb[:, :, : plan.old_view], value), dim=2)
            if g.keep is not None:
                key, value = key.index_select(2, g.keep), value.index_select(2, g.keep)
            self._write(kb, vb, key, value, g, plan)
            return ko, vo
        self._write(kb, vb, key, value, g, plan)
        return kb[:, :, : plan.view], vb[:, :, : plan.view]

    @staticmethod
    def _write(
        kb: torch.Tensor, vb: torch.Tensor, key: torch.Tensor, value: torch.Tensor, g: _Group, plan: Plan
    ) -> None:
        rng = plan.slot_range
        if rng:
            kb[:, :, rng[0] : rng[1]] = key
            vb[:, :, rng[0] : rng[1]] = value
        else:
            assert g.slots is not None
            kb.index_copy_(2, g.slots, key)
            vb.index_copy_(2, g.slots, value)

    def _grow(
        self, i: int, key: torch.Tensor, value: torch.Tensor, need: int, limit: int | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        old_k, old_v = self.k[i], self.v[i]
        have = 0 if old_k is None else old_k.shape[2]
        size = buffer_size(have, need, limit)
        b, h, _, d = key.shape
        kb = key.new_empty((b, h, size, d))
        vb = value.new_empty((b, h, size, value.shape[3]))
        if old_k is not None and old_v is not None:
            kb[:, :, :have] = old_k
            vb[:, :, :have] = old_v
        self.k[i], self.v[i] = kb, vb
        return kb, vb

    def trim(self, r: int) -> None:
        for g in self.groups:
            g.trim(r)

    def kv_bytes(self) -> list[int]:
        out = []
        for i, kb in enumerate(self.k):
            vb = self.v[i]
            if kb is None or vb is None:
                out.append(0)
                continue
            slot = (kb[0, :, 0].numel() + vb[0, :, 0].numel()) * kb.element_size() * kb.shape[0]
            out.append(self.group_of[i].layout.held() * slot)
        return out

    def kv_allocated_bytes(self) -> list[int]:
        return [0 if k is None else k.nbytes + v.nbytes for k, v in zip(self.k, self.v, strict=True)]  # type: ignore[union-attr]


class TorchModel(Tokenized):
    """A transformers causal LM (batch 1) with its tokenizer; makes policy-cached Sequences."""

    def __init__(self, model: Any, tokenizer: Any = None, path: Path | None = None) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.path = path
        config = model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        self.sliding_window: int | None = getattr(text_config, "sliding_window", None)
        self.layer_types = config_layer_types(
            getattr(text_config, "layer_types", None), self.sliding_window, text_config.num_hidden_layers
        )
        impl = config._attn_implementation
        if impl not in ("sdpa", "eager"):
            raise ValueError(
                f"attention implementation {impl!r} is not supported: load the model with sdpa or eager"
            )
        self.additive_masks = impl == "eager"  # eager adds the mask to the scores; sdpa takes booleans
        layer_specs(Policy("full"), self.layer_types, self.sliding_window)  # fail early on unsupported layers
        eos = model.generation_config.eos_token_id if model.generation_config else None
        if eos is None:
            eos = getattr(text_config, "eos_token_id", None)
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))

        self.dtype: torch.dtype = next(model.parameters()).dtype

    def sequence(self, policy: Policy, max_block: int = 1, prefill_chunk: int = 512) -> TorchSequence:
        return TorchSequence(self, policy, max_block, prefill_chunk)


class TorchSequence:
    """One policy cache on a TorchModel: the `engine.decode.Sequence` interface."""

    def __init__(
        self, model: TorchModel, policy: Policy, max_block: int = 1, prefill_chunk: int = 512
    ) -> None:
        if prefill_chunk < 1:
            raise ValueError("prefill_chunk must be >= 1")
        self.owner = model
        self.policy = policy
        self.specs = layer_specs(policy, model.layer_types, model.sliding_window)
        self.cache = PolicyCache(self.specs, max_block)
        self.max_block = max_block
        self.prefill_chunk = prefill_chunk
        # Each layer type has one spec (layer_spec depends on the type only): one mask per type.
        self._type_spec = dict(zip(model.layer_types, self.specs, strict=True))

    @property
    def position(self) -> int:
        return self.cache.position

    def prefill(self, ids: Seq[int]) -> int:
        return chunked_prefill(lambda chunk: self._run(chunk, last_only=True), ids, self.prefill_chunk)

    def forward(self, ids: Seq[int]) -> list[int]:
        return self._run(list(ids), last_only=False)

    def trim(self, n: int) -> None:
        self.cache.trim(n)

    def kv_bytes(self) -> list[int]:
        return self.cache.kv_bytes()

    def kv_allocated_bytes(self) -> list[int]:
        """Bytes of the K/V buffers allocated (>= kv_bytes: buffers grow in steps)."""
        return self.cache.kv_allocated_bytes()

    @torch.inference_mode()
    def _run(self, ids: list[int], last_only: bool) -> list[int]:
        m = len(ids)
        start = self.cache.position
        masks = self.cache.begin(m)
        if self.owner.additive_masks:
            masks = {s: None if x is None else _additive(x, self.owner.dtype) for s, x in masks.items()}
        by_type = {t: masks[spec] for t, spec in self._type_spec.items()}
        if len(by_type) == 1:
            mask = next(iter(by_type.values()))
            if mask is None:  # a model without dict masks needs some prepared 4-D mask
                mask = _all_visible(self.cache.groups[0].plan)
                mask = _additive(mask, self.owner.dtype) if self.owner.additive_masks else mask
            attention_mask: Any = mask
        else:
            attention_mask = by_type
        out = self.owner.model(
            input_ids=torch.tensor([ids]),
            position_ids=torch.arange(start, start + m)[None],
            past_key_values=self.cache,
            attention_mask=attention_mask,
            use_cache=True,
            logits_to_keep=1 if last_only else 0,
        )
        return out.logits[0].argmax(-1).tolist()


def _additive(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(mask.shape, dtype=dtype).masked_fill_(~mask, torch.finfo(dtype).min)


_ONES = torch.ones((1, 1, 1, 0), dtype=torch.bool)


def _all_visible(plan: Plan | None) -> torch.Tensor:
    """A prepared all-True mask for one query (models without a dict mask need some 4-D mask)."""
    global _ONES
    assert plan is not None
    n = plan.view
    if _ONES.shape[-1] < n:
        _ONES = torch.ones((1, 1, 1, max(n, 2 * _ONES.shape[-1], 1024)), dtype=torch.bool)
    return _ONES[..., :n]


def load_torch(path: Path, dtype: str = "float32") -> TorchModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype])
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    return TorchModel(model, tokenizer, path)
