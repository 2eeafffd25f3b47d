"""Multi-head latent attention (DeepSeek-V3 / Kimi-K2 family, `kv_lora_rank`) on torch and on MLX (mlx-lm's
deepseek_v3): the cache holds what the model hands it, one head per position of the normalized latent (K,
kv_lora_rank) and the post-RoPE decoupled key (V, qk_rope_head_dim), so K and V have their own head sizes
under every policy (full, sink_window, hybrid, quantized); greedy equals transformers `generate` with a
covering window, the bytes reported are the bytes stored, and speculative decoding (a model drafter, prompt
lookup, a random block drafter reading its hidden states, a random masked-diffusion drafter) equals greedy
after the window wraps, with exact rollback. The tiny torch model has a latent of 16
and a rope key of 8; the MLX one 64 and 32 (mx.quantize takes groups of 32, 64 or 128, so its :qN policies
need a group of 32 dividing both). On MLX an MLA family whose mlx-lm code caches something else
(deepseek_v2: per-head K/V) is refused at load in one line."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine
from engine.backends.torch.session import TorchModel
from engine.geometry import UnsupportedModelError
from engine.policy import Policy, expected_kv_bytes, full, hybrid, layer_slot_bytes, parse_policy, sink_window
from tests.engine import tiny_drafters, tiny_families, tiny_models
from tests.engine.backends import HAVE_MLX, on

NEW = 40
DIMS = {"torch": (16, 8), "mlx": (64, 32)}  # (kv_lora_rank, qk_rope_head_dim): K's and V's head sizes
# a narrower copy of the model as drafter: partly wrong
DRAFTER = {"torch": sink_window(1, 3), "mlx": sink_window(4, 4)}
needs_mlx = pytest.mark.skipif(not HAVE_MLX, reason="mlx / mlx-lm not installed")


def _torch(backend: str = "torch") -> Any:
    """The transformers model (the oracle) whose weights `_model(backend)` runs."""
    if backend == "torch":
        return tiny_families.deepseek_v3()
    k, v = DIMS[backend]
    return tiny_families.deepseek_v3(kv_lora_rank=k, qk_rope_head_dim=v)


def _model(backend: str = "torch") -> engine.Model:
    return on(backend, _torch(backend))


@functools.cache
def _greedy(backend: str, policy: Policy, prompt_len: int) -> tuple[int, ...]:
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    session = _model(backend).session(policy, prefill_chunk=8)
    return tuple(engine.generate(session, ids, engine.Stop(NEW)).tokens)


def _one_slot(state: Any) -> int:
    """Bytes one position takes in a layer's buffers, read from the buffers themselves (torch: `k`, `v` or
    the quantized `parts`; mlx: its `state`)."""
    if hasattr(state, "parts"):
        arrays = [t for part in state.parts for t in part]
    else:
        arrays = state.state if hasattr(state, "keys") else [state.k, state.v]
    return sum(t[0, :, 0].nbytes for t in arrays)


def test_geometry_counts_the_latent_and_the_rope_key_as_stored(backend: str) -> None:
    k, v = DIMS[backend]
    geo = _model(backend).geometry
    assert geo.layer_types == ("full_attention",) * 2
    assert (geo.kv_heads, geo.head_dim, geo.value_dim) == (1, k, v)
    assert geo.slot_bytes("float32") == [(k + v) * 4] * 2  # not 2 x heads x (qk_head_dim or v_head_dim)
    session = _model(backend).session(full())
    session.prefill(tiny_models.prompt(5))
    assert session.kv_bytes() == [5 * (k + v) * 4] * 2
    assert all(_one_slot(s) == (k + v) * 4 for s in session.states)


@pytest.mark.parametrize("policy", [full(), sink_window(4, 200), hybrid(2, 8)], ids=str)
@pytest.mark.parametrize("prompt_len", [1, 17])
def test_covering_window_equals_transformers_generate(backend: str, policy: Policy, prompt_len: int) -> None:
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    assert list(_greedy(backend, policy, prompt_len)) == tiny_models.hf_greedy(_torch(backend), ids, NEW)


@needs_mlx
def test_a_bounded_window_decodes_on_mlx_as_on_torch() -> None:
    policy = sink_window(2, 6)
    ids = tiny_models.prompt(17, seed=17)
    torch_twin = engine.generate(_torch("mlx").session(policy, prefill_chunk=8), ids, engine.Stop(NEW)).tokens
    assert list(_greedy("mlx", policy, 17)) == torch_twin
    assert torch_twin != tiny_models.hf_greedy(_torch("mlx"), ids, NEW)  # the window matters


POLICIES = ["sink_window:4:8", "hybrid:2:6", "sink_window:2:6:q8", "sink_window:2:6:k8v4", "full:q4"]


@pytest.mark.parametrize("text", POLICIES)
@pytest.mark.parametrize("k", [1, 4])
def test_speculative_equals_greedy_after_the_window_wraps(backend: str, text: str, k: int) -> None:
    policy = parse_policy(text)
    prompt_len = 17
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    verifier = _model(backend).session(policy, max_block=k + 1, prefill_chunk=8)
    drafter = engine.ModelDrafter(_model(backend).session(DRAFTER[backend], max_block=k + 1))
    gen = engine.speculative_generate(verifier, drafter, ids, k, engine.Stop(NEW))
    assert tuple(gen.tokens) == _greedy(backend, policy, prompt_len)
    assert prompt_len + NEW > 2 + 8  # the window wrapped
    if k > 1:
        assert 0 < gen.accepted < gen.drafted  # blocks were partly rejected: rollback was exercised
    # what is reported is what is stored: the formula, and the buffers' own sizes
    slot = layer_slot_bytes(policy, _model(backend).geometry, "float32")
    assert verifier.kv_bytes() == expected_kv_bytes(verifier.specs, verifier.position, k + 1, slot)
    for state, one in zip(verifier.states, slot, strict=True):
        assert _one_slot(state) == one and state.nbytes == state.group.held() * one


def test_quantized_latent_stays_close_to_the_model_dtype(backend: str) -> None:
    """q8 K/V on the latent and rope key: the first-step logits stay close to the float32 cache's."""
    ids = tiny_models.prompt(24, seed=3)
    logits = [
        np.array(_model(backend).session(p, prefill_chunk=8).prefill(ids, logits=True).logits.tolist())
        for p in (full(), parse_policy("full:q8"))
    ]
    assert np.abs(logits[0] - logits[1]).max() < 0.05 * np.abs(logits[0]).max()


