"""Batched speculative decoding (engine.speculative.speculative_generate_batch): B rows verified in one
forward, each accepting its own prefix and rolling back on its own, rows stopping at their own times;
every row's tokens equal greedy decoding of its prompt alone, under every policy (quantized K/V
included), long after the windows have wrapped."""

from __future__ import annotations

from typing import Any

import pytest

import engine
from engine.policy import Policy, full, hybrid, parse_policy, sink_window
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

    class Features(engine.PromptLookupDrafter):
        layers = (1,)

    with pytest.raises(ValueError, match="hidden states"):
        engine.speculative_generate_batch(session, [Features(), Features()], prompts, 2, engine.Stop(8))
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
    from engine.speculative import DraftLength

    def settle(block_s: dict[int, float], acceptance: float) -> int:
        length = DraftLength(4)
        for _ in range(12):
            k = length.choose()
            length.record(k, block_s.get(k, 0.0), [1] * k, [int(acceptance > 0.5)] * k)
        return length.choose()

    # a verify of 5 tokens costs 5 plain steps (compute-bound batch) and half the drafts are rejected
    assert settle({0: 1.0, 4: 5.0}, 0.0) == 0
    # verify nearly as cheap as a plain step, drafts accepted: draft the most
    assert settle({0: 1.0, 4: 1.2}, 1.0) == 4


@pytest.mark.parametrize("policy", [sink_window(0, 5), hybrid(2, 6)], ids=str)
def test_adaptive_draft_length_stays_exact(policy: Policy) -> None:
    m, k = tiny_models.gemma(), 4
    prompts = _prompts()
    stop = engine.Stop(NEW)
    session = m.session(policy, max_block=k + 1, prefill_chunk=16, rows=len(prompts))
    drafters = [_drafter("torch", "narrow", k) for _ in prompts]
    gens = engine.speculative_generate_batch(session, drafters, prompts, k, stop, adapt=True)
    assert [g.tokens for g in gens] == _alone(m, policy, prompts, stop)
