"""Is a slowdown beyond the noise? A one-sided Mann-Whitney U test over per-repeat samples, in pure Python.

    p = worse_p_value(new_samples, base_samples, higher_is_better=True)   # small p: new is really worse
    p < ALPHA                                                              # the rule the baseline uses

Exact (every split of the pooled ranks enumerated) up to EXACT_LIMIT splits, else the normal approximation
with the tie correction and a continuity correction. Ties get mid-ranks.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

ALPHA = 0.05
EXACT_LIMIT = 50_000
RULE = f"Mann-Whitney U, one-sided, p < {ALPHA:g}"


def _ranks(values: Sequence[float]) -> list[float]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def worse_p_value(new: Sequence[float], base: Sequence[float], higher_is_better: bool = True) -> float:
    """P(a U at least this extreme | no difference) for the alternative 'new is worse than base'."""
    if len(new) < 1 or len(base) < 1:
        raise ValueError("both sides need at least one sample")
    sign = 1.0 if higher_is_better else -1.0
    worse = [-sign * x for x in new]  # larger = worse, for both directions
    pooled = [*worse, *(-sign * x for x in base)]
    ranks = _ranks(pooled)
    n, m = len(new), len(base)
    u = sum(ranks[:n]) - n * (n + 1) / 2  # large U: new ranks high, i.e. worse
    if math.comb(n + m, n) <= EXACT_LIMIT:
        hits = total = 0
        for pick in itertools.combinations(range(n + m), n):
            total += 1
            hits += sum(ranks[i] for i in pick) - n * (n + 1) / 2 >= u - 1e-9
        return hits / total
    mean = n * m / 2
    ties = sum(t**3 - t for t in (pooled.count(v) for v in set(pooled)))
    var = n * m / 12 * ((n + m + 1) - ties / ((n + m) * (n + m - 1)))
    if var <= 0:
        return 1.0
    z = (u - mean - 0.5) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2))
