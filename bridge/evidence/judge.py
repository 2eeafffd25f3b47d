"""Judging a requirement for a subject from the done results (`judge`, `gate_subject`): the newest trusted,
executed run that belongs to the subject, verified and re-gated (`Outcome`); every newer result that names
the subject but is no such run listed as `Ignored`, with why."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import gates
import gates.tables
from bridge.bus import trust
from bridge.bus.records import MANIFEST_PATH
from bridge.bus.trust import UNSIGNED, trust_words
from bridge.evidence.baseline import compare_to_previous
from bridge.evidence.done import Done, DoneResults, regate
from bridge.evidence.requirements import Requirement, shown
from bridge.host import accelerator_words
from bridge.presets.preset import Preset
from bridge.wire import git

Status = Literal["pass", "fail", "missing", "mismatch"]
NOT_RAN = ("expired", "cancelled", "rejected")  # done results whose runner ran nothing
MARK = {"pass": "✓", "fail": "✗", "missing": "✗", "mismatch": "✗"}
IgnoredKind = Literal["untrusted", "not-run", "mismatch", "pins"]


@dataclass(frozen=True)
class Ignored:
    """A done result that names the subject but is no evidence, and why: `untrusted` (not a runner's signed
    done commit for its label: unsigned, bad or unknown key, edited, key not allowed for the label),
    `not-run` (expired, cancelled, rejected), `mismatch` (it does not belong to the subject or request, or
    ran another preset definition), `pins` (its parameters do not meet the requirement's pins)."""

    id: str
    kind: IgnoredKind
    reason: str

    def __str__(self) -> str:
        return f"{self.id} ({self.kind}): {self.reason}"


@dataclass
class Outcome:
    """What the bus holds for one requirement, judged."""

    requirement: Requirement
    status: Status
    reasons: list[str]
    evidence: Done | None = None
    verdict: gates.Verdict | None = None  # the re-gated verdict, when the report could be gated
    notes: list[str] = field(default_factory=list)
    report: dict[str, Any] | None = None  # the evidence's report, when it could be gated (its Results tables)
    trust: str | None = None  # of the evidence: `signed by RUNNER@LABELS` or `unsigned (allowed)`
    ignored: list[Ignored] = field(default_factory=list)  # newer results that name the subject, not used

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    @property
    def accelerator(self) -> str | None:
        """The evidence's accelerator, as its result.json's host fingerprint records it."""
        r = self.evidence.result if self.evidence else None
        return accelerator_words(r.host.get("accelerator")) if r else None

    @property
    def forced(self) -> list[str]:
        """The labels the evidence's runner served without their hardware (`runner --force-labels`)."""
        r = self.evidence.result if self.evidence else None
        return list(r.forced_labels) if r else []

    @property
    def params(self) -> dict[str, Any] | None:
        """The parameters the evidence's run had, as its result.json records them."""
        r = self.evidence.result if self.evidence else None
        return dict(r.params) if r else None

    def facts(self) -> list[str]:
        """What a row says of the evidence besides its verdict: who signed it, forced labels, accelerator, the
        parameters the run had."""
        out = [self.trust] if self.trust else []
        if self.forced:
            out.append(f"labels forced without their hardware: {', '.join(self.forced)}")
        if self.evidence is not None:
            out.append(f"accelerator: {self.accelerator or 'none'}")
        if self.params is not None:
            out.append(
                f"params: {' '.join(f'{k}={shown(v)}' for k, v in sorted(self.params.items())) or 'none'}"
            )
        return out

    def line(self) -> str:
        """One line for `kakeya gate pr`, then one per ignored result."""
        what = self.evidence.id if self.evidence and self.passed else "; ".join(self.reasons)
        facts = self.facts()
        head = " · ".join([f"{MARK[self.status]} {self.requirement}: {self.status} — {what}", *facts])
        return "\n".join([head, *(f"    ignored {i}" for i in self.ignored)])

    def as_dict(self) -> dict[str, Any]:
        r = self.evidence.result if self.evidence else None
        return {
            "requirement": str(self.requirement),
            "status": self.status,
            "reasons": self.reasons,
            "notes": self.notes,
            "request_id": self.evidence.id if self.evidence else None,
            "done": self.evidence.sha if self.evidence else None,
            "runner": r.runner_name if r else None,
            "trust": self.trust,
            "forced_labels": self.forced,
            "accelerator": r.host.get("accelerator") if r else None,
            "params": self.params,
            "ignored": [{"request_id": i.id, "kind": i.kind, "reason": i.reason} for i in self.ignored],
            "verdict": self.verdict.model_dump(mode="json") if self.verdict else None,
        }


def judge(dones: DoneResults, subject: str, req: Requirement, preset: Preset) -> Outcome:
    """The newest trusted, executed done result of `req` that names `subject`, verified and re-gated. The
    newer ones that name it but are no evidence (untrusted, not run, not belonging to it, not meeting the
    pins) are listed as ignored, with why: none of them can mask the evidence."""
    candidates = dones.of(req.preset, req.label)
    ignored: list[Ignored] = []
    for found in judged_runs(dones, subject, req, preset):
        if isinstance(found, Ignored):
            ignored.append(found)
            continue
        found.ignored = ignored
        return found
    why = f"no trusted, executed {req} run on the bus names {subject[:12]}"
    if ignored:
        why += f" ({len(ignored)} result(s) ignored)"
    elif candidates:
        other = candidates[0]
        why += f" (the newest, {other.id}, is for {(other.subject or 'an unknown commit')[:12]})"
    return Outcome(req, "missing", [why], ignored=ignored)


def judged_runs(
    dones: DoneResults, subject: str, req: Requirement, preset: Preset
) -> Iterator[Outcome | Ignored]:
    """Every done result of `req` that names `subject`, newest first: each trusted, executed run of it
    verified and re-gated (an Outcome), each other one Ignored, with why (`kakeya history` keeps every run
    of a subject, `judge` the newest)."""
    for done in (d for d in dones.of(req.preset, req.label) if d.names(subject)):
        signer, why = screen(dones, done, subject, req, preset)
        if why is not None:
            yield why
            continue
        outcome = regate_evidence(dones, done, subject, req, preset)
        outcome.trust = trust_words(signer) if dones.signers is not None else UNSIGNED
        yield outcome


def screen(
    dones: DoneResults, done: Done, subject: str, req: Requirement, preset: Preset
) -> tuple[str | None, Ignored | None]:
    """(the principal that signed it, None) when `done` is evidence for `req` on `subject`: a runner's signed
    done commit for its label (when `dones` has signers), a run that executed, belonging to the subject and
    its request, of this registry's preset definition (when signed), with parameters that meet the pins.
    (None, why not) otherwise."""
    signer = None
    if dones.signers is not None:
        repo = dones.repo_with(done.sha)
        signer, problem = trust.signed_done(repo, done.sha, subject, done.label, dones.signers)
        if problem:
            return None, Ignored(done.id, "untrusted", problem)
    r = done.result
    if r is not None and r.status in NOT_RAN:
        return None, Ignored(done.id, "not-run", f"{r.status}: {r.reason}" if r.reason else r.status)
    problems = provenance(dones, done, subject, req, preset)
    if dones.signers is not None and r and r.preset_hash != preset.content_hash:
        problems.append(
            f"preset mismatch: it ran preset definition {r.preset_hash or 'unknown'}, the trusted "
            f"registry has {preset.content_hash}"
        )
    if problems:
        return None, Ignored(done.id, "mismatch", f"does not belong to {subject[:12]}: {'; '.join(problems)}")
    assert r is not None  # provenance found it
    if unmet := req.unmet(r.params):
        return None, Ignored(done.id, "pins", f"its parameters do not meet {req}: {'; '.join(unmet)}")
    return signer, None


def provenance(dones: DoneResults, done: Done, subject: str, req: Requirement, preset: Preset) -> list[str]:
    """Every way the done result disagrees with being `req`'s evidence for `subject` (empty: none)."""
    m, r = done.manifest, done.result

    def disagree(whose: str, pairs: tuple[tuple[str, str | None, str], ...]) -> list[str]:
        return [f"its {whose} names {what} {seen}, not {want}" for what, seen, want in pairs if seen != want]

    problems = []
    if m is None:
        problems.append(f"its {MANIFEST_PATH} is missing or invalid")
    else:
        problems += disagree(
            "request",
            (("subject", m.subject, subject), ("id", m.id, done.id), ("preset", m.preset, preset.name)),
        )
    if r is None:
        problems.append("its result.json is missing or invalid")
    else:
        problems += disagree(
            "result.json",
            (
                ("subject", r.subject, subject),
                ("request", r.request_id, done.id),
                ("preset", r.preset, preset.name),
            ),
        )
        if done.label is not None and done.label not in r.runner_labels:
            problems.append(
                f"it ran on a runner labelled {', '.join(r.runner_labels) or 'nothing'}, not {done.label}"
            )
    repo = dones.repo_with(done.sha)
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


def regate_evidence(
    dones: DoneResults, done: Done, subject: str, req: Requirement, preset: Preset
) -> Outcome:
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
    raw = dones.report(done)
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
    verdict = regate(report, preset, done.label)
    if preset.baseline is not None:
        params = done.result.params if done.result else None
        verdict = verdict.with_comparison(
            *compare_to_previous(dones, preset, done.label, done.id, report, params)
        )
    if verdict.passed:
        return Outcome(req, "pass", [], evidence=done, verdict=verdict, notes=notes, report=report)
    return Outcome(
        req,
        "fail",
        [f"{done.id}: {r}" for r in verdict.reasons()] or [f"{done.id}: {verdict.status}"],
        evidence=done,
        verdict=verdict,
        notes=notes,
        report=report,
    )


def gate_subject(
    dones: DoneResults, subject: str, requirements: Sequence[Requirement], registry: Mapping[str, Preset]
) -> list[Outcome]:
    """Judge every requirement for `subject` (a full sha) from the results indexed under it (a preset with a
    baseline also reads its other done results, to find the previous pass)."""
    presets = {r.preset for r in requirements}
    with_baseline = {p for p in presets if registry[p].baseline is not None}
    dones.load(presets - with_baseline, subject=subject)
    if with_baseline:
        dones.load(with_baseline)
    return [judge(dones, subject, r, registry[r.preset]) for r in requirements]


def evidence_json(outcomes: Sequence[Outcome]) -> str:
    return json.dumps([o.as_dict() for o in outcomes])
