"""The server's draft length: each step's k from the measured cost per emitted token at the running batch
size, down to k = 0, a plain batched step (no drafting), re-probing the other choice now and then.

`speculative_generate_batch(adapt=True)` (engine.speculative.DraftLength) decides once per batch whose rows
only leave; a server's batch lives for hours while rows join and leave, and what pays changes with its
size: on the project's 2-core CPU a block drafter's k = 4 block costs 2.1x a plain step at 1 row and 3.2x
at 32 rows, so drafting pays at 1 row and loses at 32 unless nearly every draft is accepted. So:

- Costs are kept per batch-size bucket (`bucket`: 1, 2-3, 4-7, ..., powers of two) and per k, as seconds
  per row of a step (CPU time of the scheduler thread on a CPU verifier, wall time on an accelerator), the
  least of the last `samples` steps (timing noise only ever adds). A k not measured in a bucket is
  interpolated between the nearest measured ones (0 and k_max are always measured before choosing).
- Acceptance is kept per draft position over every bucket (it does not depend on the batch size): a step
  at k emits 1 + the sum of the first k acceptance fractions per row.
- Each step takes the k of the least cost per emitted token, cost(k) / tokens(k), where k = 0 is a plain
  step measured as such (engine/serve/scheduler.py runs it without the drafter: no draft, no drafter
  forward; a drafter reading hidden states gets them later, in one batched catch-up, `Backlog`, whose time
  is charged to the plain steps it catches up on, `Backlog.per_position`, and left out of the block's).
- The end (0 or k_max) other than the best is measured again once the time spent in the bucket since its
  last probe pays for the probe's loss within `budget` (1/50 by default: at most ~2% lost to probing), so a
  cost measured low or high at another moment (load, a batch that grew) is corrected.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def bucket(rows: int) -> int:
    """1 -> 1, 2-3 -> 2, 4-7 -> 3, 8-15 -> 4, ... (rows of similar per-row cost)."""
    return max(rows, 1).bit_length()


class StepLength:
    """Draft length of each server step (module docstring). `choose(rows)` then `record(...)` per step."""

    def __init__(self, k_max: int, samples: int = 4, budget: float = 0.02) -> None:
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1 (got {k_max})")
        self.k_max = k_max
        self.samples = samples
        self.budget = budget
        self.times: dict[tuple[int, int], list[float]] = {}  # (bucket, k) -> last steps' seconds per row
        self.seen: set[int] = set()  # buckets whose first (warm-up) step has run
        self.spent: dict[int, float] = {}  # seconds per row spent in a bucket since its last probe
        self.drafted = [0] * k_max
        self.accepted = [0] * k_max
        self.steps = {k: 0 for k in range(k_max + 1)}  # steps run at each k (reported, tested)

    def tokens(self, k: int) -> float:
        """Tokens a row emits in a step at k: 1 + the acceptance fraction of each of its k draft positions."""
        return 1.0 + sum(a / d for a, d in zip(self.accepted[:k], self.drafted[:k], strict=True) if d)

    def cost(self, b: int, k: int) -> float:
        """Seconds per row of a step at k in bucket b: measured, or linear between measured draft lengths."""
        if (b, k) in self.times:
            return min(self.times[b, k])
        lo = max(j for j in range(k) if (b, j) in self.times)
        hi = min(j for j in range(k + 1, self.k_max + 1) if (b, j) in self.times)
        return self.cost(b, lo) + (self.cost(b, hi) - self.cost(b, lo)) * (k - lo) / (hi - lo)

    def per_token(self, b: int) -> list[float]:
        """Seconds per emitted token at each k in bucket b (0 and k_max measured)."""
        return [self.cost(b, k) / self.tokens(k) for k in range(self.k_max + 1)]

    def choose(self, rows: int) -> int:
        b = bucket(rows)
        if b not in self.seen:  # the first step of a new batch size warms up (its time is not a cost)
            return 0
        if missing := [k for k in (0, self.k_max) if (b, k) not in self.times]:
            return missing[-1]
        per = self.per_token(b)
        best = min(range(self.k_max + 1), key=lambda k: (per[k], -k))
        # a probe loses its cost less what the best k takes for the tokens the probe emits
        loss = {k: self.cost(b, k) - self.tokens(k) * per[best] for k in (0, self.k_max) if k != best}
        probe = min(loss, key=loss.__getitem__)
        if self.spent.get(b, 0.0) * self.budget >= loss[probe]:
            self.spent[b] = 0.0
            return probe
        return best

    def record(
        self, k: int, seconds: float, rows: int, drafted: Sequence[int] = (), accepted: Sequence[int] = ()
    ) -> None:
        """A step of `rows` rows at k took `seconds`; drafted/accepted per draft position (over the rows)."""
        b = bucket(rows)
        self.steps[k] += 1
        if b not in self.seen:
            self.seen.add(b)
        else:
            self.times[b, k] = [*self.times.get((b, k), [])[1 - self.samples :], seconds / max(rows, 1)]
            self.spent[b] = self.spent.get(b, 0.0) + seconds / max(rows, 1)
        for i, (d, a) in enumerate(zip(drafted, accepted, strict=False)):
            self.drafted[i] += d
            self.accepted[i] += a

    def summary(self) -> dict[str, Any]:
        return {
            "steps": dict(self.steps),
            "acceptance": [
                round(a / d, 3) if d else None for a, d in zip(self.accepted, self.drafted, strict=True)
            ],
            "ms_per_row": {f"{b}:{k}": round(min(t) * 1e3, 3) for (b, k), t in sorted(self.times.items())},
        }


class Backlog:
    """A drafter that reads the verifier's hidden states (`layers`), skipped by plain steps: each plain
    step's features of every row are stashed (torch: per-layer buffers [rows, capacity, hidden], the rows
    following the batch's as they join and leave) and the drafter observes them all in one batched
    `observe_rows` before it next drafts (`flush`), or when a row's backlog fills the buffer. The drafter's
    context ends exactly as if it had observed every step; a plain step costs no drafter forward.

    Hidden states that are not torch tensors (MLX) are observed at once, each step (no stash)."""

    def __init__(self, drafter: Any, capacity: int = 64) -> None:
        self.drafter = drafter
        self.layers: tuple[int, ...] = tuple(drafter.layers)
        self.capacity = capacity
        self.bufs: dict[int, Any] = {}
        self.counts: list[int] = [0] * drafter.rows
        # seconds a flush takes per stashed position (the latest flushes, smoothed): a plain step's share of
        # the catch-up, which `StepLength` charges to plain steps (a block's time leaves the flush out)
        self.per_position = 0.0

    def stash(self, hidden: dict[int, Any], counts: Sequence[int]) -> None:
        """The features of the next counts[i] (0 or 1) fed positions of row i: hidden[layer][i, 0]."""
        first = hidden[self.layers[0]]
        if not _is_torch(first):
            self.drafter.observe_rows(hidden, counts)
            return
        import torch

        rows = len(counts)
        if len(self.counts) != rows:
            raise ValueError(f"the backlog follows {len(self.counts)} rows, the step fed {rows}")
        if max(self.counts, default=0) >= self.capacity:
            self.flush()
        if not self.bufs:
            self.bufs = {j: first.new_zeros((rows, self.capacity, hidden[j].shape[-1])) for j in self.layers}
        go = [i for i, n in enumerate(counts) if n]
        if not go:
            return
        with torch.inference_mode():
            index = torch.tensor(go, device=first.device)
            at = torch.tensor([self.counts[i] for i in go], device=first.device)
            for j in self.layers:
                self.bufs[j][index, at] = hidden[j][index, 0].to(self.bufs[j].dtype)
        for i in go:
            self.counts[i] += 1

    def flush(self, clock: Any = None) -> None:
        """The drafter observes every stashed position (one `observe_rows`); timed with `clock` if given."""
        if n := sum(self.counts):
            started = clock() if clock else 0.0
            m = max(self.counts)
            self.drafter.observe_rows({j: b[:, :m] for j, b in self.bufs.items()}, list(self.counts))
            if clock:
                seconds = (clock() - started) / n
                self.per_position = (
                    seconds if not self.per_position else 0.7 * self.per_position + 0.3 * seconds
                )
        self.counts = [0] * len(self.counts)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Only these rows go on (the drafter's `keep_rows` is the caller's)."""
        rows = list(rows)
        self.counts = [self.counts[r] for r in rows]
        if self.bufs:
            import torch

            index = torch.tensor(rows, device=next(iter(self.bufs.values())).device)
            self.bufs = {j: b.index_select(0, index) for j, b in self.bufs.items()}

    def add_rows(self, n: int) -> None:
        """n rows joined the batch (after its rows), with nothing stashed."""
        self.counts += [0] * n
        if self.bufs:
            import torch

            self.bufs = {j: torch.cat((b, b.new_zeros((n, *b.shape[1:])))) for j, b in self.bufs.items()}


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")
