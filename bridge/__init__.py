"""Kakeya's bridge: request hardware runs through a git bus, run them on a runner, gate the evidence.

    from bridge import Client, load_config
    client = Client(load_config())
    manifest = client.request("probe", {}, "cpu")
    result = client.results(manifest.id, Path("out/probe"), client.wait(manifest.id))

The bridge never imports the engine; the CLI (`kakeya ...`) is bridge.cli.
"""

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
