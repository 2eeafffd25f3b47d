"""MLX backend: an mlx-lm model plus the policy cache (the same slot layout as the PyTorch backend).

mlx-lm models take a list of per-layer cache objects with a tiny interface, and this backend plugs its
own in without forking any model code:

- `offset`: the absolute position of the forward's first token; every attention layer passes it to
  RoPE, so each position keeps its original rotary position whatever slot it lands in.
- `update_and_fetch(k, v)`: writes the new K/V (after RoPE) into the layer's buffer following the
  `engine.cache.Plan` of this forward (sinks + ring, or a growing buffer) and returns the slots to
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

The plan for all layers is made once per forward before the model runs (`_Group.begin`), as in the
PyTorch backend. Nothing here imports torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.cache import Layout, Plan, Positions, buffer_size, visible_mask
from engine.decode import chunked_prefill
from engine.models import Tokenized
from engine.policy import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    LayerSpec,
    Policy,
    config_layer_types,
    layer_specs,
)

DTYPES = {"float32": mx.float32, "bfloat16": mx.bfloat16, "float16": mx.float16}
# Model types whose mlx-lm `Model.__call__` is `head(model.model(...))`: prefill computes the head for
# the last position only. Others get the full logits (correct, slower for large vocabularies).
PLAIN_HEAD = frozenset({"gemma3_text", "qwen3", "qwen2", "llama", "mistral"})


class _Group:
    """Layers sharing one LayerSpec and layer type: one layout, one position table, one mask."""

    def __init__(self, spec: LayerSpec, layer_type: str, native_window: int | None, max_block: int) -> None:
        self.spec = spec
        self.layer_type = layer_type
        self.native_window = native_window if layer_type == SLIDING_ATTENTION else None
        self.layout = Layout(spec, max_block)
        self.positions = Positions(self.layout)
        self.plan: Plan | None = None
        self.mask: mx.array | str | None = None
        self.asked = False  # make_mask was called for this forward
        self.slots: mx.array | None = None  # written slots, when not a contiguous range
        self.keep: mx.array | None = None  # concat: rows of the block that are written

    def begin(self, m: int) -> None:
        plan = self.plan = self.layout.plan(m)
        self.asked = False
        qp, kp = self.positions.apply(plan)
        self.slots = None if plan.slot_range else mx.array(plan.slots, dtype=mx.int32)
        self.keep = None if plan.keep is None else mx.array(plan.keep, dtype=mx.int32)
        if not plan.mask:
            self.mask = None
        elif not plan.concat and self.layout.limit is None:
            self.mask = "causal"  # slots are positions 0..end-1: mlx's bottom-right aligned causal mask
        else:
            self.mask = mx.array(visible_mask(self.spec, qp, kp))

    def trim(self, r: int) -> None:
        self.positions.trim(r)


class LayerCache:
    """The per-layer cache object an mlx-lm model is called with (see the module docstring)."""

    def __init__(self, group: _Group, layer: int) -> None:
        self.group = group
        self.layer = layer
        self.keys: mx.array | None = None
        self.values: mx.array | None = None

    @property
    def offset(self) -> int:
        plan = self.group.plan
        return 0 if plan is None else plan.start

    def make_mask(self, n: int, return_array: bool = False, window_size: int | None = None) -> Any:
        g = self.group
        if window_size is not None and window_size != g.native_window:
            raise ValueError(
                f"mlx-lm asked layer {self.layer} ({g.layer_type}, sliding_window={g.native_window}) for a "
                f"mask with window_size={window_size}: the model's mlx-lm code and its config's layer_types "
                "disagree; this model is not supported by the mlx backend"
            )
        assert g.plan is not None and g.plan.m == n, "make_mask outside a planned forward"
        g.asked = True
        if return_array and isinstance(g.mask, str):
            start = g.plan.start
            return mx.array(visible_mask(g.spec, np.arange(start, start + n), np.arange(start + n)))
        return g.mask

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        g = self.group
        plan = g.plan
        assert plan is not None, "the cache was used outside a planned forward"
        if self.keys is None or self.values is None or self.keys.shape[2] < plan.capacity:
            self._grow(keys, values, plan.capacity, g.layout.limit)
        assert self.keys is not None and self.values is not None
        if plan.concat:
            ko = mx.concatenate((self.keys[:, :, : plan.old_view], keys), axis=2)
            vo = mx.concatenate((self.values[:, :, : plan.old_view], values), axis=2)
            if g.keep is not None:
                keys, values = keys[:, :, g.keep], values[:, :, g.keep]
            self._write(keys, values)
            return ko, vo
        self._write(keys, values)
        return self.keys[:, :, : plan.view], self.values[:, :, : plan.view]

    def _write(self, keys: mx.array, values: mx.array) -> None:
        g = self.group
        assert g.plan is not None and self.keys is not None and self.values is not None
        rng = g.plan.slot_range
        if rng:
            self.keys[:, :, rng[0] : rng[1]] = keys
            self.values[:, :, rng[0] : rng[1]] = values
        else:
            self.keys[:, :, g.slots] = keys
            self.values[:, :, g.slots] = values

    def _grow(self, keys: mx.array, values: mx.array, need: int, limit: int | None) -> None:
        have = 0 if self.keys is None else self.keys.shape[2]
        size = buffer_size(have, need, limit)
        b, h, _, d = keys.shape
        kb = mx.zeros((b, h, size, d), keys.dtype)
        vb = mx.zeros((b, h, size, values.shape[3]), values.dtype)
        if self.keys is not None and self.values is not None:
            kb[:, :, :have] = self.keys
            vb[:, :, :have] = self.values
        self.keys, self.values = kb, vb

    @property
    def state(self) -> list[mx.array]:
        return [] if self.keys is None or self.values is None else [self.keys, self.values]

    def is_trimmable(self) -> bool:
        return False  # rollback goes through MLXSequence.trim, which keeps every layer in step

    def empty(self) -> bool:
        return self.keys is None

    def slot_bytes(self) -> int:
        if self.keys is None or self.values is None:
            return 0
        b, h, _, d = self.keys.shape
        return b * h * (d + self.values.shape[3]) * self.keys.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes allocated (the buffers may be longer than the positions held)."""
        return 0 if self.keys is None or self.values is None else self.keys.nbytes + self.values.nbytes


