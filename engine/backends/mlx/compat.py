"""What mlx-lm needs and lacks, in one place: the config.json keys it reads that a transformers 5 config
may lack (`mlx_config`), `layer_types` / `sliding_window` as transformers reads them, which model types
have a plain head or attend a quantized cache, a check that mlx-lm built the layers the config says, and
hidden-state recording (mlx-lm models return none: the recorded layers' classes are swapped while a
forward runs)."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten
from transformers import AutoConfig

from engine.geometry import FULL_ATTENTION, LINEAR_ATTENTION, SLIDING_ATTENTION

# Model types whose mlx-lm `Model.__call__` is `head(model.model(...))`: prefill computes the head for
# the last position only. Others get the full logits (correct, slower for large vocabularies).
PLAIN_HEAD = frozenset({"gemma3_text", "qwen3", "qwen2", "llama", "mistral"})
# Model types whose mlx-lm attention calls `base.scaled_dot_product_attention(..., cache=cache)` on what
# `update_and_fetch` returned: a quantized cache with `bits` / `group_size` is attended quantized there.
QUANTIZED_SDPA = frozenset({"gemma3_text", "qwen3", "qwen2", "llama", "mistral", "qwen3_5", "qwen3_next"})


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


def check_layer_types(model: nn.Module, layer_types: list[str]) -> None:
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


def transformers_view(path: Path) -> dict[str, Any]:
    """`layer_types` and `sliding_window` as transformers (and so the PyTorch backend) reads them: a
    config class may derive them (e.g. from `use_sliding_window`) rather than store them."""
    text = AutoConfig.from_pretrained(str(path)).get_text_config()
    return {
        "layer_types": getattr(text, "layer_types", None),
        "sliding_window": getattr(text, "sliding_window", None),
    }


def weights_dtype(model: nn.Module) -> mx.Dtype:
    for _, p in tree_flatten(model.parameters()):
        if mx.issubdtype(p.dtype, mx.floating):
            return p.dtype
    return mx.float32
