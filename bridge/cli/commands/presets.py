"""`kakeya presets [--json]` and `kakeya presets show NAME [--json]`.

--json gives each preset's parameters as one JSON Schema object (`params`: type, minimum/maximum, enum,
pattern, maxLength, default, required), the same schema `kakeya mcp` gives its tools.
"""

from __future__ import annotations

import argparse
import json

from bridge.core.errors import InvalidRequest
from bridge.presets.preset import Preset
from bridge.presets.registry import get_preset, load_registry


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("presets", help="list the preset allowlist, or show one preset")
    parser.add_argument(
        "action", nargs="?", choices=["list", "show"], default="list", help="list (default) or show NAME"
    )
    parser.add_argument("name", nargs="?", help="preset name (with show)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    registry = load_registry()
    if args.action == "show":
        if not args.name:
            raise InvalidRequest("kakeya presets show needs a preset NAME")
        preset = get_preset(registry, args.name)
        print(json.dumps(preset.summary()) if args.json else _describe(preset))
        return 0
    if args.json:
        print(json.dumps([p.summary() for p in registry.values()]))
        return 0
    for p in registry.values():
        params = ", ".join(f"{n}={_default(s)}" for n, s in p.params.items()) or "no parameters"
        print(f"{p.name:<20} [{', '.join(p.runners)}]  {params}")
        print(f"{'':<20} {p.description}")
    return 0


def _default(spec: object) -> str:
    if getattr(spec, "required", False):
        return "<required>"
    value = getattr(spec, "default", None)
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _describe(preset: Preset) -> str:
    info = preset.summary()
    lines = [
        f"{preset.name}: {preset.description}",
        f"  runners: {', '.join(preset.runners)}   timeout: {preset.timeout_s} s   "
        f"report: {preset.report.kind} v{preset.report.schema_version}",
        f"  hash: {info['hash']}",
        "  parameters:",
    ]
    for name, s in preset.params.items():
        lines.append(
            f"    {name:<12} {s.type:<9} default {_default(s):<14} {s.bounds()}"
            + (f"  — {s.description}" if s.description else "")
        )
    if not preset.params:
        lines.append("    (none)")
    lines.append("  gate:")
    lines += [
        f"    {c['check']} {c['path']}" + (f" {json.dumps(c['value'])}" if "value" in c else "")
        for c in info["gate"]
    ] or ["    (no checks)"]
    return "\n".join(lines)
