"""Every test runs as on a fresh machine: git reads no global or system configuration (no identity, no
credential helpers, no `safe.directory`), whatever the host has. A test that needs an identity sets its own."""

from __future__ import annotations

import os
import tempfile

_EMPTY = os.path.join(tempfile.mkdtemp(prefix="kakeya-gitconfig-"), "gitconfig")
open(_EMPTY, "w").close()
os.environ["GIT_CONFIG_GLOBAL"] = _EMPTY
os.environ["GIT_CONFIG_NOSYSTEM"] = "1"

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
