"""Random-weight tiny models of the families issue 32 is about (float32, built from transformers' own
configs, cached per process): a DeepSeek-V3 (multi-head latent attention: K of 16 + 8 rope dims, V of 8),
Mamba-2 hybrids (Falcon-H1: attention beside a Mamba-2 mixer in every layer; Bamba and Granite-4.0-H:
Mamba-2 layers beside attention layers; Zamba2: Mamba-2 beside a shared attention block) and the
Mamba (v1) hybrids Jamba and Zamba."""

from __future__ import annotations

import functools
from typing import Any

import torch

from engine.backends.torch.session import TorchModel
from tests.engine.tiny_models import TOKENS, WIDTH

# The tiny models' tokens and width (tests/engine/tiny_models.py), 2 layers; each family sets its K/V heads.
TINY = dict(**TOKENS, **WIDTH, num_hidden_layers=2)

# Multi-head latent attention (DeepSeek V2/V3): a K/V latent of 16, K heads of 16 + 8 rope dims, V heads of 8.
MLA = dict(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=8)
# DeepSeek-style routed experts (DeepSeek V2/V3, Nemotron-H): 4 of width 32, 2 per token, in one group.
ROUTED = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_group=1, topk_group=1)


def _config(cls: Any, overrides: dict[str, Any], **kwargs: Any) -> object:
    """`cls(**kwargs)` with `overrides` (config keys a test changes, e.g. wider heads) taking precedence."""
    return cls(**{**kwargs, **overrides})


def deepseek_v3_config(**overrides: Any) -> object:
    from transformers import DeepseekV3Config

    return _config(
        DeepseekV3Config,
        overrides,
        **TINY,
        **MLA,
        **ROUTED,
        num_key_value_heads=4,
        q_lora_rank=32,
        first_k_dense_replace=1,
    )


def falcon_h1_config(**overrides: Any) -> object:
    from transformers import FalconH1Config

    return _config(
        FalconH1Config,
        overrides,
        **TINY,
        num_key_value_heads=2,
        head_dim=16,
        mamba_d_ssm=64,
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_n_groups=1,
        mamba_d_state=16,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=16,
    )


@functools.cache
def deepseek_v3(seed: int = 0, **overrides: Any) -> TorchModel:
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(deepseek_v3_config(**overrides))
    model.generation_config.eos_token_id = None
    return TorchModel(model)


@functools.cache
def falcon_h1_module(seed: int = 0) -> torch.nn.Module:
    from transformers import FalconH1ForCausalLM

    torch.manual_seed(seed)
    model = FalconH1ForCausalLM(falcon_h1_config())
    model.generation_config.eos_token_id = None
    return model


MAMBA2_TINY = dict(
    mamba_n_heads=4,
    mamba_d_head=32,  # heads x head = expand x hidden
    mamba_expand=2,
    mamba_n_groups=1,
    mamba_d_state=16,
    mamba_d_conv=4,
    mamba_chunk_size=16,
)


def bamba_config(**overrides: Any) -> object:
    """Bamba (IBM): Mamba-2 layers 0 and 2, attention layers 1 and 3."""
    from transformers import BambaConfig

    return _config(
        BambaConfig,
        overrides,
        **{**TINY, "num_hidden_layers": 4},
        num_key_value_heads=2,
        attn_layer_indices=[1, 3],
        **MAMBA2_TINY,
    )


def granite_hybrid_config(**overrides: Any) -> object:
    """Granite-4.0-H (`granitemoehybrid`): Mamba-2 x3 then attention, MoE MLPs."""
    from transformers import GraniteMoeHybridConfig

    return _config(
        GraniteMoeHybridConfig,
        overrides,
        **{**TINY, "num_hidden_layers": 4},
        num_key_value_heads=2,
        layer_types=["mamba", "mamba", "mamba", "attention"],
        num_local_experts=4,
        num_experts_per_tok=2,
        **MAMBA2_TINY,
    )


def nemotron_h_config(**overrides: Any) -> object:
    """Nemotron-H: Mamba-2, MoE (no mixer), attention, MLP (no mixer)."""
    from transformers import NemotronHConfig

    tiny = {k: v for k, v in TINY.items() if k != "num_hidden_layers"}  # from layers_block_type
    return _config(
        NemotronHConfig,
        overrides,
        **tiny,
        num_key_value_heads=2,
        head_dim=16,
        layers_block_type=["linear_attention", "moe", "full_attention", "mlp"],
        mamba_num_heads=4,
        mamba_head_dim=32,
        n_groups=1,
        ssm_state_size=16,
        conv_kernel=4,
        chunk_size=16,
        **ROUTED,
        moe_shared_expert_intermediate_size=32,
    )


# Zamba and Zamba2: Mamba layers 0, 2; hybrid layers 1, 3 (the shared attention block, then a Mamba mixer)
ZAMBA_TINY = dict(
    **{**TINY, "num_hidden_layers": 4},
    num_key_value_heads=4,
    layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
    mamba_d_conv=4,
    mamba_expand=2,
)


def zamba_config(**overrides: Any) -> object:
    """Zamba: Mamba (v1) mixers of 2 heads."""
    from transformers import ZambaConfig

    return _config(ZambaConfig, overrides, **ZAMBA_TINY, n_mamba_heads=2, mamba_d_state=8, mamba_dt_rank=8)


def zamba2_config(**overrides: Any) -> object:
    """Zamba2: Mamba-2 mixers."""
    from transformers import Zamba2Config

    return _config(
        Zamba2Config,
        overrides,
        **ZAMBA_TINY,
        n_mamba_heads=4,
        mamba_d_state=16,
        mamba_ngroups=1,
        chunk_size=16,
    )


@functools.cache
def mamba2_hybrid(name: str, seed: int = 0, **overrides: Any) -> TorchModel:
    """A tiny Mamba hybrid by model type: the Mamba-2 ones (bamba, granitemoehybrid, falcon_h1,
    nemotron_h, zamba2) and those with Mamba (v1) mixers (jamba, zamba)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = {
        "bamba": bamba_config,
        "granitemoehybrid": granite_hybrid_config,
        "falcon_h1": falcon_h1_config,
        "nemotron_h": nemotron_h_config,
        "zamba2": zamba2_config,
        "jamba": jamba_config,
        "zamba": zamba_config,
    }[name](**overrides)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model.generation_config.eos_token_id = None
    return TorchModel(model)


def jamba_config(**overrides: Any) -> object:
    """Jamba: a Mamba (v1) layer, then an attention layer with a mixture-of-experts MLP."""
    from transformers import JambaConfig

    return _config(
        JambaConfig,
        overrides,
        **{**TINY, "num_hidden_layers": 2},
        num_key_value_heads=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        num_experts=2,
        num_experts_per_tok=1,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=8,
    )
