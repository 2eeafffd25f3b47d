"""The draft length of each speculative block from measured costs (`DraftLength`): one controller for the
speculative loops (engine/speculative.py, `adapt=`) and the server's scheduler (engine/serve/scheduler.py).

What pays depends on the machine and the batch size: on the project's 2-core CPU a block drafter's k = 4
block costs 1.9x a plain step at 1 row and 3.1x at 32 rows on torch, and on MLX's CPU backend a k = 1
block already costs 2.7x a plain step at 32 rows (python -m benchmarks.block_costs), so drafting pays at
1 row on torch and cannot pay at 32 rows on MLX. So:

- Costs are kept per batch-size bucket (`bucket`: 1, 2, 3-4, 5-8, ..., 17-32, ...: a batch that starts
  at a power of two stays in its bucket until half its rows have left) and per k, as seconds per row of a
  block (CPU time of the process or thread for a verifier on the CPU, so that other processes' load does
  not count; wall time on an accelerator), the least of the last `samples` (timing noise only ever adds);
  with `rows_fit` (the speculative loops, whose rows only leave) of those measured with about as many
  rows as now (3/4 to 4/3; `measured`: a block's fixed costs weigh more per row as rows leave).
  A k not measured in a bucket is interpolated between the nearest measured ones (0 and k_max are always
  measured before choosing). The first block in a bucket only warms up (its time is not a cost: the first
  decode forward carries one-off costs); then one at k_max and one at k = 0 are timed.
- Acceptance is kept per draft position over every bucket (it does not depend on the batch size): a block
  at k emits 1 + the sum of the first k acceptance fractions per row.
- Each block takes the k of the least cost per emitted token. k = 0 counts `margin` cheaper than measured:
  the speculative loops' k = 0 block still keeps the drafter's context (a feature drafter observes every
  committed position), while the plain decoding they switch to (`plain`) does not, so a draft length that
  only ties with a k = 0 block would make the run slower than plain decoding (`PLAIN_MARGIN`). The server
  runs k = 0 as a true plain step (no margin).
- `optimistic` (the speculative loops, whose switch to plain decoding is final within a call): k = 0 on
  acceptance only after `evidence` rows of drafting blocks (the first blocks' acceptance, sampled drafts
  above all, decides little): 3 times what drafting could gain at full acceptance, at most 16; at once
  where no draft length could pay even with every draft accepted. Where no draft length could pay even
  at full acceptance by the least a block can cost (`floor`, from the k = 1 block), k_max is not run.
- The end (0 or k_max) other than the best is measured again once the time spent in the bucket since its
  last probe pays for the probe's loss within `budget` (a probe loses its cost less what the best k takes
  for the tokens the probe emits; `plain_budget` while plain decoding wins), so a cost measured at another
  moment (load, a batch that grew, a noisy sample) is corrected. The k that runs is measured as it runs,
  so a cost misjudged low corrects itself.

One `DraftLength` may serve many calls (`speculative_generate_batch(adapt=length)`): what it measured
carries over, so only the first batch of a size pays the probes. A speculative loop that went plain records
its plain steps as k = 0 blocks (what it costs not to draft), which also count toward the next probe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# How much cheaper than a measured k = 0 block the plain decoding a speculative loop switches to counts
# (`DraftLength.margin`): drafting must beat it by this much (a k = 0 block pays the drafter's upkeep).
PLAIN_MARGIN = 0.05
# The share of their time the speculative loops may lose to probes while plain decoding wins (`plain_budget`;
# 2% while drafting wins, as the server): they are to be no slower than plain decoding where drafting does
# not pay.
LOOP_BUDGET = 0.002


# Blocks the geometric guess of a draft position's acceptance is worth (`DraftLength.tokens`).
PRIOR = 4


def bucket(rows: int) -> int:
    """1 -> 0, 2 -> 1, 3-4 -> 2, 5-8 -> 3, 9-16 -> 4, 17-32 -> 5, ... (rows of similar per-row cost)."""
    return (max(rows, 1) - 1).bit_length()


class DraftLength:
    """Draft length of each block (module docstring): `choose(rows)`, run the block, `record(...)`."""

    def __init__(
        self,
        k_max: int,
        samples: int = 4,
        budget: float = 0.02,
        margin: float = 0.0,
        optimistic: bool = False,
        plain_budget: float | None = None,
        rows_fit: bool = False,
    ) -> None:
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1 (got {k_max})")
        self.k_max = k_max
        self.samples = samples
        self.budget = budget
        self.plain_budget = budget if plain_budget is None else plain_budget  # while plain decoding wins
        self.margin = margin
        self.optimistic = optimistic
        self.drafting = 0  # rows of drafting blocks recorded (k > 0): how many samples the acceptance holds
        # (bucket, k) -> the last blocks' (seconds per row, rows); `bare`: the k = 1 blocks less their drafter
        # calls (the verify forward and bookkeeping)
        self.times: dict[tuple[int, int], list[tuple[float, int]]] = {}
        self.bare: dict[tuple[int, int], list[tuple[float, int]]] = {}
        # the rows of the block being chosen; `rows_fit`: only costs measured with about as many count (a
        # speculative loop's rows only leave; a server's come and go, and would be probed again and again)
        self.rows = 1
        self.rows_fit = rows_fit
        self.seen: set[int] = set()  # buckets whose first (warm-up) block has run
        self.spent: dict[int, float] = {}  # seconds per row spent in a bucket since its last probe
        self.drafted = [0] * k_max
        self.accepted = [0] * k_max
        self.steps = {k: 0 for k in range(k_max + 1)}  # blocks run at each k (reported, tested)
        # k = 0 won on measured costs: a speculative loop decodes the rest of its call plainly (`start`
        # clears it for the next call)
        self.plain = False

    @classmethod
    def for_loops(cls, k: int) -> DraftLength:
        """What the speculative loops use (`adapt=True` builds one per call; a caller decoding many batches
        builds one with this and passes it to every call, `adapt=length`)."""
        return cls(k, margin=PLAIN_MARGIN, optimistic=True, plain_budget=LOOP_BUDGET, rows_fit=True)

    def start(self) -> None:
        """A speculative loop's call begins: it drafts until measured costs say otherwise."""
        self.plain = False

    def tokens(self, k: int) -> float:
        """Tokens a row emits in a block at k: 1 + the acceptance fraction of each of its k draft positions.
        A position drafted in few blocks leans on the geometric guess from the first position's fraction
        f (position i: f^(i+1)), worth `PRIOR` blocks: a deep position sampled once or twice (sampled
        drafts, a block probed after short ones) neither sinks nor lifts a draft length alone."""
        f = self.accepted[0] / self.drafted[0] if self.drafted[0] else 1.0
        return 1.0 + sum(
            (self.accepted[i] + PRIOR * f ** (i + 1)) / (self.drafted[i] + PRIOR) for i in range(k)
        )

    def measured(self, table: dict[tuple[int, int], list[tuple[float, int]]], b: int, k: int) -> list[float]:
        """The seconds per row of `table`'s blocks at k in bucket b (`rows_fit`: measured with about as many
        rows as now, 3/4 to 4/3)."""
        fit = (lambda r: 3 * r <= 4 * self.rows and 4 * r >= 3 * self.rows) if self.rows_fit else None
        return [t for t, r in table.get((b, k), []) if fit is None or fit(r)]

    def cost(self, b: int, k: int) -> float:
        """Seconds per row of a block at k in bucket b: measured, or linear between measured draft lengths."""
        if seen := self.measured(self.times, b, k):
            return min(seen)
        lo = max(j for j in range(k) if self.measured(self.times, b, j))
        hi = min(j for j in range(k + 1, self.k_max + 1) if self.measured(self.times, b, j))
        return self.cost(b, lo) + (self.cost(b, hi) - self.cost(b, lo)) * (k - lo) / (hi - lo)

    def per_token(self, b: int) -> list[float]:
        """Seconds per emitted token at each k in bucket b (0 and k_max measured; k = 0 less the margin)."""
        per = [self.cost(b, k) / self.tokens(k) for k in range(self.k_max + 1)]
        per[0] /= 1 + self.margin
        return per

    def floor(self, b: int, k: int) -> float:
        """The least a block at k >= 1 can cost per row in bucket b, from the measured k = 1 block: its
        drafter's share at least as at k = 1, its verify forward at least the k = 1 forward plus, per further
        draft, what the k = 1 forward cost over the plain step (a forward's cost is convex in its tokens:
        flat while memory-bound, then linear)."""
        extra = max(0.0, min(self.measured(self.bare, b, 1)) - self.cost(b, 0))
        return self.cost(b, 1) + (k - 1) * extra

    def hopeless(self, b: int) -> bool:
        """No draft length could pay in bucket b even with every draft accepted (`floor`)."""
        plain = self.cost(b, 0) / (1 + self.margin)
        return all(self.floor(b, k) / (k + 1) >= plain for k in range(1, self.k_max + 1))

    def evidence(self, b: int, plain: float) -> int:
        """Rows of drafting blocks before an `optimistic` switch to plain on acceptance: 3 times what
        drafting could gain at full acceptance (plain's seconds per token over the least a drafting block
        could take per token), at most 16; 0 where it could gain nothing. Exploring is cheap where blocks
        are cheap (and a wrong switch costs the most there), dear where they cost nearly what they save."""
        gain = plain / min(self.cost(b, k) / (k + 1) for k in range(1, self.k_max + 1))
        return 0 if gain <= 1 else min(16, math.ceil(3 * gain))

    def choose(self, rows: int = 1) -> int:
        b, self.rows = bucket(rows), rows
        if b not in self.seen:
            return 0
        if missing := [k for k in (0, 1) if not self.measured(self.times, b, k)]:
            self.spent[b] = 0.0
            return missing[-1]
        if self.hopeless(b):  # plain; the cheap k = 1 block is probed again within the budget
            loss = self.cost(b, 1) - self.tokens(1) * self.cost(b, 0) / (1 + self.margin)
            if self.spent.get(b, 0.0) * self.plain_budget >= loss:
                self.spent[b] = 0.0
                return 1
            self.plain = True
            return 0
        if not self.measured(self.times, b, self.k_max):
            self.spent[b] = 0.0
            return self.k_max
        per = self.per_token(b)
        best = min(range(self.k_max + 1), key=lambda k: (per[k], -k))
        drafts = range(1, self.k_max + 1)
        # the switch to plain is final: unless no draft length could pay even with every draft accepted,
        # a few blocks' acceptance decides nothing yet: draft on (the best measured k > 0, no probe)
        if best == 0 and self.optimistic and self.drafting < self.evidence(b, per[0]):
            return min(drafts, key=lambda k: (per[k], -k))
        loss = {k: self.cost(b, k) - self.tokens(k) * per[best] for k in (0, self.k_max) if k != best}
        probe = min(loss, key=loss.__getitem__)
        if self.spent.get(b, 0.0) * (self.plain_budget if best == 0 else self.budget) >= loss[probe]:
            self.spent[b] = 0.0
            return probe
        self.plain = self.plain or best == 0
        return best

    def record(
        self,
        k: int,
        seconds: float,
        rows: int = 1,
        drafted: Sequence[int] = (),
        accepted: Sequence[int] = (),
        drafter: float = 0.0,
    ) -> None:
        """A block of `rows` rows at k took `seconds`, `drafter` of them in the drafter's calls (proposing,
        observing, accepting); drafted/accepted per draft position (over the rows). A block at k = 0 counts
        without its drafter's upkeep: what the plain decoding it stands for costs."""
        b = bucket(rows)
        self.steps[k] += 1
        self.drafting += rows if k > 0 else 0
        if b not in self.seen:
            self.seen.add(b)
        else:
            per_row, bare = seconds / max(rows, 1), (seconds - drafter) / max(rows, 1)
            last = 1 - self.samples
            self.times[b, k] = [*self.times.get((b, k), [])[last:], (bare if k == 0 else per_row, rows)]
            if k == 1:  # what `floor` reads
                self.bare[b, k] = [*self.bare.get((b, k), [])[last:], (bare, rows)]
            self.spent[b] = self.spent.get(b, 0.0) + per_row
        for i, (d, a) in enumerate(zip(drafted, accepted, strict=False)):
            self.drafted[i] += d
            self.accepted[i] += a

    def summary(self) -> dict[str, Any]:
        return {
            "steps": dict(self.steps),
            "acceptance": [
                round(a / d, 3) if d else None for a, d in zip(self.accepted, self.drafted, strict=True)
            ],
            "ms_per_row": {
                f"{b}:{k}": round(min(t for t, _ in seen) * 1e3, 3)
                for (b, k), seen in sorted(self.times.items())
            },
        }
