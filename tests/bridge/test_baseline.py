"""A preset's `baseline: {from: previous-pass, ...}`: the runner compares each report with the last passing run
of the same preset and runner label on the bus, records the comparison in verdict.json and fails a regression.
Real runs through `kakeya run` (request, in-process runner, results) on the embedded bus."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from bridge import evidence as E
from bridge.bus.bus import Bus
from bridge.bus.records import done_ref, new_id, results_path
from bridge.cli.main import main
from bridge.config import load_config
from bridge.core.errors import InvalidRequest
from bridge.core.result import RunContext
from bridge.presets.registry import load_preset_file, load_registry
from bridge.run.execute import run_preset
from bridge.wire import git as G
from tests.bridge.bus_support import WRITE_REPORT_PY, Env, git

# Writes a probe report whose /probe/memory_bytes is the metric and whose /probe/cpu_count passes the gate
# (>= 2) only when `ok` is true.
BENCH_PY = WRITE_REPORT_PY + textwrap.dedent("""
    with open("bench.json") as fh:  # the code under test decides the metric, as a real change would
        cfg = json.load(fh)
    write_report(cpu_count=2 if cfg["ok"] else 1, memory_bytes=cfg["value"])
""")

BENCH = {
    "name": "bench",
    "description": "a benchmark with a metric that must not regress",
    "runners": ["cpu", "cpu-b"],
    "timeout_s": 60,
    "argv": ["{python}", "bench.py", "{size}"],
    "params": {"size": {"type": "int", "min": 1, "max": 8, "default": 1}},
    "report": {"kind": "probe", "schema_version": 1},
    "gate": [{"check": "min", "path": "/probe/cpu_count", "value": 2}],
    "baseline": {"from": "previous-pass", "metric": "/probe/memory_bytes", "max_regression_pct": 10},
}


@pytest.fixture(name="bench")
def bench_fixture(world: Env, monkeypatch) -> Env:
    (world.presets / "bench.yaml").write_text(yaml.safe_dump(BENCH))
    (world.project / "bench.py").write_text(BENCH_PY)
    git(world.project, "add", "bench.py")
    git(world.project, "commit", "-qm", "bench")
    monkeypatch.setenv("KAKEYA_LABELS", "cpu,cpu-b")
    return world


def run(
    env: Env, capsys, value: int, ok: bool = True, label: str = "cpu", size: int = 1
) -> tuple[int, str, dict, dict]:
    """Commit code whose metric is `value`, then `kakeya run bench` -> (exit code, request id, verdict, result)."""
    (env.project / "bench.json").write_text(json.dumps({"value": value, "ok": ok}))
    git(env.project, "add", "bench.json")
    git(env.project, "commit", "-q", "--allow-empty", "-m", f"metric {value}")
    code = main(["run", "bench", "-p", f"size={size}", "--runner", label])
    line = capsys.readouterr().out.splitlines()[0]
    rid = line.split(":")[0]
    out = env.project / "out" / rid
    return (
        code,
        rid,
        json.loads((out / "verdict.json").read_text()),
        json.loads((out / "result.json").read_text()),
    )


def test_previous_pass_baseline_over_a_series_of_runs(bench: Env, capsys):
    # 1. the first run: nothing to compare with, which is not a failure
    code, first, verdict, result = run(bench, capsys, 100)
    first_subject = result["subject"]
    assert code == 0 and verdict["status"] == "pass" and result["verdict"] == "pass"
    assert verdict["comparison"] is None
    assert verdict["baseline"] == {
        "source": "previous-pass",
        "run": None,
        "subject": None,
        "note": "no previous pass of bench on cpu with these parameters; nothing to compare with",
    }
    summary = (bench.project / "out" / first / "summary.md").read_text()
    assert "Baseline (previous-pass): no previous pass of bench on cpu" in summary

    # 2. within the tolerance: passes, with the comparison recorded
    code, second, verdict, result = run(bench, capsys, 95)
    assert code == 0 and verdict["status"] == "pass"
    assert verdict["baseline"]["run"] == first
    assert verdict["baseline"]["subject"] == first_subject != result["subject"]
    c = verdict["comparison"]
    assert (c["status"], c["metric"], c["new"], c["base"], c["regression_pct"]) == (
        "pass",
        "/probe/memory_bytes",
        95,
        100,
        pytest.approx(5.0),
    )
    assert "**Compare: ✓ pass**" in (bench.project / "out" / second / "summary.md").read_text()

    # 3. past the tolerance against the last pass (95): the verdict fails, with the reason
    code, third, verdict, result = run(bench, capsys, 80)
    assert code == 1 and verdict["status"] == "fail" and result["verdict"] == "fail"
    assert verdict["baseline"]["run"] == second and verdict["comparison"]["status"] == "fail"
    assert all(ch["status"] == "pass" for ch in verdict["checks"])  # the checks alone would pass
    why = "/probe/memory_bytes: 80 vs baseline 95, 15.79 % worse; exceeds the allowed 10 % regression"
    assert result["reason"] == f"regression: {why}"
    summary = (bench.project / "out" / third / "summary.md").read_text()
    assert (
        summary.startswith("# bench: ran, gate failed\n")
        and why in summary
        and "**Compare: ✗ fail**" in summary
    )
    page = (bench.project / "out" / third / "report.html").read_text()
    assert "<title>bench: ran, gate failed</title>" in page and "verdict fail" not in page
    # the done commit on the bus says the same
    bus = Bus(str(bench.project / ".kakeya" / "bus.git"), bench.project)
    repo = bus.url
    done = bus.ls_remote(done_ref(third)).refs[done_ref(third)]
    on_bus = json.loads(G.read_path(repo, done, f"{results_path(third)}/verdict.json") or b"")
    assert on_bus["comparison"]["status"] == "fail" and on_bus["status"] == "fail"

    # 4. a run that fails its gate (with a value that would be a fine baseline for nothing below)
    code, fourth, verdict, _ = run(bench, capsys, 1000, ok=False)
    assert code == 1 and verdict["status"] == "fail" and verdict["baseline"]["run"] == second

    # 5. neither the regressed run (3) nor the failing one (4) is a baseline: the last pass is still run 2.
    # Against run 4 (1000) this would be a 91 % regression.
    code, fifth, verdict, fifth_result = run(bench, capsys, 90)
    assert code == 0 and verdict["status"] == "pass"
    assert (verdict["baseline"]["run"], verdict["comparison"]["base"]) == (second, 95)

    # 6. the same preset on another runner label has its own history
    code, _, verdict, _ = run(bench, capsys, 1, label="cpu-b")
    assert (
        code == 0
        and verdict["comparison"] is None
        and "no previous pass of bench on cpu-b" in verdict["baseline"]["note"]
    )

    # 7. a run with other parameters is no baseline for this one (nor this one for them)
    code, _, verdict, _ = run(bench, capsys, 1, size=2)
    assert code == 0 and verdict["comparison"] is None
    assert "no previous pass of bench on cpu with these parameters" in verdict["baseline"]["note"]

    # `kakeya gate pr` computes the comparison itself from the bus (the runner's verdict is not trusted)
    head = fifth_result["subject"]
    assert main(["gate", "pr", "--subject", head, "--require", "bench@cpu", "--json"]) == 0
    [o] = json.loads(capsys.readouterr().out)
    assert o["request_id"] == fifth and o["verdict"]["comparison"]["base"] == 95
    assert o["verdict"]["baseline"]["run"] == second


def test_gate_pr_fails_a_regression_the_runner_did_not_record(bench: Env, capsys):
    """Runs made while the preset had no baseline: adding `baseline:` to the trusted registry applies to them."""
    plain = {k: v for k, v in BENCH.items() if k != "baseline"}
    (bench.presets / "bench.yaml").write_text(yaml.safe_dump(plain))
    assert run(bench, capsys, 100)[0] == 0
    code, rid, verdict, _ = run(bench, capsys, 50)
    assert code == 0 and verdict["baseline"] is None and verdict["comparison"] is None
    (bench.presets / "bench.yaml").write_text(yaml.safe_dump(BENCH))
    head = git(bench.project, "rev-parse", "HEAD")
    assert main(["gate", "pr", "--subject", head, "--require", "bench@cpu"]) == 1
    assert capsys.readouterr().out == (
        f"✗ bench@cpu: fail — {rid}: baseline: /probe/memory_bytes: 50 vs baseline 100, "
        "50 % worse; exceeds the allowed 10 % regression · unsigned (allowed) · accelerator: none · params: size=1\n"
    )


def test_an_unreachable_bus_is_recorded_not_failed(bench: Env, tmp_path: Path):
    """The run's own verdict stands and nothing it produced is lost when the baseline cannot be looked up."""
    preset = load_registry()["bench"]
    out = tmp_path / "out"
    (bench.project / "bench.json").write_text(json.dumps({"value": 7, "ok": True}))
    outcome = run_preset(
        preset,
        preset.validate_params({}),
        bench.project,
        out,
        config=load_config(),
        context=RunContext(request_id=new_id("bench"), runner_labels=["cpu"]),
    )
    assert outcome.result.verdict == "pass"
    bus = Bus(str(tmp_path / "no-such-bus"), G.init_bare(tmp_path / "store"))
    after = E.apply_baseline(bus, preset, "cpu", outcome)
    assert after.result == outcome.result  # the run's own result stands: verdict pass, no reason added
    after.write()
    saved = json.loads((out / "result.json").read_text())
    assert saved["verdict"] == "pass" and saved["reason"] is None
    verdict = json.loads((out / "verdict.json").read_text())
    assert verdict["status"] == "pass" and verdict["comparison"] is None
    assert verdict["baseline"]["note"].startswith("not compared: cannot reach the bus at")
    assert "Baseline (previous-pass): not compared: cannot reach the bus" in (out / "summary.md").read_text()
    # a preset without a baseline is left as it is
    assert E.apply_baseline(bus, load_registry()["work"], "cpu", outcome) is outcome


