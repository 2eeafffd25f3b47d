"""Regression compare: within tolerance, just past it, direction, missing metric, unusable baseline."""

import pytest

from gates import Comparison, compare


def rep(value, kind="throughput"):
    return {"kind": kind, "summary": {"tok_s": value, "label": "x"}, "rungs": [{"t": 1}]}


@pytest.mark.parametrize(
    ("new", "base", "pct", "higher", "status", "regression"),
    [
        (95.0, 100.0, 5, True, "pass", 5.0),  # exactly at the limit
        (94.9, 100.0, 5, True, "fail", 5.1),  # just past it
        (0.285, 0.3, 5, True, "pass", 5.0),  # at the limit despite binary rounding
        (0.2849, 0.3, 5, True, "fail", 5.0333),
        (120.0, 100.0, 0, True, "pass", -20.0),  # better
        (100.0, 100.0, 0, True, "pass", 0.0),
        (105.0, 100.0, 5, False, "pass", 5.0),  # lower is better: an increase is the regression
        (105.1, 100.0, 5, False, "fail", 5.1),
        (80.0, 100.0, 0, False, "pass", -20.0),
        (-10.5, -10.0, 5, True, "pass", 5.0),  # negative baselines use |base|
        (-10.6, -10.0, 5, True, "fail", 6.0),
    ],
)
def test_regression_within_and_past_tolerance(new, base, pct, higher, status, regression):
    result = compare(rep(new), rep(base), "/summary/tok_s", pct, higher_is_better=higher)
    assert result.status == status, result.reason
    assert result.regression_pct == pytest.approx(regression, abs=1e-3)
    assert (result.new, result.base) == (new, base)
    assert result.exit_code() == {"pass": 0, "fail": 1}[status]


def test_reason_and_markdown():
    result = compare(rep(90), rep(100), "/summary/tok_s", 5)
    assert (
        result.reason == "/summary/tok_s: 90 vs baseline 100, 10 % worse; exceeds the allowed 5 % regression"
    )
    assert result.change_pct == pytest.approx(-10.0)
    md = result.to_markdown()
    assert md.startswith("**Compare: ✗ fail** (higher is better)")
    assert "| ✗ | `/summary/tok_s` | 90 | 100 | -10.00 % | 5 % |" in md
    assert Comparison.model_validate_json(result.model_dump_json()) == result
    assert "unchanged" in compare(rep(100), rep(100), "/summary/tok_s", 0).reason


@pytest.mark.parametrize(
    ("new", "base", "status", "reason"),
    [
        ({"kind": "throughput", "summary": {}}, rep(100), "fail", "the new report has no /summary/tok_s"),
        (rep("fast"), rep(100), "fail", '/summary/tok_s in the new report is "fast": a string, not a number'),
        (rep(float("nan")), rep(100), "fail", "NaN: not finite"),
        (rep(True), rep(100), "fail", "a boolean, not a number"),
        (rep(100), {"kind": "throughput"}, "error", "the baseline report has no /summary/tok_s"),
        (rep(100), rep(None), "error", "null, not a number"),
        (
            rep(100),
            rep(100, kind="niah"),
            "error",
            'cannot compare a "throughput" report with a "niah" baseline',
        ),
        (rep(1), rep(0), "error", "is 0 in the baseline"),
        ([], rep(1), "fail", "the new report is an array, not a JSON object"),
    ],
)
def test_missing_or_unusable_metric(new, base, status, reason):
    result = compare(new, base, "/summary/tok_s", 5)
    assert result.status == status
    assert reason in result.reason


def test_zero_baseline_and_zero_new_is_unchanged():
    assert compare(rep(0), rep(0), "/summary/tok_s", 0).status == "pass"


@pytest.mark.parametrize(
    ("metric", "pct", "message"),
    [
        ("/rungs/*/t", 5, "without '*'"),
        ("", 5, "must be a JSON pointer"),
        ("summary/tok_s", 5, "must start with '/'"),
        ("/summary/tok_s", -1, "finite percentage >= 0"),
        ("/summary/tok_s", float("inf"), "finite percentage >= 0"),
    ],
)
def test_bad_metric_or_tolerance_is_a_caller_error(metric, pct, message):
    with pytest.raises(ValueError, match=message.replace("*", r"\*")):
        compare(rep(1), rep(1), metric, pct)
