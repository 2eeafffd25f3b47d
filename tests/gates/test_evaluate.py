"""Checks over a report: thresholds just inside and just past, `*` fan-out, missing paths, the Verdict."""

import json

import pytest

import gates
from gates import Check, Verdict, evaluate, evaluate_file, load_report

# A minimal valid report whose body the checks look at (probe v1), with a ladder added under
# `accelerators.cuda.devices` for string checks; numeric fan-out checks use run_check on plain dicts.
LADDER = {
    "rungs": [
        {"ctx": 256, "delta": 0.01, "exact": True},
        {"ctx": 1024, "delta": 0.04, "exact": True},
        {"ctx": 4096, "delta": 0.02, "exact": True},
    ],
    "empty": [],
    "name": "x",
    "flag": True,
}


def one(check, path, value=None, doc=LADDER):
    return gates.run_check(doc, Check(check=check, path=path, value=value))


@pytest.mark.parametrize(
    ("check", "path", "value", "status", "seen", "at"),
    [
        ("min", "/rungs/0/ctx", 256, "pass", 256, "/rungs/0/ctx"),
        ("min", "/rungs/0/ctx", 257, "fail", 256, "/rungs/0/ctx"),
        ("max", "/rungs/*/delta", 0.04, "pass", 0.04, "/rungs/1/delta"),
        ("max", "/rungs/*/delta", 0.0399, "fail", 0.04, "/rungs/1/delta"),
        ("min", "/rungs/*/ctx", 256, "pass", 256, "/rungs/0/ctx"),
        ("min", "/rungs/*/ctx", 256.5, "fail", 256, "/rungs/0/ctx"),
        ("between", "/rungs/*/delta", [0.01, 0.04], "pass", 0.01, "/rungs/0/delta"),
        ("between", "/rungs/*/delta", [0.0101, 0.05], "fail", 0.01, "/rungs/0/delta"),
        ("between", "/rungs/*/delta", [0.0, 0.039], "fail", 0.04, "/rungs/1/delta"),
        ("eq", "/rungs/2/ctx", 4096, "pass", 4096, "/rungs/2/ctx"),
        ("eq", "/rungs/2/ctx", 4096.0, "pass", 4096, "/rungs/2/ctx"),
        ("eq", "/rungs/*/ctx", 256, "fail", 1024, "/rungs/1/ctx"),
        ("eq", "/flag", 1, "fail", True, "/flag"),
        ("eq", "/name", "x", "pass", "x", "/name"),
        (
            "eq",
            "/rungs/0",
            {"ctx": 256, "delta": 0.01, "exact": True},
            "pass",
            LADDER["rungs"][0],
            "/rungs/0",
        ),
        ("eq", "/rungs/1", {"ctx": 1024, "delta": 0.04, "exact": 1}, "fail", LADDER["rungs"][1], "/rungs/1"),
        ("eq", "/empty", [], "pass", [], "/empty"),
        ("eq", "/empty", [0], "fail", [], "/empty"),
        ("all_true", "/rungs/*/exact", None, "pass", True, "/rungs/0/exact"),
        ("all_true", "/flag", None, "pass", True, "/flag"),
    ],
)
def test_threshold_at_and_just_past_its_limit(check, path, value, status, seen, at):
    result = one(check, path, value)
    assert (result.status, result.value, result.at) == (status, seen, at), result.reason
    assert result.path == path and result.threshold == value
    assert at in result.reason


def test_fan_out_reports_the_worst_value_and_how_many():
    result = one("max", "/rungs/*/delta", 0.03)
    assert (result.status, result.value, result.at, result.count) == ("fail", 0.04, "/rungs/1/delta", 3)
    assert result.reason == "/rungs/1/delta = 0.04, needs ≤ 0.03 (worst of 3 values)"


