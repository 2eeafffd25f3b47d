"""What a gate says: `Verdict` (schema violations, check results, a baseline `Comparison`), its markdown for
summary.md, and the one rule mapping a status to an exit code."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from gates.checks import CheckResult, threshold_text
from gates.markdown import cell, code, table
from gates.report import fmt, fmt_number

Status = Literal["pass", "fail", "error"]
MARK = {"pass": "✓", "fail": "✗", "error": "!"}
EXIT_CODES: dict[str, int] = {"pass": 0, "fail": 1, "error": 2}


def exit_code(status: Status) -> int:
    """The one exit-code rule for a gate's outcome: 0 pass, 1 fail, 2 error (could not be evaluated)."""
    return EXIT_CODES[status]


class Violation(BaseModel):
    """One way a report breaks its schema: where (JSON pointer, "" = the whole report) and what."""

    pointer: str
    message: str

    def __str__(self) -> str:
        return f"{self.pointer or '/'}: {self.message}"


class Baseline(BaseModel):
    """What a report was compared against (a preset's `baseline:`): a run, or none and why not."""

    source: str  # how the baseline is chosen, e.g. "previous-pass"
    run: str | None = None  # the baseline run (a request id); None when there was none
    subject: str | None = None  # the commit the baseline run tested
    note: str = ""  # one line for people: which run, or why there is no comparison


class Comparison(BaseModel):
    """A metric of a new report against the same metric of a baseline report (gates.compare builds it)."""

    status: Status
    metric: str
    new: float | None = None
    base: float | None = None
    change_pct: float | None = None  # signed (new - base) / |base|, in percent
    regression_pct: float | None = None  # how much worse than base, in percent of |base|; negative = better
    max_regression_pct: float
    higher_is_better: bool
    reason: str
    # With per-repeat samples: the noise rule, its p-value and the sample counts (new, base).
    noise_rule: str | None = None
    p_value: float | None = None
    samples: tuple[int, int] | None = None

    def exit_code(self) -> int:
        return exit_code(self.status)

    def to_markdown(self) -> str:
        better = "higher is better" if self.higher_is_better else "lower is better"
        change = "—" if self.change_pct is None else f"{self.change_pct:+.2f} %"
        return "\n".join(
            [
                f"**Compare: {MARK[self.status]} {self.status}** ({better})",
                "",
                *table(
                    ["", "metric", "new", "base", "change", "max regression", "noise"],
                    [
                        [
                            MARK[self.status],
                            code(self.metric),
                            fmt_number(self.new),
                            fmt_number(self.base),
                            change,
                            f"{self.max_regression_pct:g} %",
                            self.noise(),
                        ]
                    ],
                ),
                "",
                cell(self.reason, table=False),
                "",
            ]
        )

    def noise(self) -> str:
        if self.p_value is None or self.samples is None:
            return "—"
        return f"p = {self.p_value:.3g} ({self.samples[0]} vs {self.samples[1]} repeats; {self.noise_rule})"


class Verdict(BaseModel):
    """A report's gate outcome: its schema violations and check results, and its baseline comparison."""

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
        return exit_code(self.status)

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
            lines += [f"Not evaluated: {cell(self.error, table=False)}", ""]
        if self.checks:
            rows = []
            for c in self.checks:
                # a value, a pointer and a reason quote the report: each a cell of its own (gates/markdown.py)
                if c.at is None:
                    seen = cell(c.reason)
                else:
                    seen = cell(fmt(c.value)) + (f" at {code(c.at)}" if c.at != c.path else "")
                if c.count > 1:
                    seen += f" (worst of {c.count})"
                threshold = cell(threshold_text(c.check, c.threshold))
                rows.append([MARK[c.status], c.check, seen, threshold, code(c.path)])
            lines += [*table(["", "check", "value", "threshold", "path"], rows), ""]
        elif not self.error:
            lines += ["No checks.", ""]
        if self.violations:
            lines += [f"Schema violations ({len(self.violations)}):", ""]
            lines += [
                f"- {code(v.pointer or '/', table=False)}: {cell(v.message, table=False)}"
                for v in self.violations
            ]
            lines.append("")
        if self.baseline is not None:
            source, note = (
                cell(self.baseline.source, table=False),
                cell(self.baseline.note or "none", table=False),
            )
            lines += [f"Baseline ({source}): {note}", ""]
        if self.comparison is not None:
            lines.append(self.comparison.to_markdown())
        return "\n".join(lines)
