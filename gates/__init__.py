"""Evidence gates: report schemas and threshold checks. Pure: imports neither bridge nor engine.

verdict = gates.evaluate(report_dict, gates.parse_checks(preset_yaml["gate"]))
verdict.status            # "pass" | "fail" | "error"
verdict.to_markdown()     # a table of the checks for summary.md

Modules, each importing only those above it: pointer (JSON pointers with `*`), report (strict JSON
reports, the finite-number test), schema (gates/schemas/), checks (check specs and running one),
verdict (Verdict, Comparison, markdown, the exit-code rule), compare (a metric against a baseline),
evaluate (the schema first, then the checks).
"""

from gates.checks import Check, CheckResult, parse_checks, run_check
from gates.compare import compare
from gates.evaluate import evaluate, evaluate_file
from gates.pointer import PathError, resolve
from gates.report import ReportError, load_report, parse_report
from gates.schema import known as known_schemas
from gates.verdict import Baseline, Comparison, Verdict, Violation, exit_code

__all__ = [
    "Baseline",
    "Check",
    "CheckResult",
    "Comparison",
    "PathError",
    "ReportError",
    "Verdict",
    "Violation",
    "compare",
    "evaluate",
    "evaluate_file",
    "exit_code",
    "known_schemas",
    "load_report",
    "parse_checks",
    "parse_report",
    "resolve",
    "run_check",
]
