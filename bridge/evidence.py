"""Evidence on the bus: the run that proves a commit (for `kakeya gate pr`) and the previous pass (for a
preset's `baseline: {from: previous-pass, ...}`).

    shelf = Shelf(bus)                       # e.g. Shelf(client.bus)
    shelf.load(["probe"], subject=sha)       # one prefix-scoped listing, one fetch by id, one batch read
    outcome = judge(shelf, subject, Requirement("probe", "cpu"), registry["probe"])
    outcome.status                           # pass | fail | missing | mismatch
    shelf.previous_pass(preset, "cpu", before=request_id)   # (done result, report) or None

Nothing a runner or a requester wrote is taken on trust: the newest done result that names the subject
(in its request or its result) and ran something (an expired, cancelled or rejected one counts only
when no run did) must agree everywhere — request.json, result.json and report.json name
the subject, the done commit descends from it and changes nothing outside .kakeya/ — and its report is
gated again with the checks of this machine's preset registry; the runner's verdict is ignored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import gates
from bridge import bus as B
from bridge import git, ledger, trust
from bridge.bus import Bus, Entry, Manifest, Snapshot
from bridge.errors import InvalidRequest, KakeyaError
from bridge.names import REQUIREMENT_RE
from bridge.presets import Preset, get_preset
from bridge.result import RunOutcome, RunResult
from bridge.trust import Signers

SUMMARY_CAP = 1024 * 1024  # GitHub refuses a job summary (the whole $GITHUB_STEP_SUMMARY file) over 1 MiB
Status = Literal["pass", "fail", "missing", "mismatch", "untrusted"]
NOT_RAN = ("expired", "cancelled", "rejected")
BATCH = 16  # done results read at a time when looking for a baseline, newest first  # done results whose runner ran nothing
MARK = {"pass": "✓", "fail": "✗", "missing": "✗", "mismatch": "✗", "untrusted": "✗"}


# --- done results -----------------------------------------------------------------------------------


@dataclass
class Done:
    """One done result on the bus, as its commit says (nothing verified yet)."""

    id: str
    sha: str  # the done commit
    label: str | None  # the request's runner label: its request.json, else its req ref
    manifest: Manifest | None  # None: missing or invalid
    result: RunResult | None
    req: str | None = None  # the request commit its req ref names (None: no req ref)
    requested: Manifest | None = None  # the manifest of that request commit

    def names(self, subject: str) -> bool:
        """Whether its request (at the done commit or on its req ref) or its result claims to be evidence for
        `subject`."""
        return subject in (
            (self.manifest.subject if self.manifest else None),
            (self.result.subject if self.result else None),
            (self.requested.subject if self.requested else None),
        )

    @property
    def subject(self) -> str | None:
        return (self.result.subject if self.result else None) or (
            self.manifest.subject if self.manifest else None
        )


class Shelf:
    """The done results of some presets, read from local object stores (`Bus.repos`): the bus's `store`
    (fetched into, objects only, no ref) and, for a bus on a local path, the bus repository itself (read in
    place)."""

    def __init__(self, bus: Bus, signers: Signers | None = None):
        self.bus = bus
        self.signers = signers  # the trusted base's allowed signers: evidence must be signed by one of them
        self.dones: dict[str, list[Done]] = {}  # preset -> its done results, oldest first
        self.later: dict[str, list[Entry]] = {}  # preset -> older done refs not read yet (baselines)

    def load(self, presets: Iterable[str], snap: Snapshot | None = None, subject: str | None = None) -> Shelf:
        """Read the done results of `presets`: with `subject`, those indexed under it (refs/kakeya/by-subject/
        <subject>/, what `gate pr` needs), else every done ref of them (for baselines). One prefix-scoped
        listing unless `snap`, one fetch by object id of what is not here yet, one batch read."""
        wanted = set(presets)
        if snap is None:  # the live requests too: a done result for a request still pending is checked on it
            where = (
                [f"{B.SUBJECT_PREFIX}{subject}/", ledger.subject_shard(subject)]
                if subject
                else [B.DONE_PREFIX]
            )
            snap = self.bus.ls_remote(*where, B.REQ_PREFIX)
        if subject is not None:
            found = [
                Entry(rid, e.label if (e := snap.entries.get(rid)) else None, e.req if e else None, done=sha)
                for rid, (subj, sha) in snap.index.items()
                if subj == subject
            ]
            shard = snap.refs.get(ledger.subject_shard(subject))
            if shard is not None:  # and those moved into the ledger (one small tree, fetched by id)
                known = {e.id for e in found}
                found += [
                    e
                    for e in ledger.as_entries(ledger.read_shard(self.bus, shard, subject)).values()
                    if e.id not in known
                ]
        else:
            found = [e for e in snap.entries.values() if e.done]
        entries = sorted((e for e in found if e.preset in wanted), key=lambda e: e.id)
        self.dones.update({name: [] for name in wanted})
        if subject is None:  # for baselines, newest first: a batch now, older ones when asked (`more`)
            for name in wanted:
                self.later[name] = [e for e in entries if e.preset == name]
                self.more(name)
            return self
        self.dones.update(self.done_results(entries))
        return self

    def more(self, preset: str) -> bool:
        """Read the next (older) batch of `preset`'s done results not read yet; False when none is left."""
        rest = self.later.get(preset, [])
        if not rest:
            return False
        batch, self.later[preset] = rest[-BATCH:], rest[:-BATCH]
        older = self.done_results(batch).get(preset, [])
        self.dones[preset] = older + self.dones.get(preset, [])
        return True

    def done_results(self, entries: Sequence[Entry]) -> dict[str, list[Done]]:
        """`entries` (oldest first) read as done results, by preset: one fetch by object id of what is not here
        yet, one batch read."""
        self.bus.fetch_ids(
            [e.done for e in entries if e.done] + [e.req for e in entries if e.req], "done results"
        )
        specs = [
            f"{e.done}:{path}"
            for e in entries
            for path in (B.MANIFEST_PATH, f"{B.results_path(e.id)}/result.json")
        ] + [f"{e.req}:{B.MANIFEST_PATH}" for e in entries if e.req]
        files = self.read(specs)
        out: dict[str, list[Done]] = {}
        for e in entries:  # oldest first
            assert e.done is not None
            manifest = B.parse_or_none(Manifest, files.get(f"{e.done}:{B.MANIFEST_PATH}"))
            result = B.parse_or_none(RunResult, files.get(f"{e.done}:{B.results_path(e.id)}/result.json"))
            label = manifest.runner if manifest else e.label
            requested = B.parse_or_none(Manifest, files.get(f"{e.req}:{B.MANIFEST_PATH}")) if e.req else None
            out.setdefault(e.preset, []).append(Done(e.id, e.done, label, manifest, result, e.req, requested))
        return out

    def read(self, specs: Sequence[str]) -> dict[str, bytes]:
        """`<sha>:<path>` -> content, for the ones found in any of the local repositories."""
        return git.read_blobs_in(self.bus.repos(), specs)

    def repo_with(self, sha: str) -> Path:
        return git.repo_having(self.bus.repos(), sha)

    def report(self, done: Done) -> bytes | None:
        return self.read([f"{done.sha}:{B.results_path(done.id)}/report.json"]).get(
            f"{done.sha}:{B.results_path(done.id)}/report.json"
        )

    def of(self, preset: str, label: str | None) -> list[Done]:
        """The done results of `preset` (on runner label `label`, when given), newest first."""
        return [d for d in reversed(self.dones.get(preset, [])) if label is None or d.label == label]

    def previous_pass(
        self,
        preset: Preset,
        label: str | None,
        before: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> tuple[Done, dict[str, Any]] | None:
        """The newest run of `preset` on `label` (with the same `params`, when given: a run of another model
        or context length is no baseline) created before request `before` that passed: it succeeded, its
        runner's verdict was pass (so it had no regression either) and its report still passes the checks of
        this registry. Failing, errored and unreadable runs are skipped, never used as a baseline. Reads
        older batches only while no pass is found."""
        checked = 0
        while True:
            found = self._pass_among(self.of(preset.name, label)[checked:], preset, before, params)
            if found is not None:
                return found
            checked = len(self.of(preset.name, label))
            if not self.more(preset.name):
                return None

    def _pass_among(
        self, dones: Sequence[Done], preset: Preset, before: str | None, params: dict[str, Any] | None
    ) -> tuple[Done, dict[str, Any]] | None:
        for done in dones:
            r = done.result
            if (
                (before is not None and done.id >= before)
                or r is None
                or r.status != "succeeded"
                or r.verdict != "pass"
                or r.request_id != done.id
                or r.preset != preset.name
                or (params is not None and r.params != params)
            ):
                continue
            raw = self.report(done)
            try:
                report = gates.parse_report(raw, "report.json") if raw is not None else None
            except gates.ReportError:
                continue
            if report is not None and regate(report, preset).passed:
                return done, report
        return None


def regate(report: dict[str, Any], preset: Preset) -> gates.Verdict:
    """The report gated with `preset`'s checks, kind and schema version (no baseline)."""
    return gates.evaluate(
        report, preset.gate, kind=preset.report.kind, schema_version=preset.report.schema_version
    )


# --- the baseline ----------------------------------------------------------------------------------


def compare_to_previous(
    shelf: Shelf,
    preset: Preset,
    label: str | None,
    request_id: str | None,
    report: dict[str, Any],
    params: dict[str, Any] | None = None,
) -> tuple[gates.Baseline, gates.Comparison | None]:
    """The preset's baseline comparison for `report` (the run `request_id`); shelf loaded with the preset."""
    spec = preset.baseline
    assert spec is not None
    where = f"{preset.name} on {label or 'any runner'}"
    found = shelf.previous_pass(preset, label, before=request_id, params=params)
    if found is None:
        return gates.Baseline(
            source=spec.from_,
            note=f"no previous pass of {where} with these parameters; nothing to compare with",
        ), None
    done, base = found
    subject = done.result.subject if done.result else None
    baseline = gates.Baseline(
        source=spec.from_,
        run=done.id,
        subject=subject,
        note=f"previous pass {done.id} (subject {(subject or 'unknown')[:12]})",
    )
    # The metric and tolerance were validated with the preset, so compare raises nothing here.
    return baseline, gates.compare(
        report,
        base,
        spec.metric,
        spec.max_regression_pct,
        higher_is_better=spec.higher_is_better,
        samples=spec.samples,
    )


def apply_baseline(bus: Bus, preset: Preset, label: str | None, outcome: RunOutcome) -> RunOutcome:
    """After the runner gated a run: compare its report with the previous pass on the bus, record the
    comparison in the verdict, and fail the verdict on a regression (in memory; the outcome is written
    once, afterwards). A preset without `baseline:` or a run without a verdict is returned as it is. The
    bus being unreachable is recorded, never raised: a run is not lost for want of its baseline."""
    result = outcome.result
    if preset.baseline is None or outcome.verdict is None or outcome.report is None:
        return outcome
    try:
        shelf = Shelf(bus).load([preset.name])
        baseline, comparison = compare_to_previous(
            shelf, preset, label, result.request_id, outcome.report, result.params
        )
    except KakeyaError as exc:
        baseline, comparison = gates.Baseline(source=preset.baseline.from_, note=f"not compared: {exc}"), None
    verdict = outcome.verdict.with_comparison(baseline, comparison)
    update: dict[str, Any] = {"verdict": verdict.status}
    if (
        verdict.status == "fail"
        and comparison is not None
        and comparison.status == "fail"
        and not result.reason
    ):
        update["reason"] = f"regression: {comparison.reason}"
    return replace(outcome, result=result.model_copy(update=update), verdict=verdict)


# --- evidence for a commit ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Requirement:
    preset: str
    label: str | None = None

    @classmethod
    def parse(cls, text: str) -> Requirement:
        m = REQUIREMENT_RE.match(text.strip())
        if not m:
            raise InvalidRequest(
                f"requirement {text!r} must look like PRESET or PRESET@LABEL, e.g. probe@cpu"
            )
        return cls(m.group(1), m.group(2))

    def __str__(self) -> str:
        return f"{self.preset}@{self.label}" if self.label else self.preset


@dataclass
class Outcome:
    """What the bus holds for one requirement, judged."""

    requirement: Requirement
    status: Status
    reasons: list[str]
    evidence: Done | None = None
    verdict: gates.Verdict | None = None  # the re-gated verdict, when the report could be gated
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def as_dict(self) -> dict[str, Any]:
        return {
            "requirement": str(self.requirement),
            "status": self.status,
            "reasons": self.reasons,
            "notes": self.notes,
            "request_id": self.evidence.id if self.evidence else None,
            "done": self.evidence.sha if self.evidence else None,
            "runner": self.evidence.result.runner_name if self.evidence and self.evidence.result else None,
            "verdict": self.verdict.model_dump(mode="json") if self.verdict else None,
        }


def check_requirements(texts: Sequence[str], registry: Mapping[str, Preset]) -> list[Requirement]:
    """Parsed, each naming a preset of `registry` and a label it may run on; duplicates dropped."""
    out: list[Requirement] = []
    for text in texts:
        req = Requirement.parse(text)
        preset = get_preset(registry, req.preset)
        if req.label is not None:
            try:
                preset.check_runs_on(req.label)
            except InvalidRequest as exc:
                raise InvalidRequest(f"requirement {req}: {exc}") from None
        if req not in out:
            out.append(req)
    return out


def judge(shelf: Shelf, subject: str, req: Requirement, preset: Preset) -> Outcome:
    """The newest done result of `req` that names `subject` and ran (else the newest that did not), verified
    and re-gated."""
    candidates = shelf.of(req.preset, req.label)
    named = [d for d in candidates if d.names(subject)]
    # An outcome in which nothing ran (expired, cancelled, rejected) never masks a run that did.
    done = next((d for d in named if not d.result or d.result.status not in NOT_RAN), None)
    done = done or next(iter(named), None)
    if done is None:
        why = f"no {req} result on the bus names {subject[:12]}"
        if candidates:
            other = candidates[0]
            why += f" (the newest, {other.id}, is for {(other.subject or 'an unknown commit')[:12]})"
        return Outcome(req, "missing", [why])
    r = done.result
    if (
        r is not None
        and r.subject is None
        and r.status != "succeeded"
        and done.manifest is not None
        and done.manifest.subject == subject
    ):  # rejected or expired: the runner ran nothing for the subject
        return Outcome(
            req,
            "fail",
            [f"{done.id}: the run was {r.status}" + (f": {r.reason}" if r.reason else "")],
            evidence=done,
        )
    if shelf.signers is not None:
        repo = shelf.repo_with(done.sha)
        problem = trust.signed_done_problem(repo, done.sha, subject, done.label, shelf.signers)
        if problem:
            return Outcome(req, "untrusted", [f"{done.id}: {problem}"], evidence=done)
    problems = provenance(shelf, done, subject, req, preset)
    if shelf.signers is not None and done.result and done.result.preset_hash != preset.content_hash:
        problems.append(
            f"preset mismatch: it ran preset definition {done.result.preset_hash or 'unknown'}, the trusted "
            f"registry has {preset.content_hash}"
        )
    if problems:
        return Outcome(
            req,
            "mismatch",
            [f"{done.id} does not belong to {subject[:12]}: {p}" for p in problems],
            evidence=done,
        )
    return regate_evidence(shelf, done, subject, req, preset)


def provenance(shelf: Shelf, done: Done, subject: str, req: Requirement, preset: Preset) -> list[str]:
    """Every way the done result disagrees with being `req`'s evidence for `subject` (empty: none)."""
    problems = []
    m, r = done.manifest, done.result
    if m is None:
        problems.append(f"its {B.MANIFEST_PATH} is missing or invalid")
    else:
        for what, seen, want in (
            ("subject", m.subject, subject),
            ("id", m.id, done.id),
            ("preset", m.preset, preset.name),
        ):
            if seen != want:
                problems.append(f"its request names {what} {seen}, not {want}")
    if r is None:
        problems.append("its result.json is missing or invalid")
    else:
        for what, seen, want in (
            ("subject", r.subject, subject),
            ("request", r.request_id, done.id),
            ("preset", r.preset, preset.name),
        ):
            if seen != want:
                problems.append(f"its result.json names {what} {seen}, not {want}")
        if done.label is not None and done.label not in r.runner_labels:
            problems.append(
                f"it ran on a runner labelled {', '.join(r.runner_labels) or 'nothing'}, not {done.label}"
            )
    repo = shelf.repo_with(done.sha)
    if problem := trust.request_problem(repo, done.id, done.sha, done.req):
        problems.append(problem)
    if not git.is_ancestor(repo, subject, done.sha):
        problems.append(f"its done commit {done.sha[:12]} does not descend from {subject[:12]}")
    elif changed := changed_outside_kakeya(repo, subject, done.sha):
        problems.append(f"its done commit changes the subject's files ({', '.join(changed[:5])})")
    return problems


def changed_outside_kakeya(repo_dir: Path, subject: str, done: str) -> list[str]:
    """Top-level entries whose content differs between the two commits, other than .kakeya."""
    a, b = (
        {
            name: (mode, obj)
            for name, (mode, _, obj) in git.ls_tree(repo_dir, commit).items()
            if name != ".kakeya"
        }
        for commit in (subject, done)
    )
    return sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))


