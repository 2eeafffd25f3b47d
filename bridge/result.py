"""A run's outcome: result.json's model, the outcome held in memory, and the files written once from it.

Files in a run's out_dir: result.json, report.json (written by the program via $KAKEYA_REPORT),
verdict.json, summary.md, report.html (bridge/page.py), logs/stdout.log, logs/stderr.log, plus whatever the program put in
$KAKEYA_RUN_DIR. The program's own files are on disk; result.json, verdict.json and summary.md are
written by `RunOutcome.write`, once, after the baseline comparison (bridge/evidence.py).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

import gates
import gates.tables
from bridge import plots
from bridge.caps import DROPPED_LINES, atomic_write, walk
from bridge.host import accelerator_words, host_fingerprint, tool_versions
from bridge.logs import Redactor
from bridge.page import outcome_heading, run_page

Status = Literal["succeeded", "failed", "timed-out", "error", "cancelled", "expired", "rejected"]


class RunContext(BaseModel):
    """Who asked for the run and where it runs (filled by the bus runner; empty for `kakeya exec`)."""

    model_config = ConfigDict(extra="forbid")
    request_id: str | None = None
    subject: str | None = None
    runner_name: str | None = None
    runner_labels: list[str] = []
    forced_labels: list[str] = []  # labels served without their accelerator (runner --force-labels)
    signed_by: str | None = None  # the principal the runner signs its done commit as (None: unsigned)


class SchedulerJob(BaseModel):
    """Where a scheduler ran the program (bridge/slurm.py): result.json's `scheduler`."""

    model_config = ConfigDict(extra="forbid")
    scheduler: Literal["slurm"] = "slurm"
    job_id: str
    state: str | None = None  # Slurm's final state
    partition: str | None = None
    node: str | None = None
    gpus: list[str] = []  # the allocated GPUs' indices on the node
    gpu_names: list[str] = []  # their names, where nvidia-smi answered inside the job
    queue_wait_s: float | None = None
    run_time_s: float | None = None


class RunResult(BaseModel):
    """result.json: the provenance and outcome of one run."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    schema_version: Literal[1] = 1
    status: Status
    reason: str | None = None
    exit_code: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    duration_s: float | None = None
    argv: list[str] = []
    preset: str
    preset_hash: str | None = None
    params: dict[str, Any] = {}
    request_id: str | None = None
    subject: str | None = None
    runner_name: str | None = None
    runner_labels: list[str] = []
    forced_labels: list[str] = []  # labels served without their accelerator (bridge/host.py hardware_for)
    signed_by: str | None = None  # the principal the runner signs as; `kakeya gate pr` verifies it
    host: dict[str, Any] = {}
    tools: dict[str, str] = {}
    report: str | None = None
    verdict: Literal["pass", "fail", "error"] | None = None
    isolation: str | None = None  # none | user (uid N) | userns: bridge/isolation.py
    network: str | None = None  # host | none
    strays_killed: int | None = None  # processes left behind by the program, killed at its end
    dropped: list[str] = []  # what the run left and the runner did not commit, with why (bridge/caps.py)

    @field_validator("dropped")
    @classmethod
    def _few(cls, lines: list[str]) -> list[str]:
        """At most DROPPED_LINES lines (a run can leave a million FIFOs; result.json stays small)."""
        if len(lines) <= DROPPED_LINES:
            return lines
        return lines[: DROPPED_LINES - 1] + [f"... and {len(lines) - DROPPED_LINES + 1} more, not listed"]

    scheduler: SchedulerJob | None = None  # a scheduler's job ran it (bridge/slurm.py)


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso(t: dt.datetime) -> str:
    return t.isoformat(timespec="milliseconds")


@dataclass
class RunOutcome:
    """One run's outcome in memory: its result, the report it wrote (parsed) and its verdict."""

    out_dir: Path
    result: RunResult
    report: dict[str, Any] | None = None
    verdict: gates.Verdict | None = None
    redact: Redactor = field(default_factory=lambda: Redactor([]))

    def files(self) -> dict[str, bytes]:
        """The runner's own files of this outcome, in memory: verdict.json (always the runner's: one that says
        why there is none when nothing was gated), result.json, summary.md and report.html, redacted."""
        out = self.out_dir
        verdict = self.verdict or no_verdict(self.result)
        # the report as the runner commits it (redacted): a secret must not reach a plot's pixels either
        report, pngs = self.report, {}
        if report is not None:
            try:
                report = json.loads(self.redact.text(json.dumps(report, ensure_ascii=False)))
                pngs = judged_plots(report, self.result, self.verdict)
            except ValueError:  # redacting broke the JSON: the tables' text is redacted below, no plots
                pass
        texts = {
            "verdict.json": verdict.model_dump_json(indent=2) + "\n",
            "result.json": self.result.model_dump_json(indent=2) + "\n",
            "summary.md": summary_markdown(self.result, out, self.verdict, report, list(pngs)),
            "report.html": run_page(self.result, out, self.verdict, report, pngs),
        }
        return {name: self.redact.text(text).encode() for name, text in texts.items()} | pngs

    def write(self) -> RunResult:
        """Write verdict.json, result.json, summary.md and report.html (each once, over whatever the program put
        there) and redact every file; the result. Run it on a directory the caps have checked (bridge/caps.py)."""
        out = self.out_dir
        out.mkdir(parents=True, exist_ok=True)
        for name, data in self.files().items():
            atomic_write(out / name, data)
        for rel, size in walk(out).files.items():
            self.redact.scrub_file(out / rel, size)
        return self.result


