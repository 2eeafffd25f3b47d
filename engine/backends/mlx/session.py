"""The MLX session: an mlx-lm model (`MLXModel`, `load_mlx`) plus the policy cache (the same slot layout as the PyTorch backend).

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
kinds from `full_attention_interval`, which `mlx_config` derives from `layer_types`. Mamba-2 mixers
(falcon_h1, granitemoehybrid, nemotron_h) and Jamba's Mamba (v1) mixers get the same kind of state (`engine/backends/mlx/mamba.py`);
multi-head latent attention (deepseek_v3) needs nothing of its own: mlx-lm hands `update_and_fetch` the
latent as K and the rope key as V, which `KV` stores with their own head sizes.
"""

from __future__ import annotations

import math
import platform
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.utils import load_config, load_model
from transformers import AutoTokenizer

from engine.backends.base import BaseSession, Tokenized
from engine.backends.mlx.compat import (
    PLAIN_HEAD,
    QUANTIZED_SDPA,
    check_layer_types,
    check_mlx_support,
    hidden_states,
    load_error,
    mlx_config,
    transformers_view,
    weights_dtype,
)
from engine.backends.mlx.device import pick_device, pick_dtype
from engine.backends.mlx.kv import KV, GroupArrays
from engine.backends.mlx.linear import DeltaNetState
from engine.backends.mlx.mamba import mixer_states, transformers_routing
from engine.backends.mlx.quant import QuantizedKV
from engine.cache import Forward
from engine.decode import BatchStep, Step
from engine.geometry import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    Geometry,
    UnsupportedConfigError,
    read_geometry,
)
from engine.policy import Policy, full


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
        check_layer_types(model, self.layer_types)

    @property
    def dtype(self) -> mx.Dtype:
        """The input embedding's dtype (Nemotron-H: `backbone.embeddings`)."""
        inner = getattr(self.model, "model", None) or getattr(self.model, "backbone", None)
        embed = getattr(inner, "embed_tokens", None) or getattr(inner, "embeddings", None)
        return mx.float32 if embed is None else embed.weight.dtype

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

    def check_masks(self) -> None:
        """At load: a model with several attention layer kinds must ask each kind's layers for their own
        mask (mlx-lm's code may build one mask for all, ignoring the config's layer_types, and would then
        decode other tokens than transformers): one 2-token forward over a throwaway session."""
        kinds = {t for t in self.layer_types if t in (FULL_ATTENTION, SLIDING_ATTENTION)}
        if len(kinds) < 2:
            return
        try:
            self.session(full()).prefill([0, 0])
        except ValueError as exc:  # _call's or make_mask's: the layers are grouped otherwise
            raise UnsupportedConfigError(
                self.model_type,
                "layer_types",
                list(self.layer_types),
                "mlx-lm's code for this model type does not build a mask per layer kind as these layer_types "
                f"say ({' '.join(str(exc).split())[:120]}); use the torch backend",
            ) from None

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


class MLXSession(BaseSession):
    """One policy cache on an MLXModel: the `engine.decode.Session` interface."""

    def __init__(
        self, model: MLXModel, policy: Policy, max_block: int = 1, prefill_chunk: int = 512, rows: int = 1
    ) -> None:
        super().__init__(model.geometry, policy, max_block, prefill_chunk, rows)
        self.owner = model
        self.arrays = [GroupArrays(g, model.sliding_window) for g in self.groups]
        arrays_of = {id(a.group): a for a in self.arrays}
        bits, geo = policy.bits, model.geometry
        group = policy.group_for(math.gcd(geo.head_dim, geo.value_dim)) if bits else 0  # divides K's and V's
        states = [
            DeltaNetState()
            if g is None
            else KV(arrays_of[id(g)], i)
            if bits is None
            else QuantizedKV(arrays_of[id(g)], i, bits, group, model.model_type in QUANTIZED_SDPA)
            for i, g in enumerate(self.group_of)
        ]
        self.states, self.cache = mixer_states(geo.layer_types, states)  # Mamba-2 hybrids

    @property
    def on_cpu(self) -> bool:
        return self.owner.device.type == mx.cpu

    def _join_refusal(self) -> str | None:
        if not all(type(s) is KV for s in self.states):
            return "quantized K/V (:qN policies) or layers without K/V"
        return None

    def _joined(self, other: BaseSession) -> None:
        assert isinstance(other, MLXSession)
        for a in self.arrays:  # the mirror is copied from the host table on the next forward
            a.stale = True
        with mx.stream(self.owner.device):
            for s, o in zip(self.states, other.states, strict=True):
                s.join(o)

    def _dropped(self, slots: list[list[list[int]] | None]) -> None:
        for a, dropped in zip(self.arrays, slots, strict=True):
            a.drop(dropped)

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

    def _run_rows(
        self, ids: list[list[int]], forwards: list[Forward], logits: bool, hidden: tuple[int, ...]
    ) -> BatchStep:
        with mx.stream(self.owner.device), hidden_states(self.owner.model, hidden) as states:
            out = self._call(ids, forwards, None)
            tokens = mx.argmax(out, axis=-1)
            kept = {i: states[i] for i in hidden}
            mx.eval(tokens, [c.state for c in self.cache], list(kept.values()), out if logits else [])
        return BatchStep(tokens.tolist(), out if logits else None, kept)  # type: ignore[arg-type]

    def _kept(self, rows: list[int]) -> None:
        index = mx.array(rows)
        for a in self.arrays:
            a.keep_rows(index)
        for s in self.states:
            s.keep_rows(index)


def load_mlx(path: Path, dtype: str = "auto", device: str = "auto", compile: bool | str = False) -> MLXModel:
    """Load an mlx-lm model to run on `device` (checked before the weights load) in `dtype`."""
    if compile:
        raise ValueError(
            "compile is not supported on the mlx backend: the policy cache updates its buffers from Python "
            "inside the forward, which mx.compile cannot trace; run without compile"
        )
    dev = pick_device(device)
    want = pick_dtype(dtype, dev)
    # a kind the engine does not handle: UnsupportedModelError, before mlx-lm reads the model
    config = load_config(path)
    model_type = str(config.get("model_type", "?"))
    check_mlx_support(model_type, read_geometry(path))
    extra = mlx_config(path)
    try:
        model, _ = load_model(path, model_config=extra)
    except (
        ValueError,
        TypeError,
    ) as exc:  # mlx-lm builds the model from fewer config fields than transformers
        raise load_error(model_type, config, exc) from None
    transformers_routing(model)  # Jamba
    if want != mx.float32 or weights_dtype(model) != mx.float32:
        model.set_dtype(want)
    config = {**load_config(path), **extra, **transformers_view(path)}
    has_tokenizer = any(
        (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
    )
    tokenizer = AutoTokenizer.from_pretrained(str(path)) if has_tokenizer else None
    out = MLXModel(model, config, tokenizer, path)
    out.device = dev
    out.check_masks()
    return out