def regate_evidence(shelf: Shelf, done: Done, subject: str, req: Requirement, preset: Preset) -> Outcome:
    assert done.result is not None
    notes = [f"runner {done.result.runner_name or 'unknown'}, done {done.sha[:12]}"]
    if done.result.preset_hash != preset.content_hash:
        notes.append(
            f"ran preset definition {done.result.preset_hash or 'unknown'}; gated with this registry's "
            f"{preset.content_hash}"
        )
    if done.result.status != "succeeded":
        return Outcome(
            req,
            "fail",
            [
                f"{done.id}: the run ended with status {done.result.status}"
                + (f": {done.result.reason}" if done.result.reason else "")
            ],
            evidence=done,
            notes=notes,
        )
    raw = shelf.report(done)
    if raw is None:
        return Outcome(req, "fail", [f"{done.id} has no report.json"], evidence=done, notes=notes)
    try:
        report = gates.parse_report(raw, "report.json")
    except gates.ReportError as exc:
        return Outcome(req, "fail", [f"{done.id}: {exc}"], evidence=done, notes=notes)
    if report.get("subject") != subject:
        return Outcome(
            req,
            "mismatch",
            [
                f"{done.id} does not belong to {subject[:12]}: its report names subject "
                f"{report.get('subject')}"
            ],
            evidence=done,
            notes=notes,
        )
    verdict = regate(report, preset)
    if preset.baseline is not None:
        params = done.result.params if done.result else None
        verdict = verdict.with_comparison(
            *compare_to_previous(shelf, preset, done.label, done.id, report, params)
        )
    if verdict.passed:
        return Outcome(req, "pass", [], evidence=done, verdict=verdict, notes=notes)
    return Outcome(
        req,
        "fail",
        [f"{done.id}: {r}" for r in verdict.reasons()] or [f"{done.id}: {verdict.status}"],
        evidence=done,
        verdict=verdict,
        notes=notes,
    )


