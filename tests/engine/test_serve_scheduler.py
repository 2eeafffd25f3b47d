"""The serving scheduler without HTTP: rows joining a running batch mid-decode change no other row's
tokens, speculative decoding inside stays greedy-exact, admission keeps to the K/V budget, and a prompt
longer than the context is served under a bounded policy and refused under `full`."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import pytest

import engine
from engine.draft_length import DraftLength
from engine.drafters.load import load_drafter
from engine.drafters.spec import parse_drafter
from engine.policy import drafter_policy, parse_policy
from engine.sampling import Sampling
from engine.serve.backlog import Backlog
from engine.serve.join import join_drafter
from engine.serve.scheduler import Engine, Params, Refused, Scheduler
from engine.zoo import corpus
from tests.engine.backends import HAVE_MLX


@pytest.fixture(scope="module")
def model() -> Any:
    import torch

    torch.set_num_threads(1)
    return engine.load("zoo:tiny-hybrid")


class Collect:
    """Each request's tokens and end, as the scheduler emits them; `rows` records the batch size seen."""

    def __init__(self) -> None:
        self.tokens: dict[int, list[int]] = {}
        self.reasons: dict[int, str] = {}
        self.done = threading.Condition()

    def emit(self, i: int) -> Any:
        self.tokens[i] = []

        def emit(tokens: list[int] | None, reason: str | None) -> None:
            if tokens:
                self.tokens[i] += tokens
            if reason:
                with self.done:
                    self.reasons[i] = reason
                    self.done.notify_all()

        return emit

    def wait(self, n: int, timeout: float = 60) -> None:
        with self.done:
            assert self.done.wait_for(lambda: len(self.reasons) >= n, timeout), self.reasons


def reference(model: Any, policy: str, prompt: list[int], n: int) -> list[int]:
    session = model.session(parse_policy(policy), max_block=1)
    return engine.generate(session, prompt, engine.Stop(n, model.eos_ids)).tokens


def run(sched: Scheduler, prompts: list[list[int]], ns: list[int], gap: float = 0.0) -> Collect:
    got = Collect()
    sched.start()
    try:
        for i, (p, n) in enumerate(zip(prompts, ns, strict=True)):
            sched.submit(p, Params(n), got.emit(i))
            time.sleep(gap)
        got.wait(len(prompts))
    finally:
        sched.stop()
    return got


def _batch_sizes(sched: Scheduler) -> list[int]:
    """The rows of every batch step the scheduler takes from now on (its `_decode` spied on)."""
    seen: list[int] = []
    decode = sched._decode

    def spy(batch: Any) -> None:
        seen.append(len(batch.rows))
        decode(batch)

    sched._decode = spy  # type: ignore[method-assign]
    return seen


def test_a_row_joining_mid_decode_changes_no_other_row(model: Any) -> None:
    policy = "sink_window:4:16"
    prompts = [model.encode(p) for p in corpus.code_prompts(3, 1, 30)]
    sched = Scheduler(Engine(model, parse_policy(policy)), kv_budget=1 << 30)
    got = Collect()
    seen_rows = _batch_sizes(sched)
    sched.start()
    try:
        sched.submit(prompts[0], Params(60), got.emit(0))
        while len(got.tokens[0]) < 12:  # the first row is decoding (past its window) when the others join
            time.sleep(0.001)
        sched.submit(prompts[1], Params(40), got.emit(1))
        while len(got.tokens[1]) < 5:
            time.sleep(0.001)
        sched.submit(prompts[2], Params(20), got.emit(2))
        got.wait(3)
    finally:
        sched.stop()
    assert max(seen_rows) == 3 and seen_rows[0] == 1  # they did share one batch
    assert len(sched.batches) == 0 and sched.reserved == 0
    for i, n in enumerate((60, 40, 20)):
        assert got.tokens[i] == reference(model, policy, prompts[i], n), i
        assert got.reasons[i] == "max_new_tokens"


@pytest.mark.parametrize("drafter", ["lookup", "block:zoo:tiny-block-drafter", "model:zoo:tiny-drafter"])
def test_speculative_rows_are_greedy_exact(model: Any, drafter: str) -> None:
    policy = "sink_window:4:16"
    factory = load_drafter(parse_drafter(drafter), model, k=4, policy=drafter_policy(parse_policy(policy)))
    prompts = [model.encode(p) for p in corpus.code_prompts(5, 2, 28)]
    ns = [30, 12, 25, 40, 8]
    eng = Engine(model, parse_policy(policy), factory, k=4, prefill_chunk=16)
    assert eng.rows_drafter == drafter.startswith("block:")  # the block drafter's rows join its batched twin
    got = run(Scheduler(eng, kv_budget=1 << 30), prompts, ns, gap=0.01)
    for i, (p, n) in enumerate(zip(prompts, ns, strict=True)):
        assert got.tokens[i] == reference(model, policy, p, n), i


