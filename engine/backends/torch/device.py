"""The torch devices and dtypes: which are here, picking one by name, naming it in reports, peak memory."""

from __future__ import annotations

import platform

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def devices() -> list[str]:
    """The torch devices present here."""
    out = ["cpu"]
    if torch.cuda.is_available():
        out += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        out.append("mps")
    return out


def pick_device(device: str = "auto") -> torch.device:
    """`auto` (cuda, else mps, else cpu), `cpu`, `cuda`, `cuda:N` or `mps`; one that is not here fails
    naming those that are."""
    have = devices()
    if device == "auto":
        name = "cuda:0" if "cuda:0" in have else "mps" if "mps" in have else "cpu"
    else:
        name = "cuda:0" if device == "cuda" else device
    if name not in have:
        raise ValueError(f"device {device!r} is not available here; torch devices here: {', '.join(have)}")
    return torch.device(name)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """`auto`: bfloat16 on cuda, float16 on mps, float32 on the cpu; else one of DTYPES."""
    if dtype == "auto":
        return {"cuda": torch.bfloat16, "mps": torch.float16}.get(device.type, torch.float32)
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use auto or one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"{device.type} ({platform.processor() or platform.machine()})"


def peak_memory_bytes() -> int | None:
    """Peak accelerator memory allocated by torch in this process (None without an accelerator)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return int(max(torch.cuda.max_memory_allocated(i) for i in range(torch.cuda.device_count())))
    if torch.backends.mps.is_available():
        return int(torch.mps.driver_allocated_memory())
    return None
