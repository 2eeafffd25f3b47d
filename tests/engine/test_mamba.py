"""Hybrids with Mamba (v1) mixers on torch (issue 32): Jamba (a Mamba layer, then attention with MoE) and
Zamba (Mamba layers; hybrid layers: a shared attention block, then a Mamba mixer), and Zamba2 (the same
with Mamba-2 mixers). A Mamba mixer keeps a `MambaState` (conv + SSM state), a Zamba hybrid layer a
`ParallelState` (K/V beside it): greedy equals transformers `generate`, speculative decoding equals
greedy after the window wraps under every policy, with exact rollback, the state counted in
`state_bytes`. transformers' multi-token Mamba (v1) scan takes no initial state, so after the first
forward the torch session feeds these models one token per forward (`STEPWISE`); batched sessions are
refused with the reason."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import engine
from engine.backends.torch import session as torch_session
from engine.backends.torch.linear import DeltaNetState, MambaState
from engine.geometry import MAMBA, MAMBA2, PARALLEL_MAMBA, PARALLEL_MAMBA2
from engine.policy import Policy, expected_kv_bytes, full, hybrid, layer_slot_bytes, parse_policy, sink_window
from tests.engine import tiny_families, tiny_models

NEW = 20
KINDS = {
    "jamba": {MAMBA, "full_attention"},
    "zamba": {MAMBA, PARALLEL_MAMBA},
    "zamba2": {MAMBA2, PARALLEL_MAMBA2},
}
# state bytes per mixer (float32): SSM state + conv state (3 inputs)
STATE = {
    "jamba": 128 * 8 * 4 + 3 * 128 * 4,  # channels (2 x 64) x d_state
    "zamba": 128 * 8 * 4 + 3 * 128 * 4,  # 2 heads x 64 channels x d_state
    "zamba2": 4 * 32 * 16 * 4 + 3 * (128 + 2 * 16) * 4,  # heads x head_dim x d_state; conv over x, B, C
}


@functools.cache
def _greedy(name: str, policy: Policy) -> tuple[int, ...]:
    tm = tiny_families.mamba2_hybrid(name)
    ids = tiny_models.prompt(17, seed=17)
    return tuple(engine.generate(tm.session(policy, prefill_chunk=8), ids, engine.Stop(NEW)).tokens)


@pytest.mark.parametrize("name", list(KINDS))
@pytest.mark.parametrize("policy", [full(), hybrid(2, 64)], ids=str)
def test_covering_window_equals_transformers_generate(name: str, policy: Policy) -> None:
    tm = tiny_families.mamba2_hybrid(name)
    assert set(tm.geometry.layer_types) == KINDS[name]
    ids = tiny_models.prompt(17, seed=17)
    assert list(_greedy(name, policy)) == tiny_models.hf_greedy(tm, ids, NEW)  # prefilled in chunks of 8


@pytest.mark.parametrize("name", list(KINDS))
@pytest.mark.parametrize(("text", "k"), [("sink_window:2:6", 4), ("hybrid:2:6:q8", 4), ("full", 1)])
def test_speculative_equals_greedy_after_the_window_wraps(name: str, text: str, k: int) -> None:
    policy = parse_policy(text)
    tm = tiny_families.mamba2_hybrid(name)
    ids = tiny_models.prompt(17, seed=17)
    verifier = tm.session(policy, max_block=k + 1, prefill_chunk=8)
    narrow = sink_window(1, 3) if name == "jamba" else sink_window(2, 10)  # narrower: partly wrong
    drafter = engine.ModelDrafter(tm.session(narrow, max_block=k + 1))
    gen = engine.speculative_generate(verifier, drafter, ids, k, engine.Stop(NEW))
    assert tuple(gen.tokens) == _greedy(name, policy)
    if k > 1:
        assert 0 < gen.accepted < gen.drafted  # partly rejected blocks: the states were rolled back
    geo = tm.geometry
    slot = layer_slot_bytes(policy, geo, "float32")
    assert verifier.kv_bytes() == expected_kv_bytes(verifier.specs, verifier.position, k + 1, slot)
    assert verifier.state_bytes() == geo.state_bytes("float32")
    assert [b for b in geo.state_bytes("float32") if b] == [STATE[name]] * sum(
        t != "full_attention" for t in geo.layer_types
    )


def _chunked_gap(name: str) -> float:
    """The logits of a prompt fed in chunks of 4 against the same prompt fed in one forward."""
    tm = tiny_families.mamba2_hybrid(name)
    ids = tiny_models.prompt(12, seed=3)
    whole = tm.session(full()).prefill(ids, logits=True).logits
    chunked = tm.session(full(), prefill_chunk=4).prefill(ids, logits=True).logits
    return float(np.abs(np.array(whole.tolist()) - np.array(chunked.tolist())).max())


def test_a_mamba_block_after_the_first_forward_runs_one_token_per_forward(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without the one-token rule, a chunk fed after the first runs transformers' multi-token scan from a
    zero SSM state: its logits move away from one forward's; Zamba2's Mamba-2 scan takes the state."""
    assert _chunked_gap("jamba") < 1e-4 and _chunked_gap("zamba") < 1e-4
    monkeypatch.setattr(torch_session, "STEPWISE", ())
    assert _chunked_gap("jamba") > 1e-3 and _chunked_gap("zamba") > 1e-3
    assert _chunked_gap("zamba2") < 1e-4


def test_a_snapshot_that_does_not_copy_the_ssm_state_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' one-token Mamba step writes the SSM state in place (`state.copy_`): a snapshot
    holding a reference would roll back to a state that moved on."""

    def gap() -> float:
        tm = tiny_families.mamba2_hybrid("jamba")
        ids = tiny_models.prompt(30, seed=5)
        a = tm.session(sink_window(2, 6), max_block=6, prefill_chunk=8)
        b = tm.session(sink_window(2, 6), max_block=6, prefill_chunk=8)
        a.prefill(ids[:20])
        b.prefill(ids[:21])
        a.forward(ids[20:24])
        a.trim(3)  # keeps ids[20:21]
        la = np.array(a.forward(ids[21:25], logits=True).logits.tolist())
        lb = np.array(b.forward(ids[21:25], logits=True).logits.tolist())
        assert a.position == b.position == 25
        return float(np.abs(la - lb).max())

    assert gap() < 1e-4
    monkeypatch.setattr(MambaState, "snapshot", DeltaNetState.snapshot)
    assert gap() > 1e-3


@pytest.mark.parametrize("name", ["jamba", "zamba"])
def test_batched_sessions_are_refused_with_the_reason(name: str) -> None:
    tm = tiny_families.mamba2_hybrid(name)
    with pytest.raises(
        ValueError, match=r"rows=2.*mamba layers yet \(their states are batch 1\).*one at a time"
    ):
        tm.session(full(), rows=2)
