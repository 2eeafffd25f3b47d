"""What people read of a run, made from its models (bridge/core/result.py) and nothing else: the outcome in words
(`outcome_words`, the CLI's and the pages'), summary.md (`summary_markdown`: markdown through gates/markdown.py,
the helper gates' own markdown uses), report.html (`run_page`: one self-contained page, no network, no
scripts: the verdict table, the baseline comparison, parameters, provenance, the plots inline as data: URIs
and the tails of the logs) and the results plots (`judged_plots`). bridge/results/outcome.py writes them.

    md = summary_markdown(result, out_dir, verdict, report)
    html = run_page(result, out_dir, verdict, report)
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gates
import gates.tables
from bridge.core.caps import walk
from bridge.core.result import RunResult
from bridge.host import accelerator_words
from bridge.results import plots
from gates.markdown import cell, code, fence, table

TAIL_LINES = 60
# a file of the run that summary.md may link to or show: a plain relative path (no markup, no scheme)
PLAIN_PATH = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,100}(/[A-Za-z0-9][A-Za-z0-9._-]{0,100}){0,3}")
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


def verdict_line(request_id: str, result: RunResult) -> str:
    """The CLI's one line for a finished request: 'ID: PRESET succeeded, verdict pass (reason)'."""
    reason = f" ({result.reason})" if result.reason else ""
    return f"{request_id}: {result.preset} {outcome_words(result.status, result.verdict)}{reason}"


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
    """The page; `judged`: the results plots (bridge/results/plots.py), shown under Results."""
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
    drawn = [p for p in sorted(out_dir.rglob("*.png")) if p.relative_to(out_dir).as_posix() not in judged]
    if drawn:
        parts.append("<h2>Plots (drawn by the program)</h2>")
    for png in drawn:
        rel = png.relative_to(out_dir).as_posix()
        if png.stat().st_size <= MAX_PLOT_BYTES:
            parts.append(_figure(rel, png.read_bytes()))
        else:
            link = (
                f'<a href="./{_e(rel)}">{_e(rel)}</a>'
                if PLAIN_PATH.fullmatch(rel)
                else f"<code>{_e(rel)}</code>"
            )
            parts.append(f"<p>{link} (too large to inline)</p>")
    for name in ("stdout.log", "stderr.log"):
        log = out_dir / "logs" / name
        if log.is_file():
            parts.append(f"<h2>{name} (last {TAIL_LINES} lines of {log.stat().st_size} bytes)</h2>")
            parts.append(f"<pre>{_e(tail(log))}</pre>")
    parts.append("</body></html>\n")
    return "".join(parts)


# --- summary.md ----------------------------------------------------------------------------------------


def _fmt(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:g}"
    return json.dumps(value) if not isinstance(value, str) else value


RESULT_ROWS = gates.tables.MAX_ROWS
STDERR_TAIL = 20
NOT_SUCCEEDED = ("failed", "error", "timed-out")
CELL_MARK = {"pass": " ✓", "fail": " ✗", None: ""}


