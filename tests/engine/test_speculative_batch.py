"""Batched speculative decoding (engine.speculative.speculative_generate_batch): B rows verified in one
forward, each accepting its own prefix and rolling back on its own, rows stopping at their own times;
every row's tokens equal greedy decoding of its prompt alone, under every policy (quantized K/V
included), long after the windows have wrapped."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

import engine
from engine.drafters.diffusion.drafter import DiffusionDrafter
from engine.drafters.load import load_block_drafter, load_diffusion_model
from engine.policy import Policy, full, hybrid, parse_policy, sink_window
from engine.zoo import corpus
from tests.engine import tiny_models
from tests.engine.backends import BACKENDS, on

POLICIES = [full(), sink_window(4, 8), sink_window(0, 5), hybrid(2, 6), parse_policy("sink_window:4:8:q8")]
LENGTHS = (5, 23, 40)  # the rows' rings wrap at different steps
NEW = 40


def _drafter(backend: str, kind: str, k: int) -> engine.Drafter:
    if kind == "lookup":
        return engine.PromptLookupDrafter()
    if kind == "narrow":  # the verifier's weights on a narrow window: agrees often, not always
        return engine.ModelDrafter(
            on(backend, tiny_models.gemma()).session(sink_window(1, 3), max_block=k + 1)
        )
    # a random-weight model of another architecture: mostly rejected
    return engine.ModelDrafter(
        on(backend, tiny_models.qwen(seed=7, layers=1)).session(full(), max_block=k + 1)
    )


def _prompts() -> list[list[int]]:
    # a repeated stretch in each: prompt lookup has something to propose
    return [tiny_models.prompt(n, seed=n) * 2 for n in LENGTHS]


def _alone(m: Any, policy: Policy, prompts: list[list[int]], stop: engine.Stop) -> list[list[int]]:
    return [engine.generate(m.session(policy, prefill_chunk=16), p, stop).tokens for p in prompts]


# torch: every policy with the model drafter that is partly accepted and with prompt lookup, a rejected
# drafter on two; mlx (the same backend-free loop on its own cache): a representative subset
CASES = [
    *[
        pytest.param("torch", p, kind, k, id=f"torch-{p}-{kind}")
        for p in POLICIES
        for kind, k in [("narrow", 4), ("lookup", 3)]
    ],
    *[pytest.param("torch", p, "random", 2, id=f"torch-{p}-random") for p in POLICIES[1:3]],
    *[
        pytest.param("mlx", p, kind, k, marks=BACKENDS[1].marks, id=f"mlx-{p}-{kind}")
        for p, kind, k in [(POLICIES[1], "narrow", 4), (POLICIES[3], "lookup", 3), (POLICIES[4], "narrow", 2)]
    ],
]


@pytest.mark.parametrize(("backend", "policy", "kind", "k"), CASES)
def test_each_row_equals_greedy_alone(backend: str, policy: Policy, kind: str, k: int) -> None:
    # quantized K/V: mx.quantize takes groups >= 32 (head_dim 32; seed 3: varied output)
    m = on(backend, tiny_models.gemma(head_dim=32, seed=3) if policy.bits else tiny_models.gemma())
    prompts = _prompts()
    plain = _alone(m, policy, prompts, engine.Stop(NEW))
    # an EOS that one row meets early: rows stop at different blocks (the others go on)
    stop = engine.Stop(NEW, eos_ids=frozenset({plain[1][12]}))
    alone = _alone(m, policy, prompts, stop)
    assert len({len(a) for a in alone}) > 1, "the rows should stop at different lengths"
    session = m.session(policy, max_block=k + 1, prefill_chunk=16, rows=len(prompts))
    gens = engine.speculative_generate_batch(
        session, [_drafter(backend, kind, k) for _ in prompts], prompts, k, stop
    )
    assert [g.tokens for g in gens] == alone
    for g in gens:
        assert g.accepted <= g.drafted and g.forwards >= (len(g.tokens) - 1) / (k + 1)
    if kind == "narrow":
        assert 0 < sum(g.accepted for g in gens) < sum(g.drafted for g in gens)
    # stopped rows left the batch: the session holds the rows that stopped last, at their own positions
    want = [len(p) + len(a) - 1 for p, a in zip(prompts, alone, strict=True)]
    assert session.rows < len(prompts) and all(p in want for p in session.positions)


def test_batch_of_one_equals_the_unbatched_loop() -> None:
    m = tiny_models.gemma()
    prompt = _prompts()[1]
    policy = hybrid(2, 6)
    one = engine.speculative_generate(
        m.session(policy, max_block=4), _drafter("torch", "narrow", 3), prompt, 3, engine.Stop(NEW)
    )
    got = engine.speculative_generate_batch(
        m.session(policy, max_block=4), [_drafter("torch", "narrow", 3)], [prompt], 3, engine.Stop(NEW)
    )[0]
    assert got.tokens == one.tokens
    assert (got.drafted, got.accepted, got.forwards) == (one.drafted, one.accepted, one.forwards)
    assert got.position_accepted == one.position_accepted


def test_refusals_name_the_reason() -> None:
    m = tiny_models.gemma()
    session = m.session(full(), max_block=3, rows=2)
    prompts = _prompts()[:2]
    lookups = [engine.PromptLookupDrafter(), engine.PromptLookupDrafter()]
    with pytest.raises(ValueError, match="max_block >= k \\+ 1"):
        engine.speculative_generate_batch(session, lookups, prompts, 4, engine.Stop(8))
    with pytest.raises(ValueError, match="2 non-empty prompts and 2 drafters"):
        engine.speculative_generate_batch(session, lookups[:1], prompts, 2, engine.Stop(8))

    # Gemma 4's assistant reads the verifier's K/V of one row (`attended_kv`): refused where it is made
    from engine.drafters.gemma4_assistant.torch import Gemma4AssistantDrafter

    with pytest.raises(ValueError, match="unbatched session"):
        Gemma4AssistantDrafter(
            tiny_models.gemma4_assistant(), tiny_models.gemma4().session(full(), 3, rows=2)
        )
    with pytest.raises(ValueError, match="linear-attention"):
        tiny_models.qwen35().session(full(), max_block=3, rows=2)


@pytest.mark.parametrize(
    ("backend", "policy"),
    [
        pytest.param("torch", sink_window(4, 8), id="torch-sink_window"),
        pytest.param("torch", hybrid(2, 6), id="torch-hybrid"),
        pytest.param("mlx", hybrid(2, 6), marks=BACKENDS[1].marks, id="mlx-hybrid"),
    ],
)
def test_one_batched_model_drafter_drafts_as_one_per_row(backend: str, policy: Policy) -> None:
    """`BatchedModelDrafter` (every row drafting in the same batched forwards, rows padded, stopping and
    rolling back on their own) proposes what a `ModelDrafter` per row proposes: same tokens, same counts."""
    m, k = on(backend, tiny_models.gemma()), 4
    prompts = _prompts()
    plain = _alone(m, policy, prompts, engine.Stop(NEW))
    stop = engine.Stop(NEW, eos_ids=frozenset({plain[1][12]}))

    def run(drafters: Any) -> list[engine.Generation]:
        session = m.session(policy, max_block=k + 1, prefill_chunk=16, rows=len(prompts))
        return engine.speculative_generate_batch(session, drafters, prompts, k, stop)

    draft_model = on(backend, tiny_models.gemma())
    per_row = run(
        [engine.ModelDrafter(draft_model.session(sink_window(1, 3), max_block=k + 1)) for _ in prompts]
    )
    batched = engine.drafters.BatchedModelDrafter(
        draft_model.session(sink_window(1, 3), max_block=k + 1, rows=len(prompts))
    )
    got = run(batched)
    assert [g.tokens for g in got] == [g.tokens for g in per_row] == _alone(m, policy, prompts, stop)
    assert [(g.drafted, g.accepted, g.forwards) for g in got] == [
        (g.drafted, g.accepted, g.forwards) for g in per_row
    ]
    assert 0 < sum(g.accepted for g in got) < sum(g.drafted for g in got)


def test_draft_length_follows_measured_costs_and_acceptance() -> None:
    from engine.draft_length import DraftLength

    def settle(step: float, per_token: float, acceptance: list[float]) -> list[int]:
        """The draft lengths chosen over 40 blocks: a block at k costs `step` (a plain step) + k *
        `per_token` (+ 0.1 of drafting when k > 0), its draft i accepted with `acceptance[i]`."""
        length, chosen = DraftLength(4), []
        for b in range(40):
            k = length.choose()
            chosen.append(k)
            cost = step + k * per_token + (0.1 if k else 0.0)
            j = sum(1 for c in chosen[:-1] if c)  # drafting blocks before this one
            accepted = [int(j * a % 1 + a >= 1) for a in acceptance[:k]]  # a fraction a of them
            accepted = [x * all(accepted[:i]) for i, x in enumerate(accepted)]  # a prefix
            length.record(k, cost * (3 if b == 0 else 1), 1, [1] * k, accepted)  # block 0: warm-up
        return chosen

    # (the last 10 blocks hold at most one probe)
    plain = settle(1.0, 1.0, [0.5] * 4)
    # a plain step warms up, then k = 1 and k = 0 are timed once each: compute-bound (each draft costs a
    # plain step), no k could pay even with every draft accepted, so k_max is never run
    assert plain[:3] == [0, 1, 0] and plain[-10:].count(0) >= 9 and 4 not in plain
    drafting = settle(1.0, 0.05, [1.0] * 4)  # a cheap verify, drafts accepted: the most
    assert drafting[:4] == [0, 1, 0, 4] and drafting[-10:].count(4) >= 9  # k_max measured, then chosen
    assert 0 in drafting[4:]  # the plain step is measured again (a cost can go stale)
    # a middle ground: the first two drafts pay, the last two almost never accepted
    tail = settle(1.0, 0.3, [1.0, 1.0, 0.1, 0.1])[-10:]
    assert tail.count(2) >= 9, tail
    # costs are kept per batch-size bucket: 8 rows' costs do not stand for 4 rows (warmed up, measured
    # again), nor 4 rows' for 8 (kept: no new probe when 8 rows come back)
    length = DraftLength(4, rows_fit=True)
    for _ in range(6):
        k = length.choose(8)
        length.record(k, 1.0, 8, [8] * k, [8] * k)
    for probe in (0, 1, 0, 4):
        assert length.choose(4) == probe
        length.record(probe, 0.5, 4, [4] * probe, [4] * probe)
    assert length.choose(8) == 4
    assert length.choose(5) == 1  # 8 rows' costs do not stand for 5 either (fixed costs weigh more per row)


def _blocks(length: Any, cost: Any, accepted: int, blocks: int, rows: int = 1) -> list[int]:
    """The draft lengths `length` chooses over `blocks` blocks when a block at k takes cost(k) seconds (an
    injected clock: nothing is timed) and accepts its first `accepted` drafts in every row."""
    chosen = []
    for _ in range(blocks):
        k = length.choose(rows)
        chosen.append(k)
        n = min(k, accepted)
        length.record(k, cost(k), rows, [rows] * k, [rows] * n + [0] * (k - n))
    return chosen


def test_draft_length_falls_back_to_plain_where_a_block_costs_what_it_saves() -> None:
    """Issue 44 (MLX on the CPU at batch 8 and 32: a block at k = 4 costs about 5 plain steps, so even
    with every draft accepted it only ties with plain decoding): after the warm-up plain step, one timed
    block at k = 1 and one at k = 0, the loop goes plain (`plain`) where no k could beat the measured plain
    step by the margin (`PLAIN_MARGIN`, what the speculative loops use) even with every draft accepted
    (`DraftLength.floor`: a block at k costs at least the k = 1 block plus, per further draft, what the
    k = 1 verify forward cost over the plain step); where one could, k_max is measured and it drafts."""
    from engine.draft_length import PLAIN_MARGIN, DraftLength

    # k = 4 commits 5 tokens in the time of 5 plain steps
    tie = DraftLength(4, margin=PLAIN_MARGIN, optimistic=True)
    assert _blocks(tie, lambda k: 1.0 + k, 4, 4, rows=8) == [0, 1, 0, 0] and tie.plain
    # drafting loses (5.5 steps for 5 tokens; shorter drafts no better)
    worse = DraftLength(4, margin=PLAIN_MARGIN, optimistic=True)
    assert _blocks(worse, lambda k: 1.0 + 1.125 * k, 4, 4) == [0, 1, 0, 0] and worse.plain
    # 4% faster than the measured k = 0 block: inside the margin, plain
    within = DraftLength(4, margin=PLAIN_MARGIN, optimistic=True)
    assert _blocks(within, lambda k: 1.0 + 0.95 * k, 4, 4) == [0, 1, 0, 0] and within.plain
    # k = 4 at 4.6 steps for 5 tokens beats plain by 8.7%: it drafts and goes on drafting (a k = 0 probe
    # costs little here, 8% of a step, so it comes often within the 3% budget)
    pays = DraftLength(4, margin=PLAIN_MARGIN, optimistic=True)
    chosen = _blocks(pays, lambda k: 1.0 + 0.9 * k, 4, 30)
    assert chosen[:4] == [0, 1, 0, 4] and not pays.plain and chosen[-10:].count(4) >= 5
    # a first drafting block with every draft rejected does not end drafting where a block costs little
    # (a k = 4 block at 2 plain steps; sampled acceptance varies a lot): the evidence must add up first,
    # 3 x what drafting could gain at full acceptance (0.952 / (2 / 5) = 2.4: 8 rows of drafting blocks)
    unlucky = DraftLength(4, margin=PLAIN_MARGIN, optimistic=True)
    chosen = _blocks(unlucky, lambda k: 1.0 + 0.25 * k, 0, 10)
    assert chosen[:4] == [0, 1, 0, 4] and 0 not in chosen[4:] and not unlucky.plain
    assert _blocks(unlucky, lambda k: 1.0 + 0.25 * k, 0, 1) == [0] and unlucky.plain  # after 8
    # where blocks cost nearly what they could save, less exploring: a k = 4 block at 4 plain steps
    # (gain 1.19: 4 rows; the k = 4 probe and the k = 1 one count), 2 more blocks, then plain
    dear = DraftLength(4, margin=PLAIN_MARGIN, optimistic=True)
    assert _blocks(dear, lambda k: 1.0 + 0.75 * k, 0, 7) == [0, 1, 0, 4, 1, 1, 0] and dear.plain
    # at 8 rows a block is 8 rows of evidence: the two measuring blocks (k = 1, k_max) are enough
    wide = DraftLength(4, margin=PLAIN_MARGIN, optimistic=True)
    assert _blocks(wide, lambda k: 1.0 + 0.25 * k, 0, 5, rows=8) == [0, 1, 0, 4, 0] and wide.plain
    # the margin is a parameter: without one, 4% faster is enough to draft
    assert _blocks(DraftLength(4, margin=0.0), lambda k: 1.0 + 0.95 * k, 4, 4) == [0, 1, 0, 4]
    # a first block that is slow (one-off costs of the first decode forward) is not a cost
    first = DraftLength(4, margin=PLAIN_MARGIN, optimistic=True)
    assert _blocks(first, lambda k: 1.0 + 0.5 * k if first.seen else 50.0, 4, 4)[3] == 4
    assert first.times[0, 0] == [(1.0, 1)]


@pytest.mark.parametrize("policy", [sink_window(0, 5), hybrid(2, 6)], ids=str)
def test_adaptive_draft_length_stays_exact(policy: Policy) -> None:
    m, k = tiny_models.gemma(), 4
    prompts = _prompts()
    stop = engine.Stop(NEW)
    session = m.session(policy, max_block=k + 1, prefill_chunk=16, rows=len(prompts))
    drafters = [_drafter("torch", "narrow", k) for _ in prompts]
    gens = engine.speculative_generate_batch(session, drafters, prompts, k, stop, adapt=True)
    assert [g.tokens for g in gens] == _alone(m, policy, prompts, stop)


ZOO_POLICIES = [full(), sink_window(4, 16), hybrid(4, 16)]


@functools.cache
def _zoo(backend: str) -> Any:
    return engine.load("zoo:tiny-hybrid", backend)  # type: ignore[arg-type]


def _zoo_prompts(m: Any) -> list[list[int]]:
    """Code prompts of different lengths (the rows' windows wrap at different blocks)."""
    texts = corpus.code_prompts(3, seed=5, n_tokens=48)
    return [m.encode(t)[:n] for t, n in zip(texts, (48, 19, 33), strict=True)]


@pytest.mark.parametrize(
    ("backend", "policy"),
    [
        *[pytest.param("torch", p, id=f"torch-{p}") for p in ZOO_POLICIES],
        *[pytest.param("mlx", p, marks=BACKENDS[1].marks, id=f"mlx-{p}") for p in ZOO_POLICIES],
    ],
)
def test_block_drafter_batched_each_row_equals_greedy_alone(backend: str, policy: Policy) -> None:
    """The block drafter on a batched verifier: each row's prompt features from its own chunked prefill,
    its committed positions' features from each batched verify forward; one `BatchedBlockDrafter` for
    all rows. Each row equals greedy decoding alone (windows wrapped: 16 < the prompts + 60 new), rows
    stop at different blocks and leave, and the batched drafter proposes what one drafter per row does."""
    m, k = _zoo(backend), 6
    prompts = _zoo_prompts(m)
    plain = _alone(m, policy, prompts, engine.Stop(60))
    stop = engine.Stop(60, eos_ids=frozenset({plain[1][25]}))  # row 1 stops early, maybe others
    alone = _alone(m, policy, prompts, stop)

    def run(drafters: Any) -> tuple[Any, list[engine.Generation]]:
        session = m.session(policy, max_block=k + 1, prefill_chunk=16, rows=len(prompts))
        return session, engine.speculative_generate_batch(session, drafters, prompts, k, stop)

    session, got = run(load_block_drafter("zoo:tiny-block-drafter", backend, rows=len(prompts)))
    assert type(got) is list and [g.tokens for g in got] == alone
    assert session.rows < len(prompts)  # the rows that stopped first left the batch
    _, per_row = run([load_block_drafter("zoo:tiny-block-drafter", backend) for _ in prompts])
    assert [g.tokens for g in per_row] == alone
    counts = [(g.drafted, g.accepted, g.forwards) for g in got]
    assert counts == [(g.drafted, g.accepted, g.forwards) for g in per_row]
    assert 0 < sum(g.accepted for g in got) < sum(g.drafted for g in got)


def test_finished_rows_leave_the_batch() -> None:
    """Rows of very different lengths (EOS early in some): each leaves the verifier and the drafter when it
    stops (`keep_rows`: its K/V freed), the others go on exactly; a session whose rows were dropped goes
    on as one fed only the kept rows (quantized K/V included)."""
    m, k = _zoo("torch"), 4
    prompts = [*_zoo_prompts(m), _zoo_prompts(m)[0][:7]]
    plain = _alone(m, hybrid(4, 16), prompts, engine.Stop(70))
    stop = engine.Stop(70, eos_ids=frozenset({plain[1][3], plain[3][30]}))
    alone = _alone(m, hybrid(4, 16), prompts, stop)
    assert len({len(a) for a in alone}) >= 3
    session = m.session(hybrid(4, 16), max_block=k + 1, rows=len(prompts))
    rows_seen: list[int] = []
    forward_rows = session.forward_rows

    def counting(ids: Any, **kw: Any) -> Any:
        rows_seen.append(len(ids))
        return forward_rows(ids, **kw)

    session.forward_rows = counting  # type: ignore[method-assign]
    drafter = load_block_drafter("zoo:tiny-block-drafter", "torch", rows=len(prompts))
    gens = engine.speculative_generate_batch(session, drafter, prompts, k, stop, adapt=True)
    assert [g.tokens for g in gens] == alone
    assert (
        rows_seen[0] == len(prompts)
        and rows_seen[-1] < len(prompts)
        and rows_seen == sorted(rows_seen, reverse=True)
    )
    assert drafter.rows == session.rows == rows_seen[-1] and len(session.kv_row_bytes()) == session.rows


@pytest.mark.parametrize(
    ("backend", "policy"),
    [
        pytest.param("torch", sink_window(4, 8), id="torch-sink_window"),
        pytest.param("torch", parse_policy("sink_window:4:8:q8"), id="torch-q8"),
        pytest.param("mlx", hybrid(2, 6), marks=BACKENDS[1].marks, id="mlx-hybrid"),
        pytest.param("mlx", parse_policy("sink_window:4:8:q8"), marks=BACKENDS[1].marks, id="mlx-q8"),
    ],
)
def test_keep_rows_goes_on_as_the_kept_rows_alone(backend: str, policy: Policy) -> None:
    m = on(backend, tiny_models.gemma(head_dim=32, seed=3) if policy.bits else tiny_models.gemma())
    prompts = _prompts()
    fed = [engine.generate(m.session(policy), p, engine.Stop(30)).tokens for p in prompts]
    both = m.session(policy, max_block=3, rows=3)
    kept = m.session(policy, max_block=3, rows=2)
    for r, p in enumerate(prompts):
        both.prefill(p, row=r)
    for r, p in enumerate([prompts[2], prompts[0]]):
        kept.prefill(p, row=r)
    for i in range(0, 12, 3):  # blocks of 3, before and after the wraps
        both.forward_rows([f[i : i + 3] for f in fed])
    both.keep_rows([2, 0])
    for i in range(0, 12, 3):
        kept.forward_rows([f[i : i + 3] for f in (fed[2], fed[0])])
    assert both.rows == 2 and both.positions == kept.positions
    for i in range(12, 27, 3):
        got = both.forward_rows([f[i : i + 3] for f in (fed[2], fed[0])]).tokens
        assert got == kept.forward_rows([f[i : i + 3] for f in (fed[2], fed[0])]).tokens
        assert got == [fed[2][i + 1 : i + 4], fed[0][i + 1 : i + 4]]
    both.trim([2, 1])  # each row rolls back on its own, as before
    kept.trim([2, 1])
    assert both.kv_row_bytes() == kept.kv_row_bytes()
    assert both.forward_rows([[7, 8], [9, 10]]).tokens == kept.forward_rows([[7, 8], [9, 10]]).tokens
    with pytest.raises(ValueError, match="distinct rows among 0..1"):
        both.keep_rows([1, 1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_diffusion_drafter_batched_is_exact(backend: str) -> None:
    """The diffusion drafter reads no hidden states: one per row (`PerRow`) on a batched verifier."""
    m, k = _zoo(backend), 4
    prompts = _zoo_prompts(m)
    policy = sink_window(4, 16)
    alone = _alone(m, policy, prompts, engine.Stop(40))
    model = load_diffusion_model("zoo:tiny-dlm", backend)
    session = m.session(policy, max_block=k + 1, rows=len(prompts))
    drafters = [DiffusionDrafter(model, steps=2) for _ in prompts]
    gens = engine.speculative_generate_batch(session, drafters, prompts, k, engine.Stop(40))
    assert [g.tokens for g in gens] == alone and sum(g.accepted for g in gens) > 0


def test_throughput_table_has_the_block_drafter_batched(tmp_path: Path) -> None:
    """The throughput report's batch table: the block drafter's batched runs (tok/s, acceptance length,
    per-position acceptance), every row's digests equal."""
    from engine.workloads import throughput

    out = tmp_path / "tp.json"
    argv = ["--model", "zoo:tiny-hybrid", "--drafter", "block:zoo:tiny-block-drafter", "--k", "4"]
    argv += ["--prompts", "2", "--new-tokens", "24", "--repeats", "1", "--batches", "1,3", "--threads", "1"]
    assert throughput.main([*argv, "--out", str(out), "--plot", "none"]) == 0
    report = json.loads(out.read_text())
    for b in report["batched"]:
        sp = b["speculative"]
        assert sp["exact"] and sp["acceptance_length"] > 1.5 and len(sp["position_acceptance"]) == 4
        assert sp["adaptive"] == throughput.ADAPT
    assert [(d["batch"], d["row"]) for d in report["prompts"][0]["digests"]] == [(1, 0), (3, 0), (3, 2)]
    assert all(d["greedy"] == d["speculative"] for p in report["prompts"] for d in p["digests"])


class _DraftingStops(engine.speculative.DraftLength):
    """A DraftLength whose measured costs say drafting stops paying after two blocks (k_max, then 0 best)."""

    blocks = 0

    def choose(self, rows: int = 1) -> int:
        self.blocks += 1
        self.plain = self.blocks > 2
        return self.k_max if self.blocks == 1 else 0


def test_when_drafting_stops_paying_the_rest_decodes_plainly(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 44: a block at k = 0 still pays the drafter's upkeep (a feature drafter observes every committed
    position), so where the adaptive draft length settles on 0 the batch goes on as plain batched decoding:
    no drafter calls and no hidden states after the switch; every row still equals greedy alone."""
    monkeypatch.setattr(engine.speculative, "DraftLength", _DraftingStops)
    m, k = _zoo("torch"), 4
    prompts = _zoo_prompts(m)
    stop = engine.Stop(30)
    alone = _alone(m, hybrid(4, 16), prompts, stop)
    session = m.session(hybrid(4, 16), max_block=k + 1, rows=len(prompts))
    hidden: list[tuple[int, ...]] = []
    forward_rows = session.forward_rows

    def counting(ids: Any, hidden_layers: tuple[int, ...] = (), **kw: Any) -> Any:
        hidden.append(tuple(kw.get("hidden", ())))
        return forward_rows(ids, **kw)

    session.forward_rows = counting  # type: ignore[method-assign]
    drafter = load_block_drafter("zoo:tiny-block-drafter", "torch", rows=len(prompts))
    proposed: list[int] = []
    propose_rows = drafter.propose_rows
    drafter.propose_rows = lambda *a: proposed.append(1) or propose_rows(*a)  # type: ignore[method-assign]
    gens = engine.speculative_generate_batch(session, drafter, prompts, k, stop, adapt=True)
    assert [g.tokens for g in gens] == alone
    assert len(proposed) == 2 and all(hidden[:2]) and not any(hidden[2:]) and len(hidden) > 10
    # two drafting blocks, then one forward per token: tokens - 1 (the prefill's) - the blocks' commits
    assert all(g.forwards == 2 + len(g.tokens) - 1 - (g.accepted + 2) for g in gens)


def _planted_plain(rows: int, k: int = 4) -> Any:
    """A `DraftLength` for the loops whose costs, measured at `rows` rows, say drafting cannot pay: a k = 1
    block costs 5 plain steps, its verify forward 4."""
    from engine.draft_length import DraftLength

    length = DraftLength.for_loops(k)
    for block_k, seconds in ((0, 1.0), (1, 5.0), (0, 1.0)):  # the warm-up, then k = 1 and 0 measured
        assert length.choose(rows) == block_k
        length.record(block_k, seconds * rows, rows, [rows] * block_k, [0] * block_k, rows * (block_k > 0))
    return length


def test_a_carried_draft_length_decodes_later_calls_plainly_from_the_first_block() -> None:
    """One `DraftLength` passed to many calls (`adapt=length`): what it measured carries over, so a later
    call at a batch size where drafting did not pay is plain decoding (the drafter is not even begun);
    its plain steps are recorded as k = 0 (what not drafting costs); a k_max other than k is refused."""
    from engine.draft_length import DraftLength

    m, k = _zoo("torch"), 4
    prompts = _zoo_prompts(m)
    stop = engine.Stop(30)
    alone = _alone(m, hybrid(4, 16), prompts, stop)
    length = _planted_plain(len(prompts), k)
    before = length.steps[0]
    for _ in range(2):
        session = m.session(hybrid(4, 16), max_block=k + 1, rows=len(prompts))
        drafter = load_block_drafter("zoo:tiny-block-drafter", "torch", rows=len(prompts))
        proposed: list[int] = []
        propose_rows = drafter.propose_rows
        drafter.propose_rows = lambda *a, p=proposed, f=propose_rows: p.append(1) or f(*a)  # type: ignore[method-assign]
        begin_rows = drafter.begin_rows
        drafter.begin_rows = lambda *a, p=proposed, f=begin_rows: p.append(1) or f(*a)  # type: ignore[method-assign]
        gens = engine.speculative_generate_batch(session, drafter, prompts, k, stop, adapt=length)
        assert [g.tokens for g in gens] == alone and not proposed and length.plain
        assert all(g.forwards == len(g.tokens) - 1 for g in gens)  # one forward per token after prefill
    assert length.steps[0] - before == 2 * (len(alone[0]) - 1)  # every plain step recorded
    assert length.steps[1] == 1 and not any(length.steps[j] for j in range(2, k + 1))  # the planted block
    # batch 1 keeps its own costs: a first call there warms up and probes (it drafts)
    one = _planted_plain(len(prompts), k)
    session = m.session(hybrid(4, 16), max_block=k + 1)
    drafter = load_block_drafter("zoo:tiny-block-drafter", "torch")
    gen = engine.speculative_generate(session, drafter, prompts[0], k, stop, adapt=one)
    assert gen.tokens == alone[0] and gen.drafted > 0
    # ... and where batch 1 did not pay either, a call there is plain decoding too (sampled: plain
    # sampling's tokens for the seed)
    from engine.sampling import Sampling

    one = _planted_plain(1, k)
    drafter = load_block_drafter("zoo:tiny-block-drafter", "torch")
    drafter.begin = lambda *a: pytest.fail("a plain call began its drafter")  # type: ignore[method-assign]
    seeded = Sampling(0.8, seed=3)
    gen = engine.speculative_generate(
        m.session(hybrid(4, 16), max_block=k + 1), drafter, prompts[0], k, stop, seeded, adapt=one
    )
    assert gen.tokens == engine.generate(m.session(hybrid(4, 16)), prompts[0], stop, seeded).tokens
    assert one.plain and gen.drafted == 0
    with pytest.raises(ValueError, match="k_max is 4, the loop's k is 3"):
        engine.speculative_generate_batch(
            m.session(hybrid(4, 16), max_block=k + 1, rows=len(prompts)),
            load_block_drafter("zoo:tiny-block-drafter", "torch", rows=len(prompts)),
            prompts,
            3,
            stop,
            adapt=DraftLength.for_loops(4),
        )


def test_a_carried_draft_length_probes_again_once_plain_decoding_paid_for_it() -> None:
    """Plain steps count toward the next probe: after enough plain decoding (the probe's loss within the
    loops' budget, `LOOP_BUDGET`), a call starts with a probe (k = 1) instead of going plain at once."""
    from engine.draft_length import LOOP_BUDGET

    length = _planted_plain(8)
    loss = 5.0 - length.tokens(1) * 1.0 / 1.05  # a k = 1 block less what plain decoding takes for its tokens
    length.start()
    assert length.choose(8) == 0 and length.plain
    plain_steps = int(loss / LOOP_BUDGET) + 1
    for _ in range(plain_steps - 2):  # (the planted k = 0 block already counted one)
        length.record(0, 8.0, 8)
    length.start()
    assert length.choose(8) == 0 and length.plain  # not yet
    length.record(0, 8.0, 8)
    length.start()
    assert length.choose(8) == 1 and not length.plain  # the probe (the cheapest drafting block)


def test_deep_draft_positions_sampled_once_lean_on_the_first_positions_fraction() -> None:
    """Sampled drafts: one block at k_max rejected at its second draft says little about positions 2..k;
    `tokens` leans on the geometric guess from the first position's fraction (worth `PRIOR` blocks), so k
    = 8 is not written off after one unlucky block, and data outweighs the guess as it comes."""
    from engine.draft_length import PRIOR, DraftLength

    length = DraftLength(8)
    length.record(0, 1.0)  # the warm-up
    for _ in range(10):  # k = 1 blocks, the first draft accepted 80% of the time
        length.record(1, 2.0, 1, [1], [1])
    length.record(1, 2.0, 1, [1], [0])
    length.record(1, 2.0, 1, [1], [0])
    length.record(8, 2.0, 1, [1] * 8, [1] + [0] * 7)  # one k = 8 block, rejected at its second draft
    f = 11 / 13
    assert length.tokens(1) == pytest.approx(1 + f)
    assert length.tokens(8) == pytest.approx(
        1 + f + sum(PRIOR * f ** (i + 1) / (1 + PRIOR) for i in range(1, 8))
    )
    assert length.tokens(8) > length.tokens(1) + 1
    for _ in range(200):  # many k = 8 blocks that never get past the first draft: the data wins
        length.record(8, 2.0, 1, [1] * 8, [1] + [0] * 7)
    assert length.tokens(8) < length.tokens(1) + 0.15  # 7 positions x 4 / 205 of the guess left
