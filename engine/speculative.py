"""Speculative decoding over any backend (no torch or mlx here): the `Drafter` protocol and the
verify loop; the drafters themselves live in engine/drafters/.

Each block: the drafter proposes up to k tokens after the last committed token t; the verifier feeds
[t, d1..dk] in one forward and answers a0..ak (its greedy token after each); the longest prefix with
d(i+1) == a(i) is accepted, plus the verifier's own next token a(n); the k - n rejected positions are
trimmed from the verifier (and the drafter). Every committed token is the verifier's greedy choice
given exactly the context step-by-step decoding would have had (the cache masks each query to its own
sink + window), so the output equals `engine.decode.generate` under the same policy token for token.

The verifier's session needs max_block >= k + 1; a model drafter's session needs max_block >= k - 1 (it rolls
back at most k - 1 fed drafts), k + 1 is simplest.

A drafter with a non-empty `layers` attribute (a `FeatureDrafter`, e.g. the block drafter) reads the
verifier's hidden states: the loop then feeds the prompt through `forward` in chunks (so every prompt
position's features come back) and asks each verify forward for those layers; after each block the drafter
`observe`s the features of the positions that stay fed (the committed ones), from the forward that
verified them. No extra verifier forward; other drafters never cost a hidden-state copy.

Sampling (`sampling` with a temperature > 0): lossless speculative sampling. The verify forward returns
its logits, and engine.sampling.verify applies the rejection rule: each committed token is distributed
exactly as plain sampling (engine.decode.generate with the same `Sampling`) would draw it. A drafter
that samples its drafts (a `SamplingDrafter`: the model and block drafters) returns its proposal
distribution q; every other drafter proposes deterministically, as under greedy decoding, and counts as
q = one-hot (`proposal`; which kind does which: engine.drafters.spec.PROPOSALS). `accepted_prefix`
decides a row's block, greedy or sampled, at batch 1 and for each row of a batch (its own random stream).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from engine.decode import Generation, Session, Step, Stop, StopReason, commit
from engine.draft_length import DraftLength
from engine.sampling import Sampling, draw, host, row_samplings, verify


class Drafter(Protocol):
    def begin(self, prompt: Sequence[int]) -> None:
        """Start a new generation after `prompt` (the verifier has prefilled it)."""
        ...

    def propose(self, last: int, k: int) -> list[int]:
        """Up to k tokens expected after the committed token `last`."""
        ...

    def accept(self, n: int, committed: Sequence[int]) -> None:
        """n of the proposed tokens were accepted; `committed` are all the tokens committed this block."""
        ...


class FeatureDrafter(Drafter, Protocol):
    """A drafter conditioned on the verifier's hidden states (engine.decode.Step.hidden)."""

    layers: tuple[int, ...]  # the verifier's hidden states it reads

    def observe(self, hidden: dict[int, Any], rows: int) -> None:
        """The features of the next `rows` fed positions: the first `rows` rows of each hidden[layer]."""
        ...


@runtime_checkable
class SamplingDrafter(Drafter, Protocol):
    """A drafter that, under sampling, draws its drafts from its own distribution and returns it."""

    def propose_sampled(
        self, last: int, k: int, sampling: Sampling, rng: np.random.Generator
    ) -> tuple[list[int], np.ndarray]:
        """Up to k drafts after `last`, drawn with `rng`, and q [len(drafts), vocab] they were drawn from."""
        ...


def proposal(
    drafter: Drafter, last: int, k: int, sampling: Sampling, rng: np.random.Generator
) -> tuple[list[int], np.ndarray | None]:
    """A block's drafts under sampling and their proposal distribution (None: deterministic, one-hot)."""
    if isinstance(drafter, SamplingDrafter):
        return drafter.propose_sampled(last, k, sampling, rng)
    return drafter.propose(last, k), None


def _first(step: Step, sampling: Sampling | None, rng: np.random.Generator | None) -> list[int]:
    """The first new token from the prefill's step: its greedy token, or drawn from its logits."""
    if sampling is None or rng is None:
        return step.tokens
    return [int(draw(sampling.probs(step.logits), rng)[0])]


