"""What mlx-lm needs and lacks, in one place: the config.json keys it reads that a transformers 5 config
may lack (`mlx_config`), `layer_types` / `sliding_window` as transformers reads them, which model types
have a plain head or attend a quantized cache, a check that mlx-lm built the layers the config says, and
hidden-state recording (mlx-lm models return none: the recorded layers' classes are swapped while a
forward runs)."""

from __future__ import annotations

import dataclasses
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

from engine.geometry import (
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    MAMBA,
    MAMBA2,
    PARALLEL_MAMBA2,
    SLIDING_ATTENTION,
    STATELESS,
    Geometry,
    UnsupportedConfigError,
    UnsupportedModelError,
)

# Model types whose mlx-lm `Model.__call__` is `head(model.model(...))`: prefill computes the head for
# the last position only. Others get the full logits (correct, slower for large vocabularies).
PLAIN_HEAD = frozenset({"gemma3_text", "qwen3", "qwen2", "llama", "mistral", "deepseek_v3", "kimi_k2"})
# Model types whose mlx-lm attention calls `base.scaled_dot_product_attention(..., cache=cache)` on what
# `update_and_fetch` returned: a quantized cache with `bits` / `group_size` is attended quantized there.
QUANTIZED_SDPA = frozenset(
    {"gemma3_text", "qwen3", "qwen2", "llama", "mistral", "qwen3_5", "qwen3_next", "jamba"}
)


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


FINAL_NORMS = ("norm", "norm_f", "final_layernorm")  # the final norm's name (Nemotron-H, Falcon-H1)


