"""The prompt-lookup drafter: proposes the tokens that followed the latest earlier occurrence of the
context's last n-gram (no model, no cache)."""

from __future__ import annotations

from collections.abc import Sequence


class PromptLookupDrafter:
    """Zero-cost drafter: find the latest earlier occurrence of the context's last n-gram (longest
    first, max_ngram down to min_ngram) and propose the tokens that followed it."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram (got {min_ngram}, {max_ngram})")
        self.sizes = range(max_ngram, min_ngram - 1, -1)
        self.context: list[int] = []
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> end of its latest followed occurrence

    def begin(self, prompt: Sequence[int]) -> None:
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

    def accept(self, n: int, committed: Sequence[int]) -> None:
        for t in committed[:-1]:  # the last one comes back as `last`
            self._push(t)
