"""Kakeya's bridge: request hardware runs through a git bus, run them on a runner, gate the evidence.

    from bridge import Client, load_config
    client = Client(load_config())
    manifest = client.request("probe", {}, "cpu")
    result = client.results(manifest.id, Path("out/probe"), client.wait(manifest.id))

The bridge never imports the engine; the CLI (`kakeya ...`) is bridge.cli.
"""

import importlib
from typing import TYPE_CHECKING, Any

# Each public name and the module it comes from, imported when first used (PEP 562): `import bridge.git`
# (what every `kakeya` command starts with) does not pay for the runner, the gates and pydantic's models.
_FROM = {
    "bridge.bus": ("Bus", "CancelMarker", "Claim", "Entry", "Manifest", "Snapshot", "request_state"),
    "bridge.client": ("Client",),
    "bridge.config": ("Config", "load_config", "project_root"),
    "bridge.errors": (
        "BusError",
        "BusUnreachable",
        "Interrupted",
        "InvalidRequest",
        "KakeyaError",
        "Rejected",
    ),
    "bridge.evidence": ("DoneResults", "Outcome", "Requirement", "apply_baseline", "gate_subject"),
    "bridge.execute": ("execute", "run_preset"),
    "bridge.outcome": ("RunOutcome",),
    "bridge.presets": ("Preset", "get_preset", "load_registry"),
    "bridge.result": ("RunContext", "RunResult"),
    "bridge.runner": ("Runner", "Served"),
}
_MODULE = {name: module for module, names in _FROM.items() for name in names}

if TYPE_CHECKING:
    from bridge.bus import Bus, CancelMarker, Claim, Entry, Manifest, Snapshot, request_state
    from bridge.client import Client
    from bridge.config import Config, load_config, project_root
    from bridge.errors import BusError, BusUnreachable, Interrupted, InvalidRequest, KakeyaError, Rejected
    from bridge.evidence import DoneResults, Outcome, Requirement, apply_baseline, gate_subject
    from bridge.execute import execute, run_preset
    from bridge.outcome import RunOutcome
    from bridge.presets import Preset, get_preset, load_registry
    from bridge.result import RunContext, RunResult
    from bridge.runner import Runner, Served


def __getattr__(name: str) -> Any:
    if name not in _MODULE:
        raise AttributeError(f"module 'bridge' has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULE[name]), name)


__all__ = [
    "Bus",
    "BusError",
    "BusUnreachable",
    "Interrupted",
    "CancelMarker",
    "Claim",
    "Client",
    "Config",
    "Entry",
    "InvalidRequest",
    "KakeyaError",
    "Manifest",
    "Outcome",
    "Preset",
    "Rejected",
    "Requirement",
    "RunContext",
    "RunOutcome",
    "RunResult",
    "Runner",
    "Served",
    "DoneResults",
    "Snapshot",
    "apply_baseline",
    "execute",
    "gate_subject",
    "get_preset",
    "load_config",
    "load_registry",
    "project_root",
    "request_state",
    "run_preset",
]