def test_all_true_names_the_first_false_item():
    doc = {"rungs": [{"exact": True}, {"exact": False}, {"exact": 1}]}
    result = one("all_true", "/rungs/*/exact", doc=doc)
    assert (result.status, result.value, result.at) == ("fail", False, "/rungs/1/exact")
    assert one("all_true", "/rungs/2/exact", doc=doc).status == "fail"  # 1 is not true


@pytest.mark.parametrize(
    ("check", "path", "value", "reason"),
    [
        ("min", "/missing", 1, "/missing is missing (no key 'missing' in the document root)"),
        ("max", "/rungs/*/recall", 1, "/rungs/0/recall is missing"),
        ("all_true", "/empty/*", None, "/empty is an empty array, so '*' matched nothing"),
        ("eq", "/empty/0", 1, "/empty/0 is missing"),
        ("min", "/name", 1, '/name = "x" is a string, not a number'),
        ("max", "/flag", 1, "/flag = true is a boolean, not a number"),
        ("max", "/rungs", 1, "is an array, not a number"),
    ],
)
def test_missing_or_non_numeric_values_fail(check, path, value, reason):
    result = one(check, path, value)
    assert result.status == "fail"
    assert reason in result.reason


def test_non_finite_value_fails_the_check_and_the_schema(probe_report):
    probe_report["probe"]["memory_bytes"] = float("nan")
    verdict = evaluate(probe_report, [Check(check="min", path="/probe/memory_bytes", value=0)])
    assert verdict.status == "fail"
    assert verdict.checks[0].status == "fail" and "is not finite" in verdict.checks[0].reason
    assert any(v.pointer == "/probe/memory_bytes" for v in verdict.violations)
    json.loads(verdict.model_dump_json())  # still writable as strict JSON


def test_schema_failure_fails_even_when_every_check_passes(probe_report):
    probe_report["surprise"] = True
    verdict = evaluate(probe_report, [Check(check="min", path="/probe/cpu_count", value=1)])
    assert verdict.checks[0].status == "pass"
    assert verdict.status == "fail"
    assert verdict.exit_code() == 1


def test_verdict_passes_and_renders_a_table(probe_report):
    checks = gates.parse_checks(
        [
            {"check": "min", "path": "/probe/cpu_count", "value": 2},
            {"check": "eq", "path": "/probe/accelerators/cuda/devices/*", "value": "NVIDIA H200"},
            {"check": "all_true", "path": "/probe/accelerators/cuda/available"},
        ]
    )
    verdict = evaluate(probe_report, checks, kind="probe", schema_version=1)
    assert verdict.status == "pass" and verdict.passed and verdict.exit_code() == 0
    assert verdict.reasons() == []
    md = verdict.to_markdown()
    assert md.startswith("**Gate: ✓ pass** (probe v1, 3 checks)")
    assert "| ✓ | min | 2 | ≥ 2 | `/probe/cpu_count` |" in md
    assert (
        '| ✓ | eq | "NVIDIA H200" at `/probe/accelerators/cuda/devices/0` (worst of 2) | = "NVIDIA H200" '
        "| `/probe/accelerators/cuda/devices/*` |"
    ) in md
    assert "| ✓ | all_true | true | all true | `/probe/accelerators/cuda/available` |" in md
    assert Verdict.model_validate_json(verdict.model_dump_json()) == verdict


def test_failing_verdict_lists_every_reason_in_markdown(probe_report):
    probe_report["probe"]["cpu_count"] = 1
    probe_report["probe"]["os"] = 5
    checks = gates.parse_checks(
        [
            {"check": "min", "path": "/probe/cpu_count", "value": 2},
            {"check": "between", "path": "/probe/nothing/*", "value": [0, 1]},
        ]
    )
    verdict = evaluate(probe_report, checks)
    assert verdict.status == "fail" and verdict.exit_code() == 1
    assert verdict.reasons() == [
        "schema: /probe/os: 5 is not of type 'string'",
        "min /probe/cpu_count: /probe/cpu_count = 1, needs ≥ 2",
        "between /probe/nothing/*: /probe/nothing is missing (no key 'nothing' in /probe)",
    ]
    md = verdict.to_markdown()
    assert md.startswith("**Gate: ✗ fail** (probe v1, 2 checks)")
    assert "| ✗ | min | 1 | ≥ 2 | `/probe/cpu_count` |" in md
    assert (
        "| ✗ | between | /probe/nothing is missing (no key 'nothing' in /probe) | in [0, 1] | `/probe/nothing/*` |"
        in md
    )
    assert "- `/probe/os`: 5 is not of type 'string'" in md


