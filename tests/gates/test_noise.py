"""Noise-aware regressions: the one-sided Mann-Whitney U test and `compare(..., samples=...)` — a regression
fails only when it exceeds the threshold AND is beyond the noise; the comparison shows both."""

from __future__ import annotations

import math

from gates import compare
from gates.noise import worse_p_value


def report(value: float, samples: list[float] | None) -> dict:
    summary = {"tok_s": value, **({"tok_s_samples": samples} if samples is not None else {})}
    return {"kind": "throughput", "summary": summary}


def test_exact_and_approximate_p_values():
    # every new sample below every base sample: the most extreme of C(8,4) = 70 splits
    assert math.isclose(worse_p_value([1, 2, 3, 4], [5, 6, 7, 8]), 1 / 70)
    assert worse_p_value([5, 6, 7, 8], [1, 2, 3, 4]) == 1.0
    # lower is better: the same numbers are now an improvement, then a regression
    assert worse_p_value([1, 2, 3, 4], [5, 6, 7, 8], higher_is_better=False) == 1.0
    assert math.isclose(worse_p_value([5, 6, 7, 8], [1, 2, 3, 4], higher_is_better=False), 1 / 70)
    # ties get mid-ranks: identical samples are no evidence at all
    assert worse_p_value([3, 3, 3], [3, 3, 3]) == 1.0
    # 3 vs 3 can never reach p < 0.05 (1/20 at best)
    assert math.isclose(worse_p_value([1, 2, 3], [4, 5, 6]), 0.05)
    # 12 vs 12 (2.7 million splits): the normal approximation
    assert worse_p_value(list(range(12)), list(range(100, 112))) < 1e-4
    assert worse_p_value(list(range(0, 24, 2)), list(range(1, 25, 2))) > 0.05


def test_a_regression_must_exceed_the_threshold_and_the_noise():
    base = report(100, [98, 100, 102, 99, 101])
    # 20 % slower and clearly separated: a regression, both reasons shown
    c = compare(
        report(80, [79, 80, 81, 80, 82]), base, "/summary/tok_s", 10, samples="/summary/tok_s_samples"
    )
    assert c.status == "fail" and c.samples == (5, 5) and c.p_value is not None and c.p_value < 0.05
    assert (
        "exceeds the allowed 10 % regression; beyond the noise (Mann-Whitney U, one-sided, p < 0.05: p = "
        in c.reason
    )
    assert "| p = " in c.to_markdown()
    # 20 % slower on the median figure, but the repeats overlap the baseline's: within the noise, not a regression
    c = compare(
        report(80, [60, 130, 80, 104, 75]), base, "/summary/tok_s", 10, samples="/summary/tok_s_samples"
    )
    assert c.status == "pass" and c.p_value is not None and c.p_value >= 0.05
    assert c.reason.endswith("repeats): not a regression") and "exceeds the allowed 10 %" in c.reason
    # beyond the noise but within the threshold: not a regression either
    c = compare(
        report(97, [96.9, 97, 97.1, 97.2, 96.8]), base, "/summary/tok_s", 10, samples="/summary/tok_s_samples"
    )
    assert (
        c.status == "pass" and c.p_value is not None and c.p_value < 0.05 and "within the allowed" in c.reason
    )
    # no samples in one report: the threshold alone decides, and says so
    c = compare(report(80, None), base, "/summary/tok_s", 10, samples="/summary/tok_s_samples")
    assert c.status == "fail" and c.p_value is None
    assert c.reason.endswith(
        "no per-repeat samples at /summary/tok_s_samples in both reports, so the threshold alone decides"
    )
