"""A preset's evidence over time: the trusted runs of PRESET@LABEL along a branch's first-parent history.

    h = collect(shelf, repo, req, preset, metric=None, ref="main", since=None)   # History (pydantic)
    text_table(h); svg(h); html_page(h)                                          # what `kakeya history` shows
    publish(repo, pages, branch="gh-pages", who=...)                             # the dashboard commit

Every run is one `kakeya gate pr` would count (bridge/evidence/judge.py `judged_runs`: signed by an allowed
runner for its label when the shelf has signers, executed, belonging to its subject and request, re-gated
with this registry's checks); nothing else on the bus is shown. A subject's runs make its noise band
(min..max, median); whether a metric changed between two consecutive subjects with runs is decided by the
Mann-Whitney U test of gates/noise.py over their runs' values (two-sided: the smaller one-sided p, doubled,
below ALPHA), never by a fixed percentage. Too few runs to ever reach ALPHA (one run each) say so.
"""

from __future__ import annotations

import html
import math
import re
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

import gates
from bridge import evidence as E
from bridge.core.errors import InvalidRequest, KakeyaError
from bridge.evidence import DoneResults, Outcome, Requirement
from bridge.presets.preset import Preset
from bridge.wire import git
from gates import markdown as gmd
from gates.noise import ALPHA, RULE, worse_p_value
from gates.report import fmt_number, is_number

LIMIT = 200  # first-parent commits looked at, newest first
Change = Literal["up", "down", "same", "too-few-runs"]


class Run(BaseModel):
    """One trusted run of the preset on one subject."""

    id: str  # the request id
    done: str  # its done commit
    date: str | None  # when it ran (result.json started_at)
    runner: str | None
    device: str | None  # the accelerator its host fingerprint names ("none": a CPU-only host)
    trust: str | None  # `signed by RUNNER@LABELS` or `unsigned (allowed)`
    # re-gated with this registry's checks; `error`: the run could not start or its runner failed it (no
    # verdict on the code: result.json's status `error`)
    verdict: Literal["pass", "fail", "error"]
    value: (
        float | None
    )  # the metric in its report (None: the run failed before a report, or has no such number)
    reason: str | None = None  # why it failed


class Point(BaseModel):
    """One commit of the branch and its trusted runs."""

    subject: str
    title: str  # the commit's subject line
    date: str  # the commit date (ISO)
    runs: list[Run] = []
    median: float | None = None
    low: float | None = None  # the noise band: the smallest and largest value of its runs
    high: float | None = None
    change: Change | None = None  # against the previous commit with values (None: none before it)
    p_value: float | None = None  # two-sided Mann-Whitney U p of that change
    against: str | None = None  # the subject it was compared with

    @property
    def values(self) -> list[float]:
        return [r.value for r in self.runs if r.value is not None]


class History(BaseModel):
    """`kakeya history PRESET@LABEL` as JSON."""

    requirement: str
    preset: str
    label: str | None
    metric: str
    ref: str
    since: str | None = None
    higher_is_better: bool | None = None  # from the metric's gate check (min / max) or the preset's baseline
    threshold: float | None = None  # the gate check's bound on the metric, when it has one
    rule: str = RULE
    points: list[Point]  # oldest first

    @property
    def runs(self) -> int:
        return sum(len(p.runs) for p in self.points)

    @property
    def slug(self) -> str:
        return f"{self.preset}@{self.label or 'any'}"


# --- collecting ------------------------------------------------------------------------------------


def first_parents(repo: Path, ref: str, since: str | None = None, limit: int = LIMIT) -> list[Point]:
    """The first-parent history of `ref` in `repo` (commits after `since`, a date git reads, at most `limit`
    of the newest), oldest first, as points without runs."""
    if git.rev_parse(repo, ref) is None:
        raise InvalidRequest(f"{ref!r} is not a branch or commit of {repo} (--branch)")
    args = ["log", "--first-parent", f"--max-count={limit}", "--format=%H%x00%cI%x00%s"]
    text = git.out(repo, *args, *([f"--since={since}"] if since else []), ref, "--")
    points = []
    for line in text.splitlines():
        sha, date, title = (line.split("\0") + ["", ""])[:3]
        points.append(Point(subject=sha, title=title, date=date))
    return points[::-1]


