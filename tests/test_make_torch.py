"""`make torch` and the install recipe (run by `make demo`/`make test` on a fresh machine): the CPU build of torch
on a Linux host without a GPU, asked of the PyTorch CPU index ONCE (torch alone, a short timeout, no retries,
its errors not shown), the package registry's wheel when that index cannot be reached, and everything else
from the registry only; every pip call quiet. A fake `python` records each pip call."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
INDEX = "http://127.0.0.1:9/cpu"
CPU = f"-m pip install -q --no-deps --timeout 15 --retries 0 torch==2.13.0 --index-url {INDEX}"


def make(tmp_path: Path, target: str, index_up: bool) -> tuple[subprocess.CompletedProcess, list[str]]:
    calls = tmp_path / "calls"
    fake_py = (
        tmp_path / "python"
    )  # records each pip call and pip's version-check setting; the index is up or not
    fake_py.write_text(
        f'#!/bin/sh\necho "$@ [$PIP_DISABLE_PIP_VERSION_CHECK]" >> {calls}\n'
        + (
            "exit 0\n"
            if index_up
            else 'case "$*" in *--index-url*) echo "WARNING: Retrying (Retry(total=0))" >&2; exit 1 ;; esac\n'
            "exit 0\n"
        )
    )
    fake_py.chmod(0o755)
    bindir = tmp_path / "bin"  # make, sh, uname, test and touch, but no nvidia-smi
    bindir.mkdir()
    for tool in ("make", "sh", "uname", "cat", "test", "touch"):
        (bindir / tool).symlink_to(shutil.which(tool) or tool)
    venv = tmp_path / "venv"
    venv.mkdir()
    proc = subprocess.run(
        ["make", "-s", "-C", str(ROOT), target, f"PY={fake_py}", f"VENV={venv}", f"TORCH_CPU_INDEX={INDEX}"],
        env={"PATH": str(bindir), "HOME": os.environ.get("HOME", "/")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = calls.read_text().splitlines()
    assert all(line.endswith(" [1]") for line in lines), lines  # no "a new pip is available" notice
    return proc, [line.removesuffix(" [1]") for line in lines]


@pytest.mark.skipif(platform.system() != "Linux", reason="the CPU build is chosen on Linux")
@pytest.mark.parametrize("index_up", [True, False])
def test_make_torch_takes_the_cpu_build_and_falls_back_to_the_registry(tmp_path: Path, index_up: bool):
    proc, lines = make(tmp_path, "torch", index_up)
    assert lines[0] == CPU
    if index_up:
        assert lines == [CPU]
        assert proc.stdout == proc.stderr == ""
    else:
        assert lines[1:] == ["-m pip install -q torch==2.13.0"]
        # one line says so; pip's retries and errors for the index are not shown
        assert proc.stdout.strip().splitlines() == [
            f"the PyTorch CPU index ({INDEX}) is not reachable: torch from the package registry"
        ]
        assert "Retrying" not in proc.stdout + proc.stderr


@pytest.mark.skipif(platform.system() != "Linux", reason="the CPU build is chosen on Linux")
@pytest.mark.parametrize("index_up", [True, False])
def test_make_install_asks_the_cpu_index_once_and_everything_else_of_the_registry(
    tmp_path: Path, index_up: bool
):
    proc, lines = make(tmp_path, "install", index_up)
    assert [line for line in lines if "index-url" in line or "extra-index" in line] == [
        CPU
    ]  # once, torch alone
    assert lines[0] == "-m pip install -q --upgrade pip"
    assert lines[-1] == "-m pip install -q -e .[torch,mlx,mcp,dev]"  # the registry: torch's own deps too
    assert all(" -q " in f" {line} " for line in lines), lines
    said = proc.stdout.strip().splitlines()
    assert said[-1] == "installing kakeya and its dependencies (a few minutes on a fresh machine)"
    assert len(said) == (1 if index_up else 2), said


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
