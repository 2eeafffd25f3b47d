"""Invariant (b): speculative decoding emits exactly the tokens of greedy decoding under the same cache
policy, long after the window has wrapped, for every drafter and k; plus the drafters themselves."""

from __future__ import annotations

import functools

import pytest

import engine
from engine.policy import Policy, full, hybrid, sink_window
from tests.engine import tiny_models
from tests.engine.backends import BACKENDS, on

NEW = 100
POLICIES = [full(), sink_window(4, 8), sink_window(0, 5), hybrid(2, 6)]
MLX_MARKS = BACKENDS[1].marks


@functools.cache
def _greedy(backend: str, model: str, policy: Policy, prompt_len: int) -> tuple[int, ...]:
    tm = on(backend, getattr(tiny_models, model)())
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    return tuple(engine.generate(tm.session(policy, prefill_chunk=16), ids, engine.Stop(NEW)).tokens)


def _drafter(backend: str, kind: str, model: str, policy: Policy, k: int) -> engine.Drafter:
    if kind == "lookup":
        return engine.PromptLookupDrafter()
    if kind == "self":  # the verifier drafting for itself: everything is accepted
        return engine.ModelDrafter(
            on(backend, getattr(tiny_models, model)()).session(policy, max_block=k + 1)
        )
    if kind == "narrow":  # same weights, a narrower window: agrees often, not always
        return engine.ModelDrafter(
            on(backend, getattr(tiny_models, model)()).session(sink_window(1, 3), max_block=k + 1)
        )
    # a random-weight drafter of another architecture (same vocabulary): mostly rejected; with the
    # smallest slack a drafter may have (it rolls back at most k - 1 fed drafts)
    return engine.ModelDrafter(
        on(backend, tiny_models.qwen(seed=7, layers=1)).session(policy, max_block=max(1, k - 1))
    )


# torch: the drafters the issue names (self, a random-weight model) at every k and every policy, the
# others at fewer k. mlx: the same algorithm on its own cache, over a representative subset.
CASES = [(d, k) for d in ("self", "random") for k in (1, 4, 8)] + [
    ("narrow", 4),
    ("lookup", 1),
    ("lookup", 8),
]
GEMMA = [pytest.param(p, d, k, "torch", id=f"torch-{p}-{d}-{k}") for p in POLICIES for d, k in CASES] + [
    pytest.param(p, d, k, "mlx", marks=MLX_MARKS, id=f"mlx-{p}-{d}-{k}")
    for p, d, k in [
        (sink_window(4, 8), "self", 8),
        (sink_window(4, 8), "random", 4),
        (hybrid(2, 6), "narrow", 4),
        (full(), "random", 1),
        (sink_window(0, 5), "lookup", 8),
    ]
]


@pytest.mark.parametrize(("policy", "drafter", "k", "backend"), GEMMA)
def test_speculative_equals_greedy_gemma(policy: Policy, drafter: str, k: int, backend: str) -> None:
    prompt_len = [3, 40, 17][k % 3]
    ids = tiny_models.prompt(prompt_len, seed=prompt_len)
    verifier = on(backend, tiny_models.gemma()).session(policy, max_block=k + 1, prefill_chunk=16)
    gen = engine.speculative_generate(
        verifier, _drafter(backend, drafter, "gemma", policy, k), ids, k, engine.Stop(NEW)
    )
    assert tuple(gen.tokens) == _greedy(backend, "gemma", policy, prompt_len)
    assert gen.accepted <= gen.drafted and gen.forwards * (k + 1) >= NEW - 1
    assert gen.acceptance_length == pytest.approx((NEW - 1) / gen.forwards)
    if drafter == "self":
        assert gen.accepted >= 0.9 * gen.drafted
    if drafter == "narrow" and k > 1:
        assert 0 < gen.accepted < gen.drafted


@pytest.mark.parametrize(
    ("policy", "drafter", "k", "backend"),
    [
        (sink_window(4, 8), "narrow", 1, "torch"),
        (sink_window(4, 8), "narrow", 4, "torch"),
        (sink_window(0, 5), "self", 8, "torch"),
        (full(), "lookup", 4, "torch"),
        pytest.param(sink_window(4, 8), "narrow", 4, "mlx", marks=MLX_MARKS),
    ],
)
def test_speculative_equals_greedy_qwen(policy: Policy, drafter: str, k: int, backend: str) -> None:
    ids = tiny_models.prompt(40, seed=40)
    verifier = on(backend, tiny_models.qwen()).session(policy, max_block=k + 1, prefill_chunk=16)
    gen = engine.speculative_generate(
        verifier, _drafter(backend, drafter, "qwen", policy, k), ids, k, engine.Stop(NEW)
    )
    assert tuple(gen.tokens) == _greedy(backend, "qwen", policy, 40)


def test_speculative_stops_like_greedy_and_leaves_a_consistent_cache(backend: str) -> None:
    tm = on(backend, tiny_models.gemma())
    ids = tiny_models.prompt(40, seed=40)
    ref = list(_greedy(backend, "gemma", sink_window(4, 8), 40))
    eos = ref[50]

    def detok(toks: list[int]) -> str:
        return "".join(chr(0x100 + t) for t in toks)

    stop_string = detok(ref[70:72])
    for stop in (
        engine.Stop(NEW, eos_ids=frozenset({eos})),
        engine.Stop(33),
        engine.Stop(NEW, stop_strings=(stop_string,), detokenize=detok),
    ):
        want = engine.generate(tm.session(sink_window(4, 8)), ids, stop)
        seq = tm.session(sink_window(4, 8), max_block=5)
        drafter = engine.ModelDrafter(tm.session(sink_window(4, 8), max_block=5))
        got = engine.speculative_generate(seq, drafter, ids, 4, stop)
        assert got.tokens == want.tokens and got.stop_reason == want.stop_reason
        # Fed: the prompt and every output token but the last, as after greedy decoding.
        assert seq.position == len(ids) + len(got.tokens) - 1


