"""`evaluate(report, checks) -> Verdict`: the schema first, then every check, one reason each. Pure."""

from __future__ import annotations

import os
from typing import Any

from gates import schema
from gates.checks import Check, run_check
from gates.pointer import json_type
from gates.report import ReportError, fmt, json_equal, load_report
from gates.verdict import Verdict, Violation


def evaluate(
    report: Any, checks: list[Check], *, kind: str | None = None, schema_version: int | None = None
) -> Verdict:
    """Gate a parsed report: its schema (chosen by its own kind and schema_version), then each check.

    `kind` / `schema_version`, when given (a preset's `report:`), are what the report must be; a
    report of another kind or version fails. A report whose kind/version has no schema is an error.
    """
    if not isinstance(report, dict):
        return Verdict(status="error", error=f"the report is {json_type(report)}, not a JSON object")
    rkind, rversion = report.get("kind"), report.get("schema_version")
    head = {
        "kind": rkind if isinstance(rkind, str) else None,
        "schema_version": rversion if isinstance(rversion, int) and not isinstance(rversion, bool) else None,
    }
    found: list[tuple[str, str]] = []
    if kind is not None and rkind != kind:
        found.append(("/kind", f"expected {kind!r}, got {fmt(rkind)}"))
    if schema_version is not None and not json_equal(rversion, schema_version):
        found.append(("/schema_version", f"expected {schema_version}, got {fmt(rversion)}"))
    if head["kind"] is not None and head["schema_version"] is not None:
        name = schema.schema_name(head["kind"], head["schema_version"])
        if not schema.has_schema(head["kind"], head["schema_version"]):
            if found:  # a report of the wrong kind for this preset: a failure, whatever it is
                name = schema.ENVELOPE
            else:
                known = ", ".join(f"{k} v{v}" for k, v in schema.known()) or "none"
                return Verdict(
                    status="error",
                    **head,
                    error=f"no schema for report kind {head['kind']!r} version {head['schema_version']} "
                    f"(gates/schemas/{name} does not exist; known: {known})",
                )
    else:
        name = schema.ENVELOPE  # kind or schema_version missing or mistyped: the envelope says so
    found += schema.violations(report, name)
    results = [run_check(report, c) for c in checks]
    ok = not found and all(r.status == "pass" for r in results)
    return Verdict(
        status="pass" if ok else "fail",
        **head,
        schema_file=name,
        violations=[Violation(pointer=p, message=m) for p, m in found],
        checks=results,
    )


def evaluate_file(
    path: str | os.PathLike[str],
    checks: list[Check],
    *,
    kind: str | None = None,
    schema_version: int | None = None,
) -> Verdict:
    """`evaluate` on a file; a file that is not a strict JSON object is an error verdict (never raises)."""
    try:
        report = load_report(path)
    except ReportError as exc:
        return Verdict(status="error", error=str(exc))
    return evaluate(report, checks, kind=kind, schema_version=schema_version)
