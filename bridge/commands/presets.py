"""`kakeya presets [--json]` and `kakeya presets show NAME [--json]`."""

from __future__ import annotations

import argparse
import json

from bridge.presets import get_preset, load_registry


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
            from bridge.errors import InvalidRequest

            raise InvalidRequest("kakeya presets show needs a preset NAME")
        info = get_preset(registry, args.name).summary()
        print(json.dumps(info) if args.json else _describe(info))
        return 0
    infos = [p.summary() for p in registry.values()]
    if args.json:
        print(json.dumps(infos))
        return 0
    for info in infos:
        params = ", ".join(f"{n}={_default(p)}" for n, p in info["params"].items()) or "no parameters"
        print(f"{info['name']:<20} [{', '.join(info['runners'])}]  {params}")
        print(f"{'':<20} {info['description']}")
    return 0


def _default(param: dict) -> str:
    if param["required"]:
        return "<required>"
    value = param["default"]
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def _describe(info: dict) -> str:
    lines = [
        f"{info['name']}: {info['description']}",
        f"  runners: {', '.join(info['runners'])}   timeout: {info['timeout_s']} s   "
        f"report: {info['report']['kind']} v{info['report']['schema_version']}",
        f"  hash: {info['hash']}",
        "  parameters:",
    ]
    for name, p in info["params"].items() or []:
        lines.append(
            f"    {name:<12} {p['type']:<9} default {_default(p):<14} {p['bounds']}"
            + (f"  — {p['description']}" if p["description"] else "")
        )
    if not info["params"]:
        lines.append("    (none)")
    lines.append("  gate:")
    lines += [
        f"    {c['check']} {c['path']}" + (f" {json.dumps(c['value'])}" if "value" in c else "")
        for c in info["gate"]
    ] or ["    (no checks)"]
    return "\n".join(lines)
