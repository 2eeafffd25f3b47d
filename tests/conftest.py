"""Every test runs as on a fresh machine: git reads no global or system configuration (no identity, no
credential helpers, no `safe.directory`), whatever the host has. A test that needs an identity sets its own."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_EMPTY = os.path.join(tempfile.mkdtemp(prefix="kakeya-gitconfig-"), "gitconfig")
open(_EMPTY, "w").close()
os.environ["GIT_CONFIG_GLOBAL"] = _EMPTY
os.environ["GIT_CONFIG_NOSYSTEM"] = "1"

# --- the lanes: `make test` runs everything; `make test-fast` deselects `-m "not integration"` ---------------

# The integration test files: each brings up Slurm, sshd, act, bubblewrap sandboxes, many runner processes,
# or runs the engine's zoo models end to end, and takes a quarter of a minute or more (out/test-durations.txt,
# summed over its tests). Every test in them is marked `integration`; the fast lane runs the rest (the unit
# tests and the quick integration tests) in under 3 minutes on two cores. A file that grows slow goes here;
# tests/test_lanes.py checks every name still exists, so a rename cannot quietly move a file into the fast lane.
INTEGRATION = frozenset(
    {
        # Slurm, sshd, act, bubblewrap sandboxes, real runner processes against a real bus
        "bridge/test_slurm.py",
        "bridge/test_bus_ssh.py",
        "test_act.py",
        "test_act_regressions.py",
        "test_workflows.py",
        "test_setup_runner.py",
        "test_client_install.py",
        "bridge/test_sandbox.py",
        "bridge/test_limits.py",
        "bridge/test_isolation.py",
        "bridge/test_hostile_output.py",
        "bridge/test_hostile_reads.py",
        "bridge/test_hostile_text.py",
        "bridge/test_runner.py",
        "bridge/test_progress.py",
        "bridge/test_real_path.py",
        "bridge/test_trust.py",
        "bridge/test_bus_ledger.py",
        "bridge/test_bus_layout.py",
        "bridge/test_client.py",
        "bridge/test_bisect.py",
        "bridge/test_gate_pr.py",
        "bridge/test_ops.py",
        "bridge/test_mcp.py",
        "bridge/test_live_logs.py",
        "bridge/test_report_tables.py",
        # the engine end to end: the zoo's models, compiled forwards, batches, drafters, the model families against
        # transformers and mlx-lm, kakeya serve under 200 clients, the GPU script
        "engine/test_speculative_batch.py",
        "engine/test_batch.py",
        "engine/test_sampling.py",
        "engine/test_speculative.py",
        "engine/test_mamba2.py",
        "engine/test_diffusion.py",
        "engine/test_block_drafter_mlx.py",
        "engine/test_block_drafter.py",
        "engine/test_cache.py",
        "engine/test_gpu_acceptance.py",
        "engine/test_zoo.py",
        "engine/test_workloads_zoo.py",
        "engine/test_linear.py",
        "engine/test_model_matrix.py",
        "engine/test_serve.py",
    }
)
_TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.relative_to(_TESTS).as_posix() in INTEGRATION:
            item.add_marker(pytest.mark.integration)


# --- durations: every test's setup + call + teardown, written where `make test` prints them ------------------

_DURATIONS: dict[str, float] = {}


def pytest_runtest_logreport(report) -> None:  # type: ignore[no-untyped-def]
    """Called in the controller for every phase of every test (xdist workers' reports included)."""
    _DURATIONS[report.nodeid] = _DURATIONS.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus) -> None:  # type: ignore[no-untyped-def]
    """`KAKEYA_TEST_DURATIONS=FILE`: each test's seconds, slowest first, then each file's total."""
    path = os.environ.get("KAKEYA_TEST_DURATIONS")
    if not path or hasattr(session.config, "workerinput") or not _DURATIONS:
        return
    files: dict[str, float] = {}
    for nodeid, seconds in _DURATIONS.items():
        files[nodeid.split("::")[0]] = files.get(nodeid.split("::")[0], 0.0) + seconds
    lines = [f"# {len(_DURATIONS)} tests, {sum(_DURATIONS.values()):.1f} s in all (summed over workers)"]
    lines += ["# files, slowest first"] + [
        f"{s:8.1f}  {f}" for f, s in sorted(files.items(), key=lambda x: -x[1])
    ]
    lines += ["# tests, slowest first"] + [
        f"{s:8.2f}  {n}" for n, s in sorted(_DURATIONS.items(), key=lambda x: -x[1])
    ]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as out:
        out.write("\n".join(lines) + "\n")
