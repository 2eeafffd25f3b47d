"""Mamba-2 hybrids on MLX (issue 32 item 3; torch: tests/engine/test_mamba2.py): mlx-lm's Granite-4.0-H
(`granitemoehybrid`: Mamba-2 x3, attention, MoE MLPs), Nemotron-H (Mamba-2, MoE, attention, MLP: the mlp
and moe blocks have no mixer, cache nothing and get no cache entry) and Falcon-H1 (attention beside a
Mamba-2 mixer in each layer: `ParallelState`). Each Mamba-2 mixer keeps a `Mamba2State` (conv + SSM state,
engine/backends/mlx/mamba.py) beside the attention layers' K/V: MLX greedy equals transformers `generate`
and the torch engine, speculative decoding (a model drafter, prompt lookup) equals MLX greedy after the
window wraps under every policy with exact rollback of the states, the state is counted in `state_bytes`;
batched sessions are refused with the reason; a Mamba-2 family mlx-lm lacks (Bamba) and Mamba-1 (Jamba)
are refused at load in one line."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mlx_lm")

import engine  # noqa: E402
from engine.backends.mlx.mamba import Mamba2State, ParallelState  # noqa: E402
from engine.backends.mlx.session import load_mlx  # noqa: E402
from engine.geometry import MAMBA2, PARALLEL_MAMBA2, UnsupportedModelError  # noqa: E402
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

NEW = 30
FAMILIES = ["granitemoehybrid", "falcon_h1", "nemotron_h"]
# attention heads of 32 (mx.quantize's smallest group) for the :qN policies
WIDE = {
    "granitemoehybrid": {"num_attention_heads": 2},  # head size hidden / heads
    "falcon_h1": {"head_dim": 32},
    "nemotron_h": {"head_dim": 32},
}


def _torch(name: str, quantized: bool = False) -> engine.Model:
    return tiny_families.mamba2_hybrid(name, **(WIDE[name] if quantized else {}))


def _model(name: str, quantized: bool = False) -> engine.Model:
    return mlx_twin(_torch(name, quantized))


@functools.cache
def _greedy(name: str, policy: Policy) -> tuple[int, ...]:
    ids = tiny_models.prompt(17, seed=17)
    model = _model(name, policy.bits is not None)
    return tuple(engine.generate(model.session(policy, prefill_chunk=8), ids, engine.Stop(NEW)).tokens)


@pytest.mark.parametrize("name", FAMILIES)
def test_greedy_equals_transformers_generate_and_the_torch_engine(name: str) -> None:
    ids = tiny_models.prompt(17, seed=17)
    assert list(_greedy(name, full())) == tiny_models.hf_greedy(_torch(name), ids, NEW)
    assert _greedy(name, hybrid(2, 64)) == _greedy(name, full())  # a covering window
    bounded = sink_window(2, 6)
    want = engine.generate(_torch(name).session(bounded, prefill_chunk=8), ids, engine.Stop(NEW)).tokens
    assert list(_greedy(name, bounded)) == want != list(_greedy(name, full()))


def test_attention_heads_are_read_apart_from_the_mamba_heads() -> None:
    """Granite-4.0-H's config has no head_dim: its attention head is hidden / attention heads (here 2
    heads of 32 beside 4 Mamba-2 heads), as both transformers and mlx-lm build it."""
    geo = _model("granitemoehybrid", quantized=True).geometry
    assert (geo.kv_heads, geo.head_dim) == (2, 32) and geo.linear_state_size == 4 * 32 * 16


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("text", ["sink_window:2:6", "hybrid:2:6", "sink_window:2:6:q8", "full:k8v4"])
@pytest.mark.parametrize("k", [1, 4])
def test_speculative_equals_greedy_after_the_window_wraps(name: str, text: str, k: int) -> None:
    policy = parse_policy(text)
    model = _model(name, policy.bits is not None)
    ids = tiny_models.prompt(17, seed=17)
    verifier = model.session(policy, max_block=k + 1, prefill_chunk=8)
    narrow = sink_window(4, 8) if name == "falcon_h1" else sink_window(1, 3)  # narrower: partly wrong
    drafter = engine.ModelDrafter(model.session(narrow, max_block=k + 1))
    gen = engine.speculative_generate(verifier, drafter, ids, k, engine.Stop(NEW))
    assert tuple(gen.tokens) == _greedy(name, policy)
    if k > 1:
        assert 0 < gen.accepted < gen.drafted  # partly rejected blocks: the states were rolled back
    geo = model.geometry
    slot = layer_slot_bytes(policy, geo, "float32")
    assert verifier.kv_bytes() == expected_kv_bytes(verifier.specs, verifier.position, k + 1, slot)
    assert verifier.state_bytes() == geo.state_bytes("float32")
    mixers = [s.mamba if isinstance(s, ParallelState) else s for s in verifier.states]
    mixers = [s for s in mixers if isinstance(s, Mamba2State)]
    assert len(mixers) == sum(t in (MAMBA2, PARALLEL_MAMBA2) for t in geo.layer_types) > 0
    conv, ssm = mixers[0][0], mixers[0][1]
    assert conv.shape == (1, 3, geo.linear_conv_dim) and ssm.size == geo.linear_state_size


@pytest.mark.parametrize("name", ["granitemoehybrid", "falcon_h1"])
def test_a_snapshot_that_shares_the_live_state_is_caught(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """mlx-lm's mixers assign new arrays into the cache entries: a snapshot must copy the list of them
    (a snapshot that is the live list rolls back to a state that moved on; the trim test below sees it)."""
    assert _rollback_gap(name) < 1e-4
    monkeypatch.setattr(Mamba2State, "snapshot", lambda self: self.cache)
    assert _rollback_gap(name) > 1e-3


def _rollback_gap(name: str) -> float:
    model = _model(name)
    ids = tiny_models.prompt(30, seed=5)
    a = model.session(sink_window(2, 6), max_block=6, prefill_chunk=8)
    b = model.session(sink_window(2, 6), max_block=6, prefill_chunk=8)
    a.prefill(ids[:20])
    b.prefill(ids[:20])
    for t in ids[20:24]:  # one token at a time
        a.forward([t])
    a.trim(3)  # keeps ids[20:21]
    b.forward(ids[20:21])
    la = np.array(a.forward(ids[21:25], logits=True).logits.tolist())
    lb = np.array(b.forward(ids[21:25], logits=True).logits.tolist())
    assert a.position == b.position == 25
    return float(np.abs(la - lb).max())


@pytest.mark.parametrize("name", FAMILIES)
def test_prompt_lookup_drafting_equals_greedy_after_the_window_wraps(name: str) -> None:
    model = _model(name)
    ids = tiny_models.prompt(10, seed=4) * 3
    greedy = engine.generate(model.session(sink_window(2, 6), prefill_chunk=8), ids, engine.Stop(NEW)).tokens
    verifier = model.session(sink_window(2, 6), max_block=5, prefill_chunk=8)
    gen = engine.speculative_generate(verifier, engine.PromptLookupDrafter(), ids, 4, engine.Stop(NEW))
    assert gen.tokens == greedy and gen.drafted > 0


@pytest.mark.parametrize("name", ["nemotron_h", "falcon_h1"])
def test_hidden_states_are_the_torch_engines(name: str) -> None:
    """Recorded on mlx-lm's own layer names (Nemotron-H: backbone, norm_f; Falcon-H1: final_layernorm)."""
    ids = tiny_models.prompt(12, seed=2)
    wanted = (0, 2, _model(name).geometry.n_layers)
    got, want = (m.session(full()).prefill(ids, hidden=wanted) for m in (_model(name), _torch(name)))
    for i in wanted:
        assert np.abs(np.array(got.hidden[i].tolist()) - want.hidden[i].numpy()).max() < 1e-4


def test_batched_sessions_are_refused_with_the_reason() -> None:
    with pytest.raises(
        ValueError, match=r"rows=2.*mamba2 layers yet \(their states are batch 1\).*one at a time"
    ):
        _model("falcon_h1").session(full(), rows=2)


@pytest.mark.parametrize("family", ["bamba", "jamba"])
def test_families_the_mlx_backend_lacks_are_refused_in_one_line(family: str, tmp_path: Path) -> None:
    if family == "jamba":
        tiny_families.jamba_module().save_pretrained(tmp_path)
        match = r"^model type 'jamba': layer kind 'mamba' \(Mamba state-space mixer\) is not supported"
    else:
        _torch("bamba").model.save_pretrained(tmp_path)
        match = (
            r"^model type 'bamba': layer kind 'mamba2' .* on the mlx backend for this model type \(mlx-lm's "
            r"Mamba-2 hybrids decoded: falcon_h1, granitemoehybrid, nemotron_h; use the torch backend\)"
        )
    with pytest.raises(UnsupportedModelError, match=match) as err:
        load_mlx(tmp_path)
    assert "\n" not in str(err.value)
