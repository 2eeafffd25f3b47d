"""Batched decoding and device placement: every row of a batch equals decoding its prompt alone (both
backends, every policy, windows that wrap), every tensor a session makes lives on the model's device,
and a device that is not there fails before the weights load."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import engine
from engine.backends.torch.device import devices, pick_dtype
from engine.backends.torch.session import TorchModel, TorchSession
from engine.policy import Policy, full, hybrid, parse_policy, sink_window
from tests.engine import tiny_models
from tests.engine.backends import HAVE_MLX, on

POLICIES = [full(), sink_window(4, 8), sink_window(0, 6), hybrid(2, 5), hybrid(4, 4096)]
QUANTIZED = [parse_policy(p) for p in ("full:q8", "sink_window:4:8:q4", "hybrid:2:5:k8v4")]
MODELS = {"gemma": tiny_models.gemma, "qwen": tiny_models.qwen, "mistral": tiny_models.mistral}
LENGTHS = (5, 23, 40, 1)  # different lengths: the rows' rings wrap at different steps


@pytest.mark.parametrize("policy", POLICIES, ids=str)
@pytest.mark.parametrize("model", ["gemma", "qwen", "mistral"])
def test_each_row_of_a_batch_equals_decoding_its_prompt_alone(
    backend: str, model: str, policy: Policy
) -> None:
    if backend == "mlx" and model == "mistral":
        pytest.skip("the mlx twin of the tiny Mistral is covered by test_decode's torch runs")
    _rows_equal_alone(on(backend, MODELS[model]()), policy)


@pytest.mark.parametrize("policy", QUANTIZED, ids=str)
def test_each_row_of_a_batch_equals_decoding_its_prompt_alone_with_quantized_kv(
    backend: str, policy: Policy
) -> None:
    m = tiny_models.gemma(head_dim=32, seed=3)  # mx.quantize takes groups >= 32; seed 3: varied output
    _rows_equal_alone(on(backend, m), policy)


def _rows_equal_alone(m: Any, policy: Policy) -> None:
    prompts = [tiny_models.prompt(n, seed=n) for n in LENGTHS]
    alone = [engine.generate(m.session(policy, prefill_chunk=16), p, engine.Stop(40)).tokens for p in prompts]
    session = m.session(policy, prefill_chunk=16, rows=len(prompts))
    got = engine.generate_batch(session, prompts, engine.Stop(40))
    assert [g.tokens for g in got] == alone
    assert len({tuple(a) for a in alone}) == len(alone) and len(set(alone[1])) > 10
    assert session.positions == [n + 39 for n in LENGTHS]
    # K/V bytes per row are each row's own, and add up to the total.
    rows = session.kv_row_bytes()
    assert sum(rows) == sum(session.kv_bytes())
    for r, p in enumerate(prompts):
        one = m.session(policy, prefill_chunk=16)
        one.prefill(p)
        for t in alone[r][:-1]:
            one.forward([t])
        assert rows[r] == sum(one.kv_bytes())


def test_rows_stop_on_their_own_and_blocks_of_several_tokens_are_exact(backend: str) -> None:
    m = on(backend, tiny_models.gemma())
    policy = sink_window(4, 8)
    prompts = [tiny_models.prompt(n, seed=n) for n in (30, 12)]
    alone = [engine.generate(m.session(policy), p, engine.Stop(30)).tokens for p in prompts]
    eos = alone[0][9]
    stop = engine.Stop(30, eos_ids=frozenset({eos}))
    session = m.session(policy, rows=2)
    fed: list[int] = []  # rows fed per step
    forward_rows = session.forward_rows
    session.forward_rows = lambda ids, **kw: fed.append(len(ids)) or forward_rows(ids, **kw)  # type: ignore[method-assign]
    got = engine.generate_batch(session, prompts, stop)
    for g, a in zip(got, alone, strict=True):
        cut = a.index(eos) + 1 if eos in a else 30
        assert g.tokens == a[:cut] and g.stop_reason == ("eos" if eos in a[:cut] else "max_new_tokens")
        assert g.forwards == len(g.tokens) - 1  # the steps it was fed in (the prefill gave its first)
    # the row that stopped left the batch (issue 44): later steps fed only the other one
    early = min(len(g.tokens) for g in got)
    assert fed == [2] * (early - 1) + [1] * (max(len(g.tokens) for g in got) - early) and early < 30
    assert session.rows == 1
    # Teacher-forced blocks of 3 tokens per row (max_block=3) equal one token at a time.
    block = m.session(policy, max_block=3, rows=2)
    single = m.session(policy, rows=2)
    for r, p in enumerate(prompts):
        block.prefill(p, row=r)
        single.prefill(p, row=r)
    for i in range(0, 27, 3):
        fed = [a[i : i + 3] for a in alone]
        one_by_one = [single.forward_rows([[f[j]] for f in fed]).tokens for j in range(3)]
        assert block.forward_rows(fed).tokens == [[s[r][0] for s in one_by_one] for r in range(2)]
    with pytest.raises(ValueError, match="at most max_block=3"):
        block.forward_rows([[1, 2, 3, 4], [1, 2, 3, 4]])
    with pytest.raises(ValueError, match="rows of the same length"):
        block.forward_rows([[1], [1, 2]])
    with pytest.raises(ValueError, match="prefill each with row="):
        block.prefill([1, 2])
    with pytest.raises(ValueError, match="feed them with forward_rows"):
        block.forward([1])
    with pytest.raises(ValueError, match="no row 2"):
        block.prefill([1, 2], row=2)


def _tensors(obj: Any, seen: set[int] | None = None) -> list[tuple[str, torch.Tensor]]:
    """Every tensor reachable from a session's own objects (not the model's weights)."""
    seen = set() if seen is None else seen
    out: list[tuple[str, torch.Tensor]] = []
    if id(obj) in seen:
        return out
    seen.add(id(obj))
    items = (
        obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list | tuple) else None
    )
    if items is None:
        if not hasattr(obj, "__dict__") or isinstance(obj, torch.nn.Module | TorchModel | type):
            return out
        items = vars(obj).items()
    for key, value in items:
        if isinstance(value, torch.Tensor):
            out.append((f"{type(obj).__name__}.{key}", value))
        elif key != "owner":
            out += _tensors(value, seen)
    return out


@pytest.mark.parametrize("rows", [1, 3])
def test_every_tensor_a_session_makes_is_on_the_models_device(rows: int) -> None:
    model = engine.load("zoo:tiny-hybrid", "torch", dtype="auto", device="cpu")
    assert model.device == torch.device("cpu") and model.dtype == torch.float32  # auto on a cpu
    assert model.device_name.startswith("cpu") and model.dtype_name == "float32"
    session = model.session(sink_window(2, 8), max_block=2, rows=rows)
    assert isinstance(session, TorchSession)
    prompts = [tiny_models.prompt(10 + 7 * r, seed=r) for r in range(rows)]
    masks = []
    for t in session.tensors:  # record the masks the forwards build
        build = t.mask
        t.mask = lambda fwd, build=build: masks.append(build(fwd)) or masks[-1]  # type: ignore[method-assign]
    if rows == 1:
        engine.generate(session, prompts[0], engine.Stop(20))
        session.forward([3, 4])
        session.trim(1)
        session.forward([5])
    else:
        engine.generate_batch(session, prompts, engine.Stop(20))
    found = _tensors(session) + [("mask", m) for m in masks if m is not None]
    kinds = {name for name, _ in found}
    assert {"KV.k", "KV.v", "GroupTensors.table", "GroupTensors.queries", "mask"} <= kinds, kinds
    assert all(t.device == model.device for _, t in found), [(n, t.device) for n, t in found]
    assert engine.models.runtime()["device"].startswith("cpu")


def test_a_device_that_is_not_there_fails_before_the_weights_load(monkeypatch) -> None:
    import transformers

    def no_weights(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("weights loaded before the device was checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_weights)
    have = ", ".join(devices())
    with pytest.raises(
        ValueError, match=f"device 'cuda:7' is not available here; torch devices here: {have}$"
    ):
        engine.load("zoo:tiny-hybrid", "torch", device="cuda:7")
    with pytest.raises(ValueError, match="device 'tpu' is not available"):
        engine.models.check_device("torch", "tpu")
    assert engine.models.check_device("torch", "auto") in devices()
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        pick_dtype("float8", torch.device("cpu"))
    assert pick_dtype("auto", torch.device("cuda")) == torch.bfloat16
    if HAVE_MLX:
        with pytest.raises(ValueError, match="device 'cuda' is not available here; mlx devices here: cpu"):
            engine.models.check_device("mlx", "cuda")
        assert engine.models.check_device("mlx", "cpu").startswith("Device(cpu")


def test_compiled_forwards_stay_exact_and_mlx_refuses_compile() -> None:
    """torch.compile with dynamo's eager backend traces the model (our cache runs between graphs); outputs
    equal the uncompiled session's, batched too. (inductor, compile=True, is the same switch with another
    backend: minutes of compiling on a cpu.)"""
    tm = tiny_models.qwen()
    compiled = TorchModel(tm.model, compile="eager")
    assert compiled.run is not tm.model
    prompts = [tiny_models.prompt(n, seed=n) for n in (20, 9)]
    policy = sink_window(2, 8)
    for p in prompts:
        want = engine.generate(tm.session(policy), p, engine.Stop(20)).tokens
        assert engine.generate(compiled.session(policy), p, engine.Stop(20)).tokens == want
    want_rows = [
        g.tokens for g in engine.generate_batch(tm.session(policy, rows=2), prompts, engine.Stop(12))
    ]
    got = engine.generate_batch(compiled.session(policy, rows=2), prompts, engine.Stop(12))
    assert [g.tokens for g in got] == want_rows
    if HAVE_MLX:
        with pytest.raises(ValueError, match="compile is not supported on the mlx backend"):
            engine.load("zoo:tiny-hybrid", "mlx", compile=True)


def test_rows_of_linear_attention_states_are_refused_with_the_reason(backend: str) -> None:
    linear = on(backend, tiny_models.qwen35())
    with pytest.raises(ValueError, match=r"rows=3\) does not support linear-attention layers"):
        linear.session(full(), rows=3)
    # One row still decodes.
    assert linear.session(full()).prefill(tiny_models.prompt(7, seed=1)).tokens


@pytest.mark.parametrize("policy", [full(), sink_window(4, 8), hybrid(2, 5)], ids=str)
def test_rows_joining_a_decoding_batch_equal_decoding_alone(backend: str, policy: Policy) -> None:
    """`Session.join`: rows prefilled on their own join a batch mid-decode (after its rings wrapped, with
    other buffer sizes), and later a batch of two; every row's tokens equal decoding its prompt alone, and
    what cannot join (quantized K/V) refuses in one line."""
    m = on(backend, tiny_models.gemma())
    prompts = [tiny_models.prompt(n, seed=n) for n in (23, 5, 40, 9)]
    alone = [engine.generate(m.session(policy, max_block=3), p, engine.Stop(40)).tokens for p in prompts]
    outs: list[list[int]] = []

    def fresh(p: list[int]) -> Any:
        s = m.session(policy, max_block=3)
        outs.append(s.prefill(p).tokens)
        return s

    batch = fresh(prompts[0])
    for i, p in enumerate(prompts):
        if i:
            batch.join(fresh(p))
            assert batch.rows == i + 1
        for _ in range(7):  # every row steps; the rows that joined later are behind
            step = batch.forward_rows([[o[-1]] for o in outs])
            for o, t in zip(outs, step.tokens, strict=True):
                o.append(t[0])
    while len(outs[-1]) < 40:
        step = batch.forward_rows([[o[-1]] for o in outs])
        for o, t in zip(outs, step.tokens, strict=True):
            o.append(t[0])
    for r, (o, want) in enumerate(zip(outs, alone, strict=True)):
        assert o[:40] == want[: len(o[:40])], r
    q = parse_policy("sink_window:4:8:q8")
    mq = on(backend, tiny_models.gemma(head_dim=32, seed=3))
    a, b = mq.session(q), mq.session(q)
    why = a.join_refusal()
    assert why is not None and "quantized" in why and "\n" not in why
    a.prefill([1, 2, 3])
    b.prefill([4, 5])
    with pytest.raises(ValueError, match="cannot join rows: quantized"):
        a.join(b)
