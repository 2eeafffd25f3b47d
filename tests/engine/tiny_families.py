"""Random-weight tiny models of the families issue 32 is about (float32, built from transformers' own
configs, cached per process): a DeepSeek-V3 (multi-head latent attention: K of 16 + 8 rope dims, V of 8)
and a Falcon-H1 (attention beside a Mamba-2 mixer in every layer)."""

from __future__ import annotations

import functools

import torch

from engine.backends.torch.session import TorchModel
from tests.engine.tiny_models import VOCAB

TINY = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    initializer_range=0.2,
    max_position_embeddings=4096,
    pad_token_id=0,
    eos_token_id=None,
    bos_token_id=None,
)


def deepseek_v3_config() -> object:
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        **TINY,
        num_key_value_heads=4,
        kv_lora_rank=16,
        q_lora_rank=32,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=8,
        moe_intermediate_size=32,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
    )


def falcon_h1_config() -> object:
    from transformers import FalconH1Config

    return FalconH1Config(
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
def deepseek_v3(seed: int = 0) -> TorchModel:
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(deepseek_v3_config())
    model.generation_config.eos_token_id = None
    return TorchModel(model)


@functools.cache
def falcon_h1_module(seed: int = 0) -> torch.nn.Module:
    from transformers import FalconH1ForCausalLM

    torch.manual_seed(seed)
    model = FalconH1ForCausalLM(falcon_h1_config())
    model.generation_config.eos_token_id = None
    return model
