"""Model geometry, read once from a Hugging Face config: layer kinds, native sliding window, layer count,
K/V heads, head size, hidden size, vocabulary, eos ids and the weights' dtype; for linear-attention layers (gated delta-net: Qwen3.5, Qwen3-Next) the
size of their constant-size convolution and recurrent states.

Both backends and the workloads read a model's shape through `Geometry.from_config` (a config.json
dict, or `PretrainedConfig.to_dict()` of the text config, which also holds keys transformers derives
such as `layer_types` from `use_sliding_window`). The model's layer kinds are read here once
(`layer_kinds`: `layer_types`, Nemotron-H / Zamba2's `layers_block_type`, Jamba's attention period,
Falcon-H1's parallel mixers), and a kind the engine does not handle is refused
here, at load and before any forward, with `UnsupportedModelError`: one line naming the model type, the
layer kind and the kinds the engine supports. No torch or mlx here; `read_geometry` imports transformers only to read a config directory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LINEAR_ATTENTION = "linear_attention"  # gated delta-net: a convolution state and a recurrent state, no K/V
MAMBA2 = "mamba2"  # a Mamba-2 mixer (Nemotron-H, Granite-4.0-H, Bamba): a convolution state and an SSM state
PARALLEL_MAMBA2 = "attention+mamba2"  # attention and a Mamba-2 mixer side by side in one layer (Falcon-H1)
MAMBA = "mamba"  # a Mamba (v1) mixer (Jamba, Zamba): a convolution state and an SSM state
PARALLEL_MAMBA = "attention+mamba"  # Zamba's hybrid layers: (shared) attention, then a Mamba (v1) mixer
# Nemotron-H's blocks with no token mixer (its layers_block_type's mlp / moe): nothing cached
STATELESS = ("mlp_block", "moe_block")
PARALLEL = (PARALLEL_MAMBA2, PARALLEL_MAMBA)  # attention K/V and a recurrent state in one layer
LAYER_KINDS = (FULL_ATTENTION, SLIDING_ATTENTION, LINEAR_ATTENTION, MAMBA2, MAMBA, *PARALLEL, *STATELESS)
RECURRENT = (LINEAR_ATTENTION, MAMBA2, MAMBA)  # constant-size state, no K/V, no positions to hide
STATEFUL = (*RECURRENT, *PARALLEL)  # layers with a recurrent state (rolled back by snapshots)
# transformers' multi-token Mamba (v1) scan starts from a zero state (it takes no initial state): after the
# first forward these layers continue their state only one token per forward (the torch session's rule)
STEPWISE = (MAMBA, PARALLEL_MAMBA)


def attention_kind(kind: str) -> str:
    """The attention a layer of `kind` does (its cache policy and mask): a Falcon-H1 layer's is full."""
    return FULL_ATTENTION if kind in PARALLEL else kind


# Kinds read from configs that the engine does not decode yet (refused at load), with what they are.
OTHER_LINEAR = "linear_attention(not gated delta-net)"  # MiniMax lightning, Kimi delta attention, ...
CROSS_ATTENTION = "cross_attention"  # Mllama: layers that attend to the image (`cross_attention_layers`)
PROMPTED = "prompted_attention"  # CPM-Ant, MVP with prompts: learned prompt positions ahead of every input
OWN_CACHE = "own_cache"  # XLNet's mems, XLM's dict, GPT-1's none: no transformers Cache to hand the K/V to
ALIBI_MASK = "alibi(padding mask)"  # BLOOM, Falcon with alibi: biases built from a 2-D padding mask
DESCRIBED = {
    MAMBA2: "Mamba-2 state-space mixer",
    MAMBA: "Mamba state-space mixer",
    PARALLEL_MAMBA2: "attention beside a Mamba-2 mixer in each layer",
    PARALLEL_MAMBA: "attention beside a Mamba mixer in one layer",
    OTHER_LINEAR: "a linear-attention kernel other than gated delta-net",
    CROSS_ATTENTION: "cross-attention to image features",
    PROMPTED: "attention over learned prompt positions the model prepends to every input",
    OWN_CACHE: "attention that keeps its own past, not a transformers Cache",
    ALIBI_MASK: "ALiBi position biases built from a 2-D padding mask",
}
SUPPORTED = (
    "full_attention, sliding_attention, linear_attention (gated delta-net), mamba2, mamba, attention+mamba2, "
    "attention+mamba, mlp_block, moe_block"
)


