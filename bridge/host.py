"""The host and accelerator fingerprint recorded in result.json, without importing torch or mlx, and what a
runner label promises of the host's hardware.

    host_fingerprint()["accelerator"]   # NVML (nvidia-ml-py) where present: name, driver, CUDA, memory, MIG
    label_needs("h200")                 # "cuda"; "mac-m4" -> "metal"; "cpu" -> None
    check_accelerator("h200")           # "CUDA: NVIDIA H200", or KakeyaError saying what is missing
    forced = hardware_for(["cpu", "h200"], force=False)   # KakeyaError unless the host has every label's

A label's accelerator: `cpu` and `cpu-*` need none; `mac*` and `mps*` need Apple's GPU (Metal through mlx,
or torch's MPS); every other label (h200, h100, a100, cuda, gpu, ...) needs a CUDA device visible to torch.
`kakeya doctor` and a runner's start use the same check.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

from bridge.core.errors import BusError, KakeyaError
from bridge.wire import git

Need = Literal["cuda", "metal"]

# What a label's hardware check runs (in this Python, a subprocess: bridge never imports torch or mlx).
CUDA_PY = (
    "import torch; n = torch.cuda.device_count() if torch.cuda.is_available() else 0; "
    "print(', '.join(torch.cuda.get_device_name(i) for i in range(n)))"
)
METAL_PY = (
    "try:\n"
    "    import mlx.core as mx\n"
    "    print(mx.metal.is_available() and mx.metal.device_info().get('device_name', 'metal'))\n"
    "except ImportError:\n"
    "    import torch\n"
    "    print(torch.backends.mps.is_available() and 'mps')\n"
)


def label_needs(label: str) -> Need | None:
    """The accelerator runner label `label` promises: None (cpu, cpu-*), 'metal' (mac*, mps*) or 'cuda'."""
    if label == "cpu" or label.startswith("cpu-"):
        return None
    return "metal" if label.startswith(("mac", "mps")) else "cuda"


def check_accelerator(label: str) -> str:
    """The accelerator label `label` promises is visible to this Python (and so to the engine): what was
    found, or KakeyaError saying what is missing and how to fix it."""
    need = label_needs(label)
    if need is None:
        return "no accelerator needed"
    code, what = (CUDA_PY, "CUDA") if need == "cuda" else (METAL_PY, "Metal")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        raise KakeyaError(
            f"label {label} needs {what}, but the check could not run ({exc})", code="hardware"
        ) from None
    devices = proc.stdout.strip()
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise KakeyaError(
            f"label {label} needs {what}, but the check failed ({last}); install "
            + ("the CUDA build of torch (scripts/setup-runner.sh --torch cuda)" if need == "cuda" else "mlx"),
            code="hardware",
        )
    if not devices or devices == "False":
        raise KakeyaError(
            f"label {label} needs {what}, but no {what} device is visible"
            + (" (nvidia-smi, CUDA_VISIBLE_DEVICES, the driver)" if need == "cuda" else ""),
            code="hardware",
        )
    return f"{what}: {devices}"


def hardware_for(labels: Sequence[str], force: bool = False) -> list[str]:
    """Check that this host has the accelerator of every label. Returns the labels that lack it and are
    served anyway because `force` (every result then says so); without `force`, a missing accelerator is a
    KakeyaError that names each label and what it lacks."""
    missing: list[tuple[str, str]] = []
    for label in labels:
        try:
            check_accelerator(label)
        except KakeyaError as exc:
            missing.append((label, str(exc)))
    if missing and not force:
        raise KakeyaError(
            f"this host lacks the hardware of label(s) {', '.join(lb for lb, _ in missing)}: "
            + "; ".join(why for _, why in missing)
            + ". Serve only the labels this host has (`kakeya doctor` checks each one), or pass "
            "--force-labels to serve them anyway (every result then says the labels were forced)",
            code="hardware",
        )
    return [lb for lb, _ in missing]


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


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def nvml_accelerator() -> dict[str, Any] | None:
    """The NVIDIA GPUs through NVML (`nvidia-ml-py`, `import pynvml`), where it is installed and a driver
    answers: driver and CUDA driver versions, and per GPU its name, UUID, memory and MIG mode. None without
    NVML (not installed, no driver, no GPU); never raises."""
    try:
        import pynvml  # type: ignore[import-not-found]  # optional: nvidia-ml-py, on CUDA runners
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 — no driver, no library: no NVML
        return None
    try:
        cuda = pynvml.nvmlSystemGetCudaDriverVersion()  # e.g. 12040
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
                mig: str | None = "enabled" if current else "disabled"
            except Exception:  # noqa: BLE001 — a GPU without MIG support
                mig = None
            gpus.append(
                {
                    "index": i,
                    "name": _text(pynvml.nvmlDeviceGetName(handle)),
                    "uuid": _text(pynvml.nvmlDeviceGetUUID(handle)),
                    "memory_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(handle).total),
                    "mig": mig,
                }
            )
        return {
            "kind": "cuda",
            "source": "nvml",
            "devices": [g["name"] for g in gpus],
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
            "cuda": f"{cuda // 1000}.{cuda % 1000 // 10}",
            "gpus": gpus,
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
        }
    except Exception:  # noqa: BLE001 — provenance is recorded as far as NVML answers, never fails a run
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def accelerator_words(acc: Any) -> str | None:
    """One line for a fingerprint's accelerator, e.g. 'NVIDIA H200 (140 GiB, MIG disabled); driver 550.54.15,
    CUDA 12.4' (None: none recorded). Reads what a result.json holds, so anything it cannot read is left out."""
    if not isinstance(acc, dict):
        return None
    gpus = acc.get("gpus")
    if isinstance(gpus, list) and gpus:
        parts = []
        for g in gpus if all(isinstance(g, dict) for g in gpus) else []:
            extra = []
            if isinstance(g.get("memory_bytes"), int):
                extra.append(f"{g['memory_bytes'] / 2**30:.0f} GiB")
            if g.get("mig"):
                extra.append(f"MIG {g['mig']}")
            parts.append(f"{g.get('name')}" + (f" ({', '.join(extra)})" if extra else ""))
        versions = [f"{k if k == 'driver' else 'CUDA'} {acc[k]}" for k in ("driver", "cuda") if acc.get(k)]
        return f"{acc.get('kind')}: {', '.join(parts)}" + (f"; {', '.join(versions)}" if versions else "")
    devices = acc.get("devices")
    shown = ", ".join(str(d) for d in devices) if isinstance(devices, list) else ""
    return f"{acc.get('kind')}: {shown or 'unknown device'}"


def host_fingerprint() -> dict[str, Any]:
    """Hostname, OS, CPU, memory and accelerator (NVML where present, else nvidia-smi's names, else Apple
    Silicon's GPU), without importing torch or mlx."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = None
    accelerator = nvml_accelerator()
    gpus = (
        command_output(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
        if accelerator is None and shutil.which("nvidia-smi")
        else None
    )
    if gpus:
        accelerator = {"kind": "cuda", "source": "nvidia-smi", "devices": gpus.splitlines()}
    elif accelerator is None and sys.platform == "darwin" and platform.machine() == "arm64":
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
