"""report.html: one self-contained page per run for people (no network, no scripts): the verdict table,
the baseline comparison, parameters, provenance, the plots inline (data: URIs) and the tails of the logs.

    html = run_page(result, out_dir, verdict, report)      # written next to summary.md by RunOutcome.write
"""

from __future__ import annotations

import base64
import html
import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gates
import gates.tables
from bridge.host import accelerator_words

if TYPE_CHECKING:
    from bridge.result import RunResult

TAIL_LINES = 60
MARK = {"pass": "✓", "fail": "✗"}
MAX_PLOT_BYTES = 4 * 1024 * 1024  # a larger plot is linked, not inlined
STYLE = """body{font:14px/1.45 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left;
vertical-align:top}th{background:#f4f4f4}code,pre{font:12px/1.35 ui-monospace,monospace}pre{background:#f7f7f7;
padding:.6em;overflow-x:auto;white-space:pre-wrap}.pass{color:#17702a}.fail,.error{color:#b00020}
img{max-width:100%;border:1px solid #ddd}"""


def outcome_words(status: str, verdict: str | None) -> str:
    """'succeeded, verdict pass', or 'ran, gate failed' for a program that succeeded but whose report failed
    the gate, or the status (and verdict) as they are: the words the CLI, summary.md and report.html use."""
    if status == "succeeded" and verdict == "fail":
        return "ran, gate failed"
    return status + (f", verdict {verdict}" if verdict else "")


def outcome_heading(status: str, verdict: str | None) -> str:
    """The heading form of `outcome_words`: 'succeeded — verdict pass', 'ran, gate failed', 'error'."""
    if status == "succeeded" and verdict == "fail":
        return "ran, gate failed"
    return status + (f" — verdict {verdict}" if verdict else "")


def signed_words(signed_by: str | None) -> str:
    """Who the runner signed the run's done commit as (`kakeya gate pr` verifies it against the trusted
    base's allowed signers), or that it is unsigned and counts only where unsigned evidence is allowed."""
    if signed_by:
        return f"signed by {signed_by}"
    return "unsigned (allowed only on the embedded bus, or with --allow-unsigned)"