class UnsupportedModelError(ValueError):
    """A model the engine cannot decode exactly, found at load (before any forward): one line naming the
    model type, the layer kind and what is supported. The workloads exit 2 on it (engine.workloads.cli)."""

    def __init__(self, model_type: str, kind: str, detail: str = "") -> None:
        what = f" ({DESCRIBED[kind]})" if kind in DESCRIBED else ""
        super().__init__(
            f"model type {model_type!r}: layer kind {kind!r}{what} is not supported{detail} "
            f"(supported: {SUPPORTED})"
        )
        self.model_type, self.kind = model_type, kind


class UnsupportedConfigError(UnsupportedModelError):
    """A config field whose value the engine (or a backend's model code) cannot decode exactly, found at load:
    one line naming the model type, the field and why. An `UnsupportedModelError`, so the workloads exit 2."""

    def __init__(self, model_type: str, field: str, value: Any, why: str) -> None:
        ValueError.__init__(self, f"model type {model_type!r}: {field}={value!r} is not supported: {why}")
        self.model_type, self.kind = model_type, field


def layer_kinds(config: Mapping[str, Any]) -> tuple[str, ...]:
    """Each layer's kind as the config says it, with the mixers transformers names alike told apart: a
    `linear_attention` layer is gated delta-net only with its `linear_num_key_heads`, Mamba-2 with
    `mamba_*` / `ssm_state_size` keys. Without `layer_types`
    (Llama, Mistral) every layer slides when there is a `sliding_window`, else is full attention."""
    types = config.get("layer_types") or config.get("layers_block_type")
    blocks = bool(config.get("layers_block_type"))  # Nemotron-H names its blocks there
    n_layers = int(config["num_hidden_layers"] if "num_hidden_layers" in config or not types else len(types))
    if not types and config.get("attn_layer_period"):  # Jamba: attention every period, else Mamba
        period, offset = int(config["attn_layer_period"]), int(config.get("attn_layer_offset") or 0)
        types = [FULL_ATTENTION if i % period == offset else MAMBA for i in range(n_layers)]
    if not types and "mamba_d_ssm" in config:  # Falcon-H1: both mixers in every layer
        types = [PARALLEL_MAMBA2] * n_layers
    if not types:
        types = [SLIDING_ATTENTION if config.get("sliding_window") else FULL_ATTENTION] * n_layers
    if cross := config.get("cross_attention_layers"):  # Mllama: these layers attend to the image only
        types = [CROSS_ATTENTION if i in cross else t for i, t in enumerate(types)]
    if config.get("prompt_length") and config.get("use_prompt", True):  # CPM-Ant; MVP with use_prompt
        types = [PROMPTED] * n_layers
    mamba = any(str(k).startswith("mamba_") or k == "ssm_state_size" for k in config)
    v1 = "mamba_dt_rank" in config  # Jamba, Zamba: Mamba (v1) mixers (Mamba-2 configs name no dt rank)
    delta = "linear_num_key_heads" in config and "linear_conv_kernel_dim" in config
    linear = (MAMBA if v1 else MAMBA2) if mamba else LINEAR_ATTENTION if delta else OTHER_LINEAR
    out = []
    for t in types:
        t = str(t)
        if t in ("mamba2", LINEAR_ATTENTION):
            t = MAMBA2 if t == "mamba2" else linear
        elif t == "hybrid" and mamba:  # Falcon-H1's, Zamba(2)'s layers_block_type
            t = PARALLEL_MAMBA if v1 else PARALLEL_MAMBA2
        elif f"{t}_block" in STATELESS and blocks:  # Nemotron-H: a block that is only an MLP / MoE
            t = f"{t}_block"
        elif t == "attention":
            t = FULL_ATTENTION
        out.append(t)
    return tuple(out)


ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Geometry:
    layer_types: tuple[str, ...]
    sliding_window: int | None
    kv_heads: int
    head_dim: int  # the head size of what the cache holds as K (MLA: the compressed latent)
    hidden_size: int
    vocab_size: int
    eos_ids: frozenset[int]
    dtype: str  # the config's weights dtype (float32 when it names none or an unknown one)
    # Linear-attention layers (0 without any): convolution channels and kernel, recurrent-state elements.
    linear_conv_dim: int = 0
    linear_conv_kernel: int = 0
    linear_state_size: int = 0
    # The head size of what the cache holds as V when it differs from K's (0: head_dim). Multi-head latent
    # attention (DeepSeek-V2/V3, Kimi-K2, GLM-4.7-Flash, MiniCPM3: a `kv_lora_rank`) hands the cache one head
    # per position: the normalized latent (kv_lora_rank) as K and the decoupled post-RoPE key
    # (qk_rope_head_dim) as V, and expands them to per-head K and V after the cache, so that is what is stored.
    v_head_dim: int = 0
    # ALiBi (BLOOM, MPT, Falcon with alibi): the model biases each key by its index in the attended keys,
    # not by its position, so a ring buffer (which reorders the keys) changes the model's output.
    alibi: bool = False

    @property
    def value_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def n_layers(self) -> int:
        return len(self.layer_types)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], eos: int | list[int] | None = None) -> Geometry:
        """From a text config's keys; `eos` (a generation config's eos_token_id) overrides the config's.

        Without `layer_types` (Llama, Mistral) every layer slides when there is a `sliding_window`, else
        every layer is full attention, as transformers reads such configs."""
        model_type = str(config.get("model_type") or "?")
        try:
            return cls._from_config(config, eos, model_type)
        except KeyError as exc:  # a config without the keys of a decoder the engine knows
            raise UnsupportedModelError(
                model_type, "unknown", f": its config has no {exc.args[0]!r}"
            ) from None

    @classmethod
    def _from_config(cls, config: Mapping[str, Any], eos: Any, model_type: str) -> Geometry:
        window = config.get("sliding_window")
        types = layer_kinds(config)
        n_layers = int(config.get("num_hidden_layers") or len(types))
        if len(types) != n_layers:
            raise ValueError(f"the config lists {len(types)} layer_types for {n_layers} layers")
        for t in types:
            if t not in LAYER_KINDS:
                raise UnsupportedModelError(model_type, t)
        if SLIDING_ATTENTION in types and not window:
            raise ValueError("a sliding_attention layer needs the model's sliding_window in its config")
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        eos = config.get("eos_token_id") if eos is None else eos
        dtype = str(config.get("dtype") or config.get("torch_dtype") or "float32").removeprefix("torch.")
        linear = {}
        if (
            MAMBA2 in types or PARALLEL_MAMBA2 in types
        ):  # Mamba-2: conv over x, B and C; SSM state heads x head_dim x d_state

            def first(*keys: str) -> int:  # the key this family names it by
                for k in keys:
                    if config.get(k):
                        return int(config[k])
                raise KeyError(keys[0])

            m_heads = first("mamba_n_heads", "mamba_num_heads", "n_mamba_heads")  # the last: Zamba2's names
            head = first("mamba_d_head", "mamba_head_dim", "mamba_headdim")
            groups = first("mamba_n_groups", "n_groups", "mamba_ngroups")
            state = first("mamba_d_state", "ssm_state_size")
            linear = {
                "linear_conv_dim": m_heads * head + 2 * groups * state,
                "linear_conv_kernel": first("mamba_d_conv", "conv_kernel"),
                "linear_state_size": m_heads * head * state,
            }
        elif (
            MAMBA in types or PARALLEL_MAMBA in types
        ):  # Mamba (v1): conv over x (expand x hidden channels); SSM state channels x d_state
            channels = int(config["mamba_expand"]) * hidden
            linear = {
                "linear_conv_dim": channels,
                "linear_conv_kernel": int(config["mamba_d_conv"]),
                "linear_state_size": channels * int(config["mamba_d_state"]),
            }
        elif LINEAR_ATTENTION in types:
            k_heads, v_heads = int(config["linear_num_key_heads"]), int(config["linear_num_value_heads"])
            k_dim, v_dim = int(config["linear_key_head_dim"]), int(config["linear_value_head_dim"])
            linear = {
                "linear_conv_dim": 2 * k_heads * k_dim + v_heads * v_dim,
                "linear_conv_kernel": int(config["linear_conv_kernel_dim"]),
                "linear_state_size": v_heads * k_dim * v_dim,
            }
        kv_heads = int(config.get("num_key_value_heads") or heads)
        _check_heads(model_type, config, heads, kv_heads)
        head_dim, v_head_dim = int(config.get("head_dim") or hidden // heads), 0
        if config.get("kv_lora_rank"):  # multi-head latent attention: the latent and the rope key, one head
            kv_heads, head_dim = 1, int(config["kv_lora_rank"])
            v_head_dim = int(config["qk_rope_head_dim"])
        if (
            window is not None
            and (not isinstance(window, int) or window < 1)
            and types.count(SLIDING_ATTENTION)
        ):
            raise UnsupportedConfigError(
                model_type, "sliding_window", window, "a sliding window is a whole number >= 1"
            )
        return cls(
            layer_types=types,
            sliding_window=int(window) if window else None,
            kv_heads=kv_heads,
            head_dim=head_dim,
            v_head_dim=v_head_dim,
            alibi=bool(
                model_type == "bloom"
                or config.get("alibi")
                or isinstance(attn := config.get("attn_config"), Mapping)
                and attn.get("alibi")
            ),
            hidden_size=hidden,
            vocab_size=int(config["vocab_size"]),
            eos_ids=frozenset([eos] if isinstance(eos, int) else (eos or [])),
            dtype=dtype if dtype in ITEMSIZE else "float32",
            **linear,
        )

    def slot_bytes(self, dtype: str) -> list[int]:
        """K and V bytes of one position (batch 1), per layer (0 for linear-attention layers)."""
        slot = self.kv_heads * (self.head_dim + self.value_dim) * ITEMSIZE[dtype]
        return [0 if t in RECURRENT or t in STATELESS else slot for t in self.layer_types]

    def state_bytes(self, dtype: str) -> list[int]:
        """Constant-size state bytes (batch 1), per layer: for a linear-attention layer its recurrent state
        (float32, as both transformers' and mlx-lm's gated delta-net kernels keep it) plus its convolution
        state (the last kernel - 1 inputs, in the model's dtype); 0 for attention layers."""
        one = (
            4 * self.linear_state_size
            + (self.linear_conv_kernel - 1) * self.linear_conv_dim * ITEMSIZE[dtype]
        )
        return [one if t in STATEFUL else 0 for t in self.layer_types]


def _check_heads(model_type: str, config: Mapping[str, Any], heads: int, kv_heads: int) -> None:
    """What `Geometry` assumes of the head counts, checked (one line naming the field): K/V heads that
    divide the query heads (multi-head latent attention expands its latent to every head: any count)."""
    if heads < 1:
        raise UnsupportedConfigError(model_type, "num_attention_heads", heads, "a model needs a query head")
    if not config.get("kv_lora_rank") and (kv_heads < 1 or heads % kv_heads):
        raise UnsupportedConfigError(
            model_type, "num_key_value_heads", kv_heads, f"K/V heads must divide the {heads} query heads"
        )


def config_dict(config: Any) -> dict[str, Any]:
    """A transformers config's keys under the standard names as well (GPT-2's `n_layer` also as
    `num_hidden_layers`: its `attribute_map`), which `Geometry.from_config` reads."""
    out = dict(config.to_dict())
    for standard in getattr(config, "attribute_map", {}) or {}:
        if standard not in out and (value := getattr(config, standard, None)) is not None:
            out[standard] = value
    return out


def read_geometry(path: Path) -> Geometry:
    """A model directory's geometry as transformers reads its config (no weights loaded)."""
    from transformers import AutoConfig, GenerationConfig  # needed only to read a directory

    config = AutoConfig.from_pretrained(str(path))
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    try:
        eos = GenerationConfig.from_pretrained(str(path)).eos_token_id
    except OSError:
        eos = None
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return Geometry.from_config({**config_dict(text), "dtype": dtype}, eos)
