"""Fixtures shared by the bridge tests: `world` (a committed project with test presets; cwd = the project)
`daemon` (`git daemon` serving bare repositories) and `httpgit` (the same over smart HTTP). Helpers live in bus_support.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.bridge.bus_support import PRESETS, WORK_PY, Daemon, Env, HttpGit, git


@pytest.fixture(name="world")
def world_fixture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Env:
    """A committed project with work.py, test presets, fast leases and polls; cwd = the project."""
    env = Env(tmp_path)
    env.presets.mkdir()
    for name, data in PRESETS.items():
        (env.presets / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, **data}))
    env.marks.mkdir()
    env.project.mkdir()
    for var in list(os.environ):
        if var.startswith("KAKEYA_"):
            monkeypatch.delenv(var)
    for key, value in {
        "KAKEYA_PRESETS": str(env.presets),
        "KAKEYA_TEST_COUNTER": str(env.counter),
        "KAKEYA_TEST_MARKS": str(env.marks),
        "KAKEYA_POLL_INTERVAL": "0.2",
        "KAKEYA_LEASE": "3",
        "KAKEYA_RUNNER_NAME": "inproc",
        # The test programs count runs in files under tmp, outside any sandbox: isolation none, by name
        # (tests/bridge/test_sandbox.py runs the default, auto, and every isolation the host offers).
        "KAKEYA_ISOLATION": "none",
        # ... which a root runner refuses (its runs would be root): CI runs the tests as root, so the suite
        # says by this variable, its own, that its trusted programs may run as root (isolation.ROOT_RUNS_FOR_TESTS)
        "KAKEYA_TEST_ROOT_RUNS": "1",
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "OMP_NUM_THREADS": "1",
    }.items():
        monkeypatch.setenv(key, value)
    (env.project / "work.py").write_text(WORK_PY)
    (env.project / ".gitignore").write_text("/out/\n")
    git(env.project, "init", "-q", "-b", "main")
    git(env.project, "add", "-A")
    git(env.project, "commit", "-q", "-m", "project")
    monkeypatch.chdir(env.project)
    return env


@pytest.fixture(name="daemon")
def daemon_fixture(tmp_path: Path) -> Iterator[Daemon]:
    d = Daemon(tmp_path / "served").start()
    yield d
    d.stop()


@pytest.fixture(name="httpgit")
def httpgit_fixture(tmp_path: Path) -> Iterator[HttpGit]:
    h = HttpGit(tmp_path / "http")
    yield h
    h.stop()
