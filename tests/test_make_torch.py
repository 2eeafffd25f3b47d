"""`make torch` (run by `make demo`/`make test` on a fresh machine): the CPU build of torch on a Linux host
without a GPU, and the package registry's wheel when the PyTorch CPU index cannot be reached."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.skipif(platform.system() != "Linux", reason="the CPU build is chosen on Linux")
@pytest.mark.parametrize("index_up", [True, False])
def test_make_torch_takes_the_cpu_build_and_falls_back_to_the_registry(tmp_path: Path, index_up: bool):
    calls = tmp_path / "calls"
    fake_py = tmp_path / "python"  # records each pip call; the CPU index is up or not
    fake_py.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n'
        + ("exit 0\n" if index_up else 'case "$*" in *--index-url*) exit 1 ;; esac\nexit 0\n')
    )
    fake_py.chmod(0o755)
    bindir = tmp_path / "bin"  # make, sh and uname, but no nvidia-smi
    bindir.mkdir()
    for tool in ("make", "sh", "uname", "cat"):
        (bindir / tool).symlink_to(shutil.which(tool) or tool)
    proc = subprocess.run(
        ["make", "-s", "-C", str(ROOT), "torch", f"PY={fake_py}", "TORCH_CPU_INDEX=http://127.0.0.1:9/cpu"],
        env={"PATH": str(bindir), "HOME": os.environ.get("HOME", "/")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = calls.read_text().splitlines()
    cpu = "-m pip install -q --timeout 20 --retries 1 torch==2.13.0 --index-url http://127.0.0.1:9/cpu"
    assert lines[0] == cpu
    if index_up:
        assert lines == [cpu]
    else:
        assert lines[1:] == ["-m pip install -q torch==2.13.0"]
        assert "not reachable" in proc.stdout


@pytest.mark.skipif(platform.system() != "Linux", reason="bubblewrap is a Linux sandbox")
@pytest.mark.skipif(os.geteuid() != 0, reason="make installs system packages only as root")
def test_make_test_installs_bubblewrap_on_a_fresh_machine(tmp_path: Path):
    """`make test` alone (not only .ci/run) installs the sandbox the tests and the default runner need: a fresh
    machine without bwrap gets it from apt, one that has it runs no apt."""
    calls = tmp_path / "calls"
    bindir = tmp_path / "bin"  # make, sh, uname and id, a recording apt-get, and no bwrap
    bindir.mkdir()
    for tool in ("make", "sh", "uname", "id"):
        (bindir / tool).symlink_to(shutil.which(tool) or tool)
    (bindir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bindir / "apt-get").chmod(0o755)
    env = {"PATH": str(bindir), "HOME": os.environ.get("HOME", "/")}
    dry = subprocess.run(["make", "-n", "-C", str(ROOT), "test"], env=env, capture_output=True, text=True)
    assert "bubblewrap" in dry.stdout, "the test target does not install bubblewrap"
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "bwrap"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "install -y -qq --no-install-recommends bubblewrap" in calls.read_text()
    calls.unlink()
    (bindir / "bwrap").symlink_to("/bin/true")
    proc = subprocess.run(["make", "-s", "-C", str(ROOT), "bwrap"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0 and not calls.exists()
