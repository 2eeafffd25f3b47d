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
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from engine.decode import Generation, Session, Stop, commit


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


def _prefill(
    verifier: Session, drafter: Drafter, prompt: Sequence[int], layers: tuple[int, ...]
) -> list[int]:
    if not layers:
        return verifier.prefill(prompt).tokens
    observe = drafter.observe  # type: ignore[attr-defined]
    chunk = getattr(verifier, "prefill_chunk", 512)
    for i in range(0, len(prompt), chunk):
        step = verifier.forward(prompt[i : i + chunk], hidden=layers)
        observe(step.hidden, len(step.tokens))
    return step.tokens[-1:]


def speculative_generate(
    verifier: Session, drafter: Drafter, prompt: Sequence[int], k: int, stop: Stop
) -> Generation:
    """Greedy speculative decoding; the tokens equal `generate(verifier, prompt, stop)`."""
    if k < 1:
        raise ValueError(f"k must be >= 1 (got {k})")
    if not prompt:
        raise ValueError("the prompt is empty")
    if verifier.max_block < k + 1:
        raise ValueError(
            f"the verifier's sequence needs max_block >= k + 1 = {k + 1} (has {verifier.max_block})"
        )
    layers = tuple(getattr(drafter, "layers", ()))
    t0 = time.perf_counter()
    drafter.begin(prompt)
    out = _prefill(verifier, drafter, list(prompt), layers)
    t1 = time.perf_counter()
    gen = Generation(out, "max_new_tokens", len(prompt), t1 - t0, 0.0)
    reason = stop.check(out)
    while reason is None:
        last = out[-1]
        drafts = drafter.propose(last, min(k, stop.max_new_tokens - len(out) - 1))
        step = verifier.forward([last, *drafts], hidden=layers)
        preds = step.tokens
        n = 0
        while n < len(drafts) and drafts[n] == preds[n]:
            n += 1
        new = [*drafts[:n], preds[n]]
        gen.forwards += 1
        gen.drafted += len(drafts)
        gen.accepted += n
        gen.count_positions(len(drafts), n)
        done, reason = commit(out, new, stop)
        # Keep [last, d1..d(done-1)] fed: the newest committed token is fed by the next block.
        verifier.trim(len(drafts) + 1 - done)
        if reason is None:
            if layers:
                drafter.observe(step.hidden, done)  # type: ignore[attr-defined]
            drafter.accept(n, new)
    gen.stop_reason = reason
    gen.decode_s = time.perf_counter() - t1
    return gen
