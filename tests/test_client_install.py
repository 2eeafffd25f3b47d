"""The client installs anywhere: the wheel, built from this checkout, installed (not editable) into a fresh venv
that has no torch or mlx, requests, shows status, fetches results and gates them against a bare repository,
with the presets of the checkout it runs in; outside any checkout it uses the presets installed with it.

Offline and quick: the wheel is built with --no-build-isolation (setuptools of this venv) and installed with
--no-index --no-deps; its dependencies (pydantic, PyYAML, jsonschema, rich and theirs, nothing else) are made
importable in the fresh venv by a .pth file over links to exactly those distributions of this venv. The MCP SDK
is the extra `kakeya[mcp]`: not in a client install, and `kakeya mcp` says in one line how to add it."""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from bridge.config import load_config
from bridge.run.runner import Runner
from bridge.wire import git as G
from engine.models import zoo_models
from tests.bridge.bus_support import WORK_PY, git

ROOT = Path(__file__).resolve().parent.parent
DEPS = ("pydantic", "PyYAML", "jsonschema", "rich")


def closure(names: tuple[str, ...]) -> set[str]:
    """The installed distributions `names` need (them included), for this platform and Python, with the
    extras a requirement names (pyjwt[crypto]: cryptography too)."""
    seen: set[tuple[str, str]] = set()
    todo = [(name, "") for name in names]
    while todo:
        name, extra = todo.pop()
        dist = md.distribution(name)
        key = (dist.metadata["Name"].lower(), extra)
        if key in seen:
            continue
        seen.add(key)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo += [(req.name, "")] + [(req.name, e) for e in req.extras]
    return {name for name, _ in seen}


def link_deps(target: Path) -> None:
    """Links in `target` to the files of the dependency closure (top-level packages, modules, dist-info)."""
    target.mkdir()
    for name in closure(DEPS):
        dist = md.distribution(name)
        for f in dist.files or []:
            top = f.parts[0]
            src = Path(str(dist.locate_file(top)))
            if top not in ("..", "__pycache__") and src.exists() and not (target / top).exists():
                (target / top).symlink_to(src)


