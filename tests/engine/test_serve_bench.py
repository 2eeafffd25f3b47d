"""The serving workload (the serve-bench preset) on the zoo's hybrid model: a real server in the run's
process, driven at two concurrencies; the report passes its schema and the preset's gate, and a
min_tok_s out of reach fails the gate on that check alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.engine.workload_support import gate, run_workload

SMALL = ["--concurrency", "1,4", "--rounds", "1", "--prompts", "4", "--prompt-tokens", "16"]
SMALL += ["--new-tokens", "8", "--policy", "sink_window:4:16", "--threads", "1"]


@pytest.mark.slow  # a subprocess that imports torch and serves: about 10 s on an idle 2-core machine
def test_serve_bench_report_passes_its_gate(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    done = run_workload("serving", *SMALL, "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 4]
    assert all(lv["exact"] and lv["failed"] == 0 and lv["output_tokens"] > 0 for lv in report["levels"])
    s = report["summary"]
    assert s["exact"] and s["kv_bounded"] and 0 < s["kv_bytes_held_max"] <= s["kv_budget"]
    assert s["kv_bytes_per_sequence"] > 0 and s["join"] == "rows join the running batch"
    assert gate(report, "serve-bench").status == "pass"
    report["summary"].update(min_tok_s=1e9, tok_s_ok=False)  # as a run that missed it reads
    verdict = gate(report, "serve-bench")
    assert verdict.status == "fail"
    assert [c.path for c in verdict.checks if c.status == "fail"] == ["/summary/tok_s_ok"]
    assert "output tok/s" in done.stdout or "tok/s" in done.stdout
