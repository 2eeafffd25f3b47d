"""`kakeya gate check REPORT (--preset NAME | --checks FILE)` and `kakeya gate compare NEW BASE --metric PATH ...`.

Both print a table (or `--json`) and exit 0 pass, 1 fail, 2 error (the report could not be evaluated).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

import gates
from bridge.errors import InvalidRequest


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("gate", help="gate a report against a preset's checks, or against a baseline")
    gsub = parser.add_subparsers(dest="gate_command", metavar="SUBCOMMAND", required=True)

    check = gsub.add_parser("check", help="validate a report's schema and run gate checks on it",
                            description="Exit 0 pass, 1 fail, 2 error (the report could not be evaluated).")
    check.add_argument("report", type=Path, metavar="REPORT.json")
    source = check.add_mutually_exclusive_group(required=True)
    source.add_argument("--preset", metavar="NAME", help="use this preset's gate checks and report kind")
    source.add_argument("--checks", type=Path, metavar="FILE",
                        help="YAML/JSON: a list of checks, or a mapping with `gate:` (and optionally `report:`)")
    check.add_argument("--json", action="store_true", help="print the verdict as JSON")
    check.set_defaults(func=run_check)

    comp = gsub.add_parser("compare", help="fail when a numeric metric regressed against a baseline report",
                           description="Exit 0 within tolerance, 1 regressed or missing, 2 baseline unusable.")
    comp.add_argument("new", type=Path, metavar="NEW.json")
    comp.add_argument("base", type=Path, metavar="BASE.json")
    comp.add_argument("--metric", required=True, metavar="PATH", help="JSON pointer to one number, e.g. /summary/tok_s")
    comp.add_argument("--max-regression", required=True, type=float, metavar="PCT",
                      help="largest allowed regression, in percent of the baseline value")
    comp.add_argument("--lower-is-better", action="store_true",
                      help="the metric is a cost (latency, bytes): an increase is a regression")
    comp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    comp.set_defaults(func=run_compare)


def _checks_file(path: Path) -> tuple[list[gates.Check], str | None, int | None]:
    try:
        data: Any = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InvalidRequest(f"checks file {path}: cannot read YAML/JSON: {exc}") from None
    kind = version = None
    if isinstance(data, dict):
        unknown = set(data) - {"gate", "report"}
        if unknown or "gate" not in data:
            raise InvalidRequest(f"checks file {path}: a mapping needs `gate:` and may have `report:` "
                                 f"(unexpected: {', '.join(sorted(map(str, unknown))) or 'no gate'})")
        report = data.get("report") or {}
        if not isinstance(report, dict) or set(report) - {"kind", "schema_version"}:
            raise InvalidRequest(f"checks file {path}: `report:` must be {{kind: ..., schema_version: ...}}")
        kind, version, data = report.get("kind"), report.get("schema_version"), data["gate"]
    try:
        return gates.parse_checks(data), kind, version
    except ValueError as exc:
        raise InvalidRequest(f"checks file {path}: {exc}") from None


def run_check(args: argparse.Namespace) -> int:
    if args.preset:
        from bridge.presets import get_preset, load_registry

        preset = get_preset(load_registry(), args.preset)
        checks, kind, version = preset.gate, preset.report.kind, preset.report.schema_version
    else:
        checks, kind, version = _checks_file(args.checks)
    verdict = gates.evaluate_file(args.report, checks, kind=kind, schema_version=version)
    print(verdict.model_dump_json(indent=2) if args.json else verdict.to_markdown())
    return verdict.exit_code()


def run_compare(args: argparse.Namespace) -> int:
    try:
        new, base = gates.load_report(args.new), gates.load_report(args.base)
    except gates.ReportError as exc:
        raise InvalidRequest(str(exc)) from None
    try:
        result = gates.compare(new, base, args.metric, args.max_regression, higher_is_better=not args.lower_is_better)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    print(result.model_dump_json(indent=2) if args.json else result.to_markdown())
    return result.exit_code()
