"""Multi-head latent attention (DeepSeek-V3 / Kimi-K2 family, `kv_lora_rank`) on torch: the cache holds
what the model hands it, one head per position of the normalized latent (K, kv_lora_rank = 16) and the
post-RoPE decoupled key (V, qk_rope_head_dim = 8), so K and V have their own head sizes under every policy
(full, sink_window, hybrid, quantized); greedy equals transformers `generate` with a covering window, the
bytes reported are the bytes stored, and speculative decoding equals greedy after the window wraps."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import engine
from engine.policy import Policy, expected_kv_bytes, full, hybrid, layer_slot_bytes, parse_policy, sink_window
from tests.engine import tiny_families, tiny_models

NEW = 40


def _model() -> engine.Model:
    return tiny_families.deepseek_v3()


@functools.cache
def _greedy(policy: Policy, prompt_len: int) -> tuple[int, ...]:
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    return tuple(engine.generate(_model().session(policy, prefill_chunk=8), ids, engine.Stop(NEW)).tokens)


def test_geometry_counts_the_latent_and_the_rope_key_as_stored() -> None:
    geo = _model().geometry
    assert geo.layer_types == ("full_attention",) * 2
    assert (geo.kv_heads, geo.head_dim, geo.value_dim) == (1, 16, 8)
    assert geo.slot_bytes("float32") == [(16 + 8) * 4] * 2  # not 2 x heads x (qk_head_dim or v_head_dim)


@pytest.mark.parametrize("policy", [full(), sink_window(4, 200), hybrid(2, 8)], ids=str)
@pytest.mark.parametrize("prompt_len", [1, 17])
def test_covering_window_equals_transformers_generate(policy: Policy, prompt_len: int) -> None:
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    assert list(_greedy(policy, prompt_len)) == tiny_models.hf_greedy(_model(), ids, NEW)


POLICIES = ["sink_window:4:8", "hybrid:2:6", "sink_window:2:6:q8", "sink_window:2:6:k8v4", "full:q4"]


@pytest.mark.parametrize("text", POLICIES)
@pytest.mark.parametrize("k", [1, 4])
def test_speculative_equals_greedy_after_the_window_wraps(text: str, k: int) -> None:
    policy = parse_policy(text)
    prompt_len = 17
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    verifier = _model().session(policy, max_block=k + 1, prefill_chunk=8)
    drafter = engine.ModelDrafter(
        _model().session(sink_window(1, 3), max_block=k + 1)
    )  # narrower: partly wrong
    gen = engine.speculative_generate(verifier, drafter, ids, k, engine.Stop(NEW))
    assert tuple(gen.tokens) == _greedy(policy, prompt_len)
    assert prompt_len + NEW > 2 + 8  # the window wrapped
    if k > 1:
        assert 0 < gen.accepted < gen.drafted  # blocks were partly rejected: rollback was exercised
    # what is reported is what is stored: the formula, and the buffers' own sizes
    geo = _model().geometry
    slot = layer_slot_bytes(policy, geo, "float32")
    assert verifier.kv_bytes() == expected_kv_bytes(verifier.specs, verifier.position, k + 1, slot)
    for state in verifier.states:
        held = state.group.held()
        if policy.bits is None:
            assert state.k.shape[1:] == (1, state.k.shape[2], 16) and state.v.shape[-1] == 8
            assert state.nbytes == held * (state.k[0, :, 0].nbytes + state.v[0, :, 0].nbytes)
        else:
            stored = sum(t[0, :, 0].nbytes for part in state.parts for t in part)
            assert state.nbytes == held * stored


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
    """The other drafter kind that needs no second model: prompt lookup on a repetitive prompt."""
    policy = parse_policy(text)
    ids = tiny_models.prompt(10, seed=4) * 3
    greedy = engine.generate(_model().session(policy, prefill_chunk=8), ids, engine.Stop(NEW)).tokens
    verifier = _model().session(policy, max_block=5, prefill_chunk=8)
    gen = engine.speculative_generate(verifier, engine.PromptLookupDrafter(), ids, 4, engine.Stop(NEW))
    assert gen.tokens == greedy and gen.drafted > 0
