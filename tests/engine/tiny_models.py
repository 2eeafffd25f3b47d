"""Random-weight tiny models for the engine tests (float32, built from configs, cached per process)."""

from __future__ import annotations

import functools

import torch

from engine.backends.torch.session import TorchModel

VOCAB = 256
# The tiny models' width: hidden 64, 4 query heads; 0.2 for varied greedy output.
WIDTH = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, initializer_range=0.2)
# Their attention: WIDTH, 2 K/V heads of 16.
ATTENTION = dict(**WIDTH, num_key_value_heads=2, head_dim=16)
# Their vocabulary and positions: no EOS or BOS (generate() must not stop early), pad 0.
TOKENS = dict(
    vocab_size=VOCAB, max_position_embeddings=4096, eos_token_id=None, bos_token_id=None, pad_token_id=0
)
# The tiny linear-attention hybrids' geometry (Qwen3.5, Qwen3-Next): ATTENTION, and gated delta-net layers
# with 2 key and 4 value heads of 16 and a 4-tap convolution.
LINEAR_HYBRID = dict(
    **ATTENTION,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,
    linear_conv_kernel_dim=4,
)

torch.set_num_threads(1)


def _randomize_norms(model: torch.nn.Module) -> None:
    # Gemma's RMSNorm scales by (1 + w) with w = 0: random w gives varied greedy output.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.5)


@functools.cache
def gemma(
    seed: int = 0,
    sliding_window: int = 16,
    layers: int = 4,
    attn: str = "sdpa",
    head_dim: int = 16,
    vocab: int = VOCAB,
) -> TorchModel:
    """A Gemma3 with alternating sliding / full layers."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        **{**TOKENS, **ATTENTION, "vocab_size": vocab, "head_dim": head_dim},
        num_hidden_layers=layers,
        sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"] * (layers // 2),
        tie_word_embeddings=False,
    )
    config._attn_implementation = attn
    model = Gemma3ForCausalLM(config)
    _randomize_norms(model)
    return _wrap(model)


@functools.cache
def qwen(seed: int = 0, layers: int = 2) -> TorchModel:
    """A Qwen3 with full-attention layers only."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(**TOKENS, **ATTENTION, num_hidden_layers=layers)
    return _wrap(Qwen3ForCausalLM(config))


@functools.cache
def mistral(seed: int = 0) -> TorchModel:
    """A Mistral: no `layer_types`, every layer slides (window 12)."""
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(seed)
    config = MistralConfig(**TOKENS, **ATTENTION, num_hidden_layers=2, sliding_window=12)
    return _wrap(MistralForCausalLM(config))


def _wrap(model: torch.nn.Module) -> TorchModel:
    model.generation_config.eos_token_id = None  # generate() must not stop early: no EOS in these tests
    return TorchModel(model)


def prompt(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=g).tolist()


def hf_greedy(tm: TorchModel, ids: list[int], new: int) -> list[int]:
    """transformers `generate`, greedy, full cache: the oracle of invariant (a)."""
    with torch.inference_mode():
        out = tm.model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, pad_token_id=0)
    return out[0, len(ids) :].tolist()


@functools.cache
def qwen35(seed: int = 0, layers: int = 4) -> TorchModel:
    """A Qwen3.5 (`qwen3_5_text`): gated delta-net linear-attention layers x3, then a full-attention layer."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(**TOKENS, **LINEAR_HYBRID, num_hidden_layers=layers, tie_word_embeddings=False)
    return _wrap(Qwen3_5ForCausalLM(config))


@functools.cache
def qwen3_next(seed: int = 0) -> TorchModel:
    """A Qwen3-Next (`qwen3_next`): gated delta-net layers x3, then full attention; sparse MoE MLPs."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    config = Qwen3NextConfig(
        **TOKENS,
        **LINEAR_HYBRID,
        num_hidden_layers=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        tie_word_embeddings=False,
    )
    return _wrap(Qwen3NextForCausalLM(config))


@functools.cache
def gemma4(seed: int = 0, sliding_window: int = 8, vocab: int = VOCAB) -> TorchModel:
    """A Gemma 4 text model: 6 layers alternating sliding / full, the last 2 reusing the K/V of layers
    2 (sliding) and 3 (full), per-layer input embeddings on."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    torch.manual_seed(seed)
    config = Gemma4TextConfig(
        **{**TOKENS, **ATTENTION, "vocab_size": vocab},
        num_hidden_layers=6,
        global_head_dim=16,
        sliding_window=sliding_window,
        layer_types=["sliding_attention", "full_attention"] * 3,
        num_kv_shared_layers=2,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=vocab,
    )
    config._attn_implementation = "sdpa"
    model = Gemma4ForCausalLM(config)
    _randomize_norms(model)
    return _wrap(model)


@functools.cache
def gemma4_assistant(seed: int = 1, sliding_window: int = 8, vocab: int = VOCAB) -> torch.nn.Module:
    """A Gemma 4 assistant for `gemma4()`: 2 layers (sliding, full) reading its K/V (same kv heads and
    head_dim), hidden size 32, backbone hidden size 64."""
    from transformers import Gemma4AssistantConfig

    from engine.drafters.gemma4_assistant.torch import assistant_model

    torch.manual_seed(seed)
    text = {
        "model_type": "gemma4_text",
        "vocab_size": vocab,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 16,
        "sliding_window": sliding_window,
        "layer_types": ["sliding_attention", "full_attention"],
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 0,
        "initializer_range": 0.2,
        "pad_token_id": 0,
    }
    config = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=64)
    config._attn_implementation = "sdpa"
    config.text_config._attn_implementation = "sdpa"
    model = assistant_model(config)
    _randomize_norms(model)
    return model