def test_rollback_restores_the_cache_exactly(backend: str) -> None:
    ids = tiny_models.prompt(30, seed=5)
    a = _model(backend).session(sink_window(2, 6), max_block=6, prefill_chunk=8)
    b = _model(backend).session(sink_window(2, 6), max_block=6, prefill_chunk=8)
    a.prefill(ids[:20])
    b.prefill(ids[:22])
    a.forward(ids[20:26])
    a.trim(4)
    la = np.array(a.forward(ids[22:26], logits=True).logits.tolist())
    lb = np.array(b.forward(ids[22:26], logits=True).logits.tolist())
    assert a.position == b.position == 26 and np.abs(la - lb).max() < 1e-4


@pytest.mark.parametrize("text", ["sink_window:2:6", "hybrid:2:6:q8"])
def test_prompt_lookup_drafting_equals_greedy_after_the_window_wraps(backend: str, text: str) -> None:
    """The other drafter kind that needs no second model: prompt lookup on a repetitive prompt."""
    policy = parse_policy(text)
    ids = tiny_models.prompt(10, seed=4) * 3
    greedy = engine.generate(_model(backend).session(policy, prefill_chunk=8), ids, engine.Stop(NEW)).tokens
    verifier = _model(backend).session(policy, max_block=5, prefill_chunk=8)
    gen = engine.speculative_generate(verifier, engine.PromptLookupDrafter(), ids, 4, engine.Stop(NEW))
    assert gen.tokens == greedy and gen.drafted > 0


@pytest.mark.parametrize("kind", tiny_drafters.KINDS)
@pytest.mark.parametrize("text", ["sink_window:2:6", "hybrid:2:6", "sink_window:2:6:q8"])
def test_block_and_diffusion_drafters_equal_greedy_after_the_window_wraps(
    backend: str, text: str, kind: str
) -> None:
    """Random drafters built to the model's shapes (the block drafter reads layer 1 and the final hidden
    state), their blocks given a correct prefix of every length: partly rejected, rolled back exactly."""
    policy = parse_policy(text)
    want = _greedy(backend, policy, 17)
    gen = tiny_drafters.prefixed_generate(
        kind, _model(backend), policy, tiny_models.prompt(17, seed=17), want
    )
    assert tuple(gen.tokens) == want and 0 < gen.accepted < gen.drafted


