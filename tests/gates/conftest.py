import copy
from typing import Any

import pytest

# A probe report as engine/workloads/probe.py writes it (envelope + body), valid against probe.v1.
PROBE: dict[str, Any] = {
    "kind": "probe",
    "schema_version": 1,
    "created_at": "2026-11-22T08:50:00+00:00",
    "environment": {
        "python": "3.11.7",
        "os": "Linux 6.1",
        "machine": "x86_64",
        "hostname": "vm",
        "cpu_count": 2,
        "memory_bytes": 25276510208,
        "versions": {"python": "3.11.7", "torch": "2.13.0+cpu", "transformers": "5.23.0"},
    },
    "subject": "0123456789abcdef0123456789abcdef01234567",
    "probe": {
        "python": "3.11.7",
        "os": "Linux 6.1",
        "cpu_count": 2,
        "memory_bytes": None,
        "packages": {"torch": "2.13.0+cpu", "transformers": "5.23.0", "mlx": None, "mlx_lm": None},
        "accelerators": {
            "cuda": {"available": True, "devices": ["NVIDIA H200", "NVIDIA H200"]},
            "mps": {"available": False},
            "metal": {"available": False},
        },
        "mlx_default_device": None,
    },
}


@pytest.fixture
def probe_report() -> dict[str, Any]:
    return copy.deepcopy(PROBE)
