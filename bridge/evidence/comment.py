"""The pull request's evidence comment: `kakeya gate pr --comment FILE` writes it as markdown, and the PR gate
workflow (.github/workflows/pr-gate.yml, .github/scripts/pr-comment.sh) keeps ONE such comment per pull
request up to date, found again by its first line, `MARKER`.

    text = render(subject, outcomes, changes, links)       # outcomes: evidence.gate_subject's
    changes = compare_with_base(bus, signers, registry, outcomes, base_sha)

It has the evidence table (evidence.summary_table), the change of each requirement's numbers against the
base branch's latest trusted run of the same preset, label and parameters (the newest passing, trusted run
whose subject is the base commit or one of its ancestors: `DoneResults.previous_pass` with that condition),
compared with gates.compare (the preset's `baseline:` metric, tolerance and noise rule when it declares one,
else every single number its gate checks with min/max/between), and each evidence's summary.md and plots
(images committed in the done commit), linked under the bus repository's web address when it is known
(`--link-base`, or a github.com bus), plain ids otherwise. Everything a result names is hostile: it goes
into table cells as code spans through gates.markdown (`cell`, `code`: no mention, link, image or HTML), a plot
only when its path is a plain file name; the whole comment is cleaned of control characters (bridge/core/text.py).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import gates
from bridge.bus.bus import Bus
from bridge.bus.records import results_path
from bridge.bus.trust import Signers
from bridge.core.errors import KakeyaError
from bridge.core.text import clean
from bridge.evidence import Done, DoneResults, Outcome, summary_table
from bridge.presets.preset import Preset
from bridge.wire import git
from gates.markdown import cell, code
from gates.noise import ALPHA
from gates.report import fmt_number

MARKER = "<!-- kakeya-evidence -->"
COMMENT_CAP = 65_000  # characters; GitHub refuses an issue comment over 65,536
PLOTS_PER_RUN = 6
PLOT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,100}(/[A-Za-z0-9][A-Za-z0-9._-]{0,100}){0,3}\.(png|svg)")
GITHUB_RE = re.compile(r"https://(?:[^/@]*@)?github\.com/([A-Za-z0-9_.-]+)/([A-Za-z0-9_.-]+?)(?:\.git)?/?")


@dataclass
class Change:
    """One number of a requirement's evidence against the base branch's run (None: nothing to compare)."""

    requirement: str
    metric: str | None
    base: Done | None
    comparison: gates.Comparison | None
    tolerance: float | None  # the preset's baseline tolerance in percent, when it declares one
    note: str = ""

    def significant(self) -> str:
        """Whether the change is beyond the noise (a Mann-Whitney test over repeats), or beyond the preset's
        tolerance when its reports have no repeats; `—` when neither can say."""
        c = self.comparison
        if c is None or c.change_pct is None:
            return "—"
        if c.p_value is not None:
            return f"{'yes' if c.p_value < ALPHA else 'no'} (p = {c.p_value:.3g})"
        if self.tolerance is not None:
            beyond = (c.regression_pct or 0) > self.tolerance
            return f"{'yes' if beyond else 'no'} (tolerance {self.tolerance:g} %)"
        return "— (one sample)"


def metrics(preset: Preset, label: str | None) -> list[tuple[str, bool, float | None, str | None]]:
    """(JSON pointer, higher is better, tolerance %, samples pointer) of the numbers worth comparing: the
    preset's baseline metric, else each single number its gate checks for `label` with min, max or between."""
    if preset.baseline is not None:
        b = preset.baseline
        return [(b.metric, b.higher_is_better, b.max_regression_pct, b.samples)]
    out: list[tuple[str, bool, float | None, str | None]] = []
    for check in preset.checks_for(label):
        fresh = all(m[0] != check.path for m in out)
        if check.check in ("min", "max", "between") and "*" not in check.path and fresh:
            out.append((check.path, check.check != "max", None, None))
    return out


def base_has(bus: Bus, base: str) -> bool:
    """Whether a local repository of the bus has commit `base` (fetched by id when not yet)."""
    try:
        bus.fetch_ids([base], "the base commit")
    except KakeyaError:
        return False
    return any(git.present(r, [base]) for r in bus.repos())


