"""Quantized K/V (policy suffix :q8, :q4, :kXvY): the policy grammar, the affine format shared by both
backends, speculative == greedy under each quantized policy (through wraps), and the bytes held."""

from __future__ import annotations

import copy
import functools

import numpy as np
import pytest
import torch

import engine
from engine.backends.torch import TorchModel, dequantize, quantize
from engine.policy import Policy, expected_kv_bytes, parse_policy, policy_slot_bytes, with_precision
from tests.engine import tiny_models
from tests.engine.backends import BACKENDS, HAVE_MLX, on

NEW = 80
HEAD_DIM = 32  # mx.quantize groups are 32, 64 or 128: the default group 64 is clamped to 32
QUANTIZED = [
    parse_policy(p) for p in ("full:q8", "sink_window:4:8:q4", "hybrid:2:6:k8v4", "sink_window:0:5:q8")
]


def _model(backend: str) -> TorchModel:
    return on(backend, tiny_models.gemma(head_dim=HEAD_DIM))


def test_policy_precision_round_trips_and_refuses_bad_input() -> None:
    for text in ("full:q8", "sink_window:4:64:q4", "hybrid:4:64:k8v4", "hybrid:4:64:q4:g32", "hybrid:4:64"):
        assert str(parse_policy(text)) == text
    assert parse_policy("hybrid:4:64:k8v4").bits == (8, 4)
    assert parse_policy("full:q4").bits == (4, 4) and parse_policy("full").bits is None
    assert parse_policy("hybrid:4:64:q8") != parse_policy("hybrid:4:64")
    for bad, words in [
        ("full:q3", ["'q3'", "q8", "q4", "k8v4"]),
        ("hybrid:4:64:k8v2", ["'k8v2'", "q8"]),
        ("sink_window:4:64:fp8", ["'fp8'"]),
        ("full:g32", ["group"]),
    ]:
        with pytest.raises(ValueError) as err:
            parse_policy(bad)
        assert all(w in str(err.value) for w in words), str(err.value)
    # a group that does not divide head_dim: refused naming both, when the session is made
    with pytest.raises(ValueError, match="group 32 does not divide head_dim 48"):
        parse_policy("full:q8:g32").group_for(48)
    assert parse_policy("full:q8").group_for(16) == 16  # clamped to a smaller head_dim


@pytest.mark.skipif(not HAVE_MLX, reason="mlx not installed")
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_quantization_is_mlx_quantize_byte_for_byte(bits: int, dtype: str) -> None:
    import mlx.core as mx

    x = torch.randn(2, 3, 7, 64, generator=torch.Generator().manual_seed(bits)).to(getattr(torch, dtype))
    codes, scales, biases = quantize(x, bits, 32)
    xm = mx.array(x.float().numpy()).astype(getattr(mx, dtype))
    cm, sm, bm = mx.quantize(xm, group_size=32, bits=bits)
    assert np.array_equal(np.array(cm).view(np.uint8), codes.numpy())
    assert np.array_equal(np.array(sm.astype(mx.float32)), scales.float().numpy())
    assert np.array_equal(np.array(bm.astype(mx.float32)), biases.float().numpy())
    back = dequantize(codes, scales, biases, bits, 32).float()
    ref = mx.dequantize(cm, sm, bm, group_size=32, bits=bits).astype(mx.float32)
    assert np.array_equal(np.array(ref), back.numpy())
    groups = x.float().reshape(2, 3, 7, 2, 32)
    err = (back.reshape(groups.shape) - groups).abs().amax(-1)
    # within one quantization step of its group (plus the dtype's rounding of the dequantized value)
    assert (err <= scales.float().abs() * 1.01 + 2**-7 * groups.abs().amax(-1)).all()


def test_torch_stores_k_and_v_side_by_side_with_the_values_they_have_apart() -> None:
    """q8 / q4 quantize [K | V] in one call: groups never straddle K and V, so the stored codes, scales
    and biases are those of K and V quantized apart; a layer stores them so, kXvY apart."""
    x = torch.randn(1, 2, 5, 2 * HEAD_DIM, generator=torch.Generator().manual_seed(3))
    for bits in (8, 4):
        joint = quantize(x, bits, HEAD_DIM)
        k, v = quantize(x[..., :HEAD_DIM], bits, HEAD_DIM), quantize(x[..., HEAD_DIM:], bits, HEAD_DIM)
        apart = zip(k, v, strict=True)
        assert all(torch.equal(j, torch.cat(kv, dim=-1)) for j, kv in zip(joint, apart, strict=True))
    for prec, joint_parts in (("q8", 1), ("q4", 1), ("k8v4", 2)):
        seq = _model("torch").session(with_precision(parse_policy("hybrid:2:6"), prec))
        seq.prefill(tiny_models.prompt(9))
        assert {len(s.parts) for s in seq.states} == {joint_parts}


@functools.cache
def _greedy(backend: str, policy: Policy, prompt_len: int) -> tuple[int, ...]:
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    return tuple(
        engine.generate(_model(backend).session(policy, prefill_chunk=16), ids, engine.Stop(NEW)).tokens
    )


CASES = [
    pytest.param(p, d, k, "torch", id=f"torch-{p}-{d}-{k}")
    for p in QUANTIZED
    for d, k in (("self", 4), ("random", 3))
] + [
    pytest.param(p, d, k, "mlx", marks=BACKENDS[1].marks, id=f"mlx-{p}-{d}-{k}")
    for p, (d, k) in zip(QUANTIZED, [("self", 4), ("random", 3)] * 2, strict=True)
]


