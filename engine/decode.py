"""Greedy decoding and stop conditions over any backend (no torch or mlx here).

Owns the `Session` protocol (one model plus one bounded cache, fed token ids) and its `Step` result
(the greedy token after each fed position, and on request the logits and chosen hidden states), the
stop conditions and the greedy loop. The loops here, in engine/speculative.py and in engine/drafters/
only ever talk to `Session`, so PyTorch and MLX run the same algorithm.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from engine.policy import LayerSpec
from engine.sampling import Sampling, draw

StopReason = Literal["max_new_tokens", "eos", "stop_string"]


@dataclass(frozen=True)
class Step:
    """What one forward answers. `tokens`: the greedy token after each fed position (prefill: after the
    last) as a host list, the one host copy of a forward. Only when asked: `logits` [rows, vocab] and
    `hidden` {layer index: [rows, hidden size]} (0 = the embeddings, i = after layer i, the last after
    the final norm, as transformers' output_hidden_states), backend arrays on the model's device."""

    tokens: list[int]
    logits: Any = None
    hidden: dict[int, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class BatchStep:
    """What one batched forward (`Session.forward_rows`) answers: `tokens[r]` the greedy token after each
    position fed to row r (host lists); only when asked, `logits` [rows, m, vocab] and `hidden` {layer:
    [rows, m, hidden size]} (numbered as in `Step`), backend arrays on the model's device."""

    tokens: list[list[int]]
    logits: Any = None
    hidden: dict[int, Any] = field(default_factory=dict)


class Session(Protocol):
    """One model + one bounded cache. Positions are fed in order from 0; `position` = positions fed.
    `max_block` is the cache's slack: the largest block fed in ring layers at once and the largest
    rollback (a bigger block still works, attended as old buffer + block, but cannot be rolled back)."""

    max_block: int
    specs: list[LayerSpec]  # what each layer keeps under the session's policy
    rows: int  # batch rows decoded at once (1 unless made with rows=B)

    @property
    def position(self) -> int: ...

    @property
    def positions(self) -> list[int]:
        """Positions fed, per batch row."""
        ...

    def prefill(
        self, ids: Sequence[int], *, logits: bool = False, hidden: Iterable[int] = (), row: int | None = None
    ) -> Step:
        """Feed a prompt (chunked for long prompts); the step of its last position. A batched session
        prefills one `row` at a time."""
        ...

    def forward_rows(
        self, ids: Sequence[Sequence[int]], *, logits: bool = False, hidden: Iterable[int] = ()
    ) -> BatchStep:
        """Batched session: feed every row the same number (<= max_block) of tokens, each at its own next
        positions; per row the greedy token after each fed position (and the logits, hidden states)."""
        ...

    def forward(
        self, ids: Sequence[int], *, logits: bool = False, hidden: Iterable[int] = (), row: int | None = None
    ) -> Step:
        """Feed len(ids) <= max_block tokens in one forward; the step of each fed position. A batched
        session feeds one `row` alone this way (a prompt whose every position's features are wanted)."""
        ...

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Batched session: keep only these rows (renumbered 0.. in this order); the others' K/V and
        positions are dropped, so later forwards compute nothing for them."""
        ...

    def trim(self, n: int | Sequence[int]) -> None:
        """Forget the last n positions fed (n <= max_block; the cache keeps that much slack); a batched
        session takes one n per row (each row rolls back on its own)."""
        ...

    def kv_bytes(self) -> list[int]:
        """K/V bytes held now, per layer."""
        ...

    def kv_allocated_bytes(self) -> list[int]:
        """K/V bytes allocated now, per layer (>= kv_bytes: buffers grow in steps)."""
        ...

    def state_bytes(self) -> list[int]:
        """Linear-attention layers' constant-size state bytes held now, per layer (0 for attention)."""
        ...

    def kv_row_bytes(self) -> list[int]:
        """K/V bytes held now, per batch row (all layers)."""
        ...


@dataclass
class Stop:
    """Stop conditions, checked after every new token (the token that triggers one is kept)."""

    max_new_tokens: int
    eos_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    detokenize: Callable[[list[int]], str] | None = None

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1 (got {self.max_new_tokens})")
        if self.stop_strings and self.detokenize is None:
            raise ValueError("stop strings need a detokenize function")
        self.eos_ids = frozenset(self.eos_ids)
        self.stop_strings = tuple(s for s in self.stop_strings if s)
        # Tokens decoded to look for a stop string that the newest token may have completed.
        self._tail = max((len(s) for s in self.stop_strings), default=0) + 8

    def check(self, out: list[int]) -> StopReason | None:
        if out[-1] in self.eos_ids:
            return "eos"
        if self.stop_strings:
            # Checked after every token, so a stop string in the tail was completed by the newest one.
            assert self.detokenize is not None
            text = self.detokenize(out[-self._tail :])
            if any(s in text for s in self.stop_strings):
                return "stop_string"
        if len(out) >= self.max_new_tokens:
            return "max_new_tokens"
        return None


@dataclass
class Generation:
    tokens: list[int]
    stop_reason: StopReason
    prompt_tokens: int
    prefill_s: float  # prompt prefill (of the verifier and the drafter, for speculative decoding)
    decode_s: float  # wall time after the first new token (greedy) / after prefill (speculative)
    forwards: int = 0  # decode forwards of the model that decides the output (after prefill)
    drafted: int = 0  # tokens proposed by the drafter
    accepted: int = 0  # drafted tokens the verifier agreed with
    position_drafted: list[int] = field(default_factory=list)  # blocks with a draft at position i (0-based)
    position_accepted: list[int] = field(default_factory=list)  # ... whose draft at position i was accepted

    def count_positions(self, drafted: int, accepted: int) -> None:
        """Record one block: `drafted` proposals, the first `accepted` of them accepted."""
        grow = drafted - len(self.position_drafted)
        if grow > 0:
            self.position_drafted += [0] * grow
            self.position_accepted += [0] * grow
        for i in range(drafted):
            self.position_drafted[i] += 1
            self.position_accepted[i] += i < accepted

    @property
    def position_acceptance(self) -> list[float]:
        """Per draft position i: the fraction of blocks drafting position i whose draft i was accepted."""
        return [
            a / d if d else 0.0 for a, d in zip(self.position_accepted, self.position_drafted, strict=True)
        ]

    @property
    def acceptance_length(self) -> float:
        """Mean tokens committed per decode forward of the verifier (1.0 for greedy)."""
        return (len(self.tokens) - 1) / self.forwards if self.forwards else 1.0

    @property
    def decode_tok_s(self) -> float:
        """Tokens after the first per second of decoding (the first comes from prefill)."""
        return (len(self.tokens) - 1) / self.decode_s if self.decode_s > 0 else 0.0


def generate(
    session: Session, prompt: Sequence[int], stop: Stop, sampling: Sampling | None = None
) -> Generation:
    """Autoregressive decoding: prefill once, then one forward per new token. Greedy unless `sampling`
    has a temperature > 0 (engine.sampling: temperature, top-k, top-p; the same tokens for a seed)."""
    if not prompt:
        raise ValueError("the prompt is empty")
    if sampling is not None and sampling.greedy:
        sampling = None
    rng = sampling.rng() if sampling else None

    def pick(step: Step) -> list[int]:
        if sampling is None or rng is None:
            return step.tokens[-1:]
        return [int(draw(sampling.probs(step.logits[-1:]), rng)[0])]

    t0 = time.perf_counter()
    out = pick(session.prefill(prompt, logits=sampling is not None))
    t1 = time.perf_counter()
    forwards = 0
    while (reason := stop.check(out)) is None:
        out += pick(session.forward(out[-1:], logits=sampling is not None))
        forwards += 1
    return Generation(out, reason, len(prompt), t1 - t0, time.perf_counter() - t1, forwards)


def generate_batch(session: Session, prompts: Sequence[Sequence[int]], stop: Stop) -> list[Generation]:
    """Greedy decoding of `session.rows` prompts of any lengths at once: each row is prefilled on its
    own, then every step feeds each live row its last token at that row's own next position (one batched
    forward). Each row's tokens are exactly those of `generate` on that prompt alone. A row that stops
    leaves the batch (`Session.keep_rows`), as in `speculative_generate_batch`: later steps compute
    nothing for it, and the session ends holding the rows that stopped last. `forwards`: the steps each
    row was fed in."""
    if len(prompts) != session.rows or not all(prompts):
        raise ValueError(f"generate_batch takes {session.rows} non-empty prompts (the session's rows)")
    t0 = time.perf_counter()
    outs = [session.prefill(p, row=r).tokens for r, p in enumerate(prompts)]
    prefill_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    reasons: list[StopReason | None] = [stop.check(o) for o in outs]
    forwards = [0] * len(prompts)
    live = [r for r in range(len(prompts)) if reasons[r] is None]  # the prompt row of each session row
    if live and len(live) < session.rows:
        session.keep_rows(live)
    while live:
        step = session.forward_rows([outs[r][-1:] for r in live])
        for i, r in enumerate(live):
            outs[r] += step.tokens[i]
            forwards[r] += 1
            reasons[r] = stop.check(outs[r])
        going = [i for i, r in enumerate(live) if reasons[r] is None]
        if going and len(going) < len(live):
            session.keep_rows(going)
        live = [live[i] for i in going]
    decode_s = time.perf_counter() - t1
    return [
        Generation(o, reason, len(p), prefill_s, decode_s, n)
        for o, reason, p, n in zip(outs, reasons, prompts, forwards, strict=True)
        if reason is not None
    ]


def commit(out: list[int], new: Iterable[int], stop: Stop) -> tuple[int, StopReason | None]:
    """Append tokens one by one, stopping at the first stop condition; returns (appended, reason)."""
    done = 0
    for t in new:
        out.append(t)
        done += 1
        if (reason := stop.check(out)) is not None:
            return done, reason
    return done, None
