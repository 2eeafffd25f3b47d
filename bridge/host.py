"""The host and accelerator fingerprint recorded in result.json, without importing torch or mlx."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from bridge import git
from bridge.errors import BusError


def command_output(argv: list[str]) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return command_output(["sysctl", "-n", "machdep.cpu.brand_string"]) or platform.processor() or "unknown"


def host_fingerprint() -> dict[str, Any]:
    """Hostname, OS, CPU, memory and accelerator, without importing torch or mlx."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    gpus = (
        command_output(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
        if shutil.which("nvidia-smi")
        else None
    )
    accelerator = None
    if gpus:
        accelerator = {"kind": "cuda", "devices": gpus.splitlines()}
    elif sys.platform == "darwin" and platform.machine() == "arm64":
        accelerator = {"kind": "metal", "devices": [_cpu_model()]}
    return {
        "hostname": platform.node(),
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "cpu_count": os.cpu_count() or 1,
        "memory_bytes": memory,
        "accelerator": accelerator,
    }


def tool_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    try:
        versions["git"] = git.version().removeprefix("git version ")
    except BusError:
        pass
    for dist in ("kakeya", "torch", "transformers", "mlx", "mlx-lm"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return versions