@contextmanager
def hidden_states(model: nn.Module, wanted: tuple[int, ...]) -> Iterator[dict[int, mx.array]]:
    """Hidden states of the forwards run inside, as transformers' output_hidden_states numbers them:
    i < n_layers is the input of layer i (0: the embeddings as the layers see them), n_layers the final
    norm's output. mlx-lm models expose none, so the layers' classes are swapped for recording ones."""
    into: dict[int, mx.array] = {}
    inner = (
        getattr(model, "model", None)
        or getattr(model, "backbone", None)  # Nemotron-H
        or getattr(getattr(model, "language_model", None), "model", None)
    )
    layers = getattr(inner, "layers", None)
    norm = next((getattr(inner, n) for n in FINAL_NORMS if n in (inner or {})), None)
    if wanted and (layers is None or norm is None):
        raise NotImplementedError(
            f"the mlx backend cannot return hidden states of {type(model).__module__}: its mlx-lm code has "
            "no model.layers and final norm to record"
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
    `rope_theta`, `rope_local_base_freq` and `rope_scaling`. Every other model: the flat rope keys
    (`_flat_rope`), and the keys of `MAMBA_HYBRIDS` / `LINEAR_HYBRIDS`.
    """
    config = json.loads((path / "config.json").read_text())
    model_type = config.get("model_type")
    if model_type in LINEAR_HYBRIDS:
        return _linear_hybrid_config(path, config)
    if model_type != "gemma3_text":
        rope = config.get("rope_parameters") or {}
        if FULL_ATTENTION in rope:  # one dict per layer type (OLMo 3): mlx-lm reads one rope for all
            if (local := rope.get(SLIDING_ATTENTION)) not in (None, rope[FULL_ATTENTION]):
                raise UnsupportedConfigError(
                    str(model_type),
                    "rope_parameters",
                    rope,
                    "its sliding layers rotate otherwise than its full ones, and mlx-lm's code reads one rope "
                    "for every layer; use the torch backend",
                )
            rope = rope[FULL_ATTENTION]
        extra = _flat_rope(config, rope)
        check_read_fields(config, extra, rope)
        return extra | (_mamba_hybrid_config(config) if model_type in MAMBA_HYBRIDS else {})
    extra = {}
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
    extra.update(_flat_rope(config, full))
    if "rope_local_base_freq" not in config and "rope_theta" in local:
        extra["rope_local_base_freq"] = local["rope_theta"]
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
    if types and LINEAR_ATTENTION not in types:  # its mask code reads layer 0's cache as a linear layer's
        raise UnsupportedConfigError(
            config["model_type"],
            "layer_types",
            types,
            f"mlx-lm's {extra['model_type']} needs a linear_attention layer (with none it builds its masks "
            "from the wrong cache and decodes other tokens than transformers); use the torch backend",
        )
    if types:
        if set(types) - {FULL_ATTENTION, LINEAR_ATTENTION}:
            raise ValueError(
                f"{path}: mlx-lm's {extra['model_type']} has only linear and full attention layers"
            )
        extra["full_attention_interval"] = _pattern(types)
    return extra | _flat_rope(config, config.get("rope_parameters") or {})


def _flat_rope(config: dict[str, Any], rope: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 writes rope settings under `rope_parameters` (`rope`: its dict for the model's
    attention); mlx-lm reads `rope_theta`, `partial_rotary_factor` and `rope_scaling` top level (and
    defaults `rope_theta` per model: Falcon-H1's 1e11)."""
    extra = {k: rope[k] for k in ("rope_theta", "partial_rotary_factor") if k not in config and k in rope}
    if config.get("rope_scaling") is None and rope.get("rope_type", "default") != "default":
        extra["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return extra


INF = {"__float__": "Infinity"}  # how transformers writes float("inf") into config.json
# Mamba hybrids mlx-lm has (transformers model type = mlx-lm module), decoded by the mlx backend: the
# Mamba-2 ones and Jamba (Mamba v1 mixers). mlx-lm has no bamba, zamba or zamba2.
MAMBA_HYBRIDS = ("falcon_h1", "granitemoehybrid", "nemotron_h", "jamba")
# Multi-head latent attention models whose mlx-lm code caches what `Geometry` counts (the latent and the
# rope key, one head per position): mlx-lm's deepseek_v3 (kimi_k2 is remapped to it). Its deepseek_v2
# caches per-head K/V instead; other MLA families are refused on the mlx backend until checked.
MLA_MODELS = ("deepseek_v3", "kimi_k2")


def check_mlx_support(model_type: str, geometry: Geometry) -> None:
    """Refuse at load, in one line, what the mlx backend does not decode: Mamba(-2) mixers and multi-head
    latent attention outside the mlx-lm models checked here (`MAMBA_HYBRIDS`, `MLA_MODELS`), and any
    layer kind `Geometry` knows that this backend has no state for."""
    for kind in dict.fromkeys(geometry.layer_types):
        if kind not in MLX_KINDS:
            raise UnsupportedModelError(model_type, kind, " on the mlx backend (use the torch backend)")
        if kind in (MAMBA, MAMBA2, PARALLEL_MAMBA2, *STATELESS) and model_type not in MAMBA_HYBRIDS:
            raise UnsupportedModelError(
                model_type,
                kind,
                f" on the mlx backend for this model type (mlx-lm's Mamba hybrids decoded: "
                f"{', '.join(MAMBA_HYBRIDS)}; use the torch backend)",
            )
    if geometry.v_head_dim and model_type not in MLA_MODELS:
        raise UnsupportedModelError(
            model_type,
            "multi-head latent attention",
            f" on the mlx backend for this model type (decoded: {', '.join(MLA_MODELS)}; use the torch backend)",
        )


PARTIAL_ROTARY = ("partial_rotary_factor", "rotary_dim", "rope_pct", "rotary_pct", "rotary_emb_base")


def check_read_fields(config: dict[str, Any], extra: dict[str, Any], rope: dict[str, Any]) -> None:
    """Refuse at load, naming the field, a geometry field the model's mlx-lm code does not read (its
    ModelArgs has no such field), where the value would change what the model computes: a partial rotary
    factor (mlx-lm would rotate the whole head: other tokens than transformers, in silence)."""
    from mlx_lm.utils import _get_classes

    try:
        _, args = _get_classes({**config, **extra})
    except ValueError:  # a model type mlx-lm does not have: load_model says so
        return
    names = {f.name for f in dataclasses.fields(args)} if dataclasses.is_dataclass(args) else set()
    factor = config.get("partial_rotary_factor", rope.get("partial_rotary_factor"))
    if names and factor not in (None, 1, 1.0) and not names & set(PARTIAL_ROTARY):
        raise UnsupportedConfigError(
            str(config.get("model_type", "?")),
            "partial_rotary_factor",
            factor,
            f"mlx-lm's {args.__module__.rsplit('.', 1)[-1]} reads no partial rotary factor (it rotates the "
            "whole head) and would decode other tokens than transformers; use the torch backend",
        )


def load_error(model_type: str, config: dict[str, Any], exc: Exception) -> UnsupportedModelError:
    """mlx-lm could not build or load a model from this config and its weights (its code reads fewer config
    fields than transformers'): the one-line refusal, naming the field where the error shows it."""
    text = " ".join(str(exc).split())[:200]
    heads, hidden = config.get("num_attention_heads"), config.get("hidden_size")
    why = f"mlx-lm's code for this model type cannot load it ({text}); use the torch backend"
    if "lm_head" in text:  # a head tied where mlx-lm's code never ties, or the other way round
        tied = bool(config.get("tie_word_embeddings"))
        return UnsupportedConfigError(model_type, "tie_word_embeddings", tied, why)
    head_dim = config.get("head_dim")
    if "Expected shape" in text and head_dim and heads and hidden and head_dim * heads != hidden:
        return UnsupportedConfigError(model_type, "head_dim", head_dim, f"not hidden_size / heads; {why}")
    return UnsupportedModelError(model_type, "weights", f" on the mlx backend: {why}")


MLX_KINDS = (FULL_ATTENTION, SLIDING_ATTENTION, LINEAR_ATTENTION, MAMBA, MAMBA2, PARALLEL_MAMBA2, *STATELESS)


def _mamba_hybrid_config(config: dict[str, Any]) -> dict[str, Any]:
    """What mlx-lm's Mamba hybrids read differently from transformers 5.

    Jamba: transformers gives layer i experts iff i % expert_layer_period == expert_layer_offset, mlx-lm
    iff (i + expert_layer_offset) % expert_layer_period == 0 (the same for the default period 2, offset 1);
    transformers defaults `tie_word_embeddings` to false, mlx-lm to true. (Its routing differs too:
    `engine.backends.mlx.mamba.transformers_routing`.)

    Granite-4.0-H: transformers writes `layer_types` as linear_attention / full_attention, mlx-lm wants
    mamba / attention; transformers applies RoPE only for `position_embedding_type == "rope"`, mlx-lm
    unless it is "nope". Nemotron-H: transformers clamps the SSM time step to (`time_step_min`, inf) in its
    multi-token forward, mlx-lm to `time_step_limit` (mlx-lm runs one forward for blocks and single tokens
    alike, so its blocks and steps agree)."""
    if config["model_type"] == "granitemoehybrid":
        names = {FULL_ATTENTION: "attention", LINEAR_ATTENTION: "mamba"}
        extra = {
            "position_embedding_type": "rope" if config.get("position_embedding_type") == "rope" else "nope"
        }
        if types := config.get("layer_types"):
            extra["layer_types"] = [names.get(t, t) for t in types]
        return extra
    if config["model_type"] == "jamba":
        period = int(config.get("expert_layer_period", 2))
        return {
            "expert_layer_offset": (period - int(config.get("expert_layer_offset", 1))) % period,
            "tie_word_embeddings": bool(config.get("tie_word_embeddings", False)),
        }
    if config["model_type"] == "nemotron_h":
        return {"time_step_limit": (float(config.get("time_step_min", 0.001)), float("inf"))}
    limit = config.get("time_step_limit")  # Falcon-H1: mlx-lm's mixer has (0, inf) built in
    if limit is not None and (limit[0] != 0.0 or limit[1] not in (INF, float("inf"))):
        raise ValueError(
            f"falcon_h1 with time_step_limit {limit}: mlx-lm's falcon_h1 clamps the SSM time step to (0, inf); "
            "use the torch backend"
        )
    return {}


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
