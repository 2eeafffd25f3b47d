"""What every benchmark shares: the environment block a result carries (host, CPU, memory, accelerator, the
versions of python, git, kakeya, torch, transformers, mlx and mlx-lm, the load average) and the writing of
its JSON. Nothing heavy is imported: versions are read from the installed packages' metadata."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bridge.host import host_fingerprint, tool_versions

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def load_average() -> list[float]:
    """The host's load average over 1, 5 and 15 minutes: how much other work shared the machine."""
    return [round(x, 2) for x in os.getloadavg()]


def environment(load_before: Sequence[float] | None = None) -> dict[str, Any]:
    """The environment block: hostname, OS, machine, CPU model and count, memory, accelerator, tool versions,
    and the load average now (at the end of a run) and, given, at its start."""
    env: dict[str, Any] = {**host_fingerprint(), "versions": tool_versions(), "load_average": load_average()}
    if load_before is not None:
        env["load_average_before"] = list(load_before)
    return env


def command(module: str, argv: Sequence[str] | None = None) -> str:
    """The command line that reproduces this run: `python -m benchmarks.<module> ARGS`."""
    return shlex.join(["python", "-m", f"benchmarks.{module}", *(sys.argv[1:] if argv is None else argv)])


def write_json(
    path: str | os.PathLike[str],
    result: dict[str, Any],
    *,
    indent: int = 2,
    default: Callable[[Any], Any] | None = None,
) -> Path:
    """Write `result` as indented JSON, atomically (a temp file, then a rename), its folder made; say where."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=indent, default=default) + "\n")
    tmp.replace(out)
    print(f"wrote {out}", file=sys.stderr)
    return out


def write_report(
    path: str | os.PathLike[str],
    kind: str,
    schema_version: int,
    body: dict[str, Any],
    load_before: Sequence[float] | None = None,
) -> dict[str, Any]:
    """An engine benchmark's report: engine/report.py's envelope (kind, created_at, the engine's environment with
    the device, dtype and peak memory of the models it loaded, subject) around `body`; given the load average at
    the start, `load_average` holds it and the load now."""
    from engine.report import write_report as envelope  # here: the bus's benchmarks import no engine

    if load_before is not None:
        body = {**body, "load_average": {"before": list(load_before), "after": load_average()}}
    report = envelope(path, kind, schema_version, body)
    print(f"wrote {path}", file=sys.stderr)
    return report


class Clocks:
    """Stands in for the `time` module of engine.decode and engine.speculative during a run: every
    `perf_counter()` they read is logged with the process's CPU time at that moment, so the CPU time of
    the decode phase (between the reads that bound `Generation.decode_s`) is known exactly."""

    def __init__(self) -> None:
        self.log: list[tuple[float, float]] = []

    def perf_counter(self) -> float:
        wall, cpu = time.perf_counter(), time.process_time()
        self.log.append((wall, cpu))
        return wall

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def cpu_since(self, wall: float) -> float:
        """CPU time from the logged read closest to `wall` to the last read."""
        start = min(self.log, key=lambda e: abs(e[0] - wall))
        return self.log[-1][1] - start[1]
