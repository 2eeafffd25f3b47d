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
from collections.abc import Iterator, Mapping, Sequence
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
    "bridge": {"bridge", "bridge.cli", "bridge.cli.commands.gate", "bridge.presets.preset"},
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
        ("engine", "from bridge.core import errors\n", "bridge"),
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


# --- the bridge's layers ---------------------------------------------------------------------------------


def layer_of(module: str) -> int | None:
    """The index in bridge.LAYERS of a bridge module (bridge.X or bridge.X.*); None for the package itself."""
    from bridge import LAYERS

    parts = module.split(".")
    if parts[0] != "bridge" or len(parts) == 1:
        return None
    return next((i for i, names in enumerate(LAYERS) if parts[1] in names), -1)


def upward_imports(root: Path) -> list[str]:
    """Every import statement in bridge/ (at any depth) that names a module of a higher layer, or a bridge
    module in no layer."""
    out = []
    for path in sorted((root / "bridge").rglob("*.py")):
        mine = layer_of(module_name(root, path))
        if mine is None:
            continue
        for line, name in imports_of(path):
            theirs = layer_of(name)
            if theirs is not None and (theirs > mine or theirs < 0):
                out.append(f"{path.relative_to(root)}:{line} imports {name}")
    return out


def test_every_bridge_module_is_in_a_layer_and_imports_none_above_it() -> None:
    from bridge import LAYERS

    folders = {p.name for p in (ROOT / "bridge").iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in (ROOT / "bridge").glob("*.py") if p.stem != "__init__"}
    assert folders | modules == {name for names in LAYERS for name in names}  # every layer, nothing else
    assert upward_imports(ROOT) == []


def test_an_import_running_back_up_a_layer_is_named(tmp_path: Path) -> None:
    copy = tmp_path / "bridge"
    shutil.copytree(ROOT / "bridge", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "bus" / "zz_up.py").write_text("def f():\n    from bridge.client import follow\n")
    (copy / "core" / "zz_nowhere.py").write_text("import bridge.zz_nowhere\n")
    assert upward_imports(tmp_path) == [
        "bridge/bus/zz_up.py:2 imports bridge.client",
        "bridge/core/zz_nowhere.py:1 imports bridge.zz_nowhere",
    ]


# --- no import circle ------------------------------------------------------------------------------------

CYCLE_PACKAGES = ("bridge", "engine", "gates")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run (or, under `if TYPE_CHECKING:`, stand for a dependency) when the module
    is imported: at its top level and inside top-level if/try/with blocks, not in functions or classes."""
    stack: list[ast.stmt] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            stack += [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
            if isinstance(node, ast.Try):
                stack += [s for h in node.handlers for s in h.body]


def import_graph(root: Path, packages: Sequence[str] = CYCLE_PACKAGES) -> dict[str, set[str]]:
    """module -> the modules of `packages` it imports at module level: `import a.b` and `from a.b import c`
    name a.b, or a.b.c where c is a submodule; a relative import is resolved against the module's package."""
    files = {module_name(root, p): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    packages_ = {m for m, p in files.items() if p.name == "__init__.py"}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        here = mod if mod in packages_ else mod.rpartition(".")[0]
        deps: set[str] = set()
        for node in module_level(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
                continue
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            deps |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
        graph[mod] = {d for d in deps if d in files and d != mod}
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan), each as a path that
    starts and ends at the same module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(path_in(graph, set(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def path_in(graph: Mapping[str, set[str]], component: set[str]) -> list[str]:
    """A cycle through the first module of `component`, staying inside it (breadth first: a shortest one)."""
    start = min(component)
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [*reversed(path), start]
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(component)


def test_no_import_circle() -> None:
    graph = import_graph(ROOT)
    assert {"bridge.core.result", "gates.verdict", "engine.policy"} <= graph.keys()  # the walk found the tree
    assert "gates.checks" in graph["gates.verdict"]  # and the edges
    found = [" -> ".join(c) for c in cycles(graph)]
    assert found == [], "import circles:\n" + "\n".join(found)


def test_the_circle_check_names_a_planted_circle(tmp_path: Path) -> None:
    pkg = tmp_path / "gates"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from gates import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import x\n")
    (pkg / "c.py").write_text("import gates.a\n\ndef f():\n    import gates.b\n")
    graph = import_graph(tmp_path, ("gates",))
    assert graph["gates.c"] == {"gates.a"}  # the import inside a function is not a module-level edge
    assert cycles(graph) == [["gates.a", "gates.b", "gates.c", "gates.a"]]
