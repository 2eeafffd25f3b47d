"""Mamba-2 hybrids on torch (issue 32 item 3): Bamba (Mamba-2 layers 0, 2; attention 1, 3), Granite-4.0-H
(`granitemoehybrid`: Mamba-2 x3, attention, MoE MLPs), Nemotron-H (Mamba-2, MoE, attention, MLP: the mlp
and moe layers have no mixer and cache nothing) and Falcon-H1 (attention beside a Mamba-2 mixer in each
layer: `ParallelState`). A Mamba-2 mixer keeps a `Mamba2State` (conv + SSM state,
engine/backends/torch/linear.py) beside the attention layers' K/V: greedy equals transformers
`generate`, speculative decoding equals greedy after the window wraps under every policy, with exact
rollback of both states (which transformers' one-token step updates in place), the state counted in
`state_bytes`; batched sessions are refused with the reason; the mlx backend refuses these models.

The same for Zamba2 (Mamba-2 layers; hybrid layers: a shared attention block, then a Mamba-2 mixer) and the
hybrids with Mamba (v1) mixers (`MambaState`): Jamba (a Mamba layer, then attention with MoE) and Zamba
(Zamba2's layout with Mamba mixers), on fewer policies (they are slower). transformers' multi-token
Mamba (v1) scan takes no initial state, so after the first forward the torch session feeds those one
token per forward (`STEPWISE`)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

import engine
from engine.backends.torch import session as torch_session
from engine.backends.torch.linear import DeltaNetState, Mamba2State
from engine.geometry import MAMBA, MAMBA2, STATEFUL, UnsupportedModelError
from engine.policy import Policy, expected_kv_bytes, full, hybrid, layer_slot_bytes, parse_policy, sink_window
from tests.engine import tiny_families, tiny_models
from tests.engine.backends import HAVE_MLX

NEW = 30
FAMILIES = ["bamba", "granitemoehybrid", "falcon_h1", "nemotron_h"]
SLOWER = ["zamba2", "jamba", "zamba"]  # Zamba2, and the Mamba (v1) hybrids
# Mamba-2 state bytes per mixer (float32): SSM heads x head_dim x d_state + conv: 3 inputs of x + B + C
STATE = {
    "bamba": 4 * 32 * 16 * 4 + 3 * (128 + 2 * 16) * 4,
    "granitemoehybrid": 4 * 32 * 16 * 4 + 3 * (128 + 2 * 16) * 4,
    "falcon_h1": 4 * 16 * 16 * 4 + 3 * (64 + 2 * 16) * 4,
    "nemotron_h": 4 * 32 * 16 * 4 + 3 * (128 + 2 * 16) * 4,
    "zamba2": 4 * 32 * 16 * 4 + 3 * (128 + 2 * 16) * 4,
    # Mamba (v1): SSM state (2 x 64) channels x d_state 8 + conv: 3 inputs of the channels
    "jamba": 128 * 8 * 4 + 3 * 128 * 4,
    "zamba": 128 * 8 * 4 + 3 * 128 * 4,
}
WIDER_DRAFTER = ("falcon_h1", "zamba", "zamba2")  # sink_window:1:3 drafts them all wrong


@functools.cache
def _greedy(name: str, policy: Policy, prompt_len: int) -> tuple[int, ...]:
    tm = tiny_families.mamba2_hybrid(name)
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    return tuple(engine.generate(tm.session(policy, prefill_chunk=8), ids, engine.Stop(NEW)).tokens)


@pytest.mark.parametrize("name", FAMILIES + SLOWER)
@pytest.mark.parametrize("policy", [full(), hybrid(2, 64)], ids=str)
def test_covering_window_equals_transformers_generate(name: str, policy: Policy) -> None:
    tm = tiny_families.mamba2_hybrid(name)
    kinds = set(tm.geometry.layer_types)
    assert kinds in (
        {MAMBA2, "full_attention"},
        {"attention+mamba2"},
        {MAMBA2, "full_attention", "mlp_block", "moe_block"},
        {MAMBA2, "attention+mamba2"},
        {MAMBA, "full_attention"},
        {MAMBA, "attention+mamba"},
    )
    ids = tiny_models.prompt(17, seed=17)
    assert list(_greedy(name, policy, 17)) == tiny_models.hf_greedy(tm, ids, NEW)


POLICIES = ["sink_window:2:6", "hybrid:2:6", "sink_window:2:6:q8", "full"]
CASES = [(n, t, k) for n in FAMILIES for t in POLICIES for k in (1, 4)] + [
    (n, t, k) for n in SLOWER for t, k in (("sink_window:2:6", 4), ("hybrid:2:6:q8", 4), ("full", 1))
]


@pytest.mark.parametrize(("name", "text", "k"), CASES)
def test_speculative_equals_greedy_after_the_window_wraps(name: str, text: str, k: int) -> None:
    policy = parse_policy(text)
    tm = tiny_families.mamba2_hybrid(name)
    ids = tiny_models.prompt(17, seed=17)
    verifier = tm.session(policy, max_block=k + 1, prefill_chunk=8)
    narrow = sink_window(2, 10) if name in WIDER_DRAFTER else sink_window(1, 3)  # narrower: partly wrong
    drafter = engine.ModelDrafter(tm.session(narrow, max_block=k + 1))
    gen = engine.speculative_generate(verifier, drafter, ids, k, engine.Stop(NEW))
    assert tuple(gen.tokens) == _greedy(name, policy, 17)
    if k > 1:
        assert 0 < gen.accepted < gen.drafted  # partly rejected blocks: the states were rolled back
    geo = tm.geometry
    slot = layer_slot_bytes(policy, geo, "float32")
    assert verifier.kv_bytes() == expected_kv_bytes(verifier.specs, verifier.position, k + 1, slot)
    assert verifier.state_bytes() == geo.state_bytes("float32")
    mixers = sum(t in STATEFUL for t in geo.layer_types)
    assert [b for b in geo.state_bytes("float32") if b] == [STATE[name]] * mixers


def test_a_snapshot_that_does_not_copy_the_ssm_state_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers' one-token Mamba-2 step writes the SSM state in place: a snapshot holding a reference
    (as DeltaNetState's may) would roll back to a state that moved on; the trim test below sees it."""
    names = ("bamba", "falcon_h1", "jamba")  # MambaState inherits the snapshot
    assert all(_rollback_gap(name) < 1e-4 for name in names)
    monkeypatch.setattr(Mamba2State, "snapshot", DeltaNetState.snapshot)
    assert all(_rollback_gap(name) > 1e-3 for name in names)


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
    """Without the one-token rule a chunk fed after the first runs transformers' multi-token Mamba (v1)
    scan from a zero SSM state: its logits move away from one forward's. Mamba-2's scan takes the state."""
    assert _chunked_gap("jamba") < 1e-4 and _chunked_gap("zamba") < 1e-4
    monkeypatch.setattr(torch_session, "STEPWISE", ())
    assert _chunked_gap("jamba") > 1e-3 and _chunked_gap("zamba") > 1e-3
    assert _chunked_gap("zamba2") < 1e-4


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