@pytest.mark.parametrize("drafter", [None, "lookup", "block:zoo:tiny-block-drafter"])
def test_a_seed_reproduces_whatever_the_draft_lengths_and_the_batch(model: Any, drafter: str | None) -> None:
    """A sampled request's tokens are those of `engine.generate` of its prompt alone with its `Sampling`
    (each output position decided by its own uniform, `Row.uniform`), with draft lengths changing every
    step and other rows in the batch: the same seed, the same text; another seed, another."""
    policy = "sink_window:4:16"
    factory = None
    if drafter:
        factory = load_drafter(
            parse_drafter(drafter), model, k=4, policy=drafter_policy(parse_policy(policy))
        )
    prompts = [model.encode(p) for p in corpus.code_prompts(2, 4, 20)]
    jobs = [
        (prompts[0], Sampling(0.8, 20, 0.95, 5)),
        (prompts[1], None),
        (prompts[0], Sampling(0.8, 20, 0.95, 5)),
        (prompts[0], Sampling(0.8, 20, 0.95, 6)),
        (prompts[1], Sampling(1.0, 0, 1.0, 7)),
    ]
    sched = Scheduler(Engine(model, parse_policy(policy), factory, k=4), kv_budget=1 << 30)
    if sched.length is not None:
        ks = itertools.cycle([4, 0, 2, 0, 0, 3, 1, 4, 4, 0])
        sched.length.choose = lambda rows: next(ks)  # type: ignore[method-assign]
    got = Collect()
    sched.start()
    try:
        for i, (p, s) in enumerate(jobs):
            sched.submit(p, Params(30, s), got.emit(i))
            time.sleep(0.02 * i)
        got.wait(len(jobs))
    finally:
        sched.stop()
    for i, (p, s) in enumerate(jobs):
        session = model.session(parse_policy(policy), max_block=1)
        assert got.tokens[i] == engine.generate(session, p, engine.Stop(30, model.eos_ids), s).tokens, i
    assert got.tokens[0] == got.tokens[2] and got.tokens[0] != got.tokens[3]


