"""Sampling in `generate` and lossless speculative sampling (engine/sampling.py).

The statistical test: on a tiny model restricted to a vocabulary of V tokens, the exact distribution of
each of the first sampled positions of plain sampling is computed by enumerating every context (the
model's logits for all V^3 continuations in one batched forward); tens of thousands of seeded
speculative-sampling draws, batched as rows of `engine.sampling.verify` (the rule the decode loop runs),
must match it by a chi-square test at a fixed significance. A planted off-by-one in the rule (the ratio
read at the next position, or no residual) must fail the same test."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import engine
import engine.sampling as sampling_module
from engine.drafters.spec import PROPOSALS
from engine.policy import full, sink_window
from engine.sampling import Sampling, draw, verify
from engine.speculative import SamplingDrafter
from tests.engine import tiny_models
from tests.engine.backends import on

V = 8  # the restricted vocabulary
PROMPT = [1, 2, 3, 4, 5]
DEPTH = 3  # sampled positions 2..4 come from the rule (position 1 from the prefill)
DRAWS = 40_000
ALPHA = 1e-3
SETTINGS = Sampling(temperature=1.3, top_k=6)


def _tables(tm: engine.Model, sampling: Sampling) -> list[np.ndarray]:
    """tables[d][index of context c, :] = the model's next-token probabilities after PROMPT + c, for every
    context c of d tokens over V (index: c read as a base-V number)."""
    conts = np.array(list(itertools.product(range(V), repeat=DEPTH)), dtype=np.int64)  # [V^3, 3]
    ids = torch.from_numpy(np.concatenate([np.tile(PROMPT, (len(conts), 1)), conts], 1))
    with torch.inference_mode():
        logits = tm.model(input_ids=ids).logits[:, len(PROMPT) - 1 :, :V].numpy()  # [V^3, 4, V]
    probs = sampling.probs(logits)
    # context of depth d = the first d tokens of a continuation: its row at index (cont index // V^(3-d))
    return [probs[:: V ** (DEPTH - d), d] for d in range(DEPTH + 1)]


def _index(ctx: np.ndarray) -> np.ndarray:
    out = np.zeros(len(ctx), dtype=np.int64)
    for j in range(ctx.shape[1]):
        out = out * V + ctx[:, j]
    return out


def _exact(p: list[np.ndarray]) -> list[np.ndarray]:
    """Plain sampling's exact marginal distribution at each of positions 1..DEPTH+1."""
    joint = p[0][0]
    marginals = [joint]
    for d in range(1, DEPTH + 1):
        joint = (joint[:, None] * p[d]).reshape(-1)  # over contexts of d + 1 tokens, base-V order
        marginals.append(joint.reshape(-1, V).sum(0))
    return marginals


def _speculative(p: list[np.ndarray], q: list[np.ndarray], sampled: bool, k: int, seed: int) -> np.ndarray:
    """DRAWS runs of speculative sampling to DEPTH + 1 tokens, as engine.speculative runs each (the first
    token drawn from the prefill's p, then blocks of min(k, left - 1) drafts verified by `verify`), batched
    over the runs. `sampled`: the drafter draws from its table q (and hands q to the rule); otherwise it
    proposes the argmax of q (a deterministic drafter: one-hot)."""
    rng = np.random.default_rng(seed)
    total = DEPTH + 1
    out = np.zeros((DRAWS, total), dtype=np.int64)
    out[:, 0] = draw(np.broadcast_to(p[0][0], (DRAWS, V)), rng)
    length = np.ones(DRAWS, dtype=np.int64)
    while (length < total).any():
        for fed in range(1, total):
            rows = np.flatnonzero(length == fed)
            if not len(rows):
                continue
            budget = min(k, total - fed - 1)
            drafts = np.zeros((len(rows), budget), dtype=np.int64)
            qs = np.zeros((len(rows), budget, V))
            ps = np.zeros((len(rows), budget + 1, V))
            for j in range(budget + 1):
                at = _index(np.concatenate([out[rows, :fed], drafts[:, :j]], 1))
                ps[:, j] = p[fed + j][at]
                if j < budget:
                    qs[:, j] = q[fed + j][at]
                    drafts[:, j] = draw(qs[:, j], rng) if sampled else qs[:, j].argmax(-1)
            n, token = verify(ps, drafts, np.full(len(rows), budget), qs if sampled else None, rng)
            for i, r in enumerate(rows):
                new = [*drafts[i, : n[i]], token[i]]
                out[r, fed : fed + len(new)] = new
                length[r] = fed + len(new)
    return out