def test_markdown_escapes_pipes_and_says_no_checks():
    verdict = evaluate({"kind": "probe"}, [Check(check="eq", path="/kind", value="a|b")])
    assert '= "a\\|b"' in verdict.to_markdown()
    assert "(report, 1 check)" in verdict.to_markdown()
    assert "No checks." in Verdict(status="pass").to_markdown()
    error = Verdict(status="error", error="no schema")
    assert error.to_markdown().startswith("**Gate: ! error** (report, 0 checks)\n\nNot evaluated: no schema")
    assert error.exit_code() == 2 and error.reasons() == ["no schema"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"kind": "probe", "x": NaN}', "/x = nan"),
        ('{"kind": "probe", "x": [Infinity]}', "/x/0 = inf"),
        ('{"kind": "probe", "x": -Infinity}', "/x = -inf"),
        ('{"kind": "probe", "x": 1e999}', "/x = inf"),
        ('{"kind": "probe", "kind": "niah"}', "duplicate key 'kind'"),
        ('{"kind": "probe",}', "is not valid JSON"),
        ("[1, 2]", "is an array, not a JSON object"),
        ("", "is not valid JSON"),
    ],
)
def test_report_loader_rejects_what_strict_json_rejects(tmp_path, text, message):
    path = tmp_path / "report.json"
    path.write_text(text)
    with pytest.raises(gates.ReportError) as exc:
        load_report(path)
    assert message in str(exc.value)
    verdict = evaluate_file(path, [])
    assert verdict.status == "error" and message in verdict.error


def test_report_loader_reads_a_file(tmp_path, probe_report):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(probe_report))
    assert load_report(path) == probe_report
    assert evaluate_file(path, []).status == "pass"
    verdict = evaluate_file(tmp_path / "absent.json", [])
    assert verdict.status == "error" and "cannot read report" in verdict.error


def test_one_exit_code_rule_for_verdicts_and_comparisons():
    assert [gates.exit_code(s) for s in ("pass", "fail", "error")] == [0, 1, 2]
    for status in ("pass", "fail", "error"):
        assert Verdict(status=status).exit_code() == gates.exit_code(status)
        comparison = gates.Comparison(
            status=status, metric="/m", max_regression_pct=5, higher_is_better=True, reason="r"
        )
        assert comparison.exit_code() == gates.exit_code(status)


@pytest.mark.parametrize(
    ("value", "finite"),
    [
        (0, True),
        (-2.5, True),
        (1e308, True),
        (True, False),
        (float("nan"), False),
        (float("inf"), False),
        (float("-inf"), False),
        ("1", False),
        (None, False),
    ],
)
def test_the_one_finite_number_test(value, finite):
    from gates.report import is_number

    assert is_number(value) is finite
    # The same test decides a numeric check: a value it refuses fails min/max/between.
    result = gates.run_check({"x": value}, Check(check="max", path="/x", value=1e300))
    assert (result.reason.endswith("not a number") or "not finite" in result.reason) is not finite


def test_a_verdict_with_its_comparison_round_trips_through_json(probe_report):
    comparison = gates.compare({"m": 90}, {"m": 100}, "/m", 5)
    verdict = evaluate(probe_report, []).with_comparison(gates.Baseline(source="previous-pass"), comparison)
    assert verdict.status == "fail" and "baseline: " in verdict.reasons()[-1]
    again = Verdict.model_validate_json(verdict.model_dump_json())
    assert again == verdict and isinstance(again.comparison, gates.Comparison)