@pytest.mark.parametrize("name", ["bamba", "falcon_h1", "jamba", "zamba"])
def test_batched_sessions_are_refused_with_the_reason(name: str) -> None:
    tm = tiny_families.mamba2_hybrid(name)
    with pytest.raises(
        ValueError, match=r"rows=2.*mamba2? layers yet \(their states are batch 1\).*one at a time"
    ):
        tm.session(full(), rows=2)


@pytest.mark.skipif(not HAVE_MLX, reason="mlx / mlx-lm not installed")
@pytest.mark.parametrize("family", ["bamba", "falcon_h1", "deepseek_v3"])
def test_the_mlx_backend_refuses_them_in_one_line(family: str, tmp_path: Path) -> None:
    from engine.backends.mlx.session import load_mlx

    tm = tiny_families.deepseek_v3() if family == "deepseek_v3" else tiny_families.mamba2_hybrid(family)
    tm.model.save_pretrained(tmp_path)
    kind = {"deepseek_v3": "multi-head latent attention", "bamba": "mamba2"}.get(family, "attention\\+mamba2")
    with pytest.raises(UnsupportedModelError, match=f"'{family}': layer kind '{kind}'.* on the mlx backend"):
        load_mlx(tmp_path)


@pytest.mark.parametrize("name", FAMILIES)
def test_prompt_lookup_drafting_equals_greedy_after_the_window_wraps(name: str) -> None:
    """The other drafter kind that needs no second model: prompt lookup on a repetitive prompt."""
    tm = tiny_families.mamba2_hybrid(name)
    ids = tiny_models.prompt(10, seed=4) * 3
    greedy = engine.generate(tm.session(sink_window(2, 6), prefill_chunk=8), ids, engine.Stop(NEW)).tokens
    verifier = tm.session(sink_window(2, 6), max_block=5, prefill_chunk=8)
    gen = engine.speculative_generate(verifier, engine.PromptLookupDrafter(), ids, 4, engine.Stop(NEW))
    assert gen.tokens == greedy and gen.drafted > 0
