"""`evaluate(report, checks) -> Verdict`: the schema first, then every check, one reason each. Pure."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from gates import schema
from gates.checks import Check
from gates.pointer import PathError, json_type, resolve

if TYPE_CHECKING:
    from gates.compare import Comparison  # resolved in gates/__init__.py (compare imports this module)

Status = Literal["pass", "fail", "error"]
MARK = {"pass": "✓", "fail": "✗", "error": "!"}


class ReportError(ValueError):
    """A report file that cannot be read as a strict JSON object."""


class Violation(BaseModel):
    """One way a report breaks its schema: where (JSON pointer, "" = the whole report) and what."""

    pointer: str
    message: str

    def __str__(self) -> str:
        return f"{self.pointer or '/'}: {self.message}"


class CheckResult(BaseModel):
    """One check's outcome: the decisive value seen (the worst one over a `*` fan-out), its pointer, the threshold."""

    check: str
    path: str
    threshold: Any = None
    status: Literal["pass", "fail"]
    value: Any = None
    at: str | None = None  # None: no value was found (the reason says why)
    count: int = 0  # how many values the path matched
    reason: str


class Baseline(BaseModel):
    """What a report was compared against (a preset's `baseline:`): a run, or none and why not."""

    source: str  # how the baseline is chosen, e.g. "previous-pass"
    run: str | None = None  # the baseline run (a request id); None when there was none
    subject: str | None = None  # the commit the baseline run tested
    note: str = ""  # one line for people: which run, or why there is no comparison


class Verdict(BaseModel):
    status: Status
    kind: str | None = None
    schema_version: int | None = None
    schema_file: str | None = None
    error: str | None = None  # why the report could not be evaluated (status "error")
    violations: list[Violation] = []
    checks: list[CheckResult] = []
    baseline: Baseline | None = None  # set when the preset declares a baseline
    comparison: Comparison | None = None  # the comparison with that baseline, when there was one

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def exit_code(self) -> int:
        return {"pass": 0, "fail": 1, "error": 2}[self.status]

    def reasons(self) -> list[str]:
        """Every reason the verdict is not a pass, one line each."""
        out = [self.error] if self.error else []
        out += [f"schema: {v}" for v in self.violations]
        out += [f"{c.check} {c.path}: {c.reason}" for c in self.checks if c.status == "fail"]
        if self.comparison is not None and self.comparison.status == "fail":
            out.append(f"baseline: {self.comparison.reason}")
        return out

    def with_comparison(self, baseline: Baseline, comparison: Comparison | None) -> Verdict:
        """This verdict with its baseline recorded; a regression (a failed comparison) fails a passing verdict.
        No baseline run, or one that cannot be compared against (comparison error), is recorded, not failed."""
        failed = comparison is not None and comparison.status == "fail" and self.status == "pass"
        return self.model_copy(
            update={
                "status": "fail" if failed else self.status,
                "baseline": baseline,
                "comparison": comparison,
            }
        )

    def to_markdown(self) -> str:
        what = f"{self.kind} v{self.schema_version}" if self.kind and self.schema_version else "report"
        n = len(self.checks)
        lines = [
            f"**Gate: {MARK[self.status]} {self.status}** ({what}, {n} check{'' if n == 1 else 's'})",
            "",
        ]
        if self.error:
            lines += [f"Not evaluated: {_cell(self.error)}", ""]
        if self.checks:
            lines += ["| | check | value | threshold | path |", "|---|---|---|---|---|"]
            for c in self.checks:
                seen = (
                    c.reason if c.at is None else _fmt(c.value) + (f" at `{c.at}`" if c.at != c.path else "")
                )
                if c.count > 1:
                    seen += f" (worst of {c.count})"
                lines.append(
                    f"| {MARK[c.status]} | {c.check} | {_cell(seen)} | {_cell(threshold_text(c.check, c.threshold))} "
                    f"| `{_cell(c.path)}` |"
                )
            lines.append("")
        elif not self.error:
            lines += ["No checks.", ""]
        if self.violations:
            lines += [f"Schema violations ({len(self.violations)}):", ""]
            lines += [f"- `{v.pointer or '/'}`: {_cell(v.message)}" for v in self.violations]
            lines.append("")
        if self.baseline is not None:
            lines += [f"Baseline ({_cell(self.baseline.source)}): {_cell(self.baseline.note or 'none')}", ""]
        if self.comparison is not None:
            lines.append(self.comparison.to_markdown())
        return "\n".join(lines)


