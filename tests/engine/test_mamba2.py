"""Mamba-2 hybrids (issue 32 item 3) on torch and on MLX: Bamba (Mamba-2 layers 0, 2; attention 1, 3;
torch only: mlx-lm has no bamba), Granite-4.0-H (`granitemoehybrid`: Mamba-2 x3, attention, MoE MLPs),
Nemotron-H (Mamba-2, MoE, attention, MLP: the mlp and moe layers have no mixer and cache nothing) and
Falcon-H1 (attention beside a Mamba-2 mixer in each layer: `ParallelState`). A Mamba-2 mixer keeps a
`Mamba2State` (conv + SSM state: engine/backends/torch/linear.py, engine/backends/mlx/mamba.py) beside
the attention layers' K/V: greedy equals transformers `generate` (on MLX also the torch engine under a
bounded window), speculative decoding (a model drafter, prompt lookup, a random block drafter reading the
hidden states, a random masked-diffusion drafter) equals greedy after the window wraps under every policy, with exact rollback of both states, the state counted in `state_bytes`; batched
sessions are refused with the reason; on MLX Bamba and Zamba are refused at load in one line (mlx-lm has neither).
The MLX :qN policies run on copies with attention heads of 32 (mx.quantize's smallest group).

The same on torch for Zamba2 (Mamba-2 layers; hybrid layers: a shared attention block, then a Mamba-2 mixer)
and the hybrids with Mamba (v1) mixers (`MambaState`): Jamba (a Mamba layer, then attention with MoE) and
Zamba (Zamba2's layout with Mamba mixers), on fewer policies (they are slower). transformers' multi-token
Mamba (v1) scan takes no initial state, so after the first forward the torch session feeds those one
token per forward (`STEPWISE`). On MLX Jamba decodes too (mlx-lm's multi-token scan starts from the
state; its mixture of experts is routed as transformers routes it), under the wrapping policies
sink_window:2:6 and hybrid:2:6."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import engine
from engine.backends.torch import session as torch_session
from engine.geometry import MAMBA, MAMBA2, STATEFUL, Geometry, UnsupportedModelError, config_dict
from engine.policy import Policy, expected_kv_bytes, full, hybrid, layer_slot_bytes, parse_policy, sink_window
from tests.engine import tiny_drafters, tiny_families, tiny_models
from tests.engine.backends import HAVE_MLX, on

NEW = 30
FAMILIES = ["bamba", "granitemoehybrid", "falcon_h1", "nemotron_h"]
MLX_FAMILIES = [*FAMILIES[1:], "jamba"]  # mlx-lm has no bamba, zamba or zamba2
SLOWER = ["zamba2", "jamba", "zamba"]  # torch only: Zamba2, and the Mamba (v1) hybrids
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
# the MLX copies for :qN policies: attention heads of 32 (Granite-4.0-H's head is hidden / heads)
WIDE = {
    "granitemoehybrid": {"num_attention_heads": 2},
    "falcon_h1": {"head_dim": 32},
    "nemotron_h": {"head_dim": 32},
    "jamba": {"num_attention_heads": 2},  # Jamba's attention head is hidden / heads
}
needs_mlx = pytest.mark.skipif(not HAVE_MLX, reason="mlx / mlx-lm not installed")


def _cases(names: list[str] = FAMILIES) -> list[Any]:
    """(backend, family) for each family on torch and, where mlx-lm has it, on MLX."""
    mlx = [pytest.param("mlx", n, marks=needs_mlx) for n in names if n in MLX_FAMILIES]
    return [("torch", n) for n in names] + mlx


def _torch(name: str, backend: str = "torch", quantized: bool = False) -> Any:
    """The transformers model (the oracle) whose weights `_model` runs."""
    return tiny_families.mamba2_hybrid(name, **(WIDE[name] if backend == "mlx" and quantized else {}))


def _model(backend: str, name: str, quantized: bool = False) -> engine.Model:
    return on(backend, _torch(name, backend, quantized))


@functools.cache
def _greedy(backend: str, name: str, policy: Policy, prompt_len: int = 17) -> tuple[int, ...]:
    model = _model(backend, name, policy.bits is not None)
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    return tuple(engine.generate(model.session(policy, prefill_chunk=8), ids, engine.Stop(NEW)).tokens)


@pytest.mark.parametrize(("backend", "name"), _cases(FAMILIES + SLOWER))
@pytest.mark.parametrize("policy", [full(), hybrid(2, 64)], ids=str)
def test_covering_window_equals_transformers_generate(backend: str, name: str, policy: Policy) -> None:
    kinds = set(_model(backend, name).geometry.layer_types)
    assert kinds in (
        {MAMBA2, "full_attention"},
        {"attention+mamba2"},
        {MAMBA2, "full_attention", "mlp_block", "moe_block"},
        {MAMBA2, "attention+mamba2"},
        {MAMBA, "full_attention"},
        {MAMBA, "attention+mamba"},
    )
    ids = tiny_models.prompt(17, seed=17)
    assert list(_greedy(backend, name, policy)) == tiny_models.hf_greedy(_torch(name), ids, NEW)


@needs_mlx
@pytest.mark.parametrize("name", MLX_FAMILIES)
def test_a_bounded_window_decodes_on_mlx_as_on_torch(name: str) -> None:
    policy = sink_window(2, 6)
    assert _greedy("mlx", name, policy) == _greedy("torch", name, policy) != _greedy("torch", name, full())


# a narrower copy of the model as drafter: partly wrong
NARROW = {("mlx", "falcon_h1"): sink_window(4, 8)} | {
    ("torch", n): sink_window(2, 10)
    for n in ("falcon_h1", "zamba", "zamba2")  # sink_window:1:3 drafts all wrong
}
POLICIES = ["sink_window:2:6", "hybrid:2:6", "sink_window:2:6:q8", "full"]
CASES: list[Any] = [("torch", n, t, k) for n in FAMILIES for t in POLICIES for k in (1, 4)]
CASES += [
    pytest.param("mlx", n, t, k, marks=needs_mlx) for n in FAMILIES[1:] for t in POLICIES for k in (1, 4)
]
CASES += [pytest.param("mlx", "jamba", t, 4, marks=needs_mlx) for t in POLICIES[:3]]
CASES += [
    ("torch", n, t, k) for n in SLOWER for t, k in (("sink_window:2:6", 4), ("hybrid:2:6:q8", 4), ("full", 1))
]


@pytest.mark.parametrize(("backend", "name", "text", "k"), CASES)
def test_speculative_equals_greedy_after_the_window_wraps(backend: str, name: str, text: str, k: int) -> None:
    policy = parse_policy(text)
    model = _model(backend, name, policy.bits is not None)
    ids = tiny_models.prompt(17, seed=17)
    verifier = model.session(policy, max_block=k + 1, prefill_chunk=8)
    narrow = NARROW.get((backend, name), sink_window(1, 3))
    drafter = engine.ModelDrafter(model.session(narrow, max_block=k + 1))
    gen = engine.speculative_generate(verifier, drafter, ids, k, engine.Stop(NEW))
    assert tuple(gen.tokens) == _greedy(backend, name, policy)
    if k > 1:
        assert 0 < gen.accepted < gen.drafted  # partly rejected blocks: the states were rolled back
    geo = model.geometry
    slot = layer_slot_bytes(policy, geo, "float32")
    assert verifier.kv_bytes() == expected_kv_bytes(verifier.specs, verifier.position, k + 1, slot)
    assert verifier.state_bytes() == geo.state_bytes("float32")
    mixers = sum(t in STATEFUL for t in geo.layer_types)
    assert [b for b in geo.state_bytes("float32") if b] == [STATE[name]] * mixers


SNAPSHOT_CASES = [
    ("torch", "bamba"),
    ("torch", "falcon_h1"),
    ("torch", "jamba"),  # MambaState inherits the snapshot
    pytest.param("mlx", "granitemoehybrid", marks=needs_mlx),
    pytest.param("mlx", "falcon_h1", marks=needs_mlx),
    pytest.param("mlx", "jamba", marks=needs_mlx),  # mlx-lm's Mamba (v1) mixer assigns new arrays too
]


@pytest.mark.parametrize(("backend", "name"), SNAPSHOT_CASES)
def test_a_snapshot_that_shares_the_live_state_is_caught(
    backend: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers' one-token Mamba-2 step writes the SSM state in place: a torch snapshot holding a
    reference (as DeltaNetState's may) rolls back to a state that moved on. mlx-lm's mixers assign new
    arrays into the cache entries: an MLX snapshot must copy the list of them. The trim test sees both."""
    assert _rollback_gap(backend, name) < 1e-4
    if backend == "torch":
        from engine.backends.torch.linear import DeltaNetState, Mamba2State

        monkeypatch.setattr(Mamba2State, "snapshot", DeltaNetState.snapshot)
    else:
        from engine.backends.mlx.mamba import Mamba2State as MLXMamba2State

        monkeypatch.setattr(MLXMamba2State, "snapshot", lambda self: self.cache)
    assert _rollback_gap(backend, name) > 1e-3