@pytest.mark.parametrize(("policy", "drafter", "k", "backend"), CASES)
def test_speculative_equals_greedy_under_quantized_policies(
    policy: Policy, drafter: str, k: int, backend: str
) -> None:
    prompt_len = 40
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    verifier = _model(backend).session(policy, max_block=k + 1, prefill_chunk=16)
    if drafter == "self":
        d = engine.ModelDrafter(_model(backend).session(policy, max_block=k + 1))
    else:
        # a random-weight drafter (head_dim 16: its own cache unquantized): mostly rejected
        drafter_model = on(backend, tiny_models.qwen(seed=7, layers=1))
        d = engine.ModelDrafter(drafter_model.session(with_precision(policy, ""), max_block=k))
    gen = engine.speculative_generate(verifier, d, ids, k, engine.Stop(NEW))
    assert tuple(gen.tokens) == _greedy(backend, policy, prompt_len)
    assert verifier.position > (policy.window or 0) + policy.sink + k + 1  # the ring wrapped
    if drafter == "self":
        assert gen.accepted >= 0.9 * gen.drafted
    else:
        assert gen.accepted < gen.drafted  # rejections: rollbacks were exercised


@pytest.mark.parametrize("policy", QUANTIZED)
def test_quantized_kv_bytes_are_the_formula_measured_from_the_buffers(policy: Policy, backend: str) -> None:
    tm = _model(backend)
    geo = tm.geometry
    slot = [policy_slot_bytes(policy, geo.kv_heads, geo.head_dim, 4)] * geo.n_layers
    seq = tm.session(policy, max_block=3, prefill_chunk=8)
    seq.prefill(tiny_models.prompt(21))
    for n in range(40):
        got, want = seq.kv_bytes(), expected_kv_bytes(seq.specs, seq.position, 3, slot)
        assert got == want, (n, got, want)
        for s, a, b in zip(seq.specs, seq.kv_allocated_bytes(), slot, strict=True):
            assert s.window is None or a <= (s.sink + s.ring_size(3)) * b
        seq.forward([5, 6, 7][: 1 + n % 3])
        seq.trim(n % 3)
    plain = tm.session(with_precision(policy, ""), max_block=3)
    plain.prefill(tiny_models.prompt(seq.position))
    assert sum(seq.kv_bytes()) < sum(plain.kv_bytes())


def test_q4_holds_at_most_0_3_of_bfloat16_including_scales(backend: str) -> None:
    base = tiny_models.gemma(head_dim=64)
    tm = TorchModel(copy.deepcopy(base.model).to(torch.bfloat16))
    model = on(backend, tm)
    for policy in (parse_policy("hybrid:4:16"), parse_policy("full")):
        ids = tiny_models.prompt(50)
        held = {}
        for prec in ("", "q4", "q8"):
            seq = model.session(with_precision(policy, prec))
            seq.prefill(ids)
            held[prec] = sum(seq.kv_bytes())
        assert held["q4"] <= 0.3 * held[""], held
        assert held["q8"] <= 0.6 * held[""], held


def test_quantization_drifts_the_logits_a_little_more_at_fewer_bits(backend: str) -> None:
    tm = _model(backend)
    ids = tiny_models.prompt(60, seed=3)
    rows = {}
    for prec in ("", "q8", "k8v4", "q4"):
        step = tm.session(with_precision(parse_policy("hybrid:2:12"), prec)).prefill(ids, logits=True)
        rows[prec] = np.array(step.logits.tolist() if hasattr(step.logits, "tolist") else step.logits)
    drift = {p: float(np.abs(rows[p] - rows[""]).max()) for p in ("q8", "k8v4", "q4")}
    scale = float(np.abs(rows[""]).max())
    assert 0 < drift["q8"] < drift["q4"] < 0.5 * scale, drift
    assert drift["q8"] < 0.05 * scale, drift


@pytest.mark.skipif(not HAVE_MLX, reason="mlx not installed")
def test_mlx_attends_q8_and_q4_through_quantized_matmul_as_if_dequantized() -> None:
    """q8 / q4 layers hand mlx-lm (codes, scales, biases) and it attends with mx.quantized_matmul; k8v4
    (two widths) dequantizes. Same logits as dequantizing the same stored values, through a wrap."""
    model = on("mlx", tiny_models.gemma(head_dim=HEAD_DIM))
    ids = tiny_models.prompt(45, seed=5)
    for prec, quantized in (("q8", True), ("q4", True), ("k8v4", False)):
        policy = with_precision(parse_policy("sink_window:2:12"), prec)
        rows = []
        for route in (True, False):
            seq = model.session(policy, max_block=3, prefill_chunk=16)
            assert all(hasattr(c, "bits") == quantized for c in seq.cache)
            if not route:
                for c in seq.cache:
                    c.__dict__.pop("bits", None)  # mlx-lm falls back to fast SDPA on dequantized K/V
            seq.prefill(ids)
            rows.append(np.array(seq.forward([3, 4, 5], logits=True).logits.tolist()))
        scale = np.abs(rows[1]).max()
        assert np.abs(rows[0] - rows[1]).max() <= 1e-4 * scale, prec