def default_metric(preset: Preset, label: str | None) -> str:
    """The preset's first gated pointer that names one number (no `*`)."""
    for check in preset.checks_for(label):
        if "*" not in check.path.split("/") and check.check in ("min", "max", "between", "eq"):
            return check.path
    raise InvalidRequest(f"preset {preset.name} gates no single number; give --metric /POINTER")


def direction(preset: Preset, label: str | None, metric: str) -> tuple[bool | None, float | None]:
    """(higher is better, threshold) of `metric`: a `min` check bounds it from below, a `max` from above;
    else the preset's baseline says which way is better (None: unknown)."""
    for check in preset.checks_for(label):
        if check.path == metric and check.check in ("min", "max"):
            return check.check == "min", float(check.value)
    if preset.baseline is not None and preset.baseline.metric == metric:
        return preset.baseline.higher_is_better, None
    return None, None


def value_at(report: Any, metric: str) -> float | None:
    """The number at JSON pointer `metric` in `report` (None: missing, not one finite number)."""
    try:
        found = gates.resolve(report, metric)
    except (gates.PathError, ValueError):
        return None
    if len(found) != 1 or not is_number(found[0][1]):
        return None
    return float(found[0][1])


def report_value(shelf: DoneResults, outcome: Outcome, metric: str) -> float | None:
    """The metric in the evidence's report.json (None: no report, unreadable, no such number)."""
    raw = shelf.report(outcome.evidence) if outcome.evidence else None
    try:
        return value_at(gates.parse_report(raw, "report.json"), metric) if raw else None
    except gates.ReportError:
        return None


def run_of(shelf: DoneResults, outcome: Outcome, metric: str) -> Run | None:
    """The history row of a judged run (None: it is no evidence, e.g. its report names another subject)."""
    done = outcome.evidence
    if done is None or done.result is None or outcome.status not in ("pass", "fail"):
        return None
    r = done.result
    return Run(
        id=done.id,
        done=done.sha,
        date=r.started_at,
        runner=r.runner_name,
        device=outcome.accelerator or "none",
        trust=outcome.trust,
        verdict="pass" if outcome.passed else "error" if r.status == "error" else "fail",
        value=report_value(shelf, outcome, metric) if r.status == "succeeded" else None,
        reason="; ".join(outcome.reasons) or None,
    )


def collect(
    shelf: DoneResults,
    repo: Path,
    req: Requirement,
    preset: Preset,
    metric: str | None = None,
    ref: str = "HEAD",
    since: str | None = None,
    limit: int = LIMIT,
) -> History:
    """The history of `req` along `ref`'s first parents: one listing scoped to those subjects' index refs
    (and their ledger shards), one fetch, one batch read."""
    metric = metric or default_metric(preset, req.label)
    if not metric.startswith("/") or "*" in metric.split("/"):
        raise InvalidRequest(f"--metric {metric!r} must be a JSON pointer to one number, e.g. /summary/tok_s")
    points = first_parents(repo, ref, since, limit)
    shelf.load_subjects([req.preset], [p.subject for p in points])
    for point in points:
        found = (o for o in E.judged_runs(shelf, point.subject, req, preset) if isinstance(o, Outcome))
        point.runs = [run for o in found if (run := run_of(shelf, o, metric)) is not None][::-1]
    higher, threshold = direction(preset, req.label, metric)
    history = History(
        requirement=str(req),
        preset=req.preset,
        label=req.label,
        metric=metric,
        ref=ref,
        since=since,
        higher_is_better=higher,
        threshold=threshold,
        points=points,
    )
    decide(history.points)
    return history


def decide(points: Sequence[Point]) -> None:
    """Each point's band and its change against the previous point with values (`change`, `p_value`)."""
    previous: Point | None = None
    for point in points:
        values = point.values
        if not values:
            continue
        point.median, point.low, point.high = statistics.median(values), min(values), max(values)
        if previous is not None:
            point.against = previous.subject
            point.change, point.p_value = changed(previous.values, values)
        previous = point


