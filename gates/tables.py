"""Each report kind's results tables: declared here once (`TABLES`), built from a report with the gate's checks
(`results_tables`), and the one rule for human units (`human`). summary.md, report.html, the job summary and
the judged plots all render these tables (bridge/render.py, bridge/evidence/summary.py, bridge/plots.py).

    tables = results_tables(report, verdict.checks)   # [] for a kind without tables
    tables[0].head()                                  # ["context", "evicted", "oracle recall", ...]
    tables[0].rows[0][3].text, .status                # "1", "pass" | "fail" | None (not judged)

A column's path is relative to its row; one `*` segment fans out over an object's keys (one column each,
`{key}` in its name), e.g. niah's `/policies/*/recall` -> `hybrid recall`, `sink_window recall`. A column is
judged by each check whose path names its values (`/rungs/*/policies/hybrid/recall_delta`) or that `also`
names (a summary of it, e.g. `/summary/oracle_min_recall` of the oracle's recall at every rung).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from gates.checks import Check, CheckResult, run_check, threshold_text
from gates.pointer import PathError, join, resolve, split
from gates.report import fmt, is_number

Unit = Literal["", "bytes", "tok/s", "x", "tokens"]
BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def human(value: Any, unit: Unit = "") -> str:
    """A value for people: bytes as KiB/MiB/GiB (binary), rates and ratios with a few digits and no
    exponent (2×10^5 reads 200,000), booleans as yes/no, missing as —."""
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not is_number(value):
        return value if isinstance(value, str) else fmt(value, 60)
    if unit == "bytes":
        size, i = float(value), 0
        while abs(size) >= 1024 and i < len(BYTE_UNITS) - 1:
            size, i = size / 1024, i + 1
        return f"{size:.0f} B" if i == 0 else f"{size:.1f}".removesuffix(".0") + f" {BYTE_UNITS[i]}"
    if unit == "tokens" and value >= 1024 and value % 1024 == 0:
        return f"{value / 1048576:g}M" if value % 1048576 == 0 else f"{value / 1024:g}K"
    if unit == "tok/s":
        return f"{value:,.1f}"
    if unit == "x":
        return f"{value:,.0f}×" if abs(value) >= 100 else f"{value:.2f}×"
    if isinstance(value, int):
        return f"{value:,}"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    text = f"{value:.3g}"
    return text + ".0" if isinstance(value, float) and text.lstrip("-").isdigit() else text


class Plot(BaseModel):
    """One panel of a table's plot: `y` columns (names before fan-out, e.g. `{key} recall`) over column `x`
    (numbers: a line per column; strings: bars), one line per value of `series` columns when given."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    x: str
    y: list[str]
    ylabel: str
    xlabel: str | None = None  # default: the x column's name
    series: list[str] = []
    # a report pointer to the number a summary check compares these values with (throughput's min_speedup)
    threshold: str | None = None
    threshold_label: str = ""  # what the check compares with it
    log_x: bool = False
    log_y: bool = False


