"""The autoregressive model drafter: a small model sharing the verifier's tokenizer drafts greedily
through its own bounded cache, rolled back to the accepted prefix after each block."""

from __future__ import annotations

from collections.abc import Sequence

from engine.decode import Session


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

    def accept(self, n: int, committed: Sequence[int]) -> None:
        if self.fed_draft > n:
            self.session.trim(self.fed_draft - n)
        elif n > self.fed_draft:  # every draft accepted: the last one still has to be fed
            self.pending.append(committed[n - 1])
        # committed[-1] (the verifier's own token) comes back as `last` in the next propose.