def _pvalue(samples: np.ndarray, expected: np.ndarray) -> float:
    """Chi-square goodness of fit (bins expected < 5 merged), via torch's regularized gamma."""
    counts = np.bincount(samples, minlength=V).astype(np.float64)
    want = expected * len(samples)
    small = want < 5
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        want = np.append(want[~small], want[small].sum())
    keep = want > 0
    if (counts[~keep] > 0).any():
        return 0.0  # a token plain sampling never draws
    counts, want = counts[keep], want[keep]
    stat = float(((counts - want) ** 2 / want).sum())
    df = len(counts) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2)))


@pytest.fixture(scope="module")
def tables() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(p, q): the verifier's and a different drafter's probability tables under SETTINGS."""
    return _tables(tiny_models.gemma(), SETTINGS), _tables(tiny_models.qwen(seed=7, layers=1), SETTINGS)


def _pvalues(tables: tuple[list[np.ndarray], list[np.ndarray]], sampled: bool, k: int) -> list[float]:
    p, q = tables
    out = _speculative(p, q, sampled, k, seed=k + 10 * sampled)
    exact = _exact(p)
    return [_pvalue(out[:, i], exact[i]) for i in range(1, DEPTH + 1)]


@pytest.mark.parametrize(("sampled", "k"), [(True, 3), (False, 3), (True, 1)])
def test_speculative_sampling_matches_plain_sampling(tables, sampled: bool, k: int) -> None:  # type: ignore[no-untyped-def]
    p, q = tables
    # the drafter must disagree with the verifier often, or the rule is barely exercised
    assert np.abs(p[1] - q[1]).sum(-1).mean() > 0.3
    pvalues = _pvalues(tables, sampled, k)
    assert min(pvalues) > ALPHA, pvalues


def _ratio_at_next_position(p: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    # the planted off-by-one: p(x) read one block position late (after the draft, not before it)
    if p.shape[1] == drafts.shape[1] + 1:
        p = p[:, 1:]
    return np.take_along_axis(p, drafts[..., None], -1)[..., 0]


@pytest.mark.parametrize(
    ("plant", "sampled"),
    [("next_position", True), ("next_position", False), ("no_residual", True), ("no_residual", False)],
)
def test_planted_rule_bug_fails_the_test(tables, monkeypatch, plant: str, sampled: bool) -> None:  # type: ignore[no-untyped-def]
    if plant == "next_position":
        monkeypatch.setattr(sampling_module, "_at", _ratio_at_next_position)
    else:
        monkeypatch.setattr(sampling_module, "_residual", lambda p, q: p)
    assert min(_pvalues(tables, sampled, 3)) < ALPHA


def test_probs_truncation() -> None:
    logits = np.log(np.array([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    assert Sampling(temperature=1.0).probs(logits) == pytest.approx(np.exp(logits))
    top2 = Sampling(temperature=1.0, top_k=2).probs(logits)[0]
    assert top2 == pytest.approx([0.5 / 0.7, 0.2 / 0.7, 0, 0, 0])
    top_p = Sampling(temperature=1.0, top_p=0.8).probs(logits)[0]  # 0.5 + 0.2 < 0.8: three kept
    assert top_p == pytest.approx([0.5 / 0.85, 0.2 / 0.85, 0.15 / 0.85, 0, 0])
    assert Sampling(temperature=0).probs(logits)[0].tolist() == [1, 0, 0, 0, 0]
    hot = Sampling(temperature=0.25).probs(logits)[0]
    assert hot[0] > 0.9
    for bad in (dict(temperature=-1.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError):
            Sampling(**bad)  # type: ignore[arg-type]


NEW = 24


def _verifier(backend: str = "torch") -> engine.Session:
    return on(backend, tiny_models.gemma()).session(sink_window(4, 8), max_block=5, prefill_chunk=16)


def test_both_backends_draw_the_same_tokens_for_a_seed() -> None:
    """One sampler on the host: the mlx twin (same float32 weights) draws the torch tokens for a seed."""
    pytest.importorskip("mlx_lm", reason="mlx / mlx-lm not installed")
    ids, settings = tiny_models.prompt(10, seed=3), Sampling(temperature=0.9, top_k=50, seed=4)
    torch_tokens = engine.generate(_verifier(), ids, engine.Stop(NEW), settings).tokens
    assert engine.generate(_verifier("mlx"), ids, engine.Stop(NEW), settings).tokens == torch_tokens
    drafter = engine.ModelDrafter(on("mlx", tiny_models.qwen(seed=7, layers=1)).session(full(), max_block=5))
    gen = engine.speculative_generate(_verifier("mlx"), drafter, ids, 4, engine.Stop(NEW), settings)
    assert len(gen.tokens) == NEW and gen.drafted > 0


def test_generate_sampling_seeded_and_greedy_limits() -> None:
    ids = tiny_models.prompt(10, seed=3)
    stop = engine.Stop(NEW)
    greedy = engine.generate(_verifier(), ids, stop).tokens
    a = engine.generate(_verifier(), ids, stop, Sampling(temperature=1.0, seed=1)).tokens
    assert a == engine.generate(_verifier(), ids, stop, Sampling(temperature=1.0, seed=1)).tokens
    assert a != engine.generate(_verifier(), ids, stop, Sampling(temperature=1.0, seed=2)).tokens
    assert a != greedy
    # temperature 0, top_k 1 and a tiny top_p are greedy, whatever the seed
    for s in (
        Sampling(temperature=0.0, seed=5),
        Sampling(temperature=2.0, top_k=1),
        Sampling(1.0, top_p=1e-9),
    ):
        assert engine.generate(_verifier(), ids, stop, s).tokens == greedy


@pytest.mark.parametrize("kind", ["self", "other", "lookup"])
def test_speculative_sampling_runs_seeded(kind: str) -> None:
    ids = tiny_models.prompt(10, seed=4) * 2  # repeats: prompt lookup finds drafts
    stop = engine.Stop(NEW)
    settings = Sampling(temperature=0.8, top_p=0.95, seed=3)

    def drafter() -> engine.Drafter:
        if kind == "lookup":
            return engine.PromptLookupDrafter()
        if kind == "self":  # the verifier's weights and policy: q == p up to float rounding
            return engine.ModelDrafter(tiny_models.gemma().session(sink_window(4, 8), max_block=5))
        return engine.ModelDrafter(tiny_models.qwen(seed=7, layers=1).session(full(), max_block=5))

    gens = [engine.speculative_generate(_verifier(), drafter(), ids, 4, stop, settings) for _ in range(2)]
    assert gens[0].tokens == gens[1].tokens and len(gens[0].tokens) == NEW
    assert gens[0].drafted > 0
    if kind == "self":  # q == p: every draft is accepted (min(1, p/q) = 1)
        assert gens[0].accepted >= 0.95 * gens[0].drafted
    # greedy settings: exactly greedy decoding
    greedy = engine.generate(_verifier(), ids, stop).tokens
    zero = Sampling(temperature=0.0, seed=3)
    assert engine.speculative_generate(_verifier(), drafter(), ids, 4, stop, zero).tokens == greedy


def test_proposal_kinds_in_one_place() -> None:
    """engine.drafters.spec.PROPOSALS says which kinds hand q to the rule; the drafters agree."""
    assert set(PROPOSALS) == set(engine.drafters.KINDS)
    assert isinstance(engine.ModelDrafter(_verifier()), SamplingDrafter) == (
        PROPOSALS["model"] == "distribution"
    )
    assert not isinstance(engine.PromptLookupDrafter(), SamplingDrafter)
    assert PROPOSALS["lookup"] == "deterministic"