class Column(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str
    path: str
    unit: Unit = ""
    also: str | None = None  # a check on this pointer judges this column too (a summary of its values)


class Table(BaseModel):
    """One results table of a report kind: a row per item of the array at `rows`."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    title: str
    rows: str
    columns: list[Column]
    plots: list[Plot] = []


def _t(title: str, rows: str, columns: list[tuple[str, ...]], plots: Sequence[dict[str, Any]] = ()) -> Table:
    keys = ("name", "path", "unit", "also")
    return Table(
        title=title,
        rows=rows,
        columns=[Column(**dict(zip(keys, c, strict=False))) for c in columns],
        plots=[Plot(**p) for p in plots],
    )


# The declaration: report kind -> its results tables (probe has none: its facts are shown as they are).
TABLES: dict[str, list[Table]] = {
    "niah": [
        _t(
            "Recall and K/V by context and policy",
            "/rungs",
            [
                ("context", "/context", "tokens"),
                ("evicted", "/needles_evicted"),
                ("full recall", "/oracle/recall", "", "/summary/oracle_min_recall"),
                ("full K/V", "/oracle/kv_bytes", "bytes"),
                ("{key} recall", "/policies/*/recall"),
                ("{key} recall Δ", "/policies/*/recall_delta"),
                ("{key} K/V", "/policies/*/kv_bytes", "bytes"),
                ("{key} K/V vs full", "/policies/*/kv_fraction"),
                ("{key} bounded", "/policies/*/kv_bounded", "", "/summary/kv_bounded"),
            ],
            [
                {
                    "x": "context",
                    "y": ["full recall", "{key} recall"],
                    "ylabel": "needle recall",
                    "log_x": True,
                },
                {
                    "x": "context",
                    "y": ["{key} recall Δ"],
                    "ylabel": "recall Δ vs full (lower is better)",
                    "log_x": True,
                },
                {
                    "x": "context",
                    "y": ["full K/V", "{key} K/V"],
                    "ylabel": "K/V held",
                    "log_x": True,
                    "log_y": True,
                },
            ],
        )
    ],
    "throughput": [
        _t(
            "Decoding by prompt and method",
            "/prompts",
            [
                ("prompt tokens", "/prompt_tokens"),
                ("{key} decode tok/s", "/*/decode_tok_s", "tok/s"),
                ("{key} e2e tok/s", "/*/e2e_tok_s", "tok/s"),
                ("speedup", "/speedup", "x"),
                ("acceptance length", "/speculative/acceptance_length"),
                ("exact", "/exact"),
            ],
            [
                {"x": "#", "y": ["{key} decode tok/s"], "ylabel": "decode tok/s", "xlabel": "prompt"},
                {
                    "x": "#",
                    "y": ["speedup"],
                    "ylabel": "speculative / greedy decode tok/s",
                    "xlabel": "prompt",
                    "threshold": "/summary/min_speedup",
                    "threshold_label": "overall speedup ≥ min_speedup",
                },
            ],
        ),
        _t(
            "Batched greedy decoding",
            "/batched",
            [
                ("batch", "/batch"),
                ("decode tok/s", "/decode_tok_s", "tok/s"),
                ("K/V", "/kv_bytes", "bytes"),
                ("exact", "/exact"),
            ],
            [{"x": "batch", "y": ["decode tok/s"], "ylabel": "decode tok/s", "log_x": True}],
        ),
    ],
    "serving": [
        _t(
            "Serving by concurrency",
            "/levels",
            [
                ("concurrency", "/concurrency"),
                ("output tok/s", "/output_tok_s", "tok/s", "/summary/tok_s_ok"),
                ("req/s", "/requests_per_s"),
                ("TTFT p50 s", "/ttft_p50_s"),
                ("TTFT p99 s", "/ttft_p99_s"),
                ("ITL p50 s", "/itl_p50_s"),
                ("ITL p99 s", "/itl_p99_s"),
                ("K/V held", "/kv_bytes_held_max", "bytes"),
                ("failed", "/failed"),
                ("exact", "/exact", "", "/summary/exact"),
            ],
            [
                {"x": "concurrency", "y": ["output tok/s"], "ylabel": "output tok/s", "log_x": True},
                {
                    "x": "concurrency",
                    "y": ["TTFT p99 s", "ITL p99 s"],
                    "ylabel": "p99 latency (s)",
                    "log_x": True,
                },
            ],
        )
    ],
    "compression": [
        _t(
            "Net bytes by batch and sequence length",
            "/table",
            [
                ("policy", "/policy"),
                ("batch", "/batch"),
                ("length", "/seq_len", "tokens"),
                ("full", "/full_bytes", "bytes"),
                ("net", "/net_bytes", "bytes"),
                ("net bytes/token", "/net_bytes_per_token"),
                ("ratio", "/compression_ratio", "x"),
            ],
            [
                {
                    "x": "length",
                    "y": ["ratio"],
                    "ylabel": "compression vs full cache",
                    "series": ["policy", "batch"],
                    "log_x": True,
                    "log_y": True,
                }
            ],
        ),
        _t(
            "Cross-check: predicted vs measured cache bytes",
            "/checks",
            [
                ("model", "/model"),
                ("policy", "/policy"),
                ("length", "/seq_len"),
                ("predicted", "/predicted_bytes", "bytes"),
                ("measured", "/measured_bytes", "bytes"),
                ("match", "/match", "", "/summary/check_passed"),
            ],
        ),
    ],
    "parity": [
        _t(
            "PyTorch vs MLX by dtype",
            "/runs",
            [
                ("dtype", "/dtype"),
                ("agreement", "/agreement", "", "/summary/float32_agreement"),
                ("exact prompts", "/exact_prompts"),
                ("first divergence", "/min_first_divergence"),
                ("prefix agreement", "/mean_prefix_agreement"),
                ("max |logit Δ|", "/max_abs_logit_diff"),
            ],
        )
    ],
    "restoration": [
        _t(
            "Recall and bytes by arm",
            "/arms",
            [
                ("arm", "/name"),
                ("policy", "/policy"),
                ("restore", "/restore"),
                ("alpha", "/alpha"),
                ("recall", "/recall"),
                ("matches oracle", "/matches_oracle"),
                ("K/V", "/kv_bytes", "bytes"),
                ("source", "/source_bytes", "bytes"),
                ("rel_mse", "/rel_mse_all"),
            ],
            [{"x": "arm", "y": ["recall"], "ylabel": "needle recall"}],
        )
    ],
}
MAX_ROWS = 40


class Cell(BaseModel):
    value: Any = None
    text: str
    status: Literal["pass", "fail"] | None = None  # judged by a check: whether this value meets it


class Col(BaseModel):
    """A column after fan-out: its name, unit, template name (for plots) and the checks that judge it."""

    name: str
    template: str
    unit: Unit
    checks: list[Check] = []

    def head(self) -> str:
        """The header, with each threshold that judges it: `hybrid recall Δ (gate ≤ 0.05)`."""
        gates = [threshold_text(c.check, c.value) for c in self.checks]
        return self.name + (f" (gate {', '.join(gates)})" if gates else "")


class Built(BaseModel):
    """A results table of one report: its columns and rows (at most MAX_ROWS; `more` counts the rest)."""

    title: str
    columns: list[Col]
    rows: list[list[Cell]]
    more: int = 0
    plots: list[Plot] = []
    thresholds: list[float | None] = []  # each plot's `threshold`, read from the report

    def head(self) -> list[str]:
        return [c.head() for c in self.columns]

    def series(self, template: str) -> list[tuple[Col, list[Any]]]:
        """The columns made from `template` (a name before fan-out, or `#` for the row number), with values."""
        if template == "#":
            return [(Col(name="#", template="#", unit=""), list(range(1, len(self.rows) + 1)))]
        return [
            (c, [row[i].value for row in self.rows])
            for i, c in enumerate(self.columns)
            if c.template == template
        ]


def _matches(pattern: list[str], pointer: list[str]) -> bool:
    return len(pattern) == len(pointer) and all(p in ("*", q) for p, q in zip(pattern, pointer, strict=True))


def _get(doc: Any, path: str) -> Any:
    try:
        return resolve(doc, path)[0][1]
    except (PathError, ValueError):
        return None


def _judge(check: Check, value: Any) -> Literal["pass", "fail"] | None:
    if value is None or check.check == "match":
        return None
    if check.check == "all_true":
        return "pass" if value is True else "fail"
    return run_check({"v": value}, check.model_copy(update={"path": "/v"})).status


def build(report: dict[str, Any], table: Table, checks: list[Check]) -> Built | None:
    """`table` of `report` (None when the report has no such rows), each column judged by `checks`."""
    items = _get(report, table.rows)
    if not isinstance(items, list) or not items or not all(isinstance(r, dict) for r in items):
        return None
    cols: list[tuple[Col, str, Check | None]] = []
    for spec in table.columns:
        parts = split(spec.path)
        star = parts.index("*") if "*" in parts else None
        if star is None:
            paths = [("", spec.path)]
        else:
            keys: dict[str, None] = {}
            for row in items:
                obj = _get(row, join(parts[:star]))
                for k, v in obj.items() if isinstance(obj, dict) else ():
                    if _get(v, join(parts[star + 1 :])) is not None:
                        keys[k] = None
            paths = [(k, join([*parts[:star], k, *parts[star + 1 :]])) for k in keys]
        for key, path in paths:
            absolute = split(table.rows) + ["*"] + split(path)
            judged = [
                c
                for c in checks
                if _matches(split(c.path), absolute) or (spec.also is not None and c.path == spec.also)
            ]
            per_value = next((c for c in judged if c.path != spec.also), None)
            col = Col(name=spec.name.replace("{key}", key), template=spec.name, unit=spec.unit, checks=judged)
            cols.append((col, path, per_value))
    values = [[_get(row, path) for _, path, _ in cols] for row in items[:MAX_ROWS]]
    kept = [
        i for i in range(len(cols)) if any(v[i] is not None for v in values)
    ]  # a column with no value: none
    cols = [cols[i] for i in kept]
    rows = [
        [
            Cell(value=v[i], text=human(v[i], col.unit), status=check and _judge(check, v[i]))
            for i, (col, _, check) in zip(kept, cols, strict=True)
        ]
        for v in values
    ]
    return Built(
        title=table.title,
        columns=[c for c, _, _ in cols],
        rows=rows,
        more=max(0, len(items) - MAX_ROWS),
        plots=table.plots,
        thresholds=[_number(report, p.threshold) for p in table.plots],
    )


def _number(report: dict[str, Any], pointer: str | None) -> float | None:
    value = _get(report, pointer) if pointer else None
    return value if is_number(value) else None


def results_tables(report: dict[str, Any], checks: Sequence[Check | CheckResult] = ()) -> list[Built]:
    """The results tables of `report`'s kind, built and judged by `checks` (a preset's checks, or a verdict's
    check results)."""
    as_checks = [
        c
        if isinstance(c, Check)
        else Check.model_validate({"check": c.check, "path": c.path, "value": c.threshold})
        for c in checks
    ]
    built = (build(report, t, as_checks) for t in TABLES.get(str(report.get("kind")), []))
    return [b for b in built if b is not None]
