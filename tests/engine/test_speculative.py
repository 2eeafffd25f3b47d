"""Invariant (b): speculative decoding emits exactly the tokens of greedy decoding under the same cache
policy, long after the window has wrapped, for every drafter and k; plus the drafters themselves."""

from __future__ import annotations

import functools

import pytest

import engine
from engine.policy import Policy, full, hybrid, sink_window
from tests.engine import tiny_models

NEW = 100
POLICIES = [full(), sink_window(4, 8), sink_window(0, 5), hybrid(2, 6)]


@functools.cache
def _greedy(model: str, policy: Policy, prompt_len: int) -> tuple[int, ...]:
    tm = getattr(tiny_models, model)()
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    return tuple(engine.generate(tm.sequence(policy, prefill_chunk=16), ids, engine.Stop(NEW)).tokens)


def _drafter(kind: str, model: str, policy: Policy, k: int) -> engine.Drafter:
    if kind == "lookup":
        return engine.PromptLookupDrafter()
    if kind == "self":  # the verifier drafting for itself: everything is accepted
        return engine.ModelDrafter(getattr(tiny_models, model)().sequence(policy, max_block=k + 1))
    if kind == "narrow":  # same weights, a narrower window: agrees often, not always
        return engine.ModelDrafter(getattr(tiny_models, model)().sequence(sink_window(1, 3), max_block=k + 1))
    # a random-weight drafter of another architecture (same vocabulary): mostly rejected
    return engine.ModelDrafter(tiny_models.qwen(seed=7, layers=1).sequence(policy, max_block=k + 1))


# The drafters the issue names (self, a random-weight model) at every k; the others at fewer.
CASES = [(d, k) for d in ("self", "random") for k in (1, 4, 8)] + [("narrow", 4), ("lookup", 1), ("lookup", 8)]


@pytest.mark.parametrize("policy", POLICIES, ids=str)
@pytest.mark.parametrize(("drafter", "k"), CASES)
def test_speculative_equals_greedy_gemma(policy: Policy, k: int, drafter: str) -> None:
    prompt_len = [3, 40, 17][k % 3]
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    verifier = tiny_models.gemma().sequence(policy, max_block=k + 1, prefill_chunk=16)
    gen = engine.speculative_generate(verifier, _drafter(drafter, "gemma", policy, k), ids, k, engine.Stop(NEW))
    assert tuple(gen.tokens) == _greedy("gemma", policy, prompt_len)
    assert gen.accepted <= gen.drafted and gen.forwards * (k + 1) >= NEW - 1
    assert gen.acceptance_length == pytest.approx((NEW - 1) / gen.forwards)
    if drafter == "self":
        assert gen.accepted >= 0.9 * gen.drafted
    if drafter == "narrow" and k > 1:
        assert 0 < gen.accepted < gen.drafted


@pytest.mark.parametrize(("policy", "drafter", "k"), [
    (sink_window(4, 8), "narrow", 1), (sink_window(4, 8), "narrow", 4), (sink_window(0, 5), "self", 8),
    (full(), "lookup", 4),
])
def test_speculative_equals_greedy_qwen(policy: Policy, k: int, drafter: str) -> None:
    ids = tiny_models.prompt(40, seed=40)
    verifier = tiny_models.qwen().sequence(policy, max_block=k + 1, prefill_chunk=16)
    gen = engine.speculative_generate(verifier, _drafter(drafter, "qwen", policy, k), ids, k, engine.Stop(NEW))
    assert tuple(gen.tokens) == _greedy("qwen", policy, 40)


def test_speculative_stops_like_greedy_and_leaves_a_consistent_cache() -> None:
    tm = tiny_models.gemma()
    ids = tiny_models.prompt(40, seed=40)
    ref = list(_greedy("gemma", sink_window(4, 8), 40))
    eos = ref[50]

    def detok(toks: list[int]) -> str:
        return "".join(chr(0x100 + t) for t in toks)

    stop_string = detok(ref[70:72])
    for stop in (engine.Stop(NEW, eos_ids=frozenset({eos})), engine.Stop(33),
                 engine.Stop(NEW, stop_strings=(stop_string,), detokenize=detok)):
        want = engine.generate(tm.sequence(sink_window(4, 8)), ids, stop)
        seq = tm.sequence(sink_window(4, 8), max_block=5)
        drafter = engine.ModelDrafter(tm.sequence(sink_window(4, 8), max_block=5))
        got = engine.speculative_generate(seq, drafter, ids, 4, stop)
        assert got.tokens == want.tokens and got.stop_reason == want.stop_reason
        # Fed: the prompt and every output token but the last, as after greedy decoding.
        assert seq.position == len(ids) + len(got.tokens) - 1


def test_prompt_lookup_proposes_the_latest_continuation() -> None:
    d = engine.PromptLookupDrafter(max_ngram=2)
    d.begin([5, 6, 7, 8, 9, 5, 6, 1, 2, 3, 4])
    assert d.propose(5, 3) == [6, 1, 2]  # latest "5" is followed by 6, 1, 2
    d.accept(1, [6, 9])
    assert d.propose(9, 4) == [5, 6, 1, 2]  # "6 9" never seen; "9" was followed by 5 6 1 2
    assert d.propose(42, 4) == []
    with pytest.raises(ValueError):
        engine.PromptLookupDrafter(max_ngram=1, min_ngram=2)


@pytest.mark.skipif(tiny_models.zoo_pair() is None, reason="engine/zoo/models/tiny-{hybrid,drafter} are not committed yet")
@pytest.mark.parametrize("k", [1, 4, 8])
def test_speculative_equals_greedy_zoo_pair(k: int) -> None:
    verifier_model = engine.load("zoo:tiny-hybrid")
    drafter_model = engine.load("zoo:tiny-drafter")
    ids = verifier_model.encode("def fibonacci(n):\n    if n < 2:\n        return n\n    return")
    for policy in (hybrid(4, 16), sink_window(4, 16)):
        want = engine.generate(verifier_model.sequence(policy), ids, engine.Stop(150))
        drafter = engine.ModelDrafter(drafter_model.sequence(policy, max_block=k + 1))
        got = engine.speculative_generate(verifier_model.sequence(policy, max_block=k + 1), drafter, ids, k, engine.Stop(150))
        assert got.tokens == want.tokens
