"""`kakeya gate check` and `kakeya gate compare`: exit codes 0 pass / 1 fail / 2 error and the printed tables."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bridge.cli.main import main
from tests.gates.conftest import PROBE as GATES_PROBE

ROOT = Path(__file__).resolve().parents[2]

# The gates tests' probe report (an H200 host), here from a 4-CPU host with MLX and no CUDA
PROBE = {
    **GATES_PROBE,
    "environment": {
        **GATES_PROBE["environment"],
        "cpu_count": 4,
        "memory_bytes": None,
        "versions": {"python": "3.11.7"},
    },
    "subject": None,
    "probe": {
        "python": "3.11.7",
        "os": "Linux 6.1",
        "cpu_count": 4,
        "memory_bytes": 8589934592,
        "packages": {"torch": None, "transformers": None, "mlx": "0.32.4", "mlx_lm": "0.32.2"},
        "accelerators": {
            "cuda": {"available": False, "devices": []},
            "mps": {"available": False},
            "metal": {"available": False},
        },
        "mlx_default_device": "Device(cpu, 0)",
    },
}


def write(path: Path, data) -> Path:
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


@pytest.fixture
def report(tmp_path) -> Path:
    return write(tmp_path / "report.json", PROBE)


@pytest.fixture
def presets(tmp_path, monkeypatch) -> Path:
    """A private preset registry with one probe preset whose gate wants 8 CPUs."""
    d = tmp_path / "presets"
    d.mkdir()
    (d / "big-probe.yaml").write_text(
        "name: big-probe\ndescription: probe that wants a big host\nrunners: [cpu]\ntimeout_s: 60\n"
        'argv: ["{python}", "-m", "engine.workloads.probe", "--out", "{report}"]\n'
        "report: {kind: probe, schema_version: 1}\n"
        "gate:\n  - {check: min, path: /probe/cpu_count, value: 8}\n"
        "  - {check: eq, path: /probe/accelerators/cuda/available, value: false}\n"
    )
    monkeypatch.setenv("KAKEYA_PRESETS", str(d))
    return d


def test_check_with_checks_file_passes(tmp_path, report, capsys):
    checks = write(
        tmp_path / "checks.yaml",
        "- {check: min, path: /probe/cpu_count, value: 4}\n"
        "- {check: eq, path: /probe/mlx_default_device, value: 'Device(cpu, 0)'}\n",
    )
    assert main(["gate", "check", str(report), "--checks", str(checks)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("**Gate: ✓ pass** (probe v1, 2 checks)")
    assert "| ✓ | min | 4 | ≥ 4 | `/probe/cpu_count` |" in out


def test_check_just_past_threshold_fails(tmp_path, report, capsys):
    checks = write(tmp_path / "checks.json", [{"check": "min", "path": "/probe/cpu_count", "value": 5}])
    assert main(["gate", "check", str(report), "--checks", str(checks)]) == 1
    out = capsys.readouterr().out
    assert out.startswith("**Gate: ✗ fail**")
    assert "| ✗ | min | 4 | ≥ 5 | `/probe/cpu_count` |" in out


def test_check_empty_fan_out_fails(tmp_path, report, capsys):
    checks = write(
        tmp_path / "checks.yaml",
        "gate:\n  - {check: eq, path: /probe/accelerators/cuda/devices/*, value: NVIDIA H200}\n",
    )
    assert main(["gate", "check", str(report), "--checks", str(checks)]) == 1
    assert (
        "/probe/accelerators/cuda/devices is an empty array, so '*' matched nothing"
        in capsys.readouterr().out
    )


def test_check_with_report_expectation_in_checks_file(tmp_path, report, capsys):
    checks = write(tmp_path / "checks.yaml", "report: {kind: niah, schema_version: 1}\ngate: []\n")
    assert main(["gate", "check", str(report), "--checks", str(checks)]) == 1
    assert "- `/kind`: expected 'niah', got \"probe\"" in capsys.readouterr().out


def test_check_json_output(tmp_path, report, capsys):
    checks = write(tmp_path / "checks.yaml", "- {check: max, path: /probe/cpu_count, value: 4}\n")
    assert main(["gate", "check", str(report), "--checks", str(checks), "--json"]) == 0
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["status"] == "pass"
    assert verdict["checks"][0] | {"reason": None} == {
        "check": "max",
        "path": "/probe/cpu_count",
        "threshold": 4,
        "status": "pass",
        "value": 4,
        "at": "/probe/cpu_count",
        "count": 1,
        "reason": None,
    }


@pytest.mark.parametrize(
    ("mutate", "text"),
    [
        (lambda r: r.update(schema_version=9), "no schema for report kind 'probe' version 9"),
        (None, "has non-finite numbers (/probe/cpu_count = nan)"),
        (None, "is not valid JSON"),
    ],
)
def test_check_unevaluable_report_is_exit_2(tmp_path, capsys, mutate, text):
    path = tmp_path / "report.json"
    if mutate:
        data = copy.deepcopy(PROBE)
        mutate(data)
        write(path, data)
    elif "nan" in text:
        write(
            path,
            json.dumps(PROBE).replace(
                '"cpu_count": 4, "memory_bytes": 8589934592', '"cpu_count": NaN, "memory_bytes": 8589934592'
            ),
        )
    else:
        write(path, "{not json")
    checks = write(tmp_path / "checks.yaml", "[]")
    assert main(["gate", "check", str(path), "--checks", str(checks)]) == 2
    out = capsys.readouterr().out
    assert out.startswith("**Gate: ! error**")
    assert text in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("- {check: median, path: /a, value: 1}", "gate check #1"),
        ("- {check: min, path: a, value: 1}", "is not a JSON pointer"),
        ("gate: []\nextra: 1\n", "unexpected: extra"),
        ("report: [probe]\ngate: []\n", "`report:` must be"),
        ("[unclosed", "cannot read YAML/JSON"),
    ],
)
def test_check_bad_checks_file_is_exit_2(tmp_path, report, capsys, content, message):
    checks = write(tmp_path / "checks.yaml", content)
    assert main(["gate", "check", str(report), "--checks", str(checks)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kakeya: error: checks file") and message in err


def test_check_with_preset(report, presets, capsys):
    assert main(["gate", "check", str(report), "--preset", "big-probe"]) == 1
    out = capsys.readouterr().out
    assert "| ✗ | min | 4 | ≥ 8 | `/probe/cpu_count` |" in out
    assert "| ✓ | eq | false | = false | `/probe/accelerators/cuda/available` |" in out

    assert main(["gate", "check", str(report), "--preset", "nope"]) == 2
    assert "unknown preset 'nope' (known: big-probe)" in capsys.readouterr().err


def test_check_with_the_shipped_probe_preset(report, monkeypatch, capsys):
    monkeypatch.delenv("KAKEYA_PRESETS", raising=False)
    assert main(["gate", "check", str(report), "--preset", "probe"]) == 0
    assert "**Gate: ✓ pass** (probe v1" in capsys.readouterr().out


def test_check_takes_at_most_one_check_source(report, tmp_path, capsys):
    # neither: the preset is inferred from the report's kind (tests/bridge/test_friction.py)
    assert main(["gate", "check", str(report), "--preset", "probe", "--checks", str(tmp_path / "c")]) == 2
    assert "argument --checks: not allowed with argument --preset" in capsys.readouterr().err


def _metric_reports(tmp_path, new, base):
    n = copy.deepcopy(PROBE)
    b = copy.deepcopy(PROBE)
    n["probe"]["memory_bytes"], b["probe"]["memory_bytes"] = new, base
    return str(write(tmp_path / "new.json", n)), str(write(tmp_path / "base.json", b))


@pytest.mark.parametrize(
    ("new", "base", "extra", "code", "line"),
    [
        (95, 100, [], 0, "| ✓ | `/probe/memory_bytes` | 95 | 100 | -5.00 % | 5 % |"),
        (94, 100, [], 1, "| ✗ | `/probe/memory_bytes` | 94 | 100 | -6.00 % | 5 % |"),
        (106, 100, ["--lower-is-better"], 1, "6 % worse; exceeds the allowed 5 % regression"),
        (94, 100, ["--lower-is-better"], 0, "6 % better; within the allowed 5 % regression"),
        (None, 100, [], 1, "/probe/memory_bytes in the new report is null"),
        (100, None, [], 2, "/probe/memory_bytes in the baseline report is null"),
    ],
)
def test_compare_exit_codes(tmp_path, capsys, new, base, extra, code, line):
    n, b = _metric_reports(tmp_path, new, base)
    assert (
        main(["gate", "compare", n, b, "--metric", "/probe/memory_bytes", "--max-regression", "5", *extra])
        == code
    )
    assert line in capsys.readouterr().out


def test_compare_json_and_user_errors(tmp_path, capsys):
    n, b = _metric_reports(tmp_path, 100, 100)
    assert (
        main(["gate", "compare", n, b, "--metric", "/probe/memory_bytes", "--max-regression", "0", "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["regression_pct"] == 0.0

    assert main(["gate", "compare", n, b, "--metric", "/probe/*", "--max-regression", "5"]) == 2
    assert "without '*'" in capsys.readouterr().err
    assert main(["gate", "compare", n, b, "--metric", "/probe/cpu_count", "--max-regression", "-1"]) == 2
    assert "finite percentage >= 0" in capsys.readouterr().err
    assert (
        main(["gate", "compare", n, str(tmp_path / "absent.json"), "--metric", "/x", "--max-regression", "5"])
        == 2
    )
    assert "cannot read report" in capsys.readouterr().err


def test_installed_kakeya_gate_check_subprocess(tmp_path, report):
    exe = ROOT / ".venv" / "bin" / "kakeya"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "bridge.cli"]
    checks = write(tmp_path / "checks.yaml", "- {check: min, path: /probe/cpu_count, value: 5}\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def kakeya(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*cmd, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
        )

    proc = kakeya("gate", "check", str(report), "--checks", str(checks))
    assert proc.returncode == 1, proc.stderr
    assert "| ✗ | min | 4 | ≥ 5 | `/probe/cpu_count` |" in proc.stdout
    n, b = _metric_reports(tmp_path, 100, 100)
    proc = kakeya("gate", "compare", n, b, "--metric", "/probe/memory_bytes", "--max-regression", "1")
    assert proc.returncode == 0, proc.stderr
    assert "**Compare: ✓ pass**" in proc.stdout