def _flat(obj: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Scalars of `obj` at any depth, nested keys as `a.b.c`; lists are left out."""
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        elif not isinstance(v, list):
            out[prefix + k] = v
    return out


def _value(value: Any) -> str:
    """A value for a table cell (gates/markdown.py: a code span unless it is plain words or numbers)."""
    return "" if value is None else cell(_fmt(value))


def tables_markdown(tables: Sequence[gates.tables.Built], level: str = "###") -> list[str]:
    """Markdown of results tables (gates/tables.py): a judged cell is marked ✓ or ✗, a judged column names its
    threshold."""
    lines: list[str] = []
    for t in tables:
        # a report's text: at most 200 characters a cell, never markdown (gates/markdown.py)
        rows = [[cell(c.text, 200) + CELL_MARK[c.status] for c in row] for row in t.rows]
        lines += [f"{level} {t.title}", "", *table([cell(h, 200) for h in t.head()], rows)]
        if t.more:
            lines += ["", f"({t.more} more rows in report.json)"]
        lines.append("")
    return lines


def results_markdown(report: Mapping[str, Any], checks: Sequence[Any] = ()) -> list[str]:
    """summary.md's Results section: the kind's results tables (gates/tables.py) judged by `checks` (the
    verdict's check results), then its summary (or a probe's facts) at every depth."""
    lines = tables_markdown(gates.tables.results_tables(dict(report), checks))
    facts = (
        report.get("summary")
        if isinstance(report.get("summary"), Mapping)
        else report.get(str(report.get("kind")))
    )
    if isinstance(facts, Mapping) and (flat_facts := _flat(facts)):
        facts_rows = [[cell(k, 200), _value(v)] for k, v in flat_facts.items()]
        lines += ["### Summary", "", *table(["", ""], facts_rows), ""]
    return ["## Results", "", *lines] if lines else []


def stderr_tail(out_dir: Path, n: int = STDERR_TAIL) -> list[str]:
    """The last `n` lines of logs/stderr.log (already redacted and capped), or []."""
    try:
        text = (out_dir / "logs" / "stderr.log").read_text(errors="replace")
    except OSError:
        return []
    tail = text.rstrip("\n").splitlines()[-n:]
    return ["## Last lines of stderr", "", *fence(tail), ""] if tail else []


def absolute_links(markdown: str, base: str, image_base: str | None = None) -> str:
    """`markdown` with its relative links (logs, plots) made absolute under `base` (a URL ending in /), images
    under `image_base` (default `base`): for a page where a relative link cannot resolve (a job summary)."""

    def absolute(m: re.Match[str]) -> str:
        return f"{m.group(1)}{(image_base or base) if m.group(1).startswith('!') else base}{m.group(2)})"

    return re.sub(r"(!?\[[^\]]*\]\()(?![a-z][a-z0-9+.-]*:|/|#)([^)\s]+)\)", absolute, markdown)


def summary_markdown(
    result: RunResult,
    out_dir: Path,
    verdict: gates.Verdict | None = None,
    report: Mapping[str, Any] | None = None,
    judged: Sequence[str] = (),
) -> str:
    """The same facts as result.json, for a human; plus the report's key results, the gate table, any plots,
    and the end of stderr when the run did not succeed."""
    lines = [
        f"# {cell(result.preset, 200, table=False)}: {outcome_heading(result.status, result.verdict)}",
        "",
    ]
    if result.reason:
        lines += [f"**Reason:** {code(result.reason, table=False)}", ""]
    rows = [
        ("request", result.request_id),
        ("subject", result.subject),
        ("runner", result.runner_name),
        ("labels", ", ".join(result.runner_labels) or None),
        ("exit code", result.exit_code),
        ("started", result.started_at),
        ("ended", result.ended_at),
        ("duration", f"{result.duration_s:.2f} s" if result.duration_s is not None else None),
        ("preset hash", result.preset_hash),
        ("isolation", result.isolation),
        ("strays killed", result.strays_killed),
        (
            "host",
            f"{result.host.get('hostname')} · {result.host.get('os')} · {result.host.get('cpu')}"
            if result.host
            else None,
        ),
    ]
    lines += [*table(["", ""], [[k, _value(v)] for k, v in rows if v is not None]), ""]
    if result.dropped:
        lines += (
            ["## Dropped (not committed)", ""] + [f"- {cell(d, table=False)}" for d in result.dropped] + [""]
        )
    if result.params:
        params = [[cell(k), code(_fmt(v))] for k, v in result.params.items()]
        lines += ["## Parameters", "", *table(["name", "value"], params), ""]
    if result.argv:
        lines += ["## Command", "", *fence([shlex.join(result.argv)]), ""]
    if report is not None:
        lines += results_markdown(report, verdict.checks if verdict else ())
        lines += [f"![{p}]({p})" for p in judged] + ([""] if judged else [])
    if verdict is not None:
        lines += ["## Gate", "", verdict.to_markdown(), ""]
    if result.status in NOT_SUCCEEDED:
        lines += stderr_tail(out_dir)
    pngs = sorted(rel for rel in walk(out_dir).files if rel.endswith(".png") and rel not in judged)
    if pngs:  # an image only where the name is a plain path; any other name is shown, never linked
        lines += ["## Plots (drawn by the program)", ""]
        lines += [
            f"![{p}]({p})" if PLAIN_PATH.fullmatch(p) else f"- {code(p, table=False)}" for p in pngs
        ] + [""]
    logs = [p for p in ("logs/stdout.log", "logs/stderr.log") if (out_dir / p).is_file()]
    if logs:
        lines += (
            ["## Logs", ""] + [f"- [{p}]({p}) ({(out_dir / p).stat().st_size} bytes)" for p in logs] + [""]
        )
    if result.tools:
        lines += ["## Tools", "", ", ".join(f"{k} {v}" for k, v in result.tools.items()), ""]
    return "\n".join(lines)


def judged_plots(
    report: dict[str, Any], result: RunResult, verdict: gates.Verdict | None
) -> dict[str, bytes]:
    """The run's results plots (bridge/results/plots.py), titled with its verdict, preset, label, subject and device."""
    env = report.get("environment")
    device = env.get("device") if isinstance(env, Mapping) else None
    title = plots.title_line(
        result.preset,
        result.verdict,
        ", ".join(result.runner_labels) or None,
        result.subject or (str(report["subject"]) if report.get("subject") else None),
        str(device) if device else accelerator_words(result.host.get("accelerator")),
    )
    return plots.judged_plots(gates.tables.results_tables(report, verdict.checks if verdict else ()), title)