def _rollback_gap(backend: str, name: str) -> float:
    model = _model(backend, name)
    ids = tiny_models.prompt(30, seed=5)
    a = model.session(sink_window(2, 6), max_block=6, prefill_chunk=8)
    b = model.session(sink_window(2, 6), max_block=6, prefill_chunk=8)
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


@pytest.mark.parametrize(("backend", "name"), _cases(["bamba", "falcon_h1", "jamba", "zamba"]))
def test_batched_sessions_are_refused_with_the_reason(backend: str, name: str) -> None:
    with pytest.raises(
        ValueError, match=r"rows=2.*mamba2? layers yet \(their states are batch 1\).*one at a time"
    ):
        _model(backend, name).session(full(), rows=2)


@pytest.mark.parametrize(("backend", "name"), _cases() + [pytest.param("mlx", "jamba", marks=needs_mlx)])
def test_prompt_lookup_drafting_equals_greedy_after_the_window_wraps(backend: str, name: str) -> None:
    """The other drafter kind that needs no second model: prompt lookup on a repetitive prompt."""
    model = _model(backend, name)
    ids = tiny_models.prompt(10, seed=4) * 3
    greedy = engine.generate(model.session(sink_window(2, 6), prefill_chunk=8), ids, engine.Stop(NEW)).tokens
    verifier = model.session(sink_window(2, 6), max_block=5, prefill_chunk=8)
    gen = engine.speculative_generate(verifier, engine.PromptLookupDrafter(), ids, 4, engine.Stop(NEW))
    assert gen.tokens == greedy and gen.drafted > 0


