"""Speculative decoding over any backend (no torch or mlx here).

Each block: the drafter proposes up to k tokens after the last committed token t; the verifier feeds
[t, d1..dk] in one forward and answers a0..ak (its greedy token after each); the longest prefix with
d(i+1) == a(i) is accepted, plus the verifier's own next token a(n); the k - n rejected positions are
trimmed from the verifier (and the drafter). Every committed token is the verifier's greedy choice
given exactly the context step-by-step decoding would have had (the cache masks each query to its own
sink + window), so the output equals `engine.decode.generate` under the same policy token for token.

The verifier's Sequence needs max_block >= k + 1; a model drafter's needs max_block >= k - 1 (it rolls
back at most k - 1 fed drafts), k + 1 is simplest.
"""

from __future__ import annotations

import time
from collections.abc import Sequence as Seq
from typing import Protocol

from engine.decode import Generation, Sequence, Stop, commit


class Drafter(Protocol):
    def begin(self, prompt: Seq[int]) -> None:
        """Start a new generation after `prompt` (the verifier has prefilled it)."""
        ...

    def propose(self, last: int, k: int) -> list[int]:
        """Up to k tokens expected after the committed token `last`."""
        ...

    def accept(self, n: int, committed: Seq[int]) -> None:
        """n of the proposed tokens were accepted; `committed` are all the tokens committed this block."""
        ...


class ModelDrafter:
    """Greedy drafting with a (small) model sharing the verifier's tokenizer; its own bounded cache."""

    def __init__(self, seq: Sequence) -> None:
        self.seq = seq
        self.pending: list[int] = []  # committed tokens not fed to the drafter yet
        self.fed_draft = 0  # proposed tokens fed to the drafter in the current block

    def begin(self, prompt: Seq[int]) -> None:
        if self.seq.position:
            raise ValueError("the drafter's sequence must be fresh")
        self.seq.prefill(prompt)
        self.pending = []

    def propose(self, last: int, k: int) -> list[int]:
        self.pending.append(last)
        self.fed_draft = 0
        if k == 0:
            return []
        drafts = [self.seq.forward(self.pending)[-1]]
        self.pending = []
        while len(drafts) < k:
            drafts.append(self.seq.forward(drafts[-1:])[0])
        self.fed_draft = len(drafts) - 1  # the last draft is never fed
        return drafts

    def accept(self, n: int, committed: Seq[int]) -> None:
        if self.fed_draft > n:
            self.seq.trim(self.fed_draft - n)
        elif n > self.fed_draft:  # every draft accepted: the last one still has to be fed
            self.pending.append(committed[n - 1])
        # committed[-1] (the verifier's own token) comes back as `last` in the next propose.


class PromptLookupDrafter:
    """Zero-cost drafter: find the latest earlier occurrence of the context's last n-gram (longest
    first, max_ngram down to min_ngram) and propose the tokens that followed it."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram (got {min_ngram}, {max_ngram})")
        self.sizes = range(max_ngram, min_ngram - 1, -1)
        self.context: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> end of its latest followed occurrence

    def begin(self, prompt: Seq[int]) -> None:
        self.context, self.index = [], {}
        for t in prompt:
            self._push(t)

    def _push(self, t: int) -> None:
        ctx, end = self.context, len(self.context)
        for n in self.sizes:
            if end >= n:
                self.index[tuple(ctx[end - n : end])] = end
        ctx.append(t)

    def propose(self, last: int, k: int) -> list[int]:
        self._push(last)
        if k == 0:
            return []
        ctx = self.context
        for n in self.sizes:
            if len(ctx) >= n and (end := self.index.get(tuple(ctx[-n:]))) is not None:
                return ctx[end : end + k]
        return []

    def accept(self, n: int, committed: Seq[int]) -> None:
        for t in committed[:-1]:  # the last one comes back as `last`
            self._push(t)


def speculative_generate(
    verifier: Sequence, drafter: Drafter, prompt: Seq[int], k: int, stop: Stop
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
    t0 = time.perf_counter()
    out = [verifier.prefill(prompt)]
    drafter.begin(prompt)
    t1 = time.perf_counter()
    gen = Generation(out, "max_new_tokens", len(prompt), t1 - t0, 0.0)
    reason = stop.check(out)
    while reason is None:
        last = out[-1]
        drafts = drafter.propose(last, min(k, stop.max_new_tokens - len(out) - 1))
        preds = verifier.forward([last, *drafts])
        n = 0
        while n < len(drafts) and drafts[n] == preds[n]:
            n += 1
        new = [*drafts[:n], preds[n]]
        gen.forwards += 1
        gen.drafted += len(drafts)
        gen.accepted += n
        done, reason = commit(out, new, stop)
        # Keep [last, d1..d(done-1)] fed: the newest committed token is fed by the next block.
        verifier.trim(len(drafts) + 1 - done)
        if reason is None:
            drafter.accept(n, new)
    gen.stop_reason = reason
    gen.decode_s = time.perf_counter() - t1
    return gen