@needs_mlx
def test_mlx_refuses_a_quantized_cache_no_mx_quantize_group_fits() -> None:
    """The torch-sized latent (16) and rope key (8): no group mx.quantize takes divides both."""
    with pytest.raises(
        ValueError, match="mx.quantize takes groups of 32, 64, 128 values, not 8 .*K and V head sizes"
    ):
        on("mlx", tiny_families.deepseek_v3()).session(parse_policy("full:q8"))


@needs_mlx
def test_mlx_refuses_an_mla_family_caching_per_head_kv_in_one_line(tmp_path: Path) -> None:
    """mlx-lm's deepseek_v2 caches per-head K/V, not the latent `Geometry` counts: refused at load."""
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    from engine.backends.mlx.session import load_mlx

    torch.manual_seed(0)
    config = DeepseekV2Config(
        **tiny_families.TINY,
        **tiny_families.MLA,
        **tiny_families.ROUTED,
        q_lora_rank=None,
    )
    DeepseekV2ForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(
        UnsupportedModelError,
        match=r"^model type 'deepseek_v2': layer kind 'multi-head latent attention' is not supported on the "
        r"mlx backend for this model type \(decoded: deepseek_v3, kimi_k2; use the torch backend\)",
    ) as err:
        load_mlx(tmp_path)
    assert "\n" not in str(err.value)


def _deepseek_module(**overrides: Any) -> Any:
    """A DeepSeek-V3 transformers module (seed 0, no TorchModel around it yet)."""
    import torch
    from transformers import DeepseekV3ForCausalLM

    torch.manual_seed(0)
    module = DeepseekV3ForCausalLM(tiny_families.deepseek_v3_config(**overrides)).eval()
    module.generation_config.eos_token_id = None
    return module


def _hf(module: Any, ids: list[int]) -> list[int]:
    import torch

    with torch.inference_mode():
        out = module.generate(torch.tensor([ids]), max_new_tokens=NEW, do_sample=False, pad_token_id=0)
    return out[0, len(ids) :].tolist()


def test_kv_head_groups_with_v_as_wide_as_qk_decode_as_generate_does() -> None:
    """Issue 44: num_key_value_heads below num_attention_heads with v_head_dim == qk_nope + qk_rope (24).
    transformers' sdpa repeats the already expanded K/V per group; with no mask (generate) it takes
    `enable_gqa` over equal head counts, with the engine's mask it crashed (`size of tensor a (4) must match
    ... (8)`). MLA has one K/V group: the engine now decodes exactly what generate does."""
    module = _deepseek_module(num_key_value_heads=2, v_head_dim=24)
    ids = tiny_models.prompt(17, seed=17)
    want = _hf(module, ids)  # before the engine loads it
    tm = TorchModel(module)
    assert engine.generate(tm.session(full(), prefill_chunk=8), ids, engine.Stop(NEW)).tokens == want
    policy = sink_window(2, 6)
    greedy = engine.generate(tm.session(policy, prefill_chunk=8), ids, engine.Stop(NEW)).tokens
    gen = tiny_drafters.prefixed_generate("block", tm, policy, ids, tuple(greedy))
    assert gen.tokens == greedy and 0 < gen.accepted < gen.drafted  # after the window wrapped


@pytest.mark.parametrize("v_head_dim", [8, 32])
def test_kv_head_groups_decode_as_one_group_does(v_head_dim: int) -> None:
    """With v_head_dim != qk_head_dim and K/V head groups transformers' own generate crashes (it repeats the
    expanded K/V); the weights do not depend on num_key_value_heads, so the oracle is the same weights with
    one group per head, which generate runs."""
    ids = tiny_models.prompt(17, seed=17)
    want = _hf(_deepseek_module(num_key_value_heads=4, v_head_dim=v_head_dim), ids)
    tm = TorchModel(_deepseek_module(num_key_value_heads=1, v_head_dim=v_head_dim))
    assert engine.generate(tm.session(full(), prefill_chunk=8), ids, engine.Stop(NEW)).tokens == want