def judged_plots(
    report: dict[str, Any], result: RunResult, verdict: gates.Verdict | None
) -> dict[str, bytes]:
    """The run's results plots (bridge/plots.py), titled with its verdict, preset, label, subject and device."""
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


def no_verdict(result: RunResult) -> gates.Verdict:
    """verdict.json of a run whose report was not gated: it says why."""
    why = f"the run ended {result.status}" + (f" ({result.reason})" if result.reason else "")
    what = "no report to gate" if result.report is None else "the report was not gated"
    return gates.Verdict(status="error", error=f"{what}: {why}")


def not_run(
    out_dir: Path,
    status: Status,
    reason: str,
    *,
    preset_name: str,
    params: Mapping[str, Any],
    context: RunContext | None = None,
    preset_hash: str | None = None,
) -> RunOutcome:
    """The outcome where nothing ran (rejected, expired, cancelled before start)."""
    result = RunResult(
        status=status,
        reason=reason,
        preset=preset_name,
        preset_hash=preset_hash,
        params=dict(params),
        host=host_fingerprint(),
        tools=tool_versions(),
        ended_at=iso(now()),
        **(context or RunContext()).model_dump(),
    )
    return RunOutcome(out_dir, result)


def write_outcome(out_dir: Path, status: Status, reason: str, **kw: Any) -> RunResult:
    """Record (write) an outcome where nothing ran; see `not_run`."""
    return not_run(out_dir, status, reason, **kw).write()


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


def _cell(value: Any) -> str:
    return "" if value is None else _fmt(value).replace("|", "\\|").replace("\n", " ")


def _text(text: str, limit: int = 200) -> str:
    """A report's text for a markdown table cell: one line, no `|`, no `<` (what a report says cannot open HTML
    in a job summary), at most `limit` characters."""
    text = text.replace("|", "\\|").replace("\n", " ").replace("<", "&lt;")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def tables_markdown(tables: Sequence[gates.tables.Built], level: str = "###") -> list[str]:
    """Markdown of results tables (gates/tables.py): a judged cell is marked ✓ or ✗, a judged column names its
    threshold."""
    lines: list[str] = []
    for t in tables:
        lines += [f"{level} {t.title}", "", "| " + " | ".join(_text(h) for h in t.head()) + " |"]
        lines += ["|" + "---|" * len(t.columns)]
        lines += [
            "| " + " | ".join(_text(c.text) + CELL_MARK[c.status] for c in row) + " |" for row in t.rows
        ]
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
        lines += ["### Summary", "", "| | |", "|---|---|"]
        lines += [f"| {k} | {_cell(v)} |" for k, v in flat_facts.items()] + [""]
    return ["## Results", "", *lines] if lines else []


def stderr_tail(out_dir: Path, n: int = STDERR_TAIL) -> list[str]:
    """The last `n` lines of logs/stderr.log (already redacted and capped), or []."""
    try:
        text = (out_dir / "logs" / "stderr.log").read_text(errors="replace")
    except OSError:
        return []
    tail = text.rstrip("\n").splitlines()[-n:]
    return ["## Last lines of stderr", "", "```", *tail, "```", ""] if tail else []


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
        f"# {result.preset}: {outcome_heading(result.status, result.verdict)}",
        "",
    ]
    if result.reason:
        lines += [f"**Reason:** {result.reason}", ""]
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
    lines += ["| | |", "|---|---|"] + [f"| {k} | {_fmt(v)} |" for k, v in rows if v is not None] + [""]
    if result.dropped:
        lines += ["## Dropped (not committed)", ""] + [f"- {d}" for d in result.dropped] + [""]
    if result.params:
        lines += ["## Parameters", "", "| name | value |", "|---|---|"]
        lines += [f"| {k} | `{_fmt(v)}` |" for k, v in result.params.items()] + [""]
    if result.argv:
        lines += ["## Command", "", "```", shlex.join(result.argv), "```", ""]
    if report is not None:
        lines += results_markdown(report, verdict.checks if verdict else ())
        lines += [f"![{p}]({p})" for p in judged] + ([""] if judged else [])
    if verdict is not None:
        lines += ["## Gate", "", verdict.to_markdown(), ""]
    if result.status in NOT_SUCCEEDED:
        lines += stderr_tail(out_dir)
    pngs = sorted(rel for rel in walk(out_dir).files if rel.endswith(".png") and rel not in judged)
    if pngs:
        lines += ["## Plots (drawn by the program)", ""] + [f"![{p}]({p})" for p in pngs] + [""]
    logs = [p for p in ("logs/stdout.log", "logs/stderr.log") if (out_dir / p).is_file()]
    if logs:
        lines += (
            ["## Logs", ""] + [f"- [{p}]({p}) ({(out_dir / p).stat().st_size} bytes)" for p in logs] + [""]
        )
    if result.tools:
        lines += ["## Tools", "", ", ".join(f"{k} {v}" for k, v in result.tools.items()), ""]
    return "\n".join(lines)
