"""`python -m engine.workloads.probe --out FILE`: what this machine can run (kind `probe`, schema v1).

Python, OS, CPU count, memory, versions of torch / transformers / mlx / mlx-lm where importable,
CUDA / MPS / Metal availability with device names, and MLX's default device.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from engine.report import environment, write_report


def _torch_accelerators() -> tuple[dict[str, Any], dict[str, Any]]:
    cuda: dict[str, Any] = {"available": False, "devices": []}
    mps: dict[str, Any] = {"available": False}
    try:
        import torch
    except ImportError:
        return cuda, mps
    if torch.cuda.is_available():
        cuda = {
            "available": True,
            "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        }
    backend = getattr(torch.backends, "mps", None)
    mps = {"available": bool(backend and backend.is_available())}
    return cuda, mps


def _mlx() -> tuple[dict[str, Any], str | None]:
    try:
        import mlx.core as mx
    except ImportError:
        return {"available": False}, None
    metal = getattr(mx, "metal", None)
    available = bool(metal and metal.is_available())
    info: dict[str, Any] = {"available": available}
    if available:
        info["device"] = str(metal.device_info().get("device_name", "unknown"))
    return info, str(mx.default_device())


def probe() -> dict[str, Any]:
    env = environment()
    cuda, mps = _torch_accelerators()
    metal, mlx_device = _mlx()
    versions = env["versions"]
    return {
        "python": env["python"],
        "os": env["os"],
        "cpu_count": env["cpu_count"],
        "memory_bytes": env["memory_bytes"],
        "packages": {name: versions.get(name) for name in ("torch", "transformers", "mlx", "mlx_lm")},
        "accelerators": {"cuda": cuda, "mps": mps, "metal": metal},
        "mlx_default_device": mlx_device,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="where to write the report (JSON)")
    args = parser.parse_args(argv)
    report = write_report(args.out, "probe", 1, {"probe": probe()})
    p = report["probe"]
    print(
        f"probe: python {p['python']}, {p['os']}, {p['cpu_count']} CPUs, packages {p['packages']}, "
        f"cuda={p['accelerators']['cuda']['available']} mps={p['accelerators']['mps']['available']} "
        f"metal={p['accelerators']['metal']['available']} mlx device={p['mlx_default_device']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
