"""The envelope every workload report carries: kind, schema_version, created_at, environment, subject.

A workload builds its body and calls `write_report`; the gate validates the whole file against
`gates/schemas/<kind>.v<N>.schema.json`.
"""

from __future__ import annotations

import datetime as dt
import importlib
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

from engine.geometry import Geometry
from engine.models import runtime

TOOLS = (("torch", "torch"), ("transformers", "transformers"), ("mlx", "mlx.core"), ("mlx_lm", "mlx_lm"))


def _version(module: str) -> str | None:
    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - a broken optional install is reported as absent
        return None
    return str(getattr(mod, "__version__", "unknown"))


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def environment() -> dict[str, Any]:
    """Tool versions and the machine, cheap enough to put in every report; where models were loaded, the
    device they ran on, their dtype and the peak accelerator memory."""
    versions = {"python": platform.python_version()}
    for name, module in TOOLS:
        found = _version(module)
        if found is not None:
            versions[name] = found
    return {
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "hostname": platform.node(),
        "cpu_count": os.cpu_count() or 1,
        "memory_bytes": _memory_bytes(),
        "versions": versions,
        **_runtime(),
    }


def _runtime() -> dict[str, Any]:
    """Device, dtype and peak accelerator memory of the models this process loaded (none: {})."""
    return runtime()


def geometry_block(geo: Geometry, **more: Any) -> dict[str, Any]:
    """A report's `geometry`: the model's layer kinds, native sliding window, K/V heads and head size (what
    its K/V bytes are read against), then `more` of the workload's own."""
    return {
        "layer_types": list(geo.layer_types),
        "sliding_window": geo.sliding_window,
        "kv_heads": geo.kv_heads,
        "head_dim": geo.head_dim,
        **more,
    }


def subject() -> str | None:
    """The commit under test: `KAKEYA_SUBJECT` when a runner set it, else the cwd's HEAD, else None."""
    sha = os.environ.get("KAKEYA_SUBJECT")
    if sha:
        return sha
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def write_report(
    path: str | os.PathLike[str], kind: str, schema_version: int, body: dict[str, Any]
) -> dict[str, Any]:
    """Wrap `body` in the envelope and write it atomically (temp file + rename)."""
    report = {
        "kind": kind,
        "schema_version": schema_version,
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "environment": environment(),
        "subject": subject(),
        **body,
    }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".tmp")
    tmp.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    tmp.replace(out)
    return report