def test_lower_is_better(bench: Env, capsys):
    data = {**BENCH, "baseline": {**BENCH["baseline"], "higher_is_better": False}}
    (bench.presets / "bench.yaml").write_text(yaml.safe_dump(data))
    assert run(bench, capsys, 5)[0] == 0
    code, _, verdict, result = run(bench, capsys, 7)
    assert code == 1 and verdict["comparison"]["regression_pct"] == pytest.approx(40.0)
    assert result["reason"] == (
        "regression: /probe/memory_bytes: 7 vs baseline 5, 40 % worse; exceeds the allowed 10 % regression"
    )
    code, _, verdict, _ = run(bench, capsys, 3)  # lower than the last pass (5): better
    assert code == 0 and verdict["comparison"]["regression_pct"] == pytest.approx(-40.0)


@pytest.mark.parametrize(
    ("baseline", "message"),
    [
        ({"from": "previous-pass", "metric": "/rungs/*/tok_s", "max_regression_pct": 5}, "no '*'"),
        ({"from": "previous-pass", "metric": "summary/x", "max_regression_pct": 5}, "must be a JSON pointer"),
        ({"from": "previous-pass", "metric": "/x", "max_regression_pct": -1}, "greater than or equal to 0"),
        ({"from": "previous-pass", "metric": "/x", "max_regression_pct": float("nan")}, "finite number"),
        (
            {"from": "main", "metric": "/x", "max_regression_pct": 5},
            "baseline.from: Input should be 'previous-pass'",
        ),
        ({"from": "previous-pass", "metric": "/x"}, "baseline.max_regression_pct: Field required"),
        (
            {"from": "previous-pass", "metric": "/x", "max_regression_pct": 5, "extra": 1},
            "baseline.extra: Extra inputs",
        ),
    ],
)
def test_baseline_is_validated_when_the_preset_is_loaded(tmp_path: Path, baseline: dict, message: str):
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump({**BENCH, "baseline": baseline}))
    with pytest.raises(InvalidRequest, match="preset file .*bench.yaml") as info:
        load_preset_file(path)
    assert message in str(info.value)


def test_a_baseline_is_part_of_the_preset_hash_and_shown(tmp_path: Path):
    with_baseline = tmp_path / "a" / "bench.yaml"
    without = tmp_path / "b" / "bench.yaml"
    for path, data in (
        (with_baseline, BENCH),
        (without, {k: v for k, v in BENCH.items() if k != "baseline"}),
    ):
        path.parent.mkdir()
        path.write_text(yaml.safe_dump(data))
    a, b = load_preset_file(with_baseline), load_preset_file(without)
    assert a.content_hash != b.content_hash
    assert a.summary()["baseline"] == {
        "from": "previous-pass",
        "metric": "/probe/memory_bytes",
        "max_regression_pct": 10.0,
        "higher_is_better": True,
    }
    assert "baseline" not in b.summary()
