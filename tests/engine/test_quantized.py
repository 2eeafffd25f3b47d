"""Quantized K/V (policy suffix :q8, :q4, :kXvY): the policy grammar, the affine format shared by both
backends, speculative == greedy under each quantized policy (through wraps), and the bytes held."""

from __future__ import annotations

import copy
import functools
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import engine
from engine.backends.torch import kv_kernels
from engine.backends.torch.quant import _dequantize, _quantize, dequantize, quantize
from engine.backends.torch.session import TorchModel
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


@pytest.fixture(params=["kernels", "torch-ops"])
def kernels(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The torch backend's quantized K/V on a cpu through its C kernels, and through its torch ops."""
    if request.param == "torch-ops":
        monkeypatch.setattr(kv_kernels, "library", lambda: None)
    else:
        _require_kernels()
    yield request.param


def _require_kernels() -> None:
    if kv_kernels.library() is None:
        # a machine with a C compiler must build them: only a compiler-less one runs torch ops alone
        assert kv_kernels._compiler() is None, kv_kernels.status()
        pytest.skip(kv_kernels.status())


@pytest.mark.skipif(not HAVE_MLX, reason="mlx not installed")
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_quantization_is_mlx_quantize_byte_for_byte(bits: int, dtype: str, kernels: str) -> None:
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


def _awkward_groups(seed: int, width: int) -> torch.Tensor:
    """[2, 3, 5, width] values whose groups (of 32) include the edge cases of the affine rule."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 5, width, generator=gen) * torch.logspace(-6, 4, 5)[:, None]
    x[0, 0, 0, :32] = -0.5  # constant negative: the ±edge tie
    x[0, 0, 1, :32] = 0.0  # zeros: scale kept, bias 0
    x[0, 0, 2, :32] = 3e-9  # below the minimum scale
    x[0, 1, 0, :32] = torch.randint(-4, 5, (32,), generator=gen).float()  # exact codes, ties at .5
    x[0, 1, 1, 5] = 1e6  # one outlier
    x[1, 2, 4, :32] = -x[1, 2, 4, :32].abs()  # all negative
    return x


@pytest.mark.parametrize("bits", [8, 4])
def test_the_c_kernels_store_and_read_the_bytes_of_the_torch_ops(bits: int) -> None:
    """The cpu kernels against the torch ops they replace: codes, scales, biases and dequantized values
    identical, fresh blocks and blocks written into strided views of a cache buffer (a slot range)."""
    _require_kernels()
    for seed, width, group in ((0, 64, 32), (1, 128, 64), (2, 96, 32), (3, 64, 16)):
        x = _awkward_groups(seed, width)
        fast = _quantize(x, bits, group)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(kv_kernels, "library", lambda: None)
            slow = _quantize(x, bits, group)
            slow_back = _dequantize(*slow, bits)
        assert all(torch.equal(a, b) for a, b in zip(fast, slow, strict=True)), (seed, bits)
        assert torch.equal(_dequantize(*fast, bits), slow_back)
        # into slots 3..8 of buffers of 11 slots, and back out of a view of the first 9
        bufs = [torch.zeros(2, 3, 11, *t.shape[3:], dtype=t.dtype) for t in fast]
        assert kv_kernels.quantize_into(x, bits, group, *(b.narrow(2, 3, 5) for b in bufs))
        assert all(torch.equal(b[:, :, 3:8], t) for b, t in zip(bufs, fast, strict=True))
        assert all(not b[:, :, :3].any() and not b[:, :, 8:].any() for b in bufs)  # nothing else written
        view = kv_kernels.dequantize(*(b.narrow(2, 0, 9) for b in bufs), bits)
        assert view is not None and view.shape == (2, 3, 9, width // group, group)
        assert torch.equal(view[:, :, 3:8], slow_back)
    # what the kernels cannot address safely is left to the caller's torch ops, nothing written
    codes, scales, biases = _quantize(x, bits, 32)
    assert not kv_kernels.quantize_into(x.double(), bits, 32, codes, scales, biases)  # not float32
    assert not kv_kernels.quantize_into(x, bits, 64, codes, scales, biases)  # another group size
    assert not kv_kernels.quantize_into(x[:, :, :4], bits, 32, codes, scales, biases)  # fewer slots
    assert not kv_kernels.quantize_into(x, bits, 32, codes, scales[..., :1, :], biases)  # a short scale row
    assert not kv_kernels.quantize_into(x, bits, 32, codes.view(torch.int8), scales, biases)
    assert kv_kernels.dequantize(codes, scales.double(), biases.double(), bits) is None
    assert kv_kernels.dequantize(codes, scales, biases, 2) is None  # a width the kernels do not know


def test_a_decode_step_through_the_kernels_writes_its_slots_and_reads_its_view_only() -> None:
    """`Buffers.step` (a decode step's write and read in two calls on checked buffers): the bytes of the
    torch ops, in its row and slots only; a step outside the buffers is refused with nothing written."""
    _require_kernels()
    x = _awkward_groups(5, 64)  # [2, 3, 5, 64]: two rows' blocks of 5 slots
    codes, scales, biases = (torch.zeros(2, 3, 12, *t.shape[3:], dtype=t.dtype) for t in _quantize(x, 8, 32))
    bufs = kv_kernels.Buffers.of(codes, scales, biases, 8, 32)
    assert bufs is not None
    read = bufs.step(x[1:], 1, 4, 10)  # row 1, slots 4..8, then its view of 10 slots
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(kv_kernels, "library", lambda: None)
        want = _quantize(x[1:], 8, 32)
        back = _dequantize(*want, 8)
    assert read is not None and read.shape == (1, 3, 10, 2, 32)
    assert all(torch.equal(t[1:, :, 4:9], w) for t, w in zip((codes, scales, biases), want, strict=True))
    assert not codes[0].any() and not codes[1, :, :4].any() and not codes[1, :, 9:].any()
    assert torch.equal(read[:, :, 4:9], back) and not read[:, :, :4].any()
    before = [t.clone() for t in (codes, scales, biases)]
    for row, start, view in ((2, 0, 5), (1, 8, 10), (0, -1, 5), (0, 0, 13)):  # beyond a row, slot or view
        assert bufs.step(x[1:], row, start, view) is None
    assert bufs.step(x[1:, :2], 0, 0, 5) is None  # not the buffers' heads
    assert bufs.step(x[1:].double(), 0, 0, 5) is None
    assert all(torch.equal(a, b) for a, b in zip(before, (codes, scales, biases), strict=True))
    assert kv_kernels.Buffers.of(codes[:, :, ::2], scales[:, :, ::2], biases[:, :, ::2], 8, 32) is None


def test_the_c_kernels_split_a_long_view_over_threads_with_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With torch allowed several threads, a long block or view goes to the kernels in slot ranges on a
    thread pool: the same bytes as one call, ranges of unequal length included."""
    _require_kernels()
    x = _awkward_groups(4, 128).repeat(1, 1, 9, 1)  # 45 slots; K of a [K | V] block: strided
    key = x[..., :64]
    threads = torch.get_num_threads()
    out = []
    try:
        for n, minimum in ((1, kv_kernels.PARALLEL_MIN), (4, 500)):
            torch.set_num_threads(n)
            monkeypatch.setattr(kv_kernels, "PARALLEL_MIN", minimum)
            bufs = [torch.zeros(2, 3, 50, *t.shape[3:], dtype=t.dtype) for t in _quantize(key, 8, 32)]
            assert kv_kernels.quantize_into(key, 8, 32, *(b.narrow(2, 2, 45) for b in bufs))
            out.append([*bufs, kv_kernels.dequantize(*(b.narrow(2, 1, 47) for b in bufs), 8)])
    finally:
        torch.set_num_threads(threads)
    assert 4 in kv_kernels._POOLS  # the second run went through the pool
    assert all(torch.equal(a, b) for a, b in zip(*out, strict=True))


def test_kernel_status_names_why_torch_ops_are_used(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    try:
        for env, value, words in (
            ("KAKEYA_KV_KERNELS", "torch", "KAKEYA_KV_KERNELS=torch"),
            ("CC", "false", "false could not build kv_kernels.c"),
        ):
            with monkeypatch.context() as mp:
                mp.setenv(env, value)
                kv_kernels._load.cache_clear()
                assert kv_kernels.library() is None
                assert kv_kernels.status().startswith("torch ops") and words in kv_kernels.status()
        if shutil.which("cc") or shutil.which("gcc"):
            kv_kernels._load.cache_clear()
            assert kv_kernels.library() is not None, kv_kernels.status()
            assert str(tmp_path) in kv_kernels.status()
            assert [p.suffix for p in (tmp_path / "kakeya" / "kernels").iterdir()] == [".so"]  # no leftovers
    finally:
        kv_kernels._load.cache_clear()


def test_a_quantized_session_decodes_the_same_with_and_without_the_kernels() -> None:
    """End to end (prefill chunks, decode steps, verify blocks, a wrapped ring, rollbacks): the same
    logits to the bit."""
    _require_kernels()
    ids = tiny_models.prompt(37, seed=2)
    runs = []
    for fast in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            if not fast:
                mp.setattr(kv_kernels, "library", lambda: None)
            for prec in ("q8", "q4", "k8v4"):
                seq = _model("torch").session(
                    with_precision(parse_policy("hybrid:2:6"), prec), max_block=3, prefill_chunk=16
                )
                rows = [seq.prefill(ids, logits=True).logits]
                for n in range(12):
                    rows.append(seq.forward([4 + n, 9, 2][: 1 + n % 3], logits=True).logits)
                    seq.trim(n % 2)
                runs.append(torch.cat(rows))
    assert all(torch.equal(a, b) for a, b in zip(runs[:3], runs[3:], strict=True))


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