def gate_subject(
    shelf: Shelf, subject: str, requirements: Sequence[Requirement], registry: Mapping[str, Preset]
) -> list[Outcome]:
    """Judge every requirement for `subject` (a full sha) from the results indexed under it (a preset with a
    baseline also reads its other done results, to find the previous pass)."""
    presets = {r.preset for r in requirements}
    with_baseline = {p for p in presets if registry[p].baseline is not None}
    shelf.load(presets - with_baseline, subject=subject)
    if with_baseline:
        shelf.load(with_baseline)
    return [judge(shelf, subject, r, registry[r.preset]) for r in requirements]


# --- the job summary ---------------------------------------------------------------------------------


def _cell(text: str, limit: int = 400) -> str:
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def summary_table(subject: str, outcomes: Sequence[Outcome], limit: int = SUMMARY_CAP) -> str:
    """Markdown for a job summary, at most `limit` bytes (UTF-8): a line, a table with one row per requirement,
    then the gate of each requirement that did not pass; what does not fit is cut and counted."""
    met = sum(o.passed for o in outcomes)
    ok = met == len(outcomes)
    head = [
        f"**Evidence for `{subject}`: {'✓ pass' if ok else '✗ fail'}** ({met} of {len(outcomes)} "
        f"requirement{'' if len(outcomes) == 1 else 's'} met)\n\n",
        "| | requirement | status | evidence | details |\n|---|---|---|---|---|\n",
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
        if o.notes:
            details += (" — " if details else "") + "; ".join(o.notes)
        rows.append(f"| {MARK[o.status]} | `{o.requirement}` | {o.status} | {ev} | {_cell(details)} |\n")
    sections = [
        f"\n<details><summary>{o.requirement}: {o.status}</summary>\n\n{o.verdict.to_markdown()}\n</details>\n"
        for o in outcomes
        if o.verdict is not None and not o.passed
    ]
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
    return "".join(out)


def append_summary(path: Path, subject: str, outcomes: Sequence[Outcome], cap: int = SUMMARY_CAP) -> int:
    """Append the summary to `path` (created if missing) so that the whole file stays under `cap` bytes;
    returns the bytes written (0 when the file is already full)."""
    existing = path.stat().st_size if path.exists() else 0
    text = summary_table(subject, outcomes, limit=cap - 1 - existing)
    if text:
        with path.open("ab") as fh:
            fh.write(text.encode())
    return len(text.encode())


def evidence_json(outcomes: Sequence[Outcome]) -> str:
    return json.dumps([o.as_dict() for o in outcomes], indent=2)
