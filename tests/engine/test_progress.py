"""engine/progress.py: a workload tells a runner how far it got through KAKEYA_PROGRESS, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.progress import report_progress
from engine.workloads import niah


def test_report_progress_writes_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAKEYA_PROGRESS", raising=False)
    monkeypatch.chdir(tmp_path)
    report_progress(1, 2, "rung 1 of 2")
    assert list(tmp_path.iterdir()) == []
    target = tmp_path / "progress.json"
    monkeypatch.setenv("KAKEYA_PROGRESS", str(target))
    report_progress(3, 5, "rung 3 of 5" + "x" * 500)
    data = json.loads(target.read_text())
    assert (data["done"], data["total"], len(data["what"])) == (3, 5, 200)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.json"]  # written atomically
    monkeypatch.setenv("KAKEYA_PROGRESS", str(tmp_path / "missing-dir" / "p.json"))
    report_progress(1, 1)  # cannot write: never fails the workload


def test_niah_reports_its_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "progress.json"
    monkeypatch.setenv("KAKEYA_PROGRESS", str(target))
    argv = ["--model", "zoo:tiny-hybrid", "--policy", "sink_window:2:8", "--contexts", "32,64"]
    assert niah.main([*argv, "--samples", "1", "--out", str(tmp_path / "niah.json")]) == 0
    data = json.loads(target.read_text())
    assert data["done"] == data["total"] > 1 and data["what"].startswith("niah gen ")
