"""A run's outcome in memory (`RunOutcome`: its result, report and verdict) and the files written once from it.

Files in a run's out_dir: result.json, report.json (written by the program via $KAKEYA_REPORT),
verdict.json, summary.md and report.html (bridge/results/render.py), logs/stdout.log, logs/stderr.log, plus whatever
the program put in $KAKEYA_RUN_DIR. The program's own files are on disk; result.json, verdict.json,
summary.md and report.html are written by `RunOutcome.write`, once, after the baseline comparison
(bridge/evidence/baseline.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gates
from bridge.core.caps import atomic_write, walk
from bridge.core.logs import Redactor
from bridge.core.result import RunContext, RunResult, Status, iso_time, now
from bridge.core.text import clean, clean_json
from bridge.host import host_fingerprint, tool_versions
from bridge.results.render import judged_plots, run_page, summary_markdown


@dataclass
class RunOutcome:
    """One run's outcome in memory: its result, the report it wrote (parsed) and its verdict."""

    out_dir: Path
    result: RunResult
    report: dict[str, Any] | None = None
    verdict: gates.Verdict | None = None
    redact: Redactor = field(default_factory=lambda: Redactor([]))
    places: dict[str, str] = field(default_factory=dict)  # the runner's paths -> the same, from the run dir

    def local(self, text: str) -> str:
        """`text` with no absolute path of the runner's (its state dir: out_dir; the run's scratch: `places`):
        each relative to the run's directory, as what is published (result.json, summary.md, the PR comment)
        says them."""
        places = {str(self.out_dir): ".", str(self.out_dir.resolve()): ".", **self.places}
        for path in sorted(places, key=len, reverse=True):
            rel = places[path]
            text = text.replace(path + "/", "" if rel == "." else rel + "/")
            text = re.sub(re.escape(path) + r"(?![\w.-])", rel, text)
        return text

    def files(self) -> dict[str, bytes]:
        """The runner's own files of this outcome, in memory: verdict.json (always the runner's: one that says
        why there is none when nothing was gated), result.json, summary.md and report.html, redacted."""
        out = self.out_dir
        # what people are shown of the gate's reasons (which quote the report) holds no control or format
        # character (bridge/core/text.py); report.json itself is kept as the program wrote it
        verdict = shown(self.verdict or no_verdict(self.result))
        gated = shown(self.verdict) if self.verdict is not None else None
        result = self.result.model_copy(
            update={"reason": clean(self.result.reason or "") or self.result.reason}
        )
        # the report as the runner commits it (redacted): a secret must not reach a plot's pixels either
        report, pngs = self.report, {}
        if report is not None:
            try:
                report = json.loads(self.redact.text(json.dumps(report, ensure_ascii=False)))
                pngs = judged_plots(report, result, gated)
            except ValueError:  # redacting broke the JSON: the tables' text is redacted below, no plots
                pass
        texts = {
            "verdict.json": verdict.model_dump_json(indent=2) + "\n",
            "result.json": result.model_dump_json(indent=2) + "\n",
            "summary.md": summary_markdown(result, out, gated, report, list(pngs)),
            "report.html": run_page(result, out, gated, report, pngs),
        }
        return {
            name: clean(self.redact.text(self.local(text)), multiline=True).encode()
            for name, text in texts.items()
        } | pngs

    def write(self) -> RunResult:
        """Write verdict.json, result.json, summary.md and report.html (each once, over whatever the program put
        there) and redact every file; the result. Run it on a directory the caps have checked (bridge/core/caps.py)."""
        out = self.out_dir
        out.mkdir(parents=True, exist_ok=True)
        for name, data in self.files().items():
            atomic_write(out / name, data)
        for rel, size in walk(out).files.items():
            self.redact.scrub_file(out / rel, size)
        return self.result


def shown(verdict: gates.Verdict) -> gates.Verdict:
    """`verdict` with every text in it cleaned (bridge/core/text.py): its reasons quote the report."""
    return gates.Verdict.model_validate(clean_json(verdict.model_dump(mode="json"), multiline=False))


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
        ended_at=iso_time(now()),
        **(context or RunContext()).model_dump(),
    )
    return RunOutcome(out_dir, result)


def write_outcome(out_dir: Path, status: Status, reason: str, **kw: Any) -> RunResult:
    """Record (write) an outcome where nothing ran; see `not_run`."""
    return not_run(out_dir, status, reason, **kw).write()