def changed(before: Sequence[float], after: Sequence[float]) -> tuple[Change, float | None]:
    """Did the metric move from `before` to `after` (each a subject's runs)? The two-sided Mann-Whitney U
    test: `up`/`down` when p < ALPHA, else `same`; `too-few-runs` when no split could reach ALPHA."""
    n, m = len(after), len(before)
    if 2 / math.comb(n + m, n) >= ALPHA:  # the smallest two-sided p these counts allow
        return "too-few-runs", None
    down, up = worse_p_value(after, before, True), worse_p_value(after, before, False)
    p = min(1.0, 2 * min(down, up))
    if p >= ALPHA:
        return "same", p
    return ("down" if down < up else "up"), p


# --- showing ---------------------------------------------------------------------------------------


def value_words(point: Point) -> str:
    if point.median is None:
        return "—"
    if len(point.values) == 1:
        return fmt_number(point.median)
    return f"{fmt_number(point.median)} [{fmt_number(point.low)}, {fmt_number(point.high)}] n={len(point.values)}"


def change_words(point: Point, higher: bool | None) -> str:
    if point.change is None:
        return ""
    if point.change == "too-few-runs":
        return "? too few runs to tell"
    p = f"p = {point.p_value:.3g}"
    if point.change == "same":
        return f"= within the noise ({p})"
    better = None if higher is None else (point.change == "up") == higher
    word = "" if better is None else (" better" if better else " worse")
    return f"{'▲' if point.change == 'up' else '▼'} {point.change}{word} ({p})"


