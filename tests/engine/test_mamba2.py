"""Mamba-2 hybrids on torch (issue 32 item 3): Bamba (Mamba-2 layers 0, 2; attention 1, 3), Granite-4.0-H
(`granitemoehybrid`: Mamba-2 x3, attention, MoE MLPs), Nemotron-H (Mamba-2, MoE, attention, MLP: the mlp
and moe layers have no mixer and cache nothing) and Falcon-H1 (attention beside a Mamba-2 mixer in each
layer: `ParallelState`). A Mamba-2 mixer keeps a `Mamba2State` (conv + SSM state,
engine/backends/torch/linear.py) beside the attention layers' K/V: greedy equals transformers
`generate`, speculative decoding equals greedy after the window wraps under every policy, with exact
rollback of both states (which transformers' one-token step updates in place), the state counted in
`state_bytes`; batched sessions are refused with the reason. On MLX: tests/engine/test_mamba2_mlx.py."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import engine
from engine.backends.torch.linear import DeltaNetState, Mamba2State
from engine.geometry import MAMBA2
from engine.policy import Policy, expected_kv_bytes, full, hybrid, layer_slot_bytes, parse_policy, sink_window
from tests.engine import tiny_families, tiny_models

NEW = 30
FAMILIES = ["bamba", "granitemoehybrid", "falcon_h1", "nemotron_h"]
# Mamba-2 state bytes per mixer (float32): SSM heads x head_dim x d_state + conv: 3 inputs of x + B + C
STATE = {
    "bamba": 4 * 32 * 16 * 4 + 3 * (128 + 2 * 16) * 4,
    "granitemoehybrid": 4 * 32 * 16 * 4 + 3 * (128 + 2 * 16) * 4,
    "falcon_h1": 4 * 16 * 16 * 4 + 3 * (64 + 2 * 16) * 4,
    "nemotron_h": 4 * 32 * 16 * 4 + 3 * (128 + 2 * 16) * 4,
}


@functools.cache
def _greedy(name: str, policy: Policy, prompt_len: int) -> tuple[int, ...]:
    tm = tiny_families.mamba2_hybrid(name)
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    return tuple(engine.generate(tm.session(policy, prefill_chunk=8), ids, engine.Stop(NEW)).tokens)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("policy", [full(), hybrid(2, 64)], ids=str)
def test_covering_window_equals_transformers_generate(name: str, policy: Policy) -> None:
    tm = tiny_families.mamba2_hybrid(name)
    kinds = set(tm.geometry.layer_types)
    assert kinds in (
        {MAMBA2, "full_attention"},
        {"attention+mamba2"},
        {MAMBA2, "full_attention", "mlp_block", "moe_block"},
    )
    ids = tiny_models.prompt(17, seed=17)
    assert list(_greedy(name, policy, 17)) == tiny_models.hf_greedy(tm, ids, NEW)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("text", ["sink_window:2:6", "hybrid:2:6", "sink_window:2:6:q8", "full"])
@pytest.mark.parametrize("k", [1, 4])
def test_speculative_equals_greedy_after_the_window_wraps(name: str, text: str, k: int) -> None:
    policy = parse_policy(text)
    tm = tiny_families.mamba2_hybrid(name)
    ids = tiny_models.prompt(17, seed=17)
    verifier = tm.session(policy, max_block=k + 1, prefill_chunk=8)
    narrow = sink_window(2, 10) if name == "falcon_h1" else sink_window(1, 3)  # narrower: partly wrong
    drafter = engine.ModelDrafter(tm.session(narrow, max_block=k + 1))
    gen = engine.speculative_generate(verifier, drafter, ids, k, engine.Stop(NEW))
    assert tuple(gen.tokens) == _greedy(name, policy, 17)
    if k > 1:
        assert 0 < gen.accepted < gen.drafted  # partly rejected blocks: the states were rolled back
    geo = tm.geometry
    slot = layer_slot_bytes(policy, geo, "float32")
    assert verifier.kv_bytes() == expected_kv_bytes(verifier.specs, verifier.position, k + 1, slot)
    assert verifier.state_bytes() == geo.state_bytes("float32")
    mixers = sum(t in (MAMBA2, "attention+mamba2") for t in geo.layer_types)
    assert [b for b in geo.state_bytes("float32") if b] == [STATE[name]] * mixers


def test_a_snapshot_that_does_not_copy_the_ssm_state_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' one-token Mamba-2 step writes the SSM state in place: a snapshot holding a reference
    (as DeltaNetState's may) would roll back to a state that moved on; the trim test below sees it."""
    assert _rollback_gap("bamba") < 1e-4 and _rollback_gap("falcon_h1") < 1e-4
    monkeypatch.setattr(Mamba2State, "snapshot", DeltaNetState.snapshot)
    assert _rollback_gap("bamba") > 1e-3 and _rollback_gap("falcon_h1") > 1e-3


def _rollback_gap(name: str) -> float:
    tm = tiny_families.mamba2_hybrid(name)
    ids = tiny_models.prompt(30, seed=5)
    a = tm.session(sink_window(2, 6), max_block=6, prefill_chunk=8)
    b = tm.session(sink_window(2, 6), max_block=6, prefill_chunk=8)
    a.prefill(ids[:20])
    b.prefill(ids[:20])
    for t in ids[20:24]:  # one token at a time: the in-place step
        a.forward([t])
    a.trim(3)  # keeps ids[20:21]
    b.forward(ids[20:21])
    la = np.array(a.forward(ids[21:25], logits=True).logits.tolist())
    lb = np.array(b.forward(ids[21:25], logits=True).logits.tolist())
    assert a.position == b.position == 25
    return float(np.abs(la - lb).max())


@pytest.mark.parametrize("name", ["bamba", "falcon_h1"])
def test_batched_sessions_are_refused_with_the_reason(name: str) -> None:
    tm = tiny_families.mamba2_hybrid(name)
    with pytest.raises(
        ValueError, match=r"rows=2.*mamba2 layers yet \(their states are batch 1\).*one at a time"
    ):
        tm.session(full(), rows=2)


@pytest.mark.parametrize("name", FAMILIES)
def test_prompt_lookup_drafting_equals_greedy_after_the_window_wraps(name: str) -> None:
    """The other drafter kind that needs no second model: prompt lookup on a repetitive prompt."""
    tm = tiny_families.mamba2_hybrid(name)
    ids = tiny_models.prompt(10, seed=4) * 3
    greedy = engine.generate(tm.session(sink_window(2, 6), prefill_chunk=8), ids, engine.Stop(NEW)).tokens
    verifier = tm.session(sink_window(2, 6), max_block=5, prefill_chunk=8)
    gen = engine.speculative_generate(verifier, engine.PromptLookupDrafter(), ids, 4, engine.Stop(NEW))
    assert gen.tokens == greedy and gen.drafted > 0
