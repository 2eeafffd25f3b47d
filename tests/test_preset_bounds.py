"""Bounds of a workload parameter in one place: a preset may narrow what its workload accepts (an
allowlist per runner), never widen it. Each preset's argv is rendered with every bounded parameter at its
min and at its max (the others at their defaults) and given to the workload's own `main`, which must
accept it: its argument checks and its pydantic `Config` pass (the run itself is stopped right there).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted((ROOT / "presets").glob("*.yaml"))
# A value the workload only accepts together with another parameter (the preset's description says so).
TOGETHER = {("compression-table", "k", 0): {"drafter": "none"}}


class Accepted(Exception):
    """The workload validated its arguments and built its Config: it would run now."""


def render(preset: dict[str, Any], values: dict[str, Any], out: Path) -> list[str]:
    def one(element: str) -> str:
        if not (element.startswith("{") and element.endswith("}")):
            return element
        key = element[1:-1]
        if key == "report":
            return str(out)
        value = values[key]
        if isinstance(value, list):
            return ",".join(str(v) for v in value)
        return str(value).lower() if isinstance(value, bool) else str(value)

    assert preset["argv"][:2] == ["{python}", "-m"], preset["argv"]
    return [one(e) for e in preset["argv"][3:]]


def cases() -> list[Any]:
    out = []
    for path in PRESETS:
        preset = yaml.safe_load(path.read_text())
        for name, spec in preset.get("params", {}).items():
            for end in ("min", "max"):
                if end in spec:
                    value = [spec[end]] if spec["type"] == "int_list" else spec[end]
                    out.append(pytest.param(preset, name, value, id=f"{preset['name']}-{name}-{end}"))
    return out


CASES = cases()


def test_there_are_bounds_to_check() -> None:
    names = {(c.values[0]["name"], c.values[1]) for c in CASES}
    assert {("niah-ladder", "contexts"), ("niah-smoke", "samples"), ("throughput-code", "k")} <= names


@pytest.mark.parametrize(("preset", "name", "value"), CASES)
def test_the_workload_accepts_the_presets_bounds(
    preset: dict[str, Any], name: str, value: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = {k: spec["default"] for k, spec in preset["params"].items() if "default" in spec}
    values[name] = value
    values.update(TOGETHER.get((preset["name"], name, spec_end(value)), {}))
    argv = render(preset, values, tmp_path / "report.json")
    module = importlib.import_module(preset["argv"][2])
    assert hasattr(module, "Config"), f"{module.__name__} has no Config model"

    class Stop(module.Config):  # type: ignore[name-defined,misc]
        def __init__(self, **data: Any) -> None:
            super().__init__(**data)
            raise Accepted

    monkeypatch.setattr(module, "Config", Stop)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # --threads sets it; restored after the test
    try:
        import torch
    except ImportError:
        pass
    else:
        monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # nor torch's threads
    with pytest.raises((Accepted, SystemExit)) as caught:
        module.main(argv)
    assert caught.type is Accepted, f"{module.__name__} refuses {name}={value!r} that {preset['name']} allows"
    assert not (tmp_path / "report.json").exists()


def spec_end(value: Any) -> Any:
    return value[0] if isinstance(value, list) else value


def test_a_bound_past_what_the_workload_accepts_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    preset = yaml.safe_load((ROOT / "presets" / "niah-smoke.yaml").read_text())
    with pytest.raises(AssertionError, match="refuses samples=0 that niah-smoke allows"):
        test_the_workload_accepts_the_presets_bounds(preset, "samples", 0, tmp_path, monkeypatch)