class MLXModel(Tokenized):
    """An mlx-lm causal LM (batch 1) with its tokenizer; makes policy-cached Sequences."""

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
        self.sliding_window: int | None = config.get("sliding_window")
        self.layer_types = config_layer_types(config.get("layer_types"), self.sliding_window, n_layers)
        if len(self.layer_types) != n_layers:
            raise ValueError(f"the config lists {len(self.layer_types)} layer_types for {n_layers} layers")
        layer_specs(Policy("full"), self.layer_types, self.sliding_window)  # fail early on unsupported layers
        _check_layer_types(model, self.layer_types)
        eos = config.get("eos_token_id")
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))

    @property
    def dtype(self) -> mx.Dtype:
        return self.model.model.embed_tokens.weight.dtype if hasattr(self.model, "model") else mx.float32

    def sequence(self, policy: Policy, max_block: int = 1, prefill_chunk: int = 512) -> MLXSequence:
        return MLXSequence(self, policy, max_block, prefill_chunk)

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


class MLXSequence:
    """One policy cache on an MLXModel: the `engine.decode.Sequence` interface."""

    def __init__(self, model: MLXModel, policy: Policy, max_block: int = 1, prefill_chunk: int = 512) -> None:
        if prefill_chunk < 1:
            raise ValueError("prefill_chunk must be >= 1")
        self.owner = model
        self.policy = policy
        self.specs = layer_specs(policy, model.layer_types, model.sliding_window)
        self.max_block = max_block
        self.prefill_chunk = prefill_chunk
        groups: dict[tuple[LayerSpec, str], _Group] = {}
        self.cache: list[LayerCache] = []
        for i, (spec, t) in enumerate(zip(self.specs, model.layer_types, strict=True)):
            g = groups.get((spec, t))
            if g is None:
                g = groups[(spec, t)] = _Group(spec, t, model.sliding_window, max_block)
            self.cache.append(LayerCache(g, i))
        self.groups = list(groups.values())

    @property
    def position(self) -> int:
        return self.groups[0].layout.n

    def prefill(self, ids: Seq[int]) -> int:
        return chunked_prefill(lambda chunk: self._run(chunk, last_only=True), ids, self.prefill_chunk)

    def forward(self, ids: Seq[int]) -> list[int]:
        return self._run(list(ids), last_only=False)

    def trim(self, n: int) -> None:
        for g in self.groups:
            g.trim(n)

    def kv_bytes(self) -> list[int]:
        """K/V bytes of the positions held, per layer."""
        return [c.group.layout.held() * c.slot_bytes() for c in self.cache]

    def kv_allocated_bytes(self) -> list[int]:
        return [c.nbytes for c in self.cache]

    def _run(self, ids: list[int], last_only: bool) -> list[int]:
        for g in self.groups:
            g.begin(len(ids))
        logits = self.owner.logits(mx.array([ids]), self.cache, 1 if last_only else None)
        if missed := [g.layer_type for g in self.groups if not g.asked]:
            raise ValueError(
                f"the mlx-lm code of this model applies another layer's mask to its {missed[0]} layers: "
                "it groups its layers differently from the config's layer_types; not supported by the mlx backend"
            )
        tokens = mx.argmax(logits[0], axis=-1)
        mx.eval(tokens, [c.state for c in self.cache])
        return [int(t) for t in tokens.tolist()]  # type: ignore[union-attr]


