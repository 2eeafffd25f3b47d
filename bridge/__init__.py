"""Kakeya's bridge: request hardware runs through a git bus, run them on a runner, gate the evidence.

    from bridge import Client, load_config
    client = Client(load_config())
    manifest = client.request("probe", {}, "cpu")
    result = client.results(manifest.id, Path("out/probe"), client.wait(manifest.id))

The bridge never imports the engine; the CLI (`kakeya ...`) is bridge.cli.

Layers, lowest first; a module imports only from its own layer and those below it (tests/test_boundaries.py):
core (errors, names, text, caps, logs, result) -> wire (git subprocesses, the pack protocols) -> config.py
and host.py -> presets -> bus (records, the bus, ledger, trust, presence, live logs, progress) -> results
(render, plots, outcome, attest) -> client (request, read, administer, follow) -> evidence (requirements,
judge, history, bisect, comment) -> run (runner, lease, execute, isolation, launcher, slurm) -> cli (the
`kakeya` commands and the MCP server), which nothing imports. docs/architecture.md lists every module.
"""

import importlib
from typing import TYPE_CHECKING, Any

LAYERS = (("core",), ("wire",), ("config", "host"), ("presets",), ("bus",), ("results",), ("client",),
          ("evidence",), ("run",), ("cli",))  # fmt: skip

# Each public name and the module it comes from, imported when first used (PEP 562): `import bridge.wire.git`
# (what every `kakeya` command starts with) does not pay for the runner, the gates and pydantic's models.
_FROM = {
    "bridge.bus.bus": ("Bus",),
    "bridge.bus.records": ("CancelMarker", "Claim", "Entry", "Manifest", "Snapshot", "request_state"),
    "bridge.client.client": ("Client",),
    "bridge.config": ("Config", "load_config", "project_root"),
    "bridge.core.errors": (
        "BusError",
        "BusUnreachable",
        "Interrupted",
        "InvalidRequest",
        "KakeyaError",
        "Rejected",
    ),
    "bridge.evidence": ("DoneResults", "Outcome", "Requirement", "apply_baseline", "gate_subject"),
    "bridge.run.execute": ("execute", "run_preset"),
    "bridge.results.outcome": ("RunOutcome",),
    "bridge.presets.preset": ("Preset",),
    "bridge.presets.registry": ("get_preset", "load_registry"),
    "bridge.core.result": ("RunContext", "RunResult"),
    "bridge.run.runner": ("Runner", "Served"),
}
_MODULE = {name: module for module, names in _FROM.items() for name in names}

if TYPE_CHECKING:
    from bridge.bus.bus import Bus
    from bridge.bus.records import CancelMarker, Claim, Entry, Manifest, Snapshot, request_state
    from bridge.client.client import Client
    from bridge.config import Config, load_config, project_root
    from bridge.core.errors import (
        BusError,
        BusUnreachable,
        Interrupted,
        InvalidRequest,
        KakeyaError,
        Rejected,
    )
    from bridge.core.result import RunContext, RunResult
    from bridge.evidence import DoneResults, Outcome, Requirement, apply_baseline, gate_subject
    from bridge.presets.preset import Preset
    from bridge.presets.registry import get_preset, load_registry
    from bridge.results.outcome import RunOutcome
    from bridge.run.execute import execute, run_preset
    from bridge.run.runner import Runner, Served


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