class _PlainAfter(engine.speculative.DraftLength):
    """A DraftLength whose measured costs say drafting stops paying after `after` blocks at k_max."""

    after = 2
    blocks = 0

    def choose(self, rows: int = 1) -> int:
        self.blocks += 1
        self.plain = self.blocks > self.after
        return 0 if self.plain else self.k_max


def test_adaptive_speculative_equals_greedy_and_goes_plain(backend: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Issue 44: `speculative_generate(adapt=True)` chooses each block's draft length from measured costs
    (the tokens stay greedy's), and where drafting stops paying it decodes the rest plainly: no drafter
    call and no hidden states after the switch, one forward per token."""
    tm = on(backend, tiny_models.gemma())
    policy, ids = sink_window(4, 8), tiny_models.prompt(40, seed=40)
    want = list(_greedy(backend, "gemma", policy, 40))

    def run() -> tuple[engine.Generation, list[int]]:
        drafter = _drafter(backend, "narrow", "gemma", policy, 4)
        proposed: list[int] = []
        propose = drafter.propose
        drafter.propose = lambda *a: proposed.append(1) or propose(*a)  # type: ignore[method-assign]
        gen = engine.speculative_generate(
            tm.session(policy, max_block=5), drafter, ids, 4, engine.Stop(NEW), adapt=True
        )
        return gen, proposed

    assert run()[0].tokens == want
    monkeypatch.setattr(engine.speculative, "DraftLength", _PlainAfter)
    gen, proposed = run()
    assert gen.tokens == want and len(proposed) == 2
    # two blocks at k = 4, then one forward per token
    assert gen.forwards == 2 + (len(gen.tokens) - 1) - (gen.accepted + 2)


def test_adaptive_speculative_sampling_goes_plain_as_plain_sampling(backend: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Once plain, a sampled run draws each token from the verifier's probabilities with its own stream,
    as `generate` does: gone plain from the first block, its tokens are plain sampling's for the seed."""
    from engine.sampling import Sampling

    monkeypatch.setattr(_PlainAfter, "after", 0)
    monkeypatch.setattr(engine.speculative, "DraftLength", _PlainAfter)
    tm = on(backend, tiny_models.gemma())
    policy, ids, stop = sink_window(4, 8), tiny_models.prompt(40, seed=40), engine.Stop(60)
    for seed in (0, 1):
        s = Sampling(0.8, seed=seed)
        want = engine.generate(tm.session(policy), ids, stop, s)
        drafter = _drafter(backend, "narrow", "gemma", policy, 4)
        got = engine.speculative_generate(
            tm.session(policy, max_block=5), drafter, ids, 4, stop, s, adapt=True
        )
        assert got.tokens == want.tokens and got.forwards == want.forwards and got.drafted == 0


def test_verifier_without_the_slack_is_refused() -> None:
    seq = tiny_models.gemma().session(sink_window(4, 8), max_block=4)
    with pytest.raises(ValueError, match="max_block >= k \\+ 1 = 5"):
        engine.speculative_generate(seq, engine.PromptLookupDrafter(), [5, 6, 7], 4, engine.Stop(10))


def test_prompt_lookup_proposes_the_latest_continuation() -> None:
    d = engine.PromptLookupDrafter(max_ngram=2)
    d.begin([5, 6, 7, 8, 9, 5, 6, 1, 2, 3, 4])
    assert d.propose(5, 3) == [6, 1, 2]  # latest "5" is followed by 6, 1, 2
    d.accept(1, [6, 9])
    assert d.propose(9, 4) == [5, 6, 1, 2]  # "6 9" never seen; "9" was followed by 5 6 1 2
    assert d.propose(42, 4) == []
    with pytest.raises(ValueError):
        engine.PromptLookupDrafter(max_ngram=1, min_ngram=2)


@pytest.mark.parametrize(
    ("k", "backend"), [(1, "torch"), (4, "torch"), (8, "torch"), pytest.param(4, "mlx", marks=MLX_MARKS)]
)
def test_speculative_equals_greedy_zoo_pair(k: int, backend: str) -> None:
    verifier_model = engine.load("zoo:tiny-hybrid", backend=backend)  # type: ignore[arg-type]
    drafter_model = engine.load("zoo:tiny-drafter", backend=backend)  # type: ignore[arg-type]
    ids = verifier_model.encode(_zoo_code_prompt())
    for policy in (hybrid(4, 16), sink_window(4, 16)):
        want = engine.generate(verifier_model.session(policy), ids, engine.Stop(150))
        drafter = engine.ModelDrafter(drafter_model.session(policy, max_block=k + 1))
        got = engine.speculative_generate(
            verifier_model.session(policy, max_block=k + 1), drafter, ids, k, engine.Stop(150)
        )
        assert got.tokens == want.tokens
        assert got.accepted > 0


def _zoo_code_prompt() -> str:
    from engine.zoo import corpus

    return corpus.code_prompts(1, seed=5, n_tokens=80)[0]