def mlx_config(path: Path) -> dict[str, Any]:
    """Keys mlx-lm needs that a transformers 5 config.json may lack, derived from the keys it has.

    Gemma-3 (`gemma3_text`): mlx-lm ignores `layer_types` and `rope_parameters`; it reads the integer
    `sliding_window_pattern` (layer i is global iff (i + 1) % pattern == 0; default 6) and the flat
    `rope_theta`, `rope_local_base_freq` and `rope_scaling`.
    """
    config = json.loads((path / "config.json").read_text())
    extra: dict[str, Any] = {}
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


def _pattern(types: list[str]) -> int:
    """The p with layer i global iff (i + 1) % p == 0, as mlx-lm's gemma3_text builds its layers."""
    n = len(types)
    for p in range(1, n + 1):
        if all((t == FULL_ATTENTION) == ((i + 1) % p == 0) for i, t in enumerate(types)):
            return p
    raise ValueError(
        "mlx-lm's gemma3_text needs layer_types that repeat (sliding x (p-1), full) with at least one "
        f"full_attention layer; got {types}"
    )


def load_mlx(path: Path, dtype: str = "float32") -> MLXModel:
    from mlx_lm.utils import load_config, load_model
    from transformers import AutoTokenizer

    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    extra = mlx_config(path)
    model, _ = load_model(path, model_config=extra)
    if dtype != "float32" or _weights_dtype(model) != mx.float32:
        model.set_dtype(DTYPES[dtype])
    config = {**load_config(path), **extra, **_transformers_view(path)}
    has_tokenizer = any(
        (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )
    tokenizer = AutoTokenizer.from_pretrained(str(path)) if has_tokenizer else None
    return MLXModel(model, config, tokenizer, path)


def _transformers_view(path: Path) -> dict[str, Any]:
    """`layer_types` and `sliding_window` as transformers (and so the PyTorch backend) reads them: a
    config class may derive them (e.g. from `use_sliding_window`) rather than store them."""
    from transformers import AutoConfig

    text = AutoConfig.from_pretrained(str(path)).get_text_config()
    return {
        "layer_types": getattr(text, "layer_types", None),
        "sliding_window": getattr(text, "sliding_window", None),
    }


def _weights_dtype(model: nn.Module) -> mx.Dtype:
    from mlx.utils import tree_flatten

    for _, p in tree_flatten(model.parameters()):
        if mx.issubdtype(p.dtype, mx.floating):
            return p.dtype
    return mx.float32