@pytest.mark.slow
def test_the_wheel_alone_requests_shows_fetches_and_gates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    started = time.monotonic()
    # 1. the wheel, from this checkout's files (copied: a build writes build/ and *.egg-info next to them)
    src = tmp_path / "src"
    files = git(ROOT, "ls-files", "-co", "--exclude-standard", "-z").split("\0")
    for rel in filter(None, files):
        if (ROOT / rel).is_file() and not rel.startswith(".venv"):
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / rel, src / rel)
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    built = subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        check=True,
        capture_output=True,
        text=True,
    )
    assert "Warning" not in built.stdout + built.stderr, built.stderr  # `make demo` shows no setuptools flood
    (wheel,) = wheels.glob("kakeya-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    metadata = zipfile.ZipFile(wheel).read(f"{wheel.name.split('-')[0]}-0.1.0.dist-info/METADATA").decode()
    core = [
        line for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert [Requirement(line.split(":", 1)[1]).name for line in core] == list(DEPS)  # no mcp: an extra
    assert 'Requires-Dist: mcp<3,>=2.3; extra == "mcp"' in metadata
    # no zoo weights in a client install; the engine's C kernel source and the presets are there
    assert not [n for n in names if n.startswith("engine/zoo/models/") or n.endswith(".safetensors")]
    assert "engine/backends/torch/kv_kernels.c" in names and "kakeya_presets/niah-smoke.yaml" in names
    # the engine extras' editable install (`make`, setup-runner.sh; the engine tests) reads them from here
    assert {"tiny-hybrid", "tiny-drafter"} <= set(zoo_models())
    # 2. a fresh venv: the wheel, and links to its dependencies only
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(
        subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    link_deps(tmp_path / "deps")
    (site / "kakeya-deps.pth").write_text(str(tmp_path / "deps") + "\n")
    pip_lib = Path(sysconfig.get_paths()["purelib"])  # this venv's pip runs the install into the fresh venv
    subprocess.run(
        [*pip, "--python", str(py), "install", "--no-index", "--no-deps", str(wheel)],
        check=True,
        env={**os.environ, "PYTHONPATH": str(pip_lib)},
    )
    installed = time.monotonic() - started
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("KAKEYA_", "PYTHON", "VIRTUAL_ENV", "GIT_"))
    }
    env.update(
        PATH=f"{venv / 'bin'}:{env.get('PATH', '')}",
        GIT_AUTHOR_NAME="T",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="T",
        GIT_COMMITTER_EMAIL="t@example.com",
    )

    def kakeya(cwd: Path, *args: str, code: int = 0) -> str:
        proc = subprocess.run(
            [venv / "bin" / "kakeya", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
        )
        assert proc.returncode == code, proc.stdout + proc.stderr
        return proc.stdout

    probe = subprocess.run(
        [
            py,
            "-c",
            "import bridge, importlib.util as u; "
            "print(bridge.__file__, u.find_spec('torch'), u.find_spec('mlx'), u.find_spec('mcp'))",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert probe[0].startswith(str(site)) and probe[1:] == ["None"] * 3  # not editable; no torch, mlx, mcp

    # 3. a project with its own presets/, and a bare bus
    project = tmp_path / "project"
    (project / "presets").mkdir(parents=True)
    preset = {
        "name": "hello",
        "description": "the project's own preset",
        "runners": ["cpu"],
        "timeout_s": 60,
        "argv": ["{python}", "work.py", "count", "{tag}", "0"],
        "params": {"tag": {"type": "str", "pattern": "[a-z]+", "max_length": 10, "default": "x"}},
        "env": {"COUNTER": str(tmp_path / "counter"), "MARKS": str(tmp_path)},
        "report": {"kind": "probe", "schema_version": 1},
        "gate": [{"check": "min", "path": "/probe/cpu_count", "value": 1}],
    }
    (project / "presets" / "hello.yaml").write_text(yaml.safe_dump(preset))
    (project / "work.py").write_text(WORK_PY)
    (project / ".gitignore").write_text("/out/\n")
    git(project, "init", "-q", "-b", "main")
    git(project, "add", "-A")
    git(project, "-c", "user.name=T", "-c", "user.email=t@e", "commit", "-qm", "project")
    bus = str(G.init_bare(tmp_path / "bus.git"))

    assert "hello" in kakeya(project, "presets")
    proc = subprocess.run(
        [venv / "bin" / "kakeya", "mcp", "--project", str(project)],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and proc.stderr.splitlines() == [
        "kakeya: error: the MCP server needs the MCP SDK: pip install 'kakeya[mcp]'"
    ], proc.stderr
    doctor = kakeya(project, "doctor", "--remote", bus)
    assert "all checks passed" in doctor and "1 valid: hello" in doctor
    # no numpy/torch here: the engine is named as not installed (what to install for its presets), not a failure
    assert "engine   not installed here (no numpy)" in doctor and "kakeya[torch]" in doctor
    rid = kakeya(project, "request", "hello", "-p", "tag=abc", "--runner", "cpu", "--remote", bus).split()[0]
    assert re.fullmatch(r"\d{8}T\d{6}\.\d{3}Z-hello-[0-9a-f]{6}", rid), rid
    assert "requested" in kakeya(project, "status", rid, "--remote", bus)
    # a runner (this venv, in process) with the same preset serves it
    monkeypatch.setenv("KAKEYA_PRESETS", str(project / "presets"))
    runner = Runner(bus, config=load_config(project), name="r1", labels=["cpu"], workdir=tmp_path / "runner")
    served = runner.once(request_id=rid)
    assert served is not None and served.pushed and served.verdict == "pass"
    assert "succeeded" in kakeya(project, "status", rid, "--remote", bus)
    kakeya(project, "results", rid, "--remote", bus, "--out", str(tmp_path / "res"))
    assert f"{rid}: hello succeeded" in kakeya(project, "wait", rid, "--remote", bus)  # rich is installed
    assert "pass" in kakeya(
        project, "gate", "check", str(tmp_path / "res" / rid / "report.json"), "--preset", "hello"
    )
    # outside any checkout: the presets installed with the package
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    listed = kakeya(outside, "presets")
    assert "probe" in listed and "niah-smoke" in listed and "hello" not in listed
    # an engine preset here: refused before anything starts, in one line naming the extra (nothing written)
    proc = subprocess.run(
        [venv / "bin" / "kakeya", "exec", "niah-smoke"], cwd=outside, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "kakeya: error: preset niah-smoke runs the engine (engine.workloads.niah), which this install lacks "
        "(no numpy): pip install 'kakeya[torch]' (or 'kakeya[mlx]')"
    ], proc.stderr
    assert list(outside.iterdir()) == []
    print(f"client-only install: {installed:.1f} s (wheel build + venv + install)")