def text_table(h: History) -> str:
    """One row per trusted run, newest commit first (commits without one are only counted: a long branch
    has many); a commit's first row carries its band and its change against the previous commit with runs."""
    head = (
        f"{h.requirement} {h.metric} along {h.ref}{f' since {h.since}' if h.since else ''}: "
        f"{h.runs} trusted run(s) on {sum(bool(p.runs) for p in h.points)} of {len(h.points)} commit(s); "
        f"changed: {RULE.replace('one-sided', 'two-sided')}"
    )
    rows = [
        ["commit", "title", "run", "date", "runner", "device", "value", "verdict", "subject's runs", "change"]
    ]
    without = sum(not p.runs for p in h.points)
    if without:
        head += f"\n{without} commit(s) without a trusted run not listed (--json has every commit)"
    for point in reversed(h.points):
        title = point.title if len(point.title) <= 40 else point.title[:39] + "…"
        if not point.runs:
            continue
        for i, run in enumerate(point.runs):
            rows.append(
                [
                    point.subject[:12] if i == 0 else "",
                    title if i == 0 else "",
                    run.id,
                    (run.date or "")[:19].replace("T", " "),
                    run.runner or "",
                    run.device or "",
                    "—" if run.value is None else fmt_number(run.value),
                    run.verdict,
                    value_words(point) if i == 0 else "",
                    change_words(point, h.higher_is_better) if i == 0 else "",
                ]
            )
    rows = [["".join(ch if ch.isprintable() else "?" for ch in cell) for cell in row] for row in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join([head, "", *lines])


def svg(h: History, width: int = 860, height: int = 360) -> str:
    """A self-contained SVG plot: each run a dot (red: verdict fail), the median line, the noise band
    (min..max of a subject's runs), the gate's threshold, a ring on each significant change."""
    e = html.escape
    pts = [p for p in h.points if p.values]
    title = f"{h.requirement}: {h.metric} along {h.ref}"
    left, right, top, bottom = 70, 20, 40, 70
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="20" text-anchor="middle" font-size="14">{e(title)}</text>',
    ]
    if not pts:
        out.append(f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle">no trusted runs</text>')
        return "\n".join([*out, "</svg>"]) + "\n"
    values = [v for p in pts for v in p.values] + ([h.threshold] if h.threshold is not None else [])
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.1 or 1.0
    lo, hi = lo - pad, hi + pad
    span_x = width - left - right

    def x(i: int) -> float:
        return left + (span_x / 2 if len(pts) == 1 else span_x * i / (len(pts) - 1))

    def y(v: float) -> float:
        return top + (height - top - bottom) * (hi - v) / (hi - lo)

    out.append(
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#888"/>'
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#888"/>'
    )
    for k in range(5):
        v = lo + (hi - lo) * k / 4
        out.append(
            f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.4g}</text>'
            f'<line x1="{left}" y1="{y(v):.1f}" x2="{width - right}" y2="{y(v):.1f}" stroke="#eee"/>'
        )
    band = [f"{x(i):.1f},{y(p.high or 0):.1f}" for i, p in enumerate(pts)]
    band += [f"{x(i):.1f},{y(p.low or 0):.1f}" for i, p in reversed(list(enumerate(pts)))]
    out.append(f'<polygon points="{" ".join(band)}" fill="#4a7bd0" fill-opacity="0.18" stroke="none"/>')
    line = " ".join(f"{x(i):.1f},{y(p.median or 0):.1f}" for i, p in enumerate(pts))
    out.append(f'<polyline points="{line}" fill="none" stroke="#4a7bd0" stroke-width="2"/>')
    if h.threshold is not None:
        ty = y(h.threshold)
        out.append(
            f'<line x1="{left}" y1="{ty:.1f}" x2="{width - right}" y2="{ty:.1f}" stroke="#b00020" '
            f'stroke-dasharray="6 4"/><text x="{width - right}" y="{ty - 4:.1f}" text-anchor="end" '
            f'fill="#b00020">gate {"≥" if h.higher_is_better else "≤"} {e(fmt_number(h.threshold))}</text>'
        )
    for i, p in enumerate(pts):
        for run in p.runs:
            if run.value is not None:
                color = {"pass": "#17702a", "error": "#777777"}.get(run.verdict, "#b00020")
                out.append(
                    f'<circle cx="{x(i):.1f}" cy="{y(run.value):.1f}" r="3.5" fill="{color}">'
                    f"<title>{e(run.id)}: {e(fmt_number(run.value))} ({run.verdict})</title></circle>"
                )
        if p.change in ("up", "down"):
            out.append(
                f'<circle cx="{x(i):.1f}" cy="{y(p.median or 0):.1f}" r="9" fill="none" stroke="#d07a00" '
                f'stroke-width="2"><title>{e(change_words(p, h.higher_is_better))}</title></circle>'
            )
        out.append(
            f'<text x="{x(i):.1f}" y="{height - bottom + 14}" text-anchor="end" '
            f'transform="rotate(-35 {x(i):.1f} {height - bottom + 14})">{p.subject[:8]}</text>'
        )
    out.append(
        f'<text x="10" y="{height - 8}" fill="#555" font-size="10">dots: runs (red: failed the gate) · band: smallest to '
        "largest run of a commit · ring: changed (Mann-Whitney U, p &lt; 0.05) · commits with no run left out</text>"
    )
    return "\n".join([*out, "</svg>"]) + "\n"


STYLE = """body{font:14px/1.45 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f4f4f4}code{font:12px ui-monospace,monospace}.pass{color:#17702a}.fail{color:#b00020}"""


