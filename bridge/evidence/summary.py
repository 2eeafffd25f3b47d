"""The evidence as a GitHub job summary (`summary_table`, `append_summary`): a table with a row per
requirement, the results tables, the gate of each that did not pass, under GitHub's 1 MiB cap."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import gates
import gates.tables
from bridge.core.text import clean
from bridge.evidence.judge import MARK, Outcome
from bridge.results.render import tables_markdown
from gates.markdown import cell, code

SUMMARY_CAP = 1024 * 1024  # GitHub refuses a job summary (the whole $GITHUB_STEP_SUMMARY file) over 1 MiB


def summary_table(subject: str, outcomes: Sequence[Outcome], limit: int = SUMMARY_CAP) -> str:
    """Markdown for a job summary, at most `limit` bytes (UTF-8): a line, a table with one row per requirement,
    then the gate of each requirement that did not pass; what does not fit is cut and counted."""
    met = sum(o.passed for o in outcomes)
    ok = met == len(outcomes)
    head = [
        f"**Evidence for `{subject}`: {'✓ pass' if ok else '✗ fail'}** ({met} of {len(outcomes)} "
        f"requirement{'' if len(outcomes) == 1 else 's'} met)\n\n",
        "| | requirement | status | evidence | trust | details |\n|---|---|---|---|---|---|\n",
    ]
    rows = []
    for o in outcomes:
        ev = f"`{o.evidence.id}`" if o.evidence else "—"
        details = (
            "; ".join(o.reasons)
            if o.reasons
            else (
                f"{len(o.verdict.checks)} check{'' if len(o.verdict.checks) == 1 else 's'} passed"
                if o.verdict
                else ""
            )
        )
        extra = o.notes + o.facts()[1 if o.trust else 0 :]
        if o.ignored:
            extra.append(f"ignored: {', '.join(f'{i.id} ({i.kind})' for i in o.ignored)}")
        if extra:
            details += (" — " if details else "") + "; ".join(extra)
        rows.append(
            f"| {MARK[o.status]} | {code(str(o.requirement), 200)} | {o.status} | {ev} | "
            f"{cell(o.trust or '—', 200)} | {cell(details, 400)} |\n"
        )
    sections = (
        [
            f"\n<details open><summary>{o.requirement}: results</summary>\n\n"
            + "\n".join(tables_markdown(tables, "####"))
            + "\n</details>\n"
            for o in outcomes
            if o.report is not None
            and (tables := gates.tables.results_tables(o.report, o.verdict.checks if o.verdict else ()))
        ]
        + [
            f"\n<details><summary>{o.requirement}: {o.status}</summary>\n\n{o.verdict.to_markdown()}\n</details>\n"
            for o in outcomes
            if o.verdict is not None and not o.passed
        ]
        + [
            f"\n<details><summary>{o.requirement}: {len(o.ignored)} result(s) ignored</summary>\n\n"
            + "".join(f"- `{i.id}` ({i.kind}): {cell(i.reason, 2000, table=False)}\n" for i in o.ignored)
            + "</details>\n"
            for o in outcomes
            if o.ignored
        ]
    )
    blocks = head + rows + sections
    out: list[str] = []
    used, reserve = 0, 200  # room for the note that says what was cut
    for i, block in enumerate(blocks):
        size = len(block.encode())
        if used + size + (reserve if i < len(blocks) - 1 else 0) > limit:
            first_section = len(head) + len(rows)
            cut_rows = max(0, first_section - max(i, len(head)))
            cut_sections = len(sections) - max(0, i - first_section)
            note = (
                f"\n_Cut to fit the 1 MiB job summary: {cut_rows} more row(s), {cut_sections} gate "
                "section(s); `kakeya gate pr --json` has all._\n"
            )
            if used + len(note.encode()) <= limit:
                out.append(note)
            break
        out.append(block)
        used += size
    return clean(
        "".join(out), multiline=True
    )  # no control or format character of a run's (bridge/core/text.py)


def append_summary(path: Path, subject: str, outcomes: Sequence[Outcome], cap: int = SUMMARY_CAP) -> int:
    """Append the summary to `path` (created if missing) so that the whole file stays under `cap` bytes;
    returns the bytes written (0 when the file is already full)."""
    existing = path.stat().st_size if path.exists() else 0
    text = summary_table(subject, outcomes, limit=cap - 1 - existing)
    if text:
        with path.open("ab") as fh:
            fh.write(text.encode())
    return len(text.encode())
