"""Continuous batching over bounded K/V: one scheduler thread steps every running request.

Requests wait in a bounded queue; one is admitted when the running rows' K/V reservations plus its own
fit the budget (`kv_budget` bytes) and a row is free (`max_batch`). A request's reservation is the most
K/V its sequence can ever hold under the policy (`Engine.reserve`): a sink_window sequence holds a fixed
number of bytes whatever its length, a `full` (or hybrid: its full-attention layers) one grows with
prompt + max_tokens. An admitted request is prefilled in a session of its own, at most `prefill_chunk`
prompt tokens per scheduler step over all joining requests (so one long prompt cannot stall every
stream), and then joins the running batch at a step boundary (`Session.join`, engine/serve/join.py). Each
step feeds every running row in one batched forward: a plain step (one token per row) or a speculative
block (the drafts of every row verified at once, each row accepting and rolling back on its own), the
draft length k of each step (0: plain) from measured costs at the running batch size
(engine/draft_length.py `DraftLength`); a row leaves the batch when it stops or its client went away
(`Session.keep_rows`).

Every row's greedy tokens equal `engine.decode.generate` of its prompt alone under the same policy
(tests/engine/test_serve_scheduler.py), speculative or not: rows are independent in a batched session.
A sampled row's tokens equal `generate` with its `Sampling` too: output position i is decided by the i-th
uniform of the request's generator (`Row.uniform`, `sampled_prefix`), whatever the draft lengths or the
other rows.
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine.decode import Session, Stop, StopReason, commit
from engine.draft_length import DraftLength
from engine.policy import Policy, layer_slot_bytes
from engine.sampling import Sampling, host
from engine.serve.backlog import Backlog
from engine.serve.join import join, join_drafter, joinable, rows_drafter
from engine.speculative import PerRow, accepted_prefix


class Refused(Exception):
    """A request the server turns away: `status` 400 (it can never run), 429 (queue full) or 503."""

    def __init__(self, status: int, message: str, param: str | None = None, retry_after: int = 0) -> None:
        super().__init__(message)
        self.status, self.param, self.retry_after = status, param, retry_after


@dataclass
class Params:
    max_tokens: int
    sampling: Sampling | None = None  # None: greedy
    stop: tuple[str, ...] = ()


Emit = Callable[[list[int] | None, StopReason | str | None], None]


@dataclass
class Request:
    """One request as the scheduler runs it. `emit(tokens, None)` for new tokens, `emit(None, reason)`
    once at the end (a StopReason, `cancelled`, or `error: ...`); called from the scheduler thread."""

    prompt: list[int]
    params: Params
    emit: Emit
    reserve: int = 0
    id: int = 0
    cancelled: bool = False  # set by the client side; the row leaves at the next step
    arrived: float = field(default_factory=time.perf_counter)
    first_at: float = 0.0
    last_at: float = 0.0


@dataclass
class Row:
    """A request being prefilled (its own session) or decoded (a row of a batch)."""

    req: Request
    stop: Stop
    rng: np.random.Generator | None
    session: Session | None = None  # while prefilling
    drafter: Any = None
    fed: int = 0  # prompt tokens fed
    out: list[int] = field(default_factory=list)
    uniforms: list[float] = field(default_factory=list)  # sampling: output position i's uniform (`uniform`)

    def uniform(self, i: int) -> float:
        """The uniform that decides output position i of a sampled request: the i-th of its generator's
        stream, whatever the batch and the draft lengths (`engine.decode.generate` spends them the same
        way: one per token, in order)."""
        assert self.rng is not None
        while len(self.uniforms) <= i:
            self.uniforms.append(float(self.rng.random()))
        return self.uniforms[i]


@dataclass
class Batch:
    session: Session
    rows: list[Row]
    drafter: Any = (
        None  # a RowsDrafter for every row: the batched block drafter, or `PerRow` (None: no drafter)
    )
    backlog: Backlog | None = (
        None  # a drafter reading hidden states: what plain steps fed it since it drafted
    )


class Engine:
    """A loaded model, its policy and drafter, and how sessions are made for the scheduler."""

    def __init__(
        self,
        model: Any,
        policy: Policy,
        drafter: Callable[[Session], Any] | None = None,
        k: int = 4,
        adapt: bool = True,
        prefill_chunk: int = 256,
        context: int | None = None,
    ) -> None:
        self.model, self.policy, self.drafter, self.k = model, policy, drafter, k
        self.adapt = adapt and drafter is not None
        self.max_block = k + 1 if drafter is not None else 1
        self.prefill_chunk = prefill_chunk
        self.context = context
        probe = model.session(policy, max_block=self.max_block, prefill_chunk=prefill_chunk)
        self.specs = probe.specs
        self.bounded = all(s.bounded for s, t in zip(self.specs, self.slot_bytes(), strict=True) if t)
        self.why_no_join = joinable(probe)
        # rows join the batch's drafter too (one drafter forward for every row) where both can join
        self.rows_drafter = (
            drafter is not None and self.why_no_join is None and rows_drafter(drafter(probe)) is not None
        )

    def slot_bytes(self) -> list[int]:
        return layer_slot_bytes(self.policy, self.model.geometry, self.model.dtype_name)

    def reserve(self, n_tokens: int) -> int:
        """The most K/V bytes a sequence of n_tokens (prompt + new) holds under the policy."""
        n = n_tokens + self.max_block
        return sum(
            s.held_slots(n, self.max_block) * b for s, b in zip(self.specs, self.slot_bytes(), strict=True)
        )

    def session(self) -> Session:
        return self.model.session(self.policy, max_block=self.max_block, prefill_chunk=self.prefill_chunk)


class Scheduler:
    """The scheduler thread and its queue (module docstring). `submit` is thread-safe."""

    def __init__(
        self,
        engine: Engine,
        kv_budget: int,
        max_batch: int = 64,
        max_queue: int = 256,
        metrics: Any = None,
    ) -> None:
        self.engine = engine
        # every batch's draft length (k = 0: a plain step), from costs per batch size (engine/draft_length.py)
        self.length = DraftLength(engine.k) if engine.adapt else None
        self.kv_budget = kv_budget
        self.max_batch = max_batch
        self.max_queue = max_queue
        self.metrics = metrics
        self.cond = threading.Condition()
        self.waiting: collections.deque[Request] = collections.deque()
        self.prefilling: list[Row] = []
        self.batches: list[Batch] = []
        self.reserved = 0  # K/V bytes reserved by admitted requests
        self.held = 0  # K/V bytes the sessions held after the last step (the scheduler thread measures it)
        self.ids = itertools.count(1)
        self.stopping = False
        self.failed: str | None = None
        self.thread = threading.Thread(target=self._loop, name="kakeya-scheduler", daemon=True)

    # ---- the client side (any thread) ----

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=10)

    def check(self, prompt: Sequence[int], params: Params) -> int:
        """The request's K/V reservation, or Refused(400) when it can never run."""
        if not prompt:
            raise Refused(400, "the prompt is empty", "prompt")
        n = len(prompt) + params.max_tokens
        if not self.engine.bounded and self.engine.context and n > self.engine.context:
            raise Refused(
                400,
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) exceeds the model's context "
                f"of {self.engine.context} tokens under policy {self.engine.policy}, whose K/V grows with the "
                "sequence; shorten it, or serve with a bounded policy (--policy sink_window:4:W)",
                "max_tokens",
            )
        reserve = self.engine.reserve(n)
        if reserve > self.kv_budget:
            raise Refused(
                400,
                f"this request can hold {reserve} bytes of K/V under policy {self.engine.policy}, more than the "
                f"server's whole budget ({self.kv_budget} bytes): lower max_tokens or shorten the prompt",
                "max_tokens",
            )
        return reserve

    def submit(self, prompt: Sequence[int], params: Params, emit: Emit) -> Request:
        reserve = self.check(prompt, params)
        with self.cond:
            if self.stopping or self.failed:
                raise Refused(
                    503,
                    f"the server is {'stopping' if self.stopping else 'down: ' + str(self.failed)}",
                    retry_after=5,
                )
            if len(self.waiting) >= self.max_queue:
                raise Refused(429, f"the queue is full ({self.max_queue} requests waiting)", retry_after=1)
            req = Request(list(prompt), params, emit, reserve, next(self.ids))
            self.waiting.append(req)
            self._gauges()
            self.cond.notify_all()
        return req

    def cancel(self, req: Request) -> None:
        with self.cond:
            req.cancelled = True
            self.cond.notify_all()

    @property
    def running(self) -> int:
        return sum(len(b.rows) for b in self.batches) + len(self.prefilling)

    def _kv_held(self) -> int:
        """K/V bytes the sessions hold now (running batches and joining requests; scheduler thread)."""
        sessions = [b.session for b in self.batches] + [r.session for r in self.prefilling if r.session]
        return sum(sum(s.kv_bytes()) for s in sessions)

    # ---- the scheduler thread ----

    def _loop(self) -> None:
        try:
            while True:
                with self.cond:
                    while not self.stopping and not (self.waiting or self.prefilling or self.batches):
                        self.cond.wait()
                    if self.stopping:
                        break
                    self._admit()
                self._step()
        except Exception as exc:  # a bug or a device fault: every request gets its end, nothing hangs
            self.failed = f"{type(exc).__name__}: {exc}"
            for row in self.prefilling + [r for b in self.batches for r in b.rows]:
                row.req.emit(None, f"error: {self.failed}")
            with self.cond:
                for req in self.waiting:
                    req.emit(None, f"error: {self.failed}")
                self.waiting.clear()
            raise
        finally:
            with self.cond:
                for req in self.waiting:
                    req.emit(None, "error: the server stopped")
                self.waiting.clear()

    def _admit(self) -> None:
        """Admit waiting requests in order while the K/V budget and a row allow (under self.cond)."""
        while self.waiting:
            req = self.waiting[0]
            if req.cancelled:
                self.waiting.popleft()
                req.emit(None, "cancelled")
                continue
            if self.running >= self.max_batch or self.reserved + req.reserve > self.kv_budget:
                break
            self.waiting.popleft()
            self.reserved += req.reserve
            s = req.params.sampling
            row = Row(req, self._stop(req), s.rng() if s else None, self.engine.session())
            if self.engine.drafter is not None:
                row.drafter = self.engine.drafter(row.session)  # type: ignore[arg-type]
                if self.engine.rows_drafter:
                    row.drafter = rows_drafter(row.drafter)
                    row.drafter.begin_rows([req.prompt])
                else:
                    row.drafter.begin(req.prompt)
            self.prefilling.append(row)
        self._gauges()

    def _stop(self, req: Request) -> Stop:
        model = self.engine.model
        return Stop(
            req.params.max_tokens, model.eos_ids, req.params.stop, model.decode if req.params.stop else None
        )

    def _finish(self, row: Row, reason: StopReason | str) -> None:
        with self.cond:
            self.reserved -= row.req.reserve
            self._gauges()
        if self.metrics:
            self.metrics.finished(reason, len(row.req.prompt), len(row.out))
        row.req.emit(None, reason)

    def _emit(self, row: Row, tokens: list[int]) -> None:
        now = time.perf_counter()
        req = row.req
        if not req.first_at:
            req.first_at = now
            if self.metrics:
                self.metrics.ttft.observe(now - req.arrived)
        elif self.metrics:
            self.metrics.itl.observe(now - req.last_at)
        req.last_at = now
        if self.metrics:
            self.metrics.tokens(len(tokens))
        req.emit(tokens, None)

    def _step(self) -> None:
        self._drop_cancelled()
        self._prefill()
        for batch in list(self.batches):
            self._decode(batch)
        self.held = self._kv_held()
        if self.metrics:
            self.metrics.observe_held(self.held)
        self._gauges()

    def _drop_cancelled(self) -> None:
        for row in [r for r in self.prefilling if r.req.cancelled]:
            self.prefilling.remove(row)
            self._finish(row, "cancelled")
        for batch in self.batches:
            gone = [r for r in batch.rows if r.req.cancelled]
            for row in gone:
                self._finish(row, "cancelled")
            if gone:
                self._keep(batch, [i for i, r in enumerate(batch.rows) if not r.req.cancelled])

    def _keep(self, batch: Batch, going: list[int]) -> None:
        """Only these rows of the batch go on (an empty list: the batch ends)."""
        if not going:
            self.batches.remove(batch)
            return
        if len(going) < len(batch.rows):
            batch.session.keep_rows(going)
            if batch.drafter is not None:
                batch.drafter.keep_rows(going)
            if batch.backlog is not None:
                batch.backlog.keep_rows(going)
            batch.rows = [batch.rows[i] for i in going]

    def _prefill(self) -> None:
        """Feed joining requests up to prefill_chunk prompt tokens in all; a request fully fed takes its
        first token and joins a batch."""
        budget = self.engine.prefill_chunk
        for row in list(self.prefilling):
            if budget <= 0:
                break
            layers = tuple(getattr(row.drafter, "layers", ()))
            session = row.session
            assert session is not None
            chunk = row.req.prompt[row.fed : row.fed + budget]
            budget -= len(chunk)
            row.fed += len(chunk)
            last = row.fed == len(row.req.prompt)
            logits = last and row.rng is not None
            if layers:
                step = session.forward(chunk, hidden=layers, logits=logits)
                if self.engine.rows_drafter:
                    row.drafter.observe_rows(
                        {j: h[None] for j, h in step.hidden.items()}, [len(step.tokens)], [0]
                    )
                else:
                    row.drafter.observe(step.hidden, len(step.tokens))
            else:
                step = session.prefill(chunk, logits=logits)
            if not last:
                continue
            self.prefilling.remove(row)
            sampling = row.req.params.sampling
            if sampling is None or row.rng is None:
                first = step.tokens[-1]
            else:
                first = inverse_cdf(sampling.probs(host(step.logits[-1:]))[0], row.uniform(0))
            row.out = [first]
            self._emit(row, [first])
            if (reason := row.stop.check(row.out)) is not None:
                self._finish(row, reason)
                continue
            row.session = None
            self._join(row, session)

    def _join(self, row: Row, session: Session) -> None:
        if self.engine.why_no_join is None and self.batches:
            batch = self.batches[0]
            join(batch.session, session)
            if self.engine.rows_drafter:
                join_drafter(batch.drafter, row.drafter)
            elif batch.drafter is not None:
                batch.drafter.drafters.append(row.drafter)
                batch.drafter.rows += 1
            if batch.backlog is not None:
                batch.backlog.add_rows(1)
            batch.rows.append(row)
            return
        drafter = None
        if self.engine.drafter is not None:
            drafter = row.drafter if self.engine.rows_drafter else PerRow([row.drafter])
        backlog = Backlog(drafter) if getattr(drafter, "layers", ()) else None
        self.batches.append(Batch(session, [row], drafter, backlog))

    def _decode(self, batch: Batch) -> None:
        """One step of every row of the batch: a plain batched forward (k = 0: no drafting; a drafter
        reading hidden states gets this step's later, `Backlog`), or a speculative block."""
        rows, session, drafter = batch.rows, batch.session, batch.drafter
        k = 0
        if drafter is not None:
            k = self.length.choose(len(rows)) if self.length else self.engine.k
        clock = time.thread_time if getattr(session, "on_cpu", False) else time.perf_counter
        started = clock()
        layers = tuple(getattr(drafter, "layers", ()))
        lasts = [r.out[-1] for r in rows]
        drafts: list[list[int]] = [[] for _ in rows]
        drafting = 0.0  # seconds in the drafter's calls
        if drafter is not None and (k or not layers):  # a drafter keeping its own context hears plain steps
            if (
                batch.backlog is not None
            ):  # the plain steps' deferred observation: their cost, not this block's
                batch.backlog.flush(clock)
                started = clock()
            drafts = drafter.propose_rows(
                lasts, [min(k, r.stop.max_new_tokens - len(r.out) - 1) for r in rows]
            )
            drafting = clock() - started
        m = 1 + max(len(d) for d in drafts)
        fed = [[last, *d] for last, d in zip(lasts, drafts, strict=True)]
        sampled = any(r.rng is not None for r in rows)
        step = session.forward_rows([f + [f[-1]] * (m - len(f)) for f in fed], hidden=layers, logits=sampled)
        if self.metrics:  # the most K/V a step holds: before the rejected drafts are trimmed
            self.metrics.observe_held(self._kv_held())
        logits = host(step.logits) if sampled else None
        ns = [0] * len(rows)
        committed: list[list[int] | None] = [None] * len(rows)
        kept = [0] * len(rows)
        reasons: list[StopReason | None] = [None] * len(rows)
        block_drafted, block_accepted = [0] * k, [0] * k
        for i, (row, d) in enumerate(zip(rows, drafts, strict=True)):
            sampling = row.req.params.sampling
            if sampling is None or row.rng is None or logits is None:
                n, token = accepted_prefix(d, step.tokens[i], None, None, None, None)
            else:
                n, token = sampled_prefix(d, sampling.probs(logits[i][: len(d) + 1]), row, len(row.out))
            new = [*d[:n], token]
            for j in range(len(d)):
                block_drafted[j] += 1
                block_accepted[j] += j < n
            before = len(row.out)
            kept[i], reasons[i] = commit(row.out, new, row.stop)
            self._emit(row, row.out[before:])
            if reasons[i] is None:
                ns[i], committed[i] = n, new
        if m > 1:
            session.trim([m - done for done in kept])
        if drafter is not None:
            upkeep = clock()
            if layers:
                counts = [kept[i] if reasons[i] is None else 0 for i in range(len(rows))]
                if k == 0 and batch.backlog is not None:
                    batch.backlog.stash(step.hidden, counts)
                else:
                    drafter.observe_rows(step.hidden, counts)
            drafter.accept_rows(ns, committed)
            drafting += clock() - upkeep
        if self.metrics:
            self.metrics.steps.labels(str(k)).inc()
            self.metrics.row_steps.labels(str(k)).inc(len(rows))
        if self.length is not None and drafter is not None:
            seconds = clock() - started
            if k == 0 and batch.backlog is not None:  # its share of the catch-up observe that will follow
                seconds += batch.backlog.per_position * sum(r is None for r in reasons)
            # (a plain step's upkeep is its own cost here: the server drafts again later)
            self.length.record(k, seconds, len(rows), block_drafted, block_accepted, drafting if k else 0.0)
        for row, reason in zip(rows, reasons, strict=True):
            if reason is not None:
                self._finish(row, reason)
        self._keep(batch, [i for i, r in enumerate(reasons) if r is None])

    def _gauges(self) -> None:
        if self.metrics:
            self.metrics.gauges(len(self.waiting), self.running, self.held, self.reserved)


def inverse_cdf(p: np.ndarray, u: float) -> int:
    """The token of probabilities p [vocab] that uniform u picks (`engine.sampling.draw` with this u)."""
    cdf = np.cumsum(p)
    return int(min((cdf <= u * cdf[-1]).sum(), p.shape[-1] - 1))


def sampled_prefix(drafts: Sequence[int], p: np.ndarray, row: Row, at: int) -> tuple[int, int]:
    """A sampled row's verdict on its drafts: the verifier's own draw at each output position at + j from
    p[j] (the probabilities after [last, drafts[:j]]) with that position's uniform (`Row.uniform`); drafts
    are accepted while they equal those draws, then the first draw that differs (or the one after every
    draft) is committed. Each committed token is the draw plain sampling makes at that position with the
    same uniform, so the tokens equal `engine.decode.generate` with the request's `Sampling` whatever the
    draft lengths; a deterministic draft d is accepted with probability p(d), as the rejection rule
    accepts a one-hot proposal."""
    for j in range(len(drafts) + 1):
        token = inverse_cdf(p[j], row.uniform(at + j))
        if j == len(drafts) or drafts[j] != token:
            return j, token
    raise AssertionError("unreachable")
