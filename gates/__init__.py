"""Evidence gates: report schemas and threshold checks. Pure: imports neither bridge nor engine.

verdict = gates.evaluate(report_dict, gates.parse_checks(preset_yaml["gate"]))
verdict.status            # "pass" | "fail" | "error"
verdict.to_markdown()     # a table of the checks for summary.md
"""

from gates.checks import Check, parse_checks
from gates.compare import Comparison, compare
from gates.evaluate import (
    Baseline,
    CheckResult,
    ReportError,
    Verdict,
    Violation,
    evaluate,
    evaluate_file,
    load_report,
    parse_report,
    run_check,
)
from gates.pointer import PathError, resolve
from gates.schema import known as known_schemas

Verdict.model_rebuild(_types_namespace={"Comparison": Comparison})  # Verdict.comparison (a forward reference)

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
    "known_schemas",
    "load_report",
    "parse_checks",
    "parse_report",
    "resolve",
    "run_check",
]
