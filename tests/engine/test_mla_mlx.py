"""Multi-head latent attention on MLX (mlx-lm's deepseek_v3): the cache holds what mlx-lm hands it, one
head per position of the normalized latent (K, kv_lora_rank) and the post-RoPE decoupled key (V,
qk_rope_head_dim), as on torch (tests/engine/test_mla.py). The tiny DeepSeek-V3 here has a latent and a
rope key of 32 each (mx.quantize takes groups of 32, 64 or 128, so the :qN policies need a group of 32 that
divides both). MLX greedy equals transformers `generate` with a covering window and the torch engine under
a bounded one; speculative decoding (a model drafter, prompt lookup) equals MLX greedy after the window
wraps under every policy, with exact rollback; the bytes reported are the bytes stored. An MLA family whose
mlx-lm code caches something else (deepseek_v2: per-head K/V) is refused at load in one line."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlx_lm")

import engine  # noqa: E402
from engine.backends.mlx.session import load_mlx  # noqa: E402
from engine.geometry import UnsupportedModelError  # noqa: E402
from engine.policy import (  # noqa: E402
    Policy,
    expected_kv_bytes,
    full,
    hybrid,
    layer_slot_bytes,
    parse_policy,
    sink_window,
)
from tests.engine import tiny_families, tiny_models  # noqa: E402
from tests.engine.backends import mlx_twin  # noqa: E402

NEW = 40
WIDE = {"kv_lora_rank": 32, "qk_rope_head_dim": 32}  # K and V head sizes of 32: mx.quantize's smallest group


def _torch() -> engine.Model:
    return tiny_families.deepseek_v3(**WIDE)


def _model() -> engine.Model:
    return mlx_twin(_torch())


@functools.cache
def _greedy(policy: Policy, prompt_len: int) -> tuple[int, ...]:
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    return tuple(engine.generate(_model().session(policy, prefill_chunk=8), ids, engine.Stop(NEW)).tokens)


def test_the_cache_stores_the_latent_and_the_rope_key() -> None:
    geo = _model().geometry
    assert geo.layer_types == ("full_attention",) * 2
    assert (geo.kv_heads, geo.head_dim, geo.value_dim) == (1, 32, 32)
    session = _model().session(full())
    session.prefill(tiny_models.prompt(5))
    for state in session.states:
        assert state.keys.shape[1::2] == (1, 32) and state.values.shape[1::2] == (1, 32)
    assert session.kv_bytes() == [5 * (32 + 32) * 4] * 2  # not 2 x heads x (qk_head_dim or v_head_dim)


@pytest.mark.parametrize("policy", [full(), sink_window(4, 200), hybrid(2, 8)], ids=str)
@pytest.mark.parametrize("prompt_len", [1, 17])
def test_covering_window_equals_transformers_generate(policy: Policy, prompt_len: int) -> None:
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    assert list(_greedy(policy, prompt_len)) == tiny_models.hf_greedy(_torch(), ids, NEW)


def test_a_bounded_window_decodes_as_on_torch() -> None:
    policy = sink_window(2, 6)
    ids = tiny_models.prompt(17, seed=17)
    want = engine.generate(_torch().session(policy, prefill_chunk=8), ids, engine.Stop(NEW)).tokens
    assert list(_greedy(policy, 17)) == want
    assert want != tiny_models.hf_greedy(_torch(), ids, NEW)  # the window matters


POLICIES = ["sink_window:4:8", "hybrid:2:6", "sink_window:2:6:q8", "sink_window:2:6:k8v4", "full:q4"]


@pytest.mark.parametrize("text", POLICIES)
@pytest.mark.parametrize("k", [1, 4])
def test_speculative_equals_greedy_after_the_window_wraps(text: str, k: int) -> None:
    policy = parse_policy(text)
    ids = tiny_models.prompt(17, seed=17)
    verifier = _model().session(policy, max_block=k + 1, prefill_chunk=8)
    drafter = engine.ModelDrafter(_model().session(sink_window(4, 4), max_block=k + 1))  # partly wrong
    gen = engine.speculative_generate(verifier, drafter, ids, k, engine.Stop(NEW))
    assert tuple(gen.tokens) == _greedy(policy, 17)
    assert 17 + NEW > 2 + 8  # the window wrapped
    if k > 1:
        assert 0 < gen.accepted < gen.drafted  # blocks were partly rejected: rollback was exercised
    # what is reported is what is stored: the formula, and the buffers' own sizes
    slot = layer_slot_bytes(policy, _model().geometry, "float32")
    assert verifier.kv_bytes() == expected_kv_bytes(verifier.specs, verifier.position, k + 1, slot)
    for state in verifier.states:
        one = sum(t[0, :, 0].nbytes for t in state.state)  # K and V (codes, scales, biases) of one slot
        assert state.nbytes == state.group.held() * one
        assert one == slot[0]


def test_quantized_latent_stays_close_to_the_model_dtype() -> None:
    """q8 K/V on the latent and rope key: the first-step logits stay close to the float32 cache's."""
    ids = tiny_models.prompt(24, seed=3)
    logits = [
        np.array(_model().session(p, prefill_chunk=8).prefill(ids, logits=True).logits.tolist())
        for p in (full(), parse_policy("full:q8"))
    ]
    assert np.abs(logits[0] - logits[1]).max() < 0.05 * np.abs(logits[0]).max()