def test_admission_keeps_to_the_kv_budget(model: Any) -> None:
    policy = "sink_window:4:16"
    eng = Engine(model, parse_policy(policy))
    per_row = eng.reserve(40)
    assert per_row == eng.reserve(4000)  # bounded: the same whatever the length
    sched = Scheduler(eng, kv_budget=2 * per_row + per_row // 2)  # two rows fit, not three
    running: list[int] = []
    decode = sched._decode

    def spy(batch: Any) -> None:
        running.append(sched.running)
        assert sched.held <= sched.kv_budget
        decode(batch)

    sched._decode = spy  # type: ignore[method-assign]
    prompts = [model.encode(p) for p in corpus.code_prompts(5, 3, 20)]
    got = run(sched, prompts, [20] * 5)
    assert max(running) == 2
    for i, p in enumerate(prompts):
        assert got.tokens[i] == reference(model, policy, p, 20)


def test_a_prompt_longer_than_the_context_is_served_bounded_and_refused_under_full(model: Any) -> None:
    prompt = model.encode(corpus.code_prompts(1, 5, 120)[0])
    assert len(prompt) > 64
    full = Scheduler(Engine(model, parse_policy("full"), context=64), kv_budget=1 << 30)
    with pytest.raises(Refused) as info:
        full.submit(prompt, Params(8), lambda t, r: None)
    assert info.value.status == 400 and info.value.param == "max_tokens"
    assert "context of 64 tokens" in str(info.value) and "\n" not in str(info.value)
    bounded = Scheduler(
        Engine(model, parse_policy("sink_window:4:16"), context=64, prefill_chunk=32), kv_budget=1 << 30
    )
    got = run(bounded, [prompt], [10])
    assert got.tokens[0] == reference(model, "sink_window:4:16", prompt, 10)


def test_a_request_larger_than_the_whole_budget_is_refused(model: Any) -> None:
    eng = Engine(model, parse_policy("full"))
    assert not eng.bounded and eng.reserve(100) > eng.reserve(50)  # full: K/V grows with the sequence
    assert not Engine(model, parse_policy("hybrid:4:16")).bounded  # its full-attention layers keep everything
    sched = Scheduler(eng, kv_budget=eng.reserve(50))
    with pytest.raises(Refused) as info:
        sched.submit(list(range(5, 40)), Params(100), lambda t, r: None)
    assert info.value.status == 400 and "budget" in str(info.value)


def test_rows_decode_exactly_where_rows_cannot_join(model: Any) -> None:
    """Quantized K/V cannot join a batch (engine/serve/join.py): each request runs as a batch of its own."""
    policy = "sink_window:4:16:q8"
    eng = Engine(model, parse_policy(policy))
    assert eng.why_no_join is not None and "quantized" in eng.why_no_join
    prompts = [model.encode(p) for p in corpus.code_prompts(3, 6, 20)]
    got = run(Scheduler(eng, kv_budget=1 << 30), prompts, [15, 10, 12])
    for i, (p, n) in enumerate(zip(prompts, [15, 10, 12], strict=True)):
        assert got.tokens[i] == reference(model, policy, p, n)


@pytest.mark.skipif(not HAVE_MLX, reason="mlx / mlx-lm not installed")
@pytest.mark.parametrize("drafter", [None, "lookup"])
def test_mlx_rows_join_a_running_batch_exactly(drafter: str | None) -> None:
    """MLX sessions take joining rows (`MLXSession.join`): rows joining a running MLX batch mid-decode
    (past the first row's window) change no other row's tokens, and each equals decoding it alone."""
    mlx_model = engine.load("zoo:tiny-hybrid", backend="mlx")
    policy = "sink_window:4:16"
    factory = load_drafter(parse_drafter(drafter), mlx_model, k=3) if drafter else None
    eng = Engine(mlx_model, parse_policy(policy), factory, k=3)
    assert eng.why_no_join is None
    prompts = [mlx_model.encode(p) for p in corpus.code_prompts(3, 8, 20)]
    ns = [60, 40, 20]
    sched = Scheduler(eng, kv_budget=1 << 30)
    seen_rows = _batch_sizes(sched)
    got = Collect()
    sched.start()
    try:
        sched.submit(prompts[0], Params(ns[0]), got.emit(0))
        while len(got.tokens[0]) < 20:
            time.sleep(0.001)
        sched.submit(prompts[1], Params(ns[1]), got.emit(1))
        while len(got.tokens[1]) < 5:
            time.sleep(0.001)
        sched.submit(prompts[2], Params(ns[2]), got.emit(2))
        got.wait(3)
    finally:
        sched.stop()
    assert max(seen_rows) == 3 and seen_rows[0] == 1 and len(sched.batches) == 0
    for i, (p, n) in enumerate(zip(prompts, ns, strict=True)):
        assert got.tokens[i] == reference(mlx_model, policy, p, n), i


@pytest.mark.skipif(not HAVE_MLX, reason="mlx / mlx-lm not installed")
def test_mlx_quantized_rows_cannot_join_and_say_so_in_one_line() -> None:
    mlx_model = engine.load("zoo:tiny-hybrid", backend="mlx")
    eng = Engine(mlx_model, parse_policy("sink_window:4:16:q8"))
    assert eng.why_no_join is not None and "quantized" in eng.why_no_join and "\n" not in eng.why_no_join
    a, b = eng.session(), eng.session()
    a.prefill([5, 6, 7])
    b.prefill([8, 9])
    with pytest.raises(ValueError, match="cannot join rows: quantized"):
        a.join(b)
    prompts = [mlx_model.encode(p) for p in corpus.code_prompts(2, 8, 20)]
    got = run(Scheduler(eng, kv_budget=1 << 30), prompts, [8, 6], gap=0.01)
    for i, (p, n) in enumerate(zip(prompts, [8, 6], strict=True)):
        assert got.tokens[i] == reference(mlx_model, "sink_window:4:16:q8", p, n), i


@pytest.mark.parametrize("drafter", ["lookup", "block:zoo:tiny-block-drafter", "model:zoo:tiny-drafter"])
def test_plain_steps_between_blocks_keep_every_row_exact(model: Any, drafter: str) -> None:
    """Plain steps (k = 0: no drafting, a hidden-state drafter's features stashed in a `Backlog`) mixed with
    blocks of every length while rows join and leave: every row still equals decoding it alone."""
    policy = "sink_window:4:16"
    factory = load_drafter(parse_drafter(drafter), model, k=4, policy=drafter_policy(parse_policy(policy)))
    prompts = [model.encode(p) for p in corpus.code_prompts(5, 9, 28)]
    ns = [30, 12, 25, 40, 8]
    sched = Scheduler(Engine(model, parse_policy(policy), factory, k=4, prefill_chunk=16), kv_budget=1 << 30)
    ks = itertools.cycle([0, 0, 3, 0, 4, 0, 0, 0, 1, 2])
    assert sched.length is not None
    sched.length.choose = lambda rows: next(ks)  # type: ignore[method-assign]
    got = run(sched, prompts, ns, gap=0.01)
    for i, (p, n) in enumerate(zip(prompts, ns, strict=True)):
        assert got.tokens[i] == reference(model, policy, p, n), i
    assert sched.length.steps[0] > 0 and sum(sched.length.steps.values()) > sched.length.steps[0]


def test_the_step_length_falls_back_to_plain_where_a_block_costs_more_than_it_saves() -> None:
    """DraftLength in the server: per batch size, the k of the least measured cost per emitted token, k = 0 included, and
    the other end probed now and then."""
    length = DraftLength(4)

    def steps(rows: int, n: int, block_cost: float, accept: float) -> list[int]:
        chosen = []
        for _ in range(n):
            k = length.choose(rows)
            chosen.append(k)
            cost = rows * (1.0 if k == 0 else block_cost)  # seconds; per row: 1 plain, block_cost a block
            drafter = rows * (block_cost - 1.0) / 2 if k else 0.0  # half a block's extra in the drafter
            length.record(k, cost, rows, [rows] * k, [int(rows * accept)] * k, drafter)
        return chosen

    one = steps(1, 200, 2.0, 1.0)  # a block of 4 all accepted emits 5 tokens for 2x a plain step: draft
    assert one[:4] == [0, 1, 0, 4] and one[-50:].count(4) >= 40
    many = steps(32, 400, 6.0, 0.5)  # 32 rows: a block costs 6x a plain step, emits 3 tokens: plain
    assert many[-300:].count(0) >= 290 and any(many[-300:])  # ... re-probing (k = 1) now and then
    assert steps(1, 20, 2.0, 1.0)[-10:].count(4) >= 9  # batch size 1 kept its own costs


def test_a_backlog_leaves_the_block_drafter_as_observing_every_step() -> None:
    """Features stashed over plain steps (rows joining and leaving) and flushed in one batched observe give
    the drafter the same context as observing every step."""
    import torch

    from engine.drafters.block.config import read_config
    from engine.drafters.block.torch import BatchedBlockDrafter, BlockDrafterModel
    from engine.models import resolve

    torch.manual_seed(0)
    net = BlockDrafterModel(read_config(resolve("zoo:tiny-block-drafter"))).eval()
    h = net.config.target_hidden_size

    def feats(rows: int) -> dict[int, Any]:
        return {j: torch.randn(rows, 1, h) for j in net.config.target_layers}

    each, lazy = BatchedBlockDrafter(net, 2), BatchedBlockDrafter(net, 2)
    for d in (each, lazy):
        d.begin_rows([[1], [2]])
    backlog = Backlog(lazy, capacity=5)
    plan = [
        ("step", [1, 1]),
        ("step", [1, 0]),
        ("keep", [1]),
        ("step", [1]),
        ("join", None),
        ("step", [1, 1]),
    ]
    plan += [("step", [1, 1])] * 7 + [("keep", [1, 0]), ("step", [0, 1])]
    for what, arg in plan:
        if what == "step":
            f = feats(len(arg))
            each.observe_rows(f, arg)
            backlog.stash(f, arg)
        elif what == "keep":
            each.keep_rows(arg)
            lazy.keep_rows(arg)
            backlog.keep_rows(arg)
        else:
            for d in (each, lazy):
                new = BatchedBlockDrafter(net, 1)
                new.begin_rows([[3]])
                join_drafter(d, new)
            backlog.add_rows(1)
    backlog.flush()
    assert each.position == lazy.position and each.rows == lazy.rows == 2
    # the same block logits (up to float rounding: a batched projection sums in another order)
    torch.testing.assert_close(
        each._block_logits([5, 6], [4, 4]), lazy._block_logits([5, 6], [4, 4]), atol=1e-4, rtol=1e-4
    )
    for (ka, va), (kb, vb) in zip(each.kv, lazy.kv, strict=True):
        for r in range(2):
            n = each.length[r]
            a0, b0 = each.length[r] - n, lazy.length[r] - n
            torch.testing.assert_close(ka[r, :, a0 : a0 + n], kb[r, :, b0 : b0 + n], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(va[r, :, a0 : a0 + n], vb[r, :, b0 : b0 + n], atol=1e-5, rtol=1e-5)
