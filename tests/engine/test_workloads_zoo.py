"""The workloads on the zoo models, gated with their presets' own checks: the niah gate passes for hybrid
and fails for sink_window (the gate can fail); speculative decoding with the zoo drafter is exact and
accepts more than one token per verifier forward; the compression cross-check matches."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from bridge.presets.registry import load_registry  # noqa: E402
from engine.workloads import compression, niah, throughput  # noqa: E402
from tests.engine.workload_support import gate as _gate  # noqa: E402
from tests.engine.workload_support import run_workload  # noqa: E402

torch.set_num_threads(1)


def _argv(preset: str, params: dict[str, Any], out: Path) -> list[str]:
    """The preset's command line, rendered by the bridge as a runner would (python -m engine.workloads.X ...)."""
    p = load_registry()[preset]
    return p.render_argv(
        p.validate_params(params),
        {"python": sys.executable, "report": str(out), "run_dir": str(out.parent)},
        os.environ,
    )


def test_niah_gate_passes_for_hybrid_and_fails_for_sink_window(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    python, _, module, *args = _argv("niah-smoke", {"contexts": "256", "samples": 1}, out)
    assert python == sys.executable and module == "engine.workloads.niah"
    done = run_workload("niah", *args)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    verdict = _gate(report, "niah-smoke")
    assert verdict.status == "pass", verdict.reasons()
    rung = report["rungs"][0]
    assert rung["needles_evicted"] and rung["oracle"]["recall"] >= 0.8
    assert (
        rung["policies"]["sink_window"]["kv_bytes"]
        < rung["policies"]["hybrid"]["kv_bytes"]
        < rung["oracle"]["kv_bytes"]
    )
    assert (tmp_path / "smoke-recall.png").is_file()

    # The sink_window preset, run as itself: needles outside the window are lost, and its gate says so.
    out = tmp_path / "sink.json"
    argv = _argv("niah-sink-window", {"contexts": "256", "samples": 1}, out)
    assert argv[1:3] == ["-m", "engine.workloads.niah"]
    assert niah.main([*argv[3:], "--plot", "none"]) == 0
    report = json.loads(out.read_text())
    assert list(report["rungs"][0]["policies"]) == ["sink_window"]
    verdict = _gate(report, "niah-sink-window")
    assert verdict.status == "fail" and not verdict.violations
    failed = [c for c in verdict.checks if c.status == "fail"]
    assert [c.path for c in failed] == ["/rungs/*/policies/sink_window/recall_delta"], verdict.reasons()
    assert failed[0].value > 0.05 and "recall_delta" in verdict.reasons()[0]


def test_throughput_with_the_zoo_drafter_is_exact_and_accepts_drafts(tmp_path: Path) -> None:
    out = tmp_path / "tp.json"
    argv = _argv("throughput-code", {"prompts": 2, "new_tokens": 32, "repeats": 1}, out)
    assert throughput.main([*argv[3:], "--plot", "none"]) == 0
    report = json.loads(out.read_text())
    s = report["summary"]
    assert (
        report["config"]["prompt_source"] == "zoo" and report["config"]["drafter"] == "model:zoo:tiny-drafter"
    )
    assert s["all_exact"] and all(p["exact"] for p in report["prompts"])
    assert s["mean_acceptance_length"] > 1.5 and s["acceptance_rate"] > 0.3
    verdict = _gate(report, "throughput-code")
    assert (
        not verdict.violations and [c.status for c in verdict.checks][0] == "pass"
    )  # exactness; speed varies


def test_throughput_with_the_diffusion_drafter_is_exact(tmp_path: Path) -> None:
    out = tmp_path / "dlm.json"
    params = {"drafter": "diffusion:zoo:tiny-dlm:steps=2", "prompts": 2, "new_tokens": 24, "repeats": 1}
    argv = _argv("throughput-code", params, out)
    assert throughput.main([*argv[3:], "--plot", "none"]) == 0
    report = json.loads(out.read_text())
    c, s = report["config"], report["summary"]
    assert c["drafter"] == "diffusion:zoo:tiny-dlm:steps=2" and c["denoise_steps"] == 2
    assert s["all_exact"] and s["mean_acceptance_length"] >= 1.0
    assert sum(p["speculative"]["drafted"] for p in report["prompts"]) > 0
    verdict = _gate(report, "throughput-code")
    assert not verdict.violations and [c.status for c in verdict.checks][0] == "pass"


def test_compression_table_on_the_zoo_models(tmp_path: Path) -> None:
    out = tmp_path / "c.json"
    argv = _argv("compression-table", {"check_lens": "64,256"}, out)
    assert compression.main(argv[3:]) == 0
    report = json.loads(out.read_text())
    assert _gate(report, "compression-table").status == "pass"
    s = report["summary"]
    assert (
        s["checks"] == 2 * 4 and s["check_passed"]
    )  # (full, 2 policies, the drafter's sink_window) x 2 lengths
    assert (
        s["policies"]["sink_window"]["max_compression_ratio"]
        > 100
        > s["policies"]["hybrid"]["max_compression_ratio"]
    )
    assert len(report["table"]) == 2 * 3 * 5