def test_rollback_restores_the_cache_exactly() -> None:
    ids = tiny_models.prompt(30, seed=5)
    a = _model().session(sink_window(2, 6), max_block=6, prefill_chunk=8)
    b = _model().session(sink_window(2, 6), max_block=6, prefill_chunk=8)
    a.prefill(ids[:20])
    b.prefill(ids[:22])
    a.forward(ids[20:26])
    a.trim(4)
    la = np.array(a.forward(ids[22:26], logits=True).logits.tolist())
    lb = np.array(b.forward(ids[22:26], logits=True).logits.tolist())
    assert a.position == b.position == 26 and np.abs(la - lb).max() < 1e-4


@pytest.mark.parametrize("text", ["sink_window:2:6", "hybrid:2:6:q8"])
def test_prompt_lookup_drafting_equals_greedy_after_the_window_wraps(text: str) -> None:
    policy = parse_policy(text)
    ids = tiny_models.prompt(10, seed=4) * 3
    greedy = engine.generate(_model().session(policy, prefill_chunk=8), ids, engine.Stop(NEW)).tokens
    verifier = _model().session(policy, max_block=5, prefill_chunk=8)
    gen = engine.speculative_generate(verifier, engine.PromptLookupDrafter(), ids, 4, engine.Stop(NEW))
    assert gen.tokens == greedy and gen.drafted > 0


def test_the_tiny_latent_is_refused_a_quantized_cache_with_the_reason() -> None:
    """torch's tiny DeepSeek-V3 (latent 16, rope key 8): no group mx.quantize takes divides both."""
    model = mlx_twin(tiny_families.deepseek_v3())
    with pytest.raises(
        ValueError, match="mx.quantize takes groups of 32, 64, 128 values, not 8 .*K and V head sizes"
    ):
        model.session(parse_policy("full:q8"))


def test_an_mla_family_caching_per_head_kv_is_refused_in_one_line(tmp_path: Path) -> None:
    """mlx-lm's deepseek_v2 caches per-head K/V, not the latent `Geometry` counts: refused at load."""
    import torch
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    torch.manual_seed(0)
    config = DeepseekV2Config(
        **tiny_families.TINY,
        kv_lora_rank=16,
        q_lora_rank=None,
        qk_rope_head_dim=8,
        qk_nope_head_dim=16,
        v_head_dim=8,
        n_routed_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
    )
    DeepseekV2ForCausalLM(config).save_pretrained(tmp_path)
    with pytest.raises(
        UnsupportedModelError,
        match=r"^model type 'deepseek_v2': layer kind 'multi-head latent attention' is not supported on the "
        r"mlx backend for this model type \(decoded: deepseek_v3, kimi_k2; use the torch backend\)",
    ) as err:
        load_mlx(tmp_path)
    assert "\n" not in str(err.value)