def accepted_prefix(
    drafts: Sequence[int],
    preds: Sequence[int],
    logits: Any,
    q: np.ndarray | None,
    sampling: Sampling | None,
    rng: np.random.Generator | None,
) -> tuple[int, int]:
    """One row's verdict on its drafts: (n, the token committed after the first n drafts). Greedy
    (`sampling` None): the longest prefix equal to the verifier's own tokens `preds`, then preds[n].
    Sampled: the rejection rule (engine.sampling.verify) on the verifier's logits after [last, drafts]
    (the first len(drafts) + 1 rows of `logits`; any backend's array or numpy), with the drafter's
    proposal q [len(drafts), vocab] (None: one-hot), drawing from this row's own `rng`."""
    if sampling is None or rng is None:
        n = 0
        while n < len(drafts) and drafts[n] == preds[n]:
            n += 1
        return n, preds[n]
    n_accepted, token = verify(
        sampling.probs(logits[: len(drafts) + 1])[None],
        np.array(drafts, dtype=np.int64).reshape(1, -1),
        np.array([len(drafts)]),
        None if q is None else q[None],
        rng,
    )
    return int(n_accepted[0]), int(token[0])


def _prefill(
    verifier: Session,
    drafter: Drafter,
    prompt: Sequence[int],
    layers: tuple[int, ...],
    logits: bool,
    row: int | None = None,
) -> Step:
    """The prompt fed to the verifier (to batch `row` alone of a batched one); the step of its last
    position (its logits when asked). A feature drafter observes every position's hidden states."""
    if not layers:
        return verifier.prefill(prompt, logits=logits, row=row)
    chunk = getattr(verifier, "prefill_chunk", 512)
    for i in range(0, len(prompt), chunk):
        last = i + chunk >= len(prompt)
        step = verifier.forward(prompt[i : i + chunk], hidden=layers, logits=logits and last, row=row)
        if row is None:
            drafter.observe(step.hidden, len(step.tokens))  # type: ignore[attr-defined]
        else:  # a RowsDrafter: this row's features, as a batch of one
            rows: Any = drafter
            rows.observe_rows({j: h[None] for j, h in step.hidden.items()}, [len(step.tokens)], [row])
    return Step(step.tokens[-1:], None if step.logits is None else step.logits[-1:])


def speculative_generate(
    verifier: Session,
    drafter: Drafter,
    prompt: Sequence[int],
    k: int,
    stop: Stop,
    sampling: Sampling | None = None,
    adapt: bool | DraftLength = False,
) -> Generation:
    """Speculative decoding. Greedy: the tokens equal `generate(verifier, prompt, stop)`. With `sampling`
    (temperature > 0): lossless speculative sampling, each token distributed as `generate(verifier,
    prompt, stop, sampling)` draws it (not the same draws: the rule spends its own uniforms).

    `adapt`: each block's draft length from measured costs and acceptance (`DraftLength`), between 0 and
    k, as in `speculative_generate_batch`; once k = 0 wins the rest is decoded plainly (`_plain_one`: one
    forward per token, no drafter, no hidden states), so where drafting does not pay (speculative sampling
    with the block drafter on MLX on the CPU: a block costs more than the ~2.5 tokens it commits) the run
    costs little more than plain decoding. Greedy tokens stay those of `generate`; sampled tokens keep
    plain sampling's distribution (a plain step draws from the verifier's own probabilities). A
    `DraftLength` carried over calls (`adapt=length`) that says plain before the prompt is fed leaves the
    drafter out altogether (not begun, no hidden states): the call is plain decoding."""
    if k < 1:
        raise ValueError(f"k must be >= 1 (got {k})")
    if not prompt:
        raise ValueError("the prompt is empty")
    if verifier.max_block < k + 1:
        raise ValueError(
            f"the verifier's sequence needs max_block >= k + 1 = {k + 1} (has {verifier.max_block})"
        )
    if sampling is not None and sampling.greedy:
        sampling = None
    rng = sampling.rng() if sampling else None
    length = draft_length(adapt, k)
    chosen = length.choose() if length else None  # the first block's k (a carried length may say plain)
    plain = length is not None and length.plain  # then no drafter at all: plain decoding from the prompt
    layers = () if plain else tuple(getattr(drafter, "layers", ()))
    t0 = time.perf_counter()
    if not plain:
        drafter.begin(prompt)
    out = _first(_prefill(verifier, drafter, list(prompt), layers, sampling is not None), sampling, rng)
    t1 = time.perf_counter()
    gen = Generation(out, "max_new_tokens", len(prompt), t1 - t0, 0.0)
    reason = stop.check(out)
    clock = time.process_time if getattr(verifier, "on_cpu", False) else time.perf_counter
    while reason is None:
        block_k = chosen if chosen is not None else length.choose() if length else k
        chosen = None
        if length is not None and length.plain:
            reason = _plain_one(verifier, out, gen, stop, sampling, rng, length, clock)
            break
        started = clock()
        last = out[-1]
        budget = min(block_k, stop.max_new_tokens - len(out) - 1)
        if sampling is None or rng is None:
            drafts, q = drafter.propose(last, budget), None
        else:
            drafts, q = proposal(drafter, last, budget, sampling, rng)
        drafting = clock() - started
        step = verifier.forward([last, *drafts], hidden=layers, logits=sampling is not None)
        n, token = accepted_prefix(drafts, step.tokens, step.logits, q, sampling, rng)
        new = [*drafts[:n], token]
        gen.forwards += 1
        gen.drafted += len(drafts)
        gen.accepted += n
        gen.count_positions(len(drafts), n)
        done, reason = commit(out, new, stop)
        # Keep [last, d1..d(done-1)] fed: the newest committed token is fed by the next block.
        verifier.trim(len(drafts) + 1 - done)
        if reason is None:
            upkeep = clock()
            if layers:
                drafter.observe(step.hidden, done)  # type: ignore[attr-defined]
            drafter.accept(n, new)
            drafting += clock() - upkeep
        if length is not None:
            accepted = [1] * n + [0] * (len(drafts) - n)
            length.record(block_k, clock() - started, 1, [1] * len(drafts), accepted, drafting)
    gen.stop_reason = reason
    gen.decode_s = time.perf_counter() - t1
    return gen


