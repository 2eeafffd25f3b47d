"""benchmarks/ is a package run as `python -m benchmarks.NAME` from the repository root: no benchmark edits
sys.path or imports a sibling by its bare name, and benchmarks/harness.py gives every result its environment
block and writes its JSON."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from benchmarks import harness

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = sorted((ROOT / "benchmarks").glob("*.py"))


def test_no_benchmark_edits_sys_path_or_imports_a_sibling_by_bare_name() -> None:
    siblings = {path.stem for path in BENCHMARKS}
    found = []
    for path in BENCHMARKS:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "path"
                and getattr(node.value, "id", "") == "sys"
            ):
                found.append(f"{path.name}:{node.lineno} uses sys.path")
            elif isinstance(node, ast.Import):
                found += [
                    f"{path.name}:{node.lineno} imports {a.name}" for a in node.names if a.name in siblings
                ]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in siblings:
                found.append(f"{path.name}:{node.lineno} imports {node.module}")
    assert (ROOT / "benchmarks" / "__init__.py").is_file()
    assert found == [], (
        f"run benchmarks as `python -m benchmarks.NAME` and import `from benchmarks import X`: {found}"
    )


def test_the_environment_block_and_the_json(tmp_path: Path) -> None:
    env = harness.environment(load_before=[1.0, 2.0, 3.0])
    for key in ("hostname", "os", "machine", "cpu", "cpu_count", "memory_bytes", "accelerator", "versions"):
        assert key in env, key
    assert env["versions"]["python"] and len(env["load_average"]) == 3
    assert env["load_average_before"] == [1.0, 2.0, 3.0]
    assert harness.command("bus", ["--parts", "slurm"]) == "python -m benchmarks.bus --parts slurm"
    out = harness.write_json(tmp_path / "deep" / "r.json", {"environment": env, "x": 1})
    assert json.loads(out.read_text()) == json.loads(json.dumps({"environment": env, "x": 1}))
    assert [p.name for p in out.parent.iterdir()] == ["r.json"]  # written through a temp file, renamed
