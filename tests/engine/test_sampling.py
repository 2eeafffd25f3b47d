"""Sampling in `generate` and lossless speculative sampling (engine/sampling.py).

The statistical test: on a tiny model restricted to a vocabulary of V tokens, the exact distribution of
each of the first sampled positions of plain sampling is computed by enumerating every context (the
model's logits for all V^3 continuations in one batched forward); tens of thousands of seeded
speculative-sampling draws, batched as rows of `engine.sampling.verify` (the rule the decode loop runs),
must match it by a chi-square test at a fixed significance. A planted off-by-one in the rule (the ratio
read at the next position, or no residual) must fail the same test."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

import engine
import engine.sampling as sampling_module
from engine.drafters.block.torch import BlockDrafter
from engine.drafters.diffusion.drafter import DiffusionDrafter
from engine.drafters.gemma4_assistant.torch import Gemma4AssistantDrafter
from engine.drafters.load import load_diffusion_model
from engine.drafters.spec import KINDS, PROPOSALS, DrafterKind
from engine.policy import full, sink_window
from engine.sampling import Sampling, draw, verify
from engine.speculative import SamplingDrafter, _prefill, proposal
from tests.engine import tiny_drafters, tiny_models
from tests.engine.backends import HAVE_MLX, on

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


# A drafter in the simulation: (the contexts [rows, fed] a block starts after, its budget, rng) -> (drafts
# [rows, budget], how many each row drafted [rows], their proposals q [rows, budget, V] or None: one-hot)
Proposer = Callable[[np.ndarray, int, np.random.Generator], tuple[np.ndarray, np.ndarray, np.ndarray | None]]


def _table_proposer(q: list[np.ndarray], sampled: bool) -> Proposer:
    """A drafter given by next-token tables q[d] (after each context of d tokens): it drafts token by token,
    drawing from q (`sampled`: it hands q to the rule) or taking its argmax (deterministic: one-hot)."""

    def propose(ctx: np.ndarray, budget: int, rng: np.random.Generator) -> Any:
        drafts = np.zeros((len(ctx), budget), dtype=np.int64)
        qs = np.zeros((len(ctx), budget, V))
        for j in range(budget):
            qs[:, j] = q[ctx.shape[1] + j][_index(np.concatenate([ctx, drafts[:, :j]], 1))]
            drafts[:, j] = draw(qs[:, j], rng) if sampled else qs[:, j].argmax(-1)
        return drafts, np.full(len(ctx), budget), qs if sampled else None

    return propose


def _speculative(p: list[np.ndarray], propose: Proposer, k: int, seed: int) -> np.ndarray:
    """DRAWS runs of speculative sampling to DEPTH + 1 tokens, as engine.speculative runs each (the first
    token drawn from the prefill's p, then blocks of min(k, left - 1) drafts verified by `verify`), batched
    over the runs."""
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
            drafts, lengths, qs = propose(out[rows, :fed], budget, rng)
            ps = np.zeros((len(rows), budget + 1, V))
            for j in range(budget + 1):
                ps[:, j] = p[fed + j][_index(np.concatenate([out[rows, :fed], drafts[:, :j]], 1))]
            n, token = verify(ps, drafts, lengths, qs, rng)
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


def _pvalues(p: list[np.ndarray], propose: Proposer, k: int, seed: int) -> list[float]:
    out = _speculative(p, propose, k, seed)
    exact = _exact(p)
    return [_pvalue(out[:, i], exact[i]) for i in range(1, DEPTH + 1)]


@pytest.mark.parametrize(("sampled", "k"), [(True, 3), (False, 3), (True, 1)])
def test_speculative_sampling_matches_plain_sampling(tables, sampled: bool, k: int) -> None:  # type: ignore[no-untyped-def]
    p, q = tables
    # the drafter must disagree with the verifier often, or the rule is barely exercised
    assert np.abs(p[1] - q[1]).sum(-1).mean() > 0.3
    pvalues = _pvalues(p, _table_proposer(q, sampled), k, seed=k + 10 * sampled)
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
    p, q = tables
    assert min(_pvalues(p, _table_proposer(q, sampled), 3, seed=3 + 10 * sampled)) < ALPHA


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
    # batched speculative sampling: each row's own stream on either backend, the same tokens
    prompts = [ids * 2, tiny_models.prompt(7, seed=5) * 2]

    def batch(backend: str) -> list[list[int]]:
        model = on(backend, tiny_models.gemma())
        session = model.session(sink_window(4, 8), max_block=5, rows=2, prefill_chunk=16)
        lookups = [engine.PromptLookupDrafter() for _ in prompts]
        gens = engine.speculative_generate_batch(
            session, lookups, prompts, 4, engine.Stop(NEW), sampling=settings
        )
        return [g.tokens for g in gens]

    assert batch("mlx") == batch("torch")


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
    """engine.drafters.spec.PROPOSALS says which kinds hand q to the rule (each kind's drafter agrees:
    test_every_drafter_kind_runs_sampled)."""
    assert set(PROPOSALS) == set(KINDS)


# Every drafter kind, real drafters on vocabulary-V models: what each proposes after every context a run
# to DEPTH + 1 tokens can start a block at, read through the protocol `speculative_generate` drives it by,
# then DRAWS runs of the rule over those proposals against plain sampling's exact marginals.
K = 3


def _kind_models(kind: DrafterKind) -> tuple[engine.Model, Callable[[engine.Session], engine.Drafter]]:
    """A vocabulary-V verifier and a fresh drafter of `kind` for a session of it (random weights)."""
    if kind == "gemma4-assistant":
        assistant = tiny_models.gemma4_assistant(vocab=V)
        return tiny_models.gemma4(vocab=V), lambda s: Gemma4AssistantDrafter(assistant, s)  # type: ignore[arg-type]
    verifier = tiny_models.gemma(vocab=V)
    if kind == "lookup":
        return verifier, lambda s: engine.PromptLookupDrafter()
    if kind == "model":
        other = tiny_models.gemma(seed=7, layers=2, vocab=V)
        return verifier, lambda s: engine.ModelDrafter(other.session(full(), max_block=K + 1))
    if kind == "block":
        weights = tiny_drafters.block_model(vocab=V)
        return verifier, lambda s: BlockDrafter(weights)
    dlm = load_diffusion_model(str(tiny_drafters.dlm_dir(vocab=V)))
    return verifier, lambda s: DiffusionDrafter(dlm, steps=2)


def _extract(kind: DrafterKind) -> dict[tuple[int, ...], tuple[list[int], np.ndarray | None]]:
    """The drafter's proposal (drafts, q or None) after PROMPT + c for every context c of 1..DEPTH - 1
    tokens, with the budget a run gives a block there: the drafter begins on PROMPT, sees the prefill's
    features, then c as blocks without drafts (propose 0, the verify forward, observe, accept), then one
    `proposal` (the loop's call under sampling)."""
    model, make = _kind_models(kind)
    rng = np.random.default_rng(0)
    table = {}
    for length in range(1, DEPTH):
        for c in itertools.product(range(V), repeat=length):
            verifier = model.session(full(), max_block=K + 1)
            drafter = make(verifier)
            layers = tuple(getattr(drafter, "layers", ()))
            drafter.begin(PROMPT)
            _prefill(verifier, drafter, PROMPT, layers, False)
            for token, after in zip(c[:-1], c[1:], strict=True):
                proposal(drafter, token, 0, SETTINGS, rng)
                step = verifier.forward([token], hidden=layers)
                if layers:
                    drafter.observe(step.hidden, 1)  # type: ignore[attr-defined]
                drafter.accept(0, [after])
            table[c] = proposal(drafter, c[-1], min(K, DEPTH - length), SETTINGS, rng)
    return table


def _extracted_proposer(
    table: dict[tuple[int, ...], tuple[list[int], np.ndarray | None]], chain: bool
) -> Proposer:
    """The simulation's drafter from `_extract`'s proposals. Deterministic: the drafts recorded. Sampled:
    drawn from the recorded q; `chain` (an autoregressive drafter) draws draft j from the q recorded after
    the context extended by the drafts before it, else (one block forward) from row j of the context's q."""
    arrays = {}
    for length in range(1, DEPTH):
        keys = list(itertools.product(range(V), repeat=length))
        budget = min(K, DEPTH - length)
        drafts = np.zeros((len(keys), budget), dtype=np.int64)
        lengths = np.array([len(table[c][0]) for c in keys])
        qs = np.zeros((len(keys), budget, V))
        for i, c in enumerate(keys):
            d, q = table[c]
            drafts[i, : len(d)] = d
            if q is not None:
                qs[i, : len(q)] = q
        arrays[length] = (drafts, lengths, qs)
    sampled = next(iter(table.values()))[1] is not None

    def propose(ctx: np.ndarray, budget: int, rng: np.random.Generator) -> Any:
        if budget == 0:
            return np.zeros((len(ctx), 0), dtype=np.int64), np.zeros(len(ctx), dtype=np.int64), None
        drafts, lengths, qs = (a[_index(ctx)] for a in arrays[ctx.shape[1]])
        if not sampled:
            return drafts, lengths, None
        if not chain:
            return draw(qs, rng), lengths, qs
        for j in range(budget):
            at = np.concatenate([ctx, drafts[:, :j]], 1)
            qs[:, j] = arrays[at.shape[1]][2][_index(at), 0]
            drafts[:, j] = draw(qs[:, j], rng)
        return drafts, lengths, qs

    return propose


@functools.cache
def _kind_case(kind: DrafterKind) -> tuple[list[np.ndarray], Proposer]:
    """(the verifier's tables, the drafter's proposals) for `kind`; checks the recorded proposals: a
    deterministic kind proposes in most contexts, a sampled one's later drafts follow the recorded q."""
    table = _extract(kind)
    sampled = PROPOSALS[kind] == "distribution"
    assert all((q is not None) == sampled for _, q in table.values())
    assert sum(len(d) > 0 for d, _ in table.values()) >= 0.5 * len(table)
    if kind == "model":  # autoregressive: q of draft 2 is the q recorded after the context + draft 1
        for c in itertools.product(range(V), repeat=1):
            (d1, *_), q = table[c]
            assert q is not None and np.allclose(q[1], table[(*c, d1)][1][0], atol=1e-5)  # type: ignore[index]
    return _tables(_kind_models(kind)[0], SETTINGS), _extracted_proposer(table, chain=kind == "model")


@pytest.mark.parametrize("kind", KINDS)
def test_every_drafter_kind_samples_losslessly(kind: DrafterKind) -> None:
    p, propose = _kind_case(kind)
    pvalues = _pvalues(p, propose, K, seed=21)
    assert min(pvalues) > ALPHA, pvalues


@pytest.mark.parametrize("kind", KINDS)
def test_planted_off_by_one_fails_every_drafter_kind(kind: DrafterKind, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    p, propose = _kind_case(kind)
    monkeypatch.setattr(sampling_module, "_at", _ratio_at_next_position)
    assert min(_pvalues(p, propose, K, seed=21)) < ALPHA


@pytest.mark.parametrize("kind", KINDS)
def test_every_drafter_kind_runs_sampled(kind: DrafterKind) -> None:
    """Reachable at temperature > 0 end to end: seeded, drafts accepted and rejected, the right q."""
    model, make = _kind_models(kind)
    ids = tiny_models.prompt(12, seed=2) * 2
    ids = [t % V for t in ids]
    settings = Sampling(temperature=0.9, seed=5)

    def run() -> engine.Generation:
        session = model.session(sink_window(4, 8), max_block=K + 1)
        return engine.speculative_generate(session, make(session), ids, K, engine.Stop(30), settings)

    gen = run()
    assert gen.tokens == run().tokens and len(gen.tokens) == 30
    assert 0 < gen.accepted < gen.drafted
    drafter = make(model.session(full(), max_block=K + 1))
    assert isinstance(drafter, SamplingDrafter) == (PROPOSALS[kind] == "distribution")


def _batch_sampled(prompts: list[list[int]], settings: Sampling, new: int) -> list[engine.Generation]:
    """Batched speculative sampling of `prompts` (row r seeded settings.seed + r), prompt lookup drafting."""
    session = tiny_models.gemma(vocab=V).session(full(), max_block=K + 1, rows=len(prompts))
    drafters = [engine.PromptLookupDrafter() for _ in prompts]
    return engine.speculative_generate_batch(
        session, drafters, prompts, K, engine.Stop(new), sampling=settings
    )


def _pit_pvalue(
    prompts: list[list[int]], gens: list[engine.Generation], settings: Sampling, target: Any = None
) -> float:
    """Each generated token x against the verifier's own distribution p after its context (one forward
    over each row's whole sequence): its randomized probability integral transform P(X < x) + U p(x) is
    uniform on [0, 1) iff every x is drawn from p; chi-square over 10 equal bins."""
    rng = np.random.default_rng(0)
    lengths = {len(p) for p in prompts}
    assert len(lengths) == 1
    start = lengths.pop() - 1
    ids = torch.tensor([[*p, *g.tokens[:-1]] for p, g in zip(prompts, gens, strict=True)])
    with torch.inference_mode():
        logits = (target or tiny_models.gemma(vocab=V)).model(input_ids=ids).logits[:, start:].numpy()
    p = settings.probs(logits)
    x = np.array([g.tokens for g in gens])[..., None]
    px = np.take_along_axis(p, x, -1)[..., 0]
    if (px == 0).any():
        return 0.0  # a token plain sampling never draws
    u = np.take_along_axis(np.cumsum(p, -1) - p, x, -1)[..., 0] + rng.random(px.shape) * px
    counts = np.bincount(np.minimum((u * 10).astype(np.int64), 9).reshape(-1), minlength=10)
    want = u.size / 10
    stat = float(((counts - want) ** 2 / want).sum())
    return float(torch.special.gammaincc(torch.tensor(4.5, dtype=torch.float64), torch.tensor(stat / 2)))


PIT_ROWS, PIT_NEW = 32, 160


def test_batched_speculative_sampling_draws_from_the_target() -> None:
    """A batched run (rows stopping at different blocks leave the batch): every token it commits is
    distributed as plain sampling draws it after that row's context; the planted bug fails the test."""
    prompts = [[1, 2, 3, 4, 5]] * PIT_ROWS
    gens = _batch_sampled(prompts, SETTINGS, PIT_NEW)
    assert sum(g.accepted for g in gens) > 0.2 * sum(len(g.tokens) for g in gens)
    assert _pit_pvalue(prompts, gens, SETTINGS) > ALPHA


def test_batched_planted_off_by_one_fails(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(sampling_module, "_at", _ratio_at_next_position)
    prompts = [[1, 2, 3, 4, 5]] * PIT_ROWS
    assert _pit_pvalue(prompts, _batch_sampled(prompts, SETTINGS, PIT_NEW), SETTINGS) < ALPHA


def test_a_batch_row_samples_as_it_would_alone() -> None:
    """Each row its own rule and random stream: row r of a batch (seed + r) is exactly `speculative_generate`
    of its prompt alone with that seed (deterministic drafts), whatever the other rows hold."""
    prompts = [tiny_models.prompt(6 + 3 * r, seed=r) * 2 for r in range(3)]
    prompts = [[t % V for t in p] for p in prompts]
    settings = Sampling(temperature=0.9, top_p=0.95, seed=11)
    batch = _batch_sampled(prompts, settings, 40)
    for r, (prompt, gen) in enumerate(zip(prompts, batch, strict=True)):
        session = tiny_models.gemma(vocab=V).session(full(), max_block=K + 1)
        alone = engine.speculative_generate(
            session,
            engine.PromptLookupDrafter(),
            prompt,
            K,
            engine.Stop(40),
            Sampling(0.9, top_p=0.95, seed=11 + r),
        )
        assert gen.tokens == alone.tokens and gen.drafted == alone.drafted > 0
    # another row beside it does not change row 0
    other = _batch_sampled([prompts[0], prompts[2]], settings, 40)
    assert other[0].tokens == batch[0].tokens


def _block_rows(rows: int, backend: str = "torch") -> Any:
    """A random block drafter over the vocabulary-V tiny Gemma (its features: layer 1 and the final state)
    for `rows` rows (a BatchedBlockDrafter; rows = 1: the batch-1 BlockDrafter)."""
    from engine.drafters.load import block_drafters

    geo = tiny_models.gemma(vocab=V).geometry
    path = tiny_drafters.block_dir((1, geo.n_layers), geo.hidden_size, V)
    return block_drafters(path, backend)(rows)


def _block_batch(prompts: list[list[int]], settings: Sampling, new: int, backend: str = "torch") -> list[Any]:
    model = on(backend, tiny_models.gemma(vocab=V))
    session = model.session(full(), max_block=K + 1, rows=len(prompts))
    return engine.speculative_generate_batch(
        session, _block_rows(len(prompts), backend), prompts, K, engine.Stop(new), sampling=settings
    )


@pytest.mark.parametrize(
    "backend", ["torch", pytest.param("mlx", marks=pytest.mark.skipif(not HAVE_MLX, reason="no mlx"))]
)
def test_a_batch_row_of_the_block_drafter_samples_as_it_would_alone(backend: str) -> None:
    """Issue 44: the block drafter's q reaches the rule in a batch as at batch 1: row r of a batch (seed + r)
    draws its drafts from its own q_r with its own stream, so it is exactly `speculative_generate` of its
    prompt alone with the batch-1 BlockDrafter (which samples its drafts) and that seed."""
    prompts = [[t % V for t in tiny_models.prompt(6 + 3 * r, seed=r)] for r in range(3)]
    settings = Sampling(temperature=0.9, top_p=0.95, seed=11)
    batch = _block_batch(prompts, settings, 30, backend)
    model = on(backend, tiny_models.gemma(vocab=V))
    for r, (prompt, gen) in enumerate(zip(prompts, batch, strict=True)):
        alone = engine.speculative_generate(
            model.session(full(), max_block=K + 1),
            _block_rows(1, backend),
            prompt,
            K,
            engine.Stop(30),
            Sampling(0.9, top_p=0.95, seed=11 + r),
        )
        assert gen.tokens == alone.tokens and (gen.drafted, gen.accepted) == (alone.drafted, alone.accepted)
        assert 0 < gen.accepted < gen.drafted


def test_batched_block_drafter_sampling_draws_from_the_target() -> None:
    """Sampled drafts with their q, rows leaving the batch as they stop: every committed token distributed
    as plain sampling draws it after its row's context (the PIT chi-square)."""
    prompts = [[1, 2, 3, 4, 5]] * PIT_ROWS
    gens = _block_batch(prompts, SETTINGS, PIT_NEW)
    assert sum(g.accepted for g in gens) > 0
    assert _pit_pvalue(prompts, gens, SETTINGS) > ALPHA


@pytest.mark.parametrize("kind", ["diffusion", "gemma4-assistant"])
def test_sampled_drafts_of_the_diffusion_and_assistant_drafters_draw_from_the_target(
    kind: DrafterKind,
) -> None:
    """Issue 44: both draw their drafts (the diffusion drafter unmasking left to right, the assistant draft
    by draft) and hand q to the rule; end to end every committed token is distributed as plain sampling
    draws it (PIT chi-square). The diffusion drafter runs batched (one per row, `PerRow`), Gemma 4's
    assistant one row at a time (it drafts for unbatched sessions)."""
    model, make = _kind_models(kind)
    assert isinstance(make(model.session(full(), max_block=K + 1)), SamplingDrafter)
    prompts = [[1, 2, 3, 4, 5]] * PIT_ROWS
    if kind == "diffusion":
        session = model.session(full(), max_block=K + 1, rows=PIT_ROWS)
        drafters = [make(session) for _ in prompts]
        gens = engine.speculative_generate_batch(
            session, drafters, prompts, K, engine.Stop(PIT_NEW), sampling=SETTINGS
        )
    else:
        gens = []
        for r, p in enumerate(prompts):
            session = model.session(full(), max_block=K + 1)
            settings = Sampling(SETTINGS.temperature, SETTINGS.top_k, seed=r)
            gens.append(
                engine.speculative_generate(session, make(session), p, K, engine.Stop(PIT_NEW), settings)
            )
    assert sum(g.accepted for g in gens) > 0
    assert _pit_pvalue(prompts, gens, SETTINGS, model) > ALPHA