class RowsDrafter(Protocol):
    """Drafts for every row of a batched verifier at once (the model drafter's `BatchedModelDrafter`, the
    block drafter's `BatchedBlockDrafter`); any other drafter runs one instance per row (`PerRow`). A
    drafter that reads the verifier's hidden states has a non-empty `layers` and `observe_rows`."""

    rows: int

    def begin_rows(self, prompts: Sequence[Sequence[int]]) -> None: ...

    def propose_rows(self, lasts: Sequence[int], ks: Sequence[int | None]) -> list[list[int]]:
        """Up to ks[r] drafts after row r's committed token lasts[r] (ks[r] None: the row has stopped)."""
        ...

    def accept_rows(self, ns: Sequence[int], committed: Sequence[Sequence[int] | None]) -> None:
        """Row r accepted ns[r] drafts and committed `committed[r]` (None: it stopped, or had stopped)."""
        ...

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Only these rows go on (renumbered 0.. in this order): the verifier dropped the others."""
        ...


@runtime_checkable
class SamplingRows(RowsDrafter, Protocol):
    """A `RowsDrafter` that, under sampling, draws each row's drafts from its own distribution and returns
    it, as a `SamplingDrafter` does at batch 1 (the block drafter's `BatchedBlockDrafter`, `PerRow`)."""

    def propose_rows_sampled(
        self,
        lasts: Sequence[int],
        ks: Sequence[int | None],
        samplings: Sequence[Sampling | None],
        rngs: Sequence[np.random.Generator | None],
    ) -> tuple[list[list[int]], list[np.ndarray | None]]:
        """Row r's drafts drawn with rngs[r] under samplings[r] and q_r they were drawn from (None: the
        row drafts deterministically, one-hot)."""
        ...


class FeatureRows(RowsDrafter, Protocol):
    """A `RowsDrafter` conditioned on the verifier's hidden states (a batch of `FeatureDrafter`s)."""

    layers: tuple[int, ...]

    def observe_rows(
        self, hidden: dict[int, Any], counts: Sequence[int], which: Sequence[int] | None = None
    ) -> None:
        """The features of the next counts[i] fed positions of row which[i] (None: row i): the first
        counts[i] of hidden[layer][i] ([rows, m, hidden size] each)."""
        ...


class PerRow:
    """One `Drafter` per row, as a `RowsDrafter` (a `FeatureRows` when they read hidden states)."""

    def __init__(self, drafters: Sequence[Drafter]) -> None:
        self.drafters = list(drafters)
        self.rows = len(self.drafters)
        self.layers: tuple[int, ...] = tuple(getattr(self.drafters[0], "layers", ())) if drafters else ()

    def begin_rows(self, prompts: Sequence[Sequence[int]]) -> None:
        for d, p in zip(self.drafters, prompts, strict=True):
            d.begin(p)

    def propose_rows(self, lasts: Sequence[int], ks: Sequence[int | None]) -> list[list[int]]:
        return [
            [] if k is None else d.propose(last, k)
            for d, last, k in zip(self.drafters, lasts, ks, strict=True)
        ]

    def propose_rows_sampled(
        self,
        lasts: Sequence[int],
        ks: Sequence[int | None],
        samplings: Sequence[Sampling | None],
        rngs: Sequence[np.random.Generator | None],
    ) -> tuple[list[list[int]], list[np.ndarray | None]]:
        drafts: list[list[int]] = []
        qs: list[np.ndarray | None] = []
        for d, last, k, s, rng in zip(self.drafters, lasts, ks, samplings, rngs, strict=True):
            block, q = (
                ([], None)
                if k is None
                else proposal(d, last, k, s, rng)
                if s and rng
                else (d.propose(last, k), None)
            )
            drafts.append(block)
            qs.append(q)
        return drafts, qs

    def accept_rows(self, ns: Sequence[int], committed: Sequence[Sequence[int] | None]) -> None:
        for d, n, new in zip(self.drafters, ns, committed, strict=True):
            if new is not None:
                d.accept(n, new)

    def keep_rows(self, rows: Sequence[int]) -> None:
        self.drafters = [self.drafters[r] for r in rows]
        self.rows = len(self.drafters)

    def observe_rows(
        self, hidden: dict[int, Any], counts: Sequence[int], which: Sequence[int] | None = None
    ) -> None:
        for i, n in enumerate(counts):
            if n:
                drafter: Any = self.drafters[i if which is None else which[i]]
                drafter.observe({layer: h[i] for layer, h in hidden.items()}, n)


def _block(
    verifier: Session, drafter: Any, live: list[int], block_k: int, k: int, layers: tuple[int, ...], stop: Stop,
    state: tuple[list[list[int]], list[StopReason | None], list[Generation]],
    samplings: Sequence[Sampling | None], rngs: Sequence[Any], clock: Any,
) -> tuple[list[int], list[int], list[int], float]:  # fmt: skip
    """One block of `speculative_generate_batch`: every live row drafts up to `block_k` tokens, one batched
    verify forward, each row accepts its own prefix, commits, rolls back and feeds the drafter. The indices
    (into `live`) of the rows still going, the block's drafted and accepted counts per draft position, and
    the seconds (`clock`) its drafter calls took."""
    outs, reasons, gens = state
    started = clock()
    lasts = [outs[r][-1] for r in live]
    ks = [min(block_k, stop.max_new_tokens - len(outs[r]) - 1) for r in live]
    sampled = any(samplings[r] for r in live)
    qs: list[np.ndarray | None] = [None] * len(live)
    if sampled and isinstance(drafter, SamplingRows):
        row_rngs = [rngs[r] for r in live]
        drafts, qs = drafter.propose_rows_sampled(lasts, ks, [samplings[r] for r in live], row_rngs)
    else:
        drafts = drafter.propose_rows(lasts, ks)
    drafting = clock() - started
    m = 1 + max(len(d) for d in drafts)
    fed = [[outs[r][-1], *d] for r, d in zip(live, drafts, strict=True)]
    step = verifier.forward_rows([f + [f[-1]] * (m - len(f)) for f in fed], hidden=layers, logits=sampled)
    logits = host(step.logits) if sampled else None
    ns = [0] * len(live)  # what each row accepted and committed (None: it stopped)
    committed: list[list[int] | None] = [None] * len(live)
    kept = [0] * len(live)  # positions each row keeps fed: [last, d1..d(done-1)]
    block_drafted, block_accepted = [0] * k, [0] * k
    for i, (r, d) in enumerate(zip(live, drafts, strict=True)):
        gen, row_logits = gens[r], None if logits is None else logits[i]
        n, token = accepted_prefix(d, step.tokens[i], row_logits, qs[i], samplings[r], rngs[r])
        new = [*d[:n], token]
        gen.forwards += 1
        gen.drafted += len(d)
        gen.accepted += n
        gen.count_positions(len(d), n)
        for j in range(len(d)):
            block_drafted[j] += 1
            block_accepted[j] += j < n
        kept[i], reasons[r] = commit(outs[r], new, stop)
        if reasons[r] is None:
            ns[i], committed[i] = n, new
    verifier.trim([m - done for done in kept])
    going = [i for i, r in enumerate(live) if reasons[r] is None]
    upkeep = clock()
    if layers:
        drafter.observe_rows(step.hidden, [kept[i] if reasons[r] is None else 0 for i, r in enumerate(live)])
    drafter.accept_rows(ns, committed)
    return going, block_drafted, block_accepted, drafting + clock() - upkeep


def speculative_generate_batch(
    verifier: Session,
    drafters: Sequence[Drafter] | RowsDrafter,
    prompts: Sequence[Sequence[int]],
    k: int,
    stop: Stop,
    adapt: bool | DraftLength = False,
    sampling: Sampling | Sequence[Sampling] | None = None,
) -> list[Generation]:
    """Speculative decoding of `verifier.rows` prompts at once, one drafter per row (or one
    `RowsDrafter` drafting for all rows in batched forwards): each block every live row drafts up to k
    tokens, all live rows are verified in one batched forward (a row with fewer drafts is padded), each
    row accepts its own prefix and rolls back on its own (`trim` per row). A row that stops leaves the
    batch: the verifier (`Session.keep_rows`) and the drafter drop it, so later blocks compute nothing for
    it (the session ends holding the rows that stopped last). Each row's tokens equal `generate` on its
    prompt alone under the same policy (tests/engine/test_speculative_batch.py).

    A drafter that reads the verifier's hidden states (`layers`: the block drafter) gets each row's
    prompt features from that row's chunked prefill and, after each block, the features of each row's
    committed positions from the very verify forward that fed them (`observe_rows`), as in
    `speculative_generate`.

    `adapt`: each block's draft length from measured costs and acceptance (`DraftLength`), between 0 and
    k; the tokens stay exact whatever k a block takes. Once k = 0 wins on the measured costs the rest of
    the batch is decoded plainly (`_plain`: no drafter, no hidden states), so an adaptive batch costs
    little more than plain batched decoding where drafting does not pay. `adapt=length`: a `DraftLength`
    carried over calls (engine/draft_length.py); where it says plain before the prompts are fed, the
    drafter is left out altogether (not begun, no hidden states): the call is plain batched decoding.

    `sampling` (temperature > 0): lossless speculative sampling per row, each row deciding its prefix by the
    rejection rule on its own (`accepted_prefix`) with its own random stream: row r draws with
    `sampling[r]` (one `Sampling` for all: seed + r), so its tokens are those of `speculative_generate` of
    its prompt alone with that seed, whatever the other rows do. A drafter that samples its drafts
    (`SamplingRows`: the block drafter's rows, or `PerRow` over `SamplingDrafter`s) draws row r's drafts
    from its own q_r with the row's stream, and q_r reaches the rule as at batch 1; any other proposes as
    under greedy decoding and counts as one-hot."""
    rows = verifier.rows
    drafter: Any = drafters if hasattr(drafters, "propose_rows") else PerRow(drafters)  # type: ignore[arg-type]
    if len(prompts) != rows or drafter.rows != rows or not all(prompts):
        raise ValueError(f"speculative_generate_batch takes {rows} non-empty prompts and {rows} drafters")
    if k < 1:
        raise ValueError(f"k must be >= 1 (got {k})")
    if verifier.max_block < k + 1:
        raise ValueError(
            f"the verifier's sequence needs max_block >= k + 1 = {k + 1} (has {verifier.max_block})"
        )
    samplings = row_samplings(sampling, rows)
    rngs = [s.rng() if s else None for s in samplings]
    length = draft_length(adapt, k)
    chosen = length.choose(rows) if length else None  # the first block's k (a carried length may say plain)
    plain = length is not None and length.plain  # then no drafter at all: plain decoding from the prompts
    layers = () if plain else tuple(getattr(drafter, "layers", ()))
    t0 = time.perf_counter()
    if not plain:
        drafter.begin_rows(prompts)
    outs = [
        _first(
            _prefill(verifier, drafter, list(p), layers, samplings[r] is not None, r), samplings[r], rngs[r]
        )
        for r, p in enumerate(prompts)
    ]
    t1 = time.perf_counter()
    gens = [Generation(o, "max_new_tokens", len(p), t1 - t0, 0.0) for o, p in zip(outs, prompts, strict=True)]
    reasons: list[StopReason | None] = [stop.check(o) for o in outs]
    live = [r for r in range(rows) if reasons[r] is None]  # the prompt row of each verifier row
    _leave(verifier, None if plain else drafter, live)
    clock = time.process_time if getattr(verifier, "on_cpu", False) else time.perf_counter
    while live:
        block_k = chosen if chosen is not None else length.choose(len(live)) if length else k
        chosen = None
        if length is not None and length.plain:
            _plain(verifier, live, outs, reasons, gens, stop, samplings, rngs, (length, clock))
            break
        started = clock()
        going, block_drafted, block_accepted, drafting = _block(
            verifier, drafter, live, block_k, k, layers, stop, (outs, reasons, gens), samplings, rngs, clock
        )
        if length:
            length.record(block_k, clock() - started, len(live), block_drafted, block_accepted, drafting)
        _leave(verifier, drafter, going)
        live = [live[i] for i in going]
    decode_s = time.perf_counter() - t1
    for gen, reason in zip(gens, reasons, strict=True):
        assert reason is not None
        gen.stop_reason, gen.decode_s = reason, decode_s
    return gens


def draft_length(adapt: bool | DraftLength, k: int) -> DraftLength | None:
    """The loops' `adapt`: False (k every block), True (a `DraftLength` of this call alone), or a
    `DraftLength` whose measured costs carry over between calls (its k_max must be k)."""
    if isinstance(adapt, DraftLength):
        if adapt.k_max != k:
            raise ValueError(f"the DraftLength's k_max is {adapt.k_max}, the loop's k is {k}")
        adapt.start()
        return adapt
    return DraftLength.for_loops(k) if adapt else None


def _plain_one(
    verifier: Session,
    out: list[int],
    gen: Generation,
    stop: Stop,
    sampling: Sampling | None,
    rng: np.random.Generator | None,
    length: DraftLength,
    clock: Any,
) -> StopReason:
    """The rest of a batch-1 speculative run decoded plainly (`DraftLength.plain`): one forward per token,
    no drafter and no hidden states, the verifier's greedy token or drawn from its probabilities; each
    step recorded as what not drafting costs (k = 0)."""
    while True:
        started = clock()
        step = verifier.forward(out[-1:], logits=sampling is not None)
        token = (
            step.tokens[-1]
            if sampling is None or rng is None
            else int(draw(sampling.probs(step.logits[-1:]), rng)[0])
        )
        gen.forwards += 1
        length.record(0, clock() - started)
        if (reason := commit(out, [token], stop)[1]) is not None:
            return reason


def _plain(
    verifier: Session,
    live: list[int],
    outs: list[list[int]],
    reasons: list[StopReason | None],
    gens: list[Generation],
    stop: Stop,
    samplings: Sequence[Sampling | None],
    rngs: Sequence[np.random.Generator | None],
    timing: tuple[DraftLength, Any],
) -> None:
    """The rest of a batch decoded plainly (`DraftLength.plain`): one token per live row per forward, no
    drafter and no hidden states, greedy or drawn from each row's own stream; stopped rows leave. Each step
    is recorded as what not drafting costs (k = 0) with the `timing` (length, clock)."""
    length, clock = timing
    while live:
        started = clock()
        sampled = any(samplings[r] for r in live)
        step = verifier.forward_rows([[outs[r][-1]] for r in live], logits=sampled)
        logits = host(step.logits) if sampled else None
        for i, r in enumerate(live):
            s, rng = samplings[r], rngs[r]
            token = (
                step.tokens[i][0]
                if s is None or rng is None or logits is None
                else int(draw(s.probs(logits[i]), rng)[0])
            )
            gens[r].forwards += 1
            reasons[r] = commit(outs[r], [token], stop)[1]
        length.record(0, clock() - started, len(live))
        going = [i for i, r in enumerate(live) if reasons[r] is None]
        if going and len(going) < verifier.rows:
            verifier.keep_rows(going)
        live[:] = [live[i] for i in going]


def _leave(verifier: Session, drafter: RowsDrafter | None, going: list[int]) -> None:
    """Rows not in `going` have stopped: the verifier and the drafter (None: unused) drop them (unless
    none goes on)."""
    if going and len(going) < verifier.rows:
        verifier.keep_rows(going)
        if drafter is not None:
            drafter.keep_rows(going)