def _e(value: Any) -> str:
    if value is None:
        return ""
    return html.escape(value if isinstance(value, str) else json.dumps(value))


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{h}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _status(status: str | None) -> str:
    return f'<b class="{_e(status)}">{_e(status)}</b>' if status else ""


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last `lines` lines of a (capped) log file."""
    data = path.read_bytes()[-256 * 1024 :].decode(errors="replace")
    return "\n".join(data.splitlines()[-lines:])


def verdict_section(verdict: gates.Verdict) -> str:
    parts = [f"<h2>Verdict: {_status(verdict.status)}</h2>"]
    if verdict.error:
        parts.append(f"<p>{_e(verdict.error)}</p>")
    if verdict.violations:
        parts.append("<p>Schema violations:</p><ul>")
        parts += [f"<li><code>{_e(v.pointer)}</code>: {_e(v.message)}</li>" for v in verdict.violations]
        parts.append("</ul>")
    if verdict.checks:
        rows = [
            [_status(c.status), *(_e(v) for k, v in c.model_dump().items() if k != "status")]
            for c in verdict.checks
        ]
        head = ["status", *(k for k in verdict.checks[0].model_dump() if k != "status")]
        parts.append(_table(head, rows))
    if verdict.baseline is not None:
        parts.append(f"<h3>Baseline ({_e(verdict.baseline.source)})</h3><p>{_e(verdict.baseline.note)}</p>")
    if verdict.comparison is not None:
        rows = [[_e(k), _e(v)] for k, v in verdict.comparison.model_dump().items() if v is not None]
        parts.append(_table(["", ""], rows))
    return "".join(parts)


def results_section(report: dict[str, Any], verdict: gates.Verdict | None) -> str:
    """The report's results tables (gates/tables.py), judged by the verdict's checks: a judged column names
    its threshold, a judged cell is marked pass or fail."""
    tables = gates.tables.results_tables(report, verdict.checks if verdict else ())
    if not tables:
        return ""
    parts = ["<h2>Results</h2>"]
    for t in tables:
        rows = [
            [
                f'<span class="{c.status}">{_e(c.text)} {MARK[c.status]}</span>' if c.status else _e(c.text)
                for c in row
            ]
            for row in t.rows
        ]
        parts += [f"<h3>{_e(t.title)}</h3>", _table([_e(h) for h in t.head()], rows)]
        if t.more:
            parts.append(f"<p>({t.more} more rows in report.json)</p>")
    return "".join(parts)


def _figure(rel: str, data: bytes) -> str:
    return (
        f'<figure><img alt="{_e(rel)}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
        f"<figcaption>{_e(rel)}</figcaption></figure>"
    )


def run_page(
    result: RunResult,
    out_dir: Path,
    verdict: gates.Verdict | None,
    report: dict[str, Any] | None = None,
    judged: dict[str, bytes] | None = None,
) -> str:
    """The page; `judged`: the results plots (bridge/plots.py), shown under Results."""
    judged = judged or {}
    title = f"{result.preset}: {outcome_heading(result.status, result.verdict)}"
    if result.status == "succeeded" and result.verdict == "fail":
        shown = 'ran, <b class="fail">gate failed</b>'
    else:
        shown = _status(result.status) + (f" — verdict {_status(result.verdict)}" if result.verdict else "")
    parts = [
        f"<!doctype html><html><head><meta charset=utf-8><title>{_e(title)}</title><style>{STYLE}</style>",
        f"</head><body><h1>{_e(result.preset)}: {shown}</h1>",
    ]
    if result.reason:
        parts.append(f"<p><b>Reason:</b> {_e(result.reason)}</p>")
    if report is not None:
        parts.append(results_section(report, verdict))
        parts += [_figure(name, data) for name, data in judged.items()]
    if verdict is not None:
        parts.append(verdict_section(verdict))
    if result.params:
        parts.append("<h2>Parameters</h2>")
        parts.append(
            _table(["name", "value"], [[_e(k), f"<code>{_e(v)}</code>"] for k, v in result.params.items()])
        )
    provenance = {
        "request": result.request_id,
        "subject": result.subject,
        "runner": result.runner_name,
        "labels": ", ".join(result.runner_labels) or None,
        "signed": signed_words(result.signed_by),
        "forced labels": (
            f"{', '.join(result.forced_labels)}: served without their hardware (--force-labels)"
            if result.forced_labels
            else None
        ),
        "accelerator": accelerator_words(result.host.get("accelerator")) or "none",
        "exit code": result.exit_code,
        "started": result.started_at,
        "ended": result.ended_at,
        "duration s": result.duration_s,
        "preset hash": result.preset_hash,
        **{f"host {k}": v for k, v in result.host.items() if k != "accelerator"},
        **{f"tool {k}": v for k, v in result.tools.items()},
    }
    parts.append("<h2>Provenance</h2>")
    parts.append(_table(["", ""], [[_e(k), _e(v)] for k, v in provenance.items() if v not in (None, "")]))
    if result.argv:
        parts.append(f"<h3>Command</h3><pre>{_e(shlex.join(result.argv))}</pre>")
    plots = [p for p in sorted(out_dir.rglob("*.png")) if p.relative_to(out_dir).as_posix() not in judged]
    if plots:
        parts.append("<h2>Plots (drawn by the program)</h2>")
    for png in plots:
        rel = png.relative_to(out_dir).as_posix()
        if png.stat().st_size <= MAX_PLOT_BYTES:
            parts.append(_figure(rel, png.read_bytes()))
        else:
            parts.append(f'<p><a href="{_e(rel)}">{_e(rel)}</a> (too large to inline)</p>')
    for name in ("stdout.log", "stderr.log"):
        log = out_dir / "logs" / name
        if log.is_file():
            parts.append(f"<h2>{name} (last {TAIL_LINES} lines of {log.stat().st_size} bytes)</h2>")
            parts.append(f"<pre>{_e(tail(log))}</pre>")
    parts.append("</body></html>\n")
    return "".join(parts)
