"""Every report schema: a valid example passes, each tampering fails with its pointer and message."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

import gates
from gates.schema import SCHEMA_DIR

ROOT = Path(__file__).resolve().parents[2]


def test_schema_files_are_valid_and_named_after_their_kind():
    kinds = gates.known_schemas()
    assert ("probe", 1) in kinds
    envelope = json.loads((SCHEMA_DIR / "envelope.schema.json").read_text())
    Draft202012Validator.check_schema(envelope)
    for kind, version in kinds:
        name = f"{kind}.v{version}.schema.json"
        schema = json.loads((SCHEMA_DIR / name).read_text())
        Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["$id"].endswith("/" + name)
        assert schema["$ref"] == "envelope.schema.json", f"{name} must share the envelope"
        assert schema["unevaluatedProperties"] is False, f"{name} must reject unknown top-level fields"
        assert schema["properties"]["kind"] == {"const": kind}
        assert schema["properties"]["schema_version"] == {"const": version}


def test_valid_probe_report_passes(probe_report):
    verdict = gates.evaluate(probe_report, [], kind="probe", schema_version=1)
    assert verdict.status == "pass", verdict.reasons()
    assert (verdict.kind, verdict.schema_version, verdict.schema_file) == ("probe", 1, "probe.v1.schema.json")
    # Optional parts: a tool absent from `versions`, a Metal device name, an unknown subject.
    del probe_report["environment"]["versions"]["torch"]
    probe_report["probe"]["accelerators"]["metal"] = {"available": True, "device": "Apple M4"}
    probe_report["subject"] = None
    assert gates.evaluate(probe_report, []).status == "pass"


def _set(doc, path, value):
    *parents, last = path.strip("/").split("/")
    for p in parents:
        doc = doc[int(p)] if isinstance(doc, list) else doc[p]
    if value is _DELETE:
        del doc[last]
    elif isinstance(doc, list):
        doc[int(last)] = value
    else:
        doc[last] = value


_DELETE = object()

TAMPERINGS = [
    # (field, new value, expected pointer, expected message fragment)
    ("/created_at", _DELETE, "", "'created_at' is a required property"),
    ("/environment", _DELETE, "", "'environment' is a required property"),
    ("/probe", _DELETE, "", "'probe' is a required property"),
    ("/probe/packages/mlx_lm", _DELETE, "/probe/packages", "'mlx_lm' is a required property"),
    ("/environment/versions/python", _DELETE, "/environment/versions", "'python' is a required property"),
    ("/probe/cpu_count", "2", "/probe/cpu_count", "'2' is not of type 'integer'"),
    ("/probe/cpu_count", 2.5, "/probe/cpu_count", "2.5 is not of type 'integer'"),
    ("/probe/cpu_count", 0, "/probe/cpu_count", "0 is less than the minimum of 1"),
    (
        "/probe/accelerators/cuda/available",
        "yes",
        "/probe/accelerators/cuda/available",
        "is not of type 'boolean'",
    ),
    (
        "/probe/accelerators/cuda/devices/1",
        7,
        "/probe/accelerators/cuda/devices/1",
        "7 is not of type 'string'",
    ),
    ("/environment/memory_bytes", -1, "/environment/memory_bytes", "-1 is less than the minimum of 0"),
    ("/environment/versions/torch", 2, "/environment/versions/torch", "2 is not of type 'string'"),
    ("/environment/gpu", "h200", "/environment", "('gpu' was unexpected)"),
    ("/probe/extra", 1, "/probe", "('extra' was unexpected)"),
    ("/extra", {"a": 1}, "", "Unevaluated properties are not allowed ('extra' was unexpected)"),
    ("/created_at", "yesterday", "/created_at", "does not match"),
    ("/subject", "main", "/subject", "does not match"),
    ("/probe/memory_bytes", float("nan"), "/probe/memory_bytes", "nan is not a finite number"),
    ("/probe/cpu_count", float("inf"), "/probe/cpu_count", "inf is not a finite number"),
    ("/environment/cpu_count", float("-inf"), "/environment/cpu_count", "-inf is not a finite number"),
    (
        "/probe/accelerators/cuda/devices",
        [float("nan")],
        "/probe/accelerators/cuda/devices/0",
        "nan is not a finite",
    ),
    ("/schema_version", "1", "/schema_version", "'1' is not of type 'integer'"),
    ("/kind", _DELETE, "", "'kind' is a required property"),
]


@pytest.mark.parametrize(
    ("field", "value", "pointer", "message"),
    TAMPERINGS,
    ids=[f"{t[0]}={'deleted' if t[1] is _DELETE else t[1]!r}" for t in TAMPERINGS],
)
def test_tampered_probe_report_fails_with_pointer(probe_report, field, value, pointer, message):
    _set(probe_report, field, value)
    verdict = gates.evaluate(probe_report, [])
    assert verdict.status == "fail"
    assert any(v.pointer == pointer and message in v.message for v in verdict.violations), verdict.violations
    assert any(message in r for r in verdict.reasons())


def test_wrong_kind_or_version_fails_against_the_presets_expectation(probe_report):
    probe_report["kind"] = "niah"
    verdict = gates.evaluate(probe_report, [], kind="probe", schema_version=1)
    assert verdict.status == "fail"
    assert ("/kind", "expected 'probe', got \"niah\"") in [(v.pointer, v.message) for v in verdict.violations]

    probe_report["kind"] = "probe"
    probe_report["schema_version"] = 2
    verdict = gates.evaluate(probe_report, [], kind="probe", schema_version=1)
    assert verdict.status == "fail"
    assert ("/schema_version", "expected 1, got 2") in [(v.pointer, v.message) for v in verdict.violations]


def test_a_kind_or_version_without_a_schema_is_an_error(probe_report):
    probe_report["schema_version"] = 2
    verdict = gates.evaluate(probe_report, [gates.Check(check="min", path="/probe/cpu_count", value=1)])
    assert verdict.status == "error"
    assert verdict.checks == [] and verdict.violations == []
    assert "no schema for report kind 'probe' version 2" in verdict.error
    assert "known: " in verdict.error and "probe v1" in verdict.error

    probe_report.update(kind="warp-drive", schema_version=1)
    assert "no schema for report kind 'warp-drive' version 1" in gates.evaluate(probe_report, []).error


@pytest.mark.parametrize("report", [[], "probe", None, 3])
def test_a_report_that_is_not_an_object_is_an_error(report):
    verdict = gates.evaluate(report, [])
    assert verdict.status == "error"
    assert "not a JSON object" in verdict.error


def test_engine_write_report_matches_the_envelope(tmp_path, monkeypatch):
    """Drift check: the real envelope writer and the real probe body pass the probe schema."""
    from engine.report import write_report
    from engine.workloads.probe import probe

    monkeypatch.setenv("KAKEYA_SUBJECT", "ab" * 20)
    write_report(tmp_path / "report.json", "probe", 1, {"probe": probe()})
    verdict = gates.evaluate_file(tmp_path / "report.json", [], kind="probe", schema_version=1)
    assert verdict.status == "pass", verdict.reasons()


def test_probe_workload_run_by_hand_passes_its_preset_gate(tmp_path):
    out = tmp_path / "probe.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    subprocess.run(
        [sys.executable, "-m", "engine.workloads.probe", "--out", str(out)],
        check=True,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
    )
    checks = gates.parse_checks(
        [
            {"check": "min", "path": "/probe/cpu_count", "value": 1},
            {"check": "eq", "path": "/kind", "value": "probe"},
        ]
    )
    verdict = gates.evaluate_file(out, checks, kind="probe", schema_version=1)
    assert verdict.status == "pass", verdict.reasons()
    assert verdict.checks[0].value == os.cpu_count()
