"""The autoregressive model drafter: a small model sharing the verifier's tokenizer drafts greedily
through its own bounded cache, rolled back to the accepted prefix after each block."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from engine.decode import Session
from engine.sampling import Sampling, draw


class ModelDrafter:
    """Greedy drafting with a (small) model sharing the verifier's tokenizer; its own bounded cache."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.pending: list[int] = []  # committed tokens not fed to the drafter yet
        self.fed_draft = 0  # proposed tokens fed to the drafter in the current block

    def begin(self, prompt: Sequence[int]) -> None:
        if self.session.position:
            raise ValueError("the drafter's session must be fresh")
        self.session.prefill(prompt)
        self.pending = []

    def propose(self, last: int, k: int) -> list[int]:
        self.pending.append(last)
        self.fed_draft = 0
        if k == 0:
            return []
        drafts = self.session.forward(self.pending).tokens[-1:]
        self.pending = []
        while len(drafts) < k:
            drafts += self.session.forward(drafts[-1:]).tokens
        self.fed_draft = len(drafts) - 1  # the last draft is never fed
        return drafts

    def propose_sampled(
        self, last: int, k: int, sampling: Sampling, rng: np.random.Generator
    ) -> tuple[list[int], np.ndarray]:
        """Speculative sampling: k drafts drawn from this model's own distribution under `sampling`, and
        that distribution q [k, vocab] at each draft (engine.sampling.verify)."""
        self.pending.append(last)
        self.fed_draft = 0
        if k == 0:
            return [], np.zeros((0, 0))
        qs = [sampling.probs(self.session.forward(self.pending, logits=True).logits[-1:])[0]]
        self.pending = []
        drafts = [int(draw(qs[-1], rng))]
        while len(drafts) < k:
            qs.append(sampling.probs(self.session.forward(drafts[-1:], logits=True).logits[-1:])[0])
            drafts.append(int(draw(qs[-1], rng)))
        self.fed_draft = len(drafts) - 1
        return drafts, np.stack(qs)

    def accept(self, n: int, committed: Sequence[int]) -> None:
        if self.fed_draft > n:
            self.session.trim(self.fed_draft - n)
        elif n > self.fed_draft:  # every draft accepted: the last one still has to be fed
            self.pending.append(committed[n - 1])
        # committed[-1] (the verifier's own token) comes back as `last` in the next propose.


class BatchedModelDrafter:
    """`ModelDrafter`'s algorithm for every row of a batched verifier at once (engine.speculative's
    `RowsDrafter`): one session of as many rows, every row drafting in the same batched forwards; a row
    fed less (padding), drafting fewer or stopped is rolled back on its own (per-row `trim`)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.rows = session.rows
        self.pending: list[list[int]] = [[] for _ in range(self.rows)]
        self.fed_draft = [0] * self.rows

    def begin_rows(self, prompts: Sequence[Sequence[int]]) -> None:
        if any(self.session.positions):
            raise ValueError("the drafter's session must be fresh")
        for r, prompt in enumerate(prompts):
            self.session.prefill(prompt, row=r)
        self.pending = [[] for _ in range(self.rows)]

    def propose_rows(self, lasts: Sequence[int], ks: Sequence[int | None]) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.rows)]
        drafting = [bool(k) for k in ks]
        for r, k in enumerate(ks):
            if k is not None:
                self.pending[r].append(lasts[r])
                self.fed_draft[r] = 0
        if not any(drafting):
            return out
        feeds = [self.pending[r] if drafting[r] else [lasts[r]] for r in range(self.rows)]
        m = max(len(f) for f in feeds)
        preds = self.session.forward_rows([f + [f[-1]] * (m - len(f)) for f in feeds]).tokens
        for r, f in enumerate(feeds):
            if drafting[r]:
                out[r].append(preds[r][len(f) - 1])
                self.pending[r] = []
        self.session.trim([m - len(f) if drafting[r] else m for r, f in enumerate(feeds)])
        extra = [0] * self.rows  # fed past a row's own drafts: rolled back at the end
        for j in range(1, max(k or 0 for k in ks)):
            preds = self.session.forward_rows(
                [[o[-1]] if o else [lasts[r]] for r, o in enumerate(out)]
            ).tokens
            for r, k in enumerate(ks):
                if drafting[r] and j < (k or 0):
                    out[r].append(preds[r][0])
                else:
                    extra[r] += 1
        self.session.trim(extra)
        for r, o in enumerate(out):
            if drafting[r]:
                self.fed_draft[r] = len(o) - 1  # the last draft is never fed
        return out

    def accept_rows(self, ns: Sequence[int], committed: Sequence[Sequence[int] | None]) -> None:
        trims = [0] * self.rows
        for r, (n, new) in enumerate(zip(ns, committed, strict=True)):
            if new is None:
                continue
            if self.fed_draft[r] > n:
                trims[r] = self.fed_draft[r] - n
            elif n > self.fed_draft[r]:  # every draft accepted: the last one still has to be fed
                self.pending[r].append(new[n - 1])
        if any(trims):
            self.session.trim(trims)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Only these rows go on: the drafter's session drops the others too."""
        self.session.keep_rows(rows)
        self.pending = [self.pending[r] for r in rows]
        self.fed_draft = [self.fed_draft[r] for r in rows]
        self.rows = len(rows)