def compare_with_base(
    bus: Bus,
    signers: Signers | None,
    registry: Mapping[str, Preset],
    outcomes: Sequence[Outcome],
    base: str,
) -> list[Change]:
    """For each outcome with a report: its numbers against the newest trusted pass of the same preset, label and
    parameters whose subject is `base` or an ancestor of it."""
    shelf = DoneResults(bus, signers).load({o.requirement.preset for o in outcomes if o.evidence is not None})
    known = base_has(bus, base)
    repos = bus.repos()

    def on_base(done: Done) -> bool:
        subject = done.subject
        return subject is not None and any(git.is_ancestor(r, subject, base) for r in repos)

    out: list[Change] = []
    for o in outcomes:
        name = str(o.requirement)
        if o.evidence is None or o.evidence.result is None:
            continue
        preset, label = registry[o.requirement.preset], o.evidence.label
        wanted = metrics(preset, label)
        if not wanted:
            out.append(Change(name, None, None, None, None, "its gate checks no single number"))
            continue
        raw = shelf.report(o.evidence)
        try:
            report = gates.parse_report(raw, "report.json") if raw is not None else None
        except gates.ReportError as exc:  # the gate above failed it already; nothing to compare
            out.append(Change(name, None, None, None, None, f"its {exc}"))
            continue
        found = (
            shelf.previous_pass(preset, label, params=o.evidence.result.params, accept=on_base)
            if known and report is not None
            else None
        )
        if found is None:
            why = (
                f"the base commit {base[:12]} is not on the bus"
                if not known
                else f"no trusted pass of {preset.name} on {label} with these parameters for {base[:12]} "
                "or its ancestors"
            )
            out.append(Change(name, None, None, None, None, why))
            continue
        done, base_report = found
        for metric, higher, tolerance, samples in wanted:
            comparison = gates.compare(
                report,
                base_report,
                metric,
                tolerance or 0.0,
                higher_is_better=higher,
                samples=samples,
            )
            out.append(Change(name, metric, done, comparison, tolerance))
    return out


def github_web(url: str) -> str | None:
    """https://github.com/OWNER/REPO for a bus that is a github.com repository; None otherwise."""
    m = GITHUB_RE.fullmatch(url)
    return f"https://github.com/{m.group(1)}/{m.group(2)}" if m else None


def plots(shelf: DoneResults, done: Done) -> list[str]:
    """The plot images committed in the done commit's results (plain relative paths only)."""
    repo = shelf.repo_with(done.sha)
    tree = git.ls_tree(repo, f"{done.sha}:{results_path(done.id)}", recursive=True)
    return sorted(p for p, (_, kind, _) in tree.items() if kind == "blob" and PLOT_RE.fullmatch(p))[
        :PLOTS_PER_RUN
    ]


def results_section(shelf: DoneResults, outcomes: Sequence[Outcome], link_base: str | None) -> str:
    lines = []
    for o in outcomes:
        d = o.evidence
        if d is None:
            continue
        where = f"{d.sha}/{results_path(d.id)}"
        head = f"- {code(str(o.requirement), 200, table=False)}: `{d.id}` (done `{d.sha[:12]}`)"
        if link_base:
            head += f" · [summary]({link_base}/blob/{where}/summary.md)"
        lines.append(head)
        for p in plots(shelf, d):
            lines.append(f"  ![{p}]({link_base}/raw/{where}/{p})" if link_base else f"  plot `{p}`")
    return "\n".join(lines)


def fmt(x: float | None) -> str:
    return "—" if x is None else fmt_number(x)


def change_table(changes: Sequence[Change], base: str) -> str:
    head = [
        f"### Change against the base branch (`{base[:12]}`)\n",
        "| requirement | metric | value | base | change | significant | base run |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = []
    for ch in changes:
        req = code(ch.requirement, 200)
        c = ch.comparison
        if c is None:
            rows.append(f"| {req} | — | — | — | — | — | {cell(ch.note, 400)} |")
            continue
        change = "—" if c.change_pct is None else f"{c.change_pct:+.2f} %"
        subject = ch.base.subject if ch.base else None
        run = f"`{ch.base.id}` (subject `{(subject or '?')[:12]}`)" if ch.base else "—"
        rows.append(
            f"| {req} | {code(ch.metric or '', 200)} | {fmt(c.new)} | {fmt(c.base)} | {change} | "
            f"{ch.significant()} | {run} |"
        )
    if not rows:
        rows = ["| — | — | — | — | — | — | no evidence to compare yet |"]
    return "\n".join(head + rows) + "\n"


def render(
    subject: str,
    outcomes: Sequence[Outcome],
    shelf: DoneResults,
    changes: Sequence[Change] | None,
    base: str | None,
    link_base: str | None,
) -> str:
    """The comment's markdown: the marker, the evidence table, the change against the base, the results."""
    parts = [MARKER, f"## Kakeya evidence for `{subject}`\n", summary_table(subject, outcomes, limit=40_000)]
    if base is not None and changes is not None:
        parts.append(change_table(changes, base))
    if results := results_section(shelf, outcomes, link_base):
        parts.append("### Results\n\n" + results + "\n")
    text = clean(
        "\n".join(parts), multiline=True
    )  # no control or format character of a run's (bridge/core/text.py)
    return text if len(text) <= COMMENT_CAP else text[: COMMENT_CAP - 80] + "\n\n_Cut to fit a comment._\n"
