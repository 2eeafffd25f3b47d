"""Sampling and the lossless speculative-sampling rule (no torch or mlx here: numpy on the host).

`Sampling` (temperature, top-k, top-p, seed) turns a forward's logits into probabilities; the draws come
from one `numpy.random.Generator` per generation seeded with `seed`, so a seed gives the same tokens on
either backend for the same logits. One implementation serves both backends: the logits of the rows
decided on are copied to the host once per forward (`host`), as the greedy loop copies its tokens.

`verify` is the standard rejection rule of speculative sampling (Leviathan et al. 2023, Chen et al. 2023),
vectorized over rows: draft x at block position i is accepted with probability min(1, p_i(x) / q_i(x));
at the first rejection the token is drawn from the normalised residual max(0, p_i - q_i); when every draft
is accepted a bonus token is drawn from p after the last draft. A drafter that proposes deterministically
(prompt lookup, an argmax drafter) has q = one-hot: draft x is accepted with probability p_i(x) and the
residual is p_i without x. Either way each committed token is distributed exactly as plain sampling from
p (tests/engine/test_sampling.py checks it with a chi-square test).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Sampling:
    """temperature 0: greedy (the argmax, no draws); top_k 0 and top_p 1.0: no truncation."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (got {self.temperature})")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (got {self.top_k}; 0 keeps every token)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (got {self.top_p})")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def rng(self) -> np.random.Generator:
        return np.random.default_rng(self.seed)

    def probs(self, logits: Any) -> np.ndarray:
        """Probabilities [..., vocab] (float64) from logits [..., vocab] (any backend's array)."""
        x = host(logits).astype(np.float64)
        if self.greedy:
            out = np.zeros_like(x)
            np.put_along_axis(out, x.argmax(-1)[..., None], 1.0, axis=-1)
            return out
        x = x / self.temperature
        if 0 < self.top_k < x.shape[-1]:
            kth = np.partition(x, -self.top_k, axis=-1)[..., -self.top_k, None]
            x = np.where(x < kth, -np.inf, x)
        x = np.exp(x - x.max(-1, keepdims=True))
        p = x / x.sum(-1, keepdims=True)
        if self.top_p < 1:
            order = np.argsort(-p, axis=-1, kind="stable")
            sorted_p = np.take_along_axis(p, order, -1)
            # keep the smallest prefix whose mass reaches top_p (the top token always)
            drop_sorted = np.cumsum(sorted_p, -1) - sorted_p >= self.top_p
            drop = np.zeros_like(drop_sorted)
            np.put_along_axis(drop, order, drop_sorted, -1)
            p = np.where(drop, 0.0, p)
            p /= p.sum(-1, keepdims=True)
        return p


def row_samplings(sampling: Sampling | Sequence[Sampling] | None, rows: int) -> list[Sampling | None]:
    """Each batch row's settings (None: greedy): one per row as given, or one `Sampling` for all rows
    with row r seeded `seed + r` (each row its own random stream)."""
    if sampling is None:
        return [None] * rows
    if isinstance(sampling, Sampling):
        return [None if sampling.greedy else replace(sampling, seed=sampling.seed + r) for r in range(rows)]
    given = list(sampling)
    if len(given) != rows:
        raise ValueError(f"{rows} batch rows need {rows} Sampling settings (got {len(given)})")
    return [None if s.greedy else s for s in given]


def host(x: Any) -> np.ndarray:
    """A backend array as a float32 numpy array on the host (torch: any device and dtype; mlx: float32 or
    float16 logits, which numpy reads directly)."""
    if isinstance(x, np.ndarray):
        return x
    if hasattr(x, "detach"):  # torch
        return x.detach().float().cpu().numpy()
    return np.asarray(x, dtype=np.float32)


def draw(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One token per row of p [..., vocab] (inverse CDF: one uniform per row)."""
    cdf = np.cumsum(p, -1)
    u = rng.random(p.shape[:-1])[..., None] * cdf[..., -1:]
    return np.minimum((cdf <= u).sum(-1), p.shape[-1] - 1)


def _at(p: np.ndarray, drafts: np.ndarray) -> np.ndarray:
    """p_i(d_i): the probability each block position i gives its draft ([rows, k])."""
    return np.take_along_axis(p[:, : drafts.shape[1]], drafts[..., None], -1)[..., 0]


def _residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """max(0, p - q), normalised (rows of p where p <= q everywhere, never rejected, keep p)."""
    r = np.maximum(p - q, 0.0)
    total = r.sum(-1, keepdims=True)
    return np.where(total > 0, r / np.where(total > 0, total, 1.0), p)


def verify(
    p: np.ndarray,
    drafts: np.ndarray,
    lengths: np.ndarray,
    q: np.ndarray | None,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """The rejection rule over rows. p [rows, k + 1, vocab]: the target's probabilities after the last
    committed token and after each draft; drafts [rows, k] (ints; row r drafted `lengths[r]` of them, the
    rest is padding); q [rows, k, vocab]: the drafter's proposal distributions, or None for a
    deterministic drafter (one-hot). Returns (n [rows]: drafts accepted, token [rows]: the token drawn
    after them, from the residual at the first rejection or from p after the last draft)."""
    rows, k = drafts.shape
    drafts = drafts.astype(np.int64)
    px = _at(p, drafts)
    qx = np.ones_like(px) if q is None else _at(q, drafts)
    ratio = np.minimum(1.0, px / np.maximum(qx, 1e-300))
    ok = (rng.random((rows, k)) < ratio) & (np.arange(k) < lengths[:, None])
    n = np.where(ok.all(1), k, ok.argmin(1)) if k else np.zeros(rows, np.int64)
    n = np.minimum(n, lengths)
    index = np.arange(rows)
    target = p[index, n]
    rejected = n < lengths
    if rejected.any():
        at = np.minimum(n, max(k - 1, 0))[rejected]
        if q is None:
            qn = np.zeros_like(target[rejected])
            qn[np.arange(len(at)), drafts[rejected, at]] = 1.0
        else:
            qn = q[index[rejected], at]
        target = target.copy()
        target[rejected] = _residual(target[rejected], qn)
    return n, draw(target, rng)