KINDS, WRAPS = tiny_drafters.KINDS, POLICIES[:3]  # sink_window, hybrid, quantized: all after the wrap
DRAFTER_CASES: list[Any] = [("torch", n, t, d) for n in FAMILIES for t in WRAPS for d in KINDS]
DRAFTER_CASES += [
    pytest.param("mlx", n, t, d, marks=needs_mlx) for n in FAMILIES[1:] for t in WRAPS for d in KINDS
]
DRAFTER_CASES += [pytest.param("mlx", "jamba", t, d, marks=needs_mlx) for t in WRAPS[:2] for d in KINDS]
DRAFTER_CASES += [("torch", n, "sink_window:2:6", d) for n in SLOWER for d in KINDS]


@pytest.mark.parametrize(("backend", "name", "text", "kind"), DRAFTER_CASES)
def test_block_and_diffusion_drafters_equal_greedy_after_the_window_wraps(
    backend: str, name: str, text: str, kind: str
) -> None:
    """Random drafters built to the model's shapes (the block drafter reads layer 1 and the final hidden
    state), their blocks given a correct prefix of every length: partly rejected, both states rolled back."""
    policy = parse_policy(text)
    want = _greedy(backend, name, policy)
    model = _model(backend, name, policy.bits is not None)
    gen = tiny_drafters.prefixed_generate(kind, model, policy, tiny_models.prompt(17, seed=17), want)
    assert tuple(gen.tokens) == want and 0 < gen.accepted < gen.drafted


