"""scripts/gpu-acceptance.sh on the cpu (QUICK sizes, the engine tests skipped: they run in this suite):
the workloads pass their presets' gates and the decode benchmark writes its JSON with the device name and
the fraction of the measured bandwidth; a device it does not know is refused before anything runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-acceptance.sh"


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "OUT": str(tmp_path / "reports"),
        "QUICK": "1",
        "SKIP_TESTS": "1",
        "BENCH_OUT": str(tmp_path / "bench.json"),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=600)


def test_the_script_passes_on_the_cpu_and_writes_the_benchmark(tmp_path: Path) -> None:
    done = _run(["cpu"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpu-acceptance: passed on cpu (cpu)" in done.stdout
    bench = json.loads((tmp_path / "bench.json").read_text())
    assert bench["device"].startswith("cpu") and bench["reference"] == "measured"
    assert bench["peak_bytes_s"] is None and bench["measured_bytes_s"] > 0
    assert 0 < bench["fraction_of_measured"] < 1 and bench["decode_tok_s"] > 0
    assert bench["bytes_per_token"] == bench["weight_bytes"] + bench["mean_kv_bytes"]
    tp = json.loads((tmp_path / "reports" / "throughput-cpu.json").read_text())
    assert tp["config"]["device"] == "cpu" and all(p["digests"] for p in tp["prompts"])


def test_an_unknown_device_is_refused_first(tmp_path: Path) -> None:
    done = _run(["cuda;rm -rf /"], tmp_path)
    assert done.returncode == 2 and "device must be auto, cpu, cuda, cuda:N or mps" in done.stderr
    assert not (tmp_path / "reports").exists()
