"""The three boundaries: bridge never imports engine (nor torch/mlx: a client installs neither), engine
never imports bridge, gates imports neither.

Checked twice: by importing every module of a package (found with pkgutil, so new modules are covered)
in a clean interpreter and looking at what landed in sys.modules, and statically, so that an import
inside a function, which importing the module does not run, cannot cross a boundary either.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "mlx", "mlx_lm", "transformers")
FORBIDDEN = {
    "bridge": ("engine", *HEAVY),
    "engine": ("bridge",),
    "gates": ("engine", "bridge", *HEAVY),
}
# Modules every walk must find: a walk that finds nothing would assert nothing.
KNOWN = {
    "bridge": {"bridge", "bridge.cli", "bridge.commands.gate", "bridge.presets"},
    "engine": {"engine", "engine.policy", "engine.speculative", "engine.workloads.niah", "engine.zoo"},
    "gates": {"gates", "gates.evaluate", "gates.verdict", "gates.checks", "gates.report", "gates.compare"},
}

# Run in a fresh interpreter: import each module of PACKAGE in turn and record which forbidden top-level
# packages each one newly loaded. A module that needs an optional library this install lacks is listed
# under "missing" (the modules it did load are still checked).
_PROBE = r"""
import importlib, json, pkgutil, sys
package, forbidden = sys.argv[1], tuple(sys.argv[2].split(","))

def loaded():
    return {m.split(".")[0] for m in sys.modules} & set(forbidden)

assert not loaded(), f"loaded before importing anything: {sorted(loaded())}"
root = importlib.import_module(package)
names = [package] + [m.name for m in pkgutil.walk_packages(root.__path__, package + ".", onerror=lambda n: None)]
offenders, missing, before = {}, {}, set(loaded())
for name in names:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in ("bridge", "engine", "gates"):
            raise
        missing[name] = str(exc)
    now = loaded()
    if now - before:
        offenders[name] = sorted(now - before)
    before = now
print(json.dumps({"modules": names, "offenders": offenders, "missing": missing, "file": root.__file__}))
"""


def probe(package: str, pythonpath: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=pythonpath, OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, package, ",".join(FORBIDDEN[package])],
        capture_output=True,
        text=True,
        env=env,
        cwd=pythonpath.split(os.pathsep)[0],
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_importing_every_module_crosses_no_boundary(package: str) -> None:
    found = probe(package, str(ROOT))
    assert Path(found["file"]).is_relative_to(ROOT / package), found["file"]  # this checkout's code
    assert KNOWN[package] <= set(found["modules"]), sorted(KNOWN[package] - set(found["modules"]))
    assert set(found["missing"]) <= {"engine.backends.mlx"}, found["missing"]  # only the optional backend
    assert found["offenders"] == {}, (
        f"importing these {package} modules loads what {package} must never import: {found['offenders']}"
    )


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import statement in a file, at any depth (functions included)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module))
    return out


def crossings(root: Path, package: str) -> list[str]:
    """Every import statement in the package's files that names what the package must never import."""
    files = sorted((root / package).rglob("*.py"))
    assert len(files) >= len(KNOWN[package]) - 1, files  # the walk found the package's files
    return [
        f"{path.relative_to(root)}:{line} imports {name}"
        for path in files
        for line, name in imports_of(path)
        if name.split(".")[0] in FORBIDDEN[package]
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_import_statement_crosses_a_boundary(package: str) -> None:
    assert crossings(ROOT, package) == []


@pytest.mark.parametrize(
    ("package", "planted", "crossing"),
    [
        ("gates", "import engine.policy\n", "engine"),
        ("engine", "from bridge import errors\n", "bridge"),
        ("bridge", "from engine.workloads import cli\n", "engine"),
        ("bridge", "import torch\n", "torch"),
    ],
)
def test_the_checks_catch_a_planted_import(tmp_path: Path, package: str, planted: str, crossing: str) -> None:
    """A copy of the package with one new module that crosses the boundary: both checks name it."""
    copy = tmp_path / package
    shutil.copytree(ROOT / package, copy, ignore=shutil.ignore_patterns("__pycache__", "models"))
    (copy / "zz_planted.py").write_text(planted)
    found = probe(package, os.pathsep.join([str(tmp_path), str(ROOT)]))
    assert Path(found["file"]).is_relative_to(tmp_path)  # the copy is what was imported
    assert found["offenders"].get(f"{package}.zz_planted") == [crossing], found["offenders"]
    assert crossings(tmp_path, package) == [f"{package}/zz_planted.py:1 imports {planted.split()[1]}"]