def _fmt(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def threshold_text(check: str, threshold: Any) -> str:
    if check == "min":
        return f"≥ {_fmt(threshold)}"
    if check == "max":
        return f"≤ {_fmt(threshold)}"
    if check == "between":
        return f"in [{_fmt(threshold[0])}, {_fmt(threshold[1])}]"
    if check == "eq":
        return f"= {_fmt(threshold)}"
    return "all true"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON sees it: true is not 1, 1 is 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and a == b


def _margin(check: str, threshold: Any, value: float) -> float:
    """How far inside the threshold a value is: >= 0 passes; the smallest margin is the worst value."""
    if check == "min":
        return value - threshold
    if check == "max":
        return threshold - value
    return min(value - threshold[0], threshold[1] - value)


def run_check(report: Any, check: Check) -> CheckResult:
    """One check over every value its path names. A missing path or an empty `*` fails."""
    base = {"check": check.check, "path": check.path, "threshold": check.value}
    want = threshold_text(check.check, check.value)
    try:
        matches = resolve(report, check.path)
    except PathError as exc:
        return CheckResult(**base, status="fail", reason=str(exc))
    count = len(matches)
    if check.check in ("min", "max", "between"):
        for at, value in matches:
            if not _number(value):
                what = "not finite" if isinstance(value, float) else f"{json_type(value)}, not a number"
                return CheckResult(
                    **base,
                    status="fail",
                    value=value,
                    at=at,
                    count=count,
                    reason=f"{at} = {_fmt(value)} is {what}",
                )
        i = min(range(count), key=lambda k: _margin(check.check, check.value, matches[k][1]))
        ok = _margin(check.check, check.value, matches[i][1]) >= 0
    elif check.check == "eq":
        i = next((k for k, (_, v) in enumerate(matches) if not _json_equal(v, check.value)), 0)
        ok = _json_equal(matches[i][1], check.value)
    else:
        i = next((k for k, (_, v) in enumerate(matches) if v is not True), 0)
        ok = matches[i][1] is True
    at, value = matches[i]
    verb = "meets" if ok else "needs"
    reason = f"{at} = {_fmt(value)}, {verb} {want}" + (f" (worst of {count} values)" if count > 1 else "")
    return CheckResult(
        **base, status="pass" if ok else "fail", value=value, at=at, count=count, reason=reason
    )


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
        found.append(("/kind", f"expected {kind!r}, got {_fmt(rkind)}"))
    if schema_version is not None and not _json_equal(rversion, schema_version):
        found.append(("/schema_version", f"expected {schema_version}, got {_fmt(rversion)}"))
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


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ReportError(f"duplicate key {key!r}")
        out[key] = value
    return out


def parse_report(data: str | bytes, name: str = "report") -> dict[str, Any]:
    """Parse a report as strict JSON: an object, no duplicate keys, no NaN / Infinity (nor overflow to them).
    `name` says which report in the error messages."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise ReportError(f"cannot read {name}: {exc}") from None
    try:
        parsed = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise ReportError(f"{name} is not valid JSON: {exc}") from None
    except ReportError as exc:
        raise ReportError(f"{name} is not valid: {exc}") from None
    bad = schema.non_finite(parsed)
    if bad:
        where = ", ".join(f"{p or '/'} = {v!r}" for p, v in bad[:5])
        raise ReportError(f"{name} has non-finite numbers ({where}); JSON numbers must be finite")
    if not isinstance(parsed, dict):
        raise ReportError(f"{name} is {json_type(parsed)}, not a JSON object")
    return parsed


def load_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """`parse_report` on a file."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ReportError(f"cannot read report {path}: {exc}") from None
    return parse_report(data, f"report {path}")


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