def html_page(h: History, plot: str | None = None) -> str:
    """A static page (no scripts, no network): the plot (inline, or the file `plot` next to it) and the table."""
    e = html.escape
    figure = f'<img src="{e(plot)}" alt="plot">' if plot else svg(h)
    rows = []
    for point in reversed(h.points):
        for i, run in enumerate(point.runs or [None]):
            first = i == 0
            cells = [
                f"<code>{point.subject[:12]}</code>" if first else "",
                e(point.title) if first else "",
                *(
                    [e(run.id), e((run.date or "")[:19]), e(run.runner or ""), e(run.device or "")]
                    if run
                    else ["no trusted run", "", "", ""]
                ),
                "" if run is None or run.value is None else e(fmt_number(run.value)),
                f'<span class="{run.verdict}">{run.verdict}</span>' if run else "",
                e(value_words(point)) if first else "",
                e(change_words(point, h.higher_is_better)) if first else "",
            ]
            rows.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    head = [
        "commit",
        "title",
        "run",
        "date",
        "runner",
        "device",
        "value",
        "verdict",
        "subject's runs",
        "change",
    ]
    return (
        f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{e(h.requirement)} history</title>"
        f"<style>{STYLE}</style></head><body>\n<h1>{e(h.requirement)}: <code>{e(h.metric)}</code></h1>\n"
        f"<p>Trusted runs along <code>{e(h.ref)}</code> ({h.runs} runs). A change between commits is "
        f"decided by the {e(RULE.replace('one-sided', 'two-sided'))} over their runs.</p>\n{figure}\n"
        f"<table><tr>{''.join(f'<th>{c}</th>' for c in head)}</tr>\n" + "\n".join(rows) + "</table>\n"
        "</body></html>\n"
    )


# --- the dashboard ---------------------------------------------------------------------------------


def dashboard(histories: Sequence[History]) -> dict[str, bytes]:
    """The files of the dashboard: index.html, and per required preset <preset>@<label>.{html,svg,json}."""
    e = html.escape
    files: dict[str, bytes] = {".nojekyll": b""}
    items = []
    for h in histories:
        files[f"{h.slug}.svg"] = svg(h).encode()
        files[f"{h.slug}.html"] = html_page(h, plot=f"{h.slug}.svg").encode()
        files[f"{h.slug}.json"] = h.model_dump_json(indent=2).encode()
        last = next((p for p in reversed(h.points) if p.runs), None)
        latest = (
            f"{e(value_words(last))} at <code>{last.subject[:12]}</code> ({last.runs[-1].verdict})"
            if last
            else "no trusted run"
        )
        items.append(
            f'<li><a href="{e(h.slug)}.html">{e(h.requirement)}</a> <code>{e(h.metric)}</code>: {latest}'
            f'<br><a href="{e(h.slug)}.html"><img src="{e(h.slug)}.svg" width="430" alt="{e(h.slug)}"></a></li>'
        )
    files["index.html"] = (
        "<!doctype html>\n<html><head><meta charset='utf-8'><title>Kakeya evidence</title>"
        f"<style>{STYLE}</style></head><body>\n<h1>Evidence over time</h1>\n<p>The required presets "
        "(.github/kakeya-required.yml): their trusted runs along the branch.</p>\n<ul>\n"
        + "\n".join(items)
        + "\n</ul>\n</body></html>\n"
    ).encode()
    return files


def publish(repo: Path, files: Mapping[str, bytes], branch: str, who: str) -> str | None:
    """Commit `files` (the whole tree) on `branch` of `repo` through its object store: no working tree, index
    or checkout is touched; the branch moves only from the tip seen (compare-and-swap). Returns the new
    commit, or None when the tree is what the branch already holds."""
    ref = f"refs/heads/{branch}"
    if git.run(repo, "check-ref-format", ref, check=False).returncode != 0:
        raise InvalidRequest(f"--branch-to {branch!r} is not a valid branch name")
    head = git.run(repo, "symbolic-ref", "-q", "HEAD", check=False).stdout.decode().strip()
    if head == ref:
        raise InvalidRequest(
            f"{branch} is checked out in {repo}; publishing would move it under your files. Check out "
            "another branch, or give --branch-to another branch"
        )
    parent = git.rev_parse(repo, ref)
    tree = git.tree_with(repo, None, files)
    if parent is not None and git.out(repo, "rev-parse", f"{parent}^{{tree}}") == tree:
        return None
    sha = git.commit(repo, tree, [parent] if parent else [], "kakeya history: the evidence dashboard", who)
    proc = git.run(repo, "update-ref", ref, sha, parent or "0" * 40, check=False)
    if proc.returncode != 0:
        raise KakeyaError(f"{branch} moved while publishing; run `kakeya history --publish` again")
    return sha


# --- alerts ----------------------------------------------------------------------------------------