def test_attention_heads_are_read_apart_from_the_mamba_heads() -> None:
    """Granite-4.0-H's config has no head_dim: its attention head is hidden / attention heads (2 heads of
    32 beside 4 Mamba-2 heads of 32), as transformers and mlx-lm build it."""
    geo = Geometry.from_config(config_dict(tiny_families.granite_hybrid_config(**WIDE["granitemoehybrid"])))
    assert (geo.kv_heads, geo.head_dim) == (2, 32) and geo.linear_state_size == 4 * 32 * 16


@needs_mlx
@pytest.mark.parametrize("name", ["nemotron_h", "falcon_h1"])
def test_mlx_hidden_states_are_the_torch_engines(name: str) -> None:
    """Recorded on mlx-lm's own names (Nemotron-H: backbone, norm_f; Falcon-H1: final_layernorm)."""
    ids = tiny_models.prompt(12, seed=2)
    wanted = (0, 2, _model("torch", name).geometry.n_layers)
    got, want = (_model(b, name).session(full()).prefill(ids, hidden=wanted) for b in ("mlx", "torch"))
    for i in wanted:
        assert np.abs(np.array(got.hidden[i].tolist()) - want.hidden[i].numpy()).max() < 1e-4


@needs_mlx
def test_jamba_on_mlx_places_and_routes_its_experts_as_transformers() -> None:
    """mlx-lm's jamba puts the experts on layer i iff (i + offset) % period == 0 (transformers: i % period
    == offset) and renormalizes the top k of its router's softmax (transformers does not): with 4 experts,
    top 2, on layer 2 of 3 (a Mamba layer), the config shim and the routing swap keep MLX = `generate`."""
    tm = tiny_families.mamba2_hybrid(
        "jamba",
        num_hidden_layers=3,
        num_experts=4,
        num_experts_per_tok=2,
        expert_layer_period=3,
        expert_layer_offset=2,
    )
    model = on("mlx", tm)
    assert type(model.model.layers[2].feed_forward).__name__ == "_TransformersRouting"
    ids = tiny_models.prompt(17, seed=17)
    got = engine.generate(model.session(full(), prefill_chunk=8), ids, engine.Stop(NEW)).tokens
    assert got == tiny_models.hf_greedy(tm, ids, NEW)


@needs_mlx
def test_mlx_reports_the_dtype_nemotron_h_is_loaded_in() -> None:
    """Its embedding is `backbone.embeddings` (mlx's cpu runs its MoE in float32 only: load, no forward)."""
    from engine.backends.mlx.session import load_mlx

    assert load_mlx(_model("mlx", "nemotron_h").path, dtype="bfloat16").dtype_name == "bfloat16"


@needs_mlx
@pytest.mark.parametrize(("family", "kind"), [("bamba", "mamba2"), ("zamba", "mamba")])
def test_mlx_refuses_the_families_it_lacks_in_one_line(family: str, kind: str, tmp_path: Path) -> None:
    from engine.backends.mlx.session import load_mlx

    _torch(family).model.save_pretrained(tmp_path)
    match = (
        rf"^model type '{family}': layer kind '{kind}' .* on the mlx backend for this model type \(mlx-lm's "
        r"Mamba hybrids decoded: falcon_h1, granitemoehybrid, nemotron_h, jamba; use the torch backend\)"
    )
    with pytest.raises(UnsupportedModelError, match=match) as err:
        load_mlx(tmp_path)
    assert "\n" not in str(err.value)
