"""`compare(new, base, metric, max_regression_pct)`: has a numeric metric regressed against a baseline report?

Pure, so the same function serves `kakeya gate compare` and a preset's `baseline: previous-pass`
(the bus finds the base report, this judges it). Missing or non-numeric metric in the new report
fails; a baseline that cannot be compared against (no such metric, zero) is an error.
"""

from __future__ import annotations

from typing import Any

from gates.noise import ALPHA, RULE, worse_p_value
from gates.pointer import PathError, json_type, resolve, split
from gates.report import fmt, fmt_number, is_number
from gates.verdict import Comparison

# Rounding slack so that exactly `max_regression_pct` passes despite binary floats (0.3 -> 0.285 is 5%).
_EPS = 1e-9


def _one_number(report: Any, metric: str, which: str) -> tuple[float | None, str | None]:
    """(value, None) or (None, why not)."""
    if not isinstance(report, dict):
        return None, f"the {which} report is {json_type(report)}, not a JSON object"
    try:
        [(_, value)] = resolve(report, metric)
    except PathError as exc:
        return None, f"the {which} report has no {metric}: {exc}"
    if not is_number(value):
        what = "not finite" if isinstance(value, float) else f"{json_type(value)}, not a number"
        return None, f"{metric} in the {which} report is {fmt(value)}: {what}"
    return float(value), None


def _samples(report: Any, pointer: str) -> list[float] | None:
    """The per-repeat samples at `pointer` (two or more finite numbers), or None."""
    try:
        [(_, values)] = resolve(report, pointer)
    except (PathError, ValueError):
        return None
    if isinstance(values, list) and len(values) >= 2 and all(is_number(v) for v in values):
        return [float(v) for v in values]
    return None


def compare(
    new: Any,
    base: Any,
    metric: str,
    max_regression_pct: float,
    *,
    higher_is_better: bool = True,
    samples: str | None = None,
) -> Comparison:
    """Pass when `metric` in `new` is at most `max_regression_pct` percent worse than in `base`.

    With `samples` (a JSON pointer to the metric's per-repeat samples in both reports), a regression also
    has to be beyond the noise: it fails only when the threshold is exceeded AND a one-sided Mann-Whitney U
    test says the new samples are worse at p < 0.05 (gates/noise.py); the comparison records both.

    Raises ValueError for a bad metric path or tolerance (a caller's mistake, not the reports').
    """
    if "*" in split(metric) or not metric:
        raise ValueError(f"metric {metric!r} must be a JSON pointer to one number, without '*'")
    if not is_number(max_regression_pct) or max_regression_pct < 0:
        raise ValueError(f"max regression must be a finite percentage >= 0, got {max_regression_pct!r}")
    head = {"metric": metric, "max_regression_pct": max_regression_pct, "higher_is_better": higher_is_better}
    if isinstance(new, dict) and isinstance(base, dict) and new.get("kind") != base.get("kind"):
        return Comparison(
            status="error",
            **head,
            reason=f"cannot compare a {fmt(new.get('kind'))} report with a {fmt(base.get('kind'))} baseline",
        )
    b, why = _one_number(base, metric, "baseline")
    if b is None:
        return Comparison(status="error", **head, reason=str(why))
    n, why = _one_number(new, metric, "new")
    if n is None:
        return Comparison(status="fail", **head, base=b, reason=str(why))
    if b == 0:
        if n == 0:
            return Comparison(
                status="pass",
                **head,
                new=n,
                base=b,
                change_pct=0.0,
                regression_pct=0.0,
                reason=f"{metric} is 0 in both reports",
            )
        return Comparison(
            status="error",
            **head,
            new=n,
            base=b,
            reason=f"{metric} is 0 in the baseline, so a relative change is undefined",
        )
    change = (n - b) / abs(b) * 100
    regression = -change if higher_is_better else change
    ok = regression <= max_regression_pct * (1 + _EPS) + _EPS
    word = "worse" if regression > 0 else "better" if regression < 0 else "unchanged"
    amount = f"{abs(regression):.4g} % {word}" if regression else "unchanged"
    reason = (
        f"{metric}: {fmt_number(n)} vs baseline {fmt_number(b)}, {amount}; "
        f"{'within' if ok else 'exceeds'} the allowed {max_regression_pct:g} % regression"
    )
    noise: dict[str, Any] = {}
    if samples is not None:
        new_s, base_s = _samples(new, samples), _samples(base, samples)
        if new_s is None or base_s is None:
            reason += f"; no per-repeat samples at {samples} in both reports, so the threshold alone decides"
        else:
            p = worse_p_value(new_s, base_s, higher_is_better)
            beyond = p < ALPHA
            noise = {"noise_rule": RULE, "p_value": p, "samples": (len(new_s), len(base_s))}
            reason += (
                f"; {'beyond' if beyond else 'within'} the noise ({RULE}: p = {p:.3g} over "
                f"{len(new_s)} vs {len(base_s)} repeats)"
            )
            if not ok and not beyond:
                reason += ": not a regression"
            ok = ok or not beyond
    return Comparison(
        **noise,
        status="pass" if ok else "fail",
        **head,
        new=n,
        base=b,
        change_pct=change,
        regression_pct=regression,
        reason=reason,
    )