TITLE_MARK = (
    "[kakeya regression]"  # what every alert's title starts with (the workflow finds its issue by it)
)


def regression(h: History) -> Point | None:
    """The newest commit with trusted runs, when its metric changed significantly against the commit before
    it with runs and not for the better (either way when the better direction is unknown); else None."""
    newest = next((p for p in reversed(h.points) if p.values), None)
    if newest is None or newest.change not in ("up", "down"):
        return None
    if h.higher_is_better is not None and (newest.change == "up") == h.higher_is_better:
        return None
    return newest


def alert_title(h: History, point: Point) -> str:
    """One issue's title per regression: the marker, the requirement, the metric and the commit (characters
    outside a plain set become `?`, so that a workflow can match it as it is)."""
    title = f"{TITLE_MARK} {h.requirement} {h.metric} at {point.subject[:12]}"
    return "".join(ch if ch.isalnum() and ch.isascii() or ch in "[]@/._:+- " else "?" for ch in title)


def code(text: str, limit: int = 120) -> str:
    """`text` as an inline code span that stays one table cell: never a link, a mention, an issue reference,
    HTML or emphasis, whatever the run or the commit says (control characters dropped, cut to `limit`)."""
    text = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    text = text if len(text) <= limit else text[: limit - 1] + "…"
    if not text:
        return ""
    fence = "`" * (max((len(m) for m in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text.replace('|', chr(92) + '|')}{pad}{fence}"


def alert_markdown(h: History, point: Point) -> str:
    """The body of a regression's issue: what changed, by how much, the runs on both sides, how to look."""
    before = next(p for p in h.points if p.subject == point.against)
    better = "higher" if h.higher_is_better else "lower" if h.higher_is_better is False else None
    gate = (
        f"; its gate: {'≥' if h.higher_is_better else '≤'} {fmt_number(h.threshold)}"
        if h.threshold is not None
        else ""
    )
    lines = [
        f"<!-- kakeya-alert: {alert_title(h, point)} -->",
        f"### {h.requirement}: {code(h.metric)} went {point.change} at {code(point.subject[:12])}",
        "",
        f"The newest commit with trusted runs on {code(h.ref)}, {code(point.subject[:12])}, moved "
        f"{code(h.metric)} **{point.change}**"
        + (f" ({better} is better{gate})" if better else " (which way is better is not known)")
        + f" against {code(before.subject[:12])}, the commit before it with runs: median "
        f"{fmt_number(point.median)} against {fmt_number(before.median)}; the two-sided Mann-Whitney U test "
        f"over their runs gives p = {point.p_value:.3g} (a change: p < {ALPHA:g}).",
        "",
        *gmd.table(
            ["", "commit", "title", "runs", "median", "band"],
            [
                [
                    side,
                    code(p.subject[:12]),
                    code(p.title, 100),
                    str(len(p.values)),
                    fmt_number(p.median),
                    f"{fmt_number(p.low)} – {fmt_number(p.high)}",
                ]
                for side, p in (("before", before), ("now", point))
            ],
        ),
        "",
        f"Runs of {code(point.subject[:12])}:",
        "",
        *gmd.table(
            ["run", "date", "runner", "device", "value", "verdict"],
            [
                [
                    code(r.id),
                    code((r.date or "")[:19]),
                    code(r.runner or ""),
                    code(r.device or ""),
                    "—" if r.value is None else fmt_number(r.value),
                    r.verdict,
                ]
                for r in point.runs
            ],
        ),
        "",
        "Look closer:",
        "",
        "```",
        f"kakeya history {h.requirement} --metric {h.metric} --branch {h.ref}",
    ]
    if better and before.median is not None and point.median is not None:
        mid = fmt_number((before.median + point.median) / 2)
        lines.append(
            f"kakeya bisect --good {before.subject[:12]} --bad {point.subject[:12]} --require {h.requirement} "
            f"--metric {h.metric} --threshold {mid}" + ("" if h.higher_is_better else " --lower-is-better")
        )
    return "\n".join([*lines, "```", ""])
