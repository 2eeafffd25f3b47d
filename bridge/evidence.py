"""Evidence on the bus: the run that proves a commit (for `kakeya gate pr`) and the previous pass (for a
preset's `baseline: {from: previous-pass, ...}`).

    shelf = Shelf(bus, signers)              # signers: the trusted base's allowed signers (None: unsigned allowed)
    shelf.load(["probe"], subject=sha)       # one prefix-scoped listing, one fetch by id, one batch read
    req = Requirement.parse("niah-ladder@h200 samples>=5", registry)   # typed pins, checked once
    outcome = judge(shelf, subject, req, registry["niah-ladder"])
    outcome.status, outcome.trust, outcome.ignored   # pass | fail | missing | mismatch; "signed by r1@h200"; ...
    shelf.previous_pass(preset, "cpu", before=request_id)   # (done result, report) or None

Nothing a runner or a requester wrote is taken on trust. The evidence is the newest done result that names
the subject (in its request or its result) and is a trusted, executed run of the requirement: the runner's
signed done commit for its label (when the shelf has signers), a run that ran (not expired, cancelled or
rejected), agreeing everywhere — request.json, result.json and report.json name the subject, the done commit
descends from it, was made on its request commit and changes nothing outside .kakeya/, it ran this
registry's preset definition (when signed) — with parameters that meet the requirement's pins. Its report is
gated again with the checks of this machine's preset registry for the label it ran on (`gate` and
`gate_on`); the runner's verdict is ignored. Every newer result that names the subject but is no such run is
listed as ignored, with why (`Ignored`): none of them can mask the evidence.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

import gates
import gates.tables
from bridge import bus as B
from bridge import git, ledger, trust
from bridge.bus import Bus, Entry, Manifest, Snapshot
from bridge.config import project_root
from bridge.errors import InvalidRequest, KakeyaError, problems
from bridge.host import accelerator_words
from bridge.names import PIN_RE, REQUIREMENT_RE
from bridge.outcome import RunOutcome
from bridge.presets import Preset, get_preset
from bridge.render import tables_markdown
from bridge.result import RunResult
from bridge.trust import UNSIGNED, Signers, trust_words

REQUIRED_FILE = ".github/kakeya-required.yml"


class RequiredFile(BaseModel):
    """.github/kakeya-required.yml: `required:` a list of `PRESET[@LABEL] [PARAM OP VALUE ...]` entries, the
    evidence a pull request needs (`gate pr`, `kakeya evidence` and the history dashboard read it)."""

    model_config = ConfigDict(extra="forbid")
    required: list[str] = []


def parse_required(text: str, where: str) -> list[str]:
    """The entries of a required file's `text`; InvalidRequest naming `where` when it is not valid."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise InvalidRequest(f"{where}: cannot read YAML: {exc}") from None
    try:
        return RequiredFile.model_validate(data).required
    except ValidationError as exc:
        raise InvalidRequest(f"{where}: {problems(exc, 'requirements file')}") from None


SUMMARY_CAP = 1024 * 1024  # GitHub refuses a job summary (the whole $GITHUB_STEP_SUMMARY file) over 1 MiB
Status = Literal["pass", "fail", "missing", "mismatch"]
NOT_RAN = ("expired", "cancelled", "rejected")  # done results whose runner ran nothing
BATCH = 16  # done results read at a time when looking for a baseline, newest first
MARK = {"pass": "✓", "fail": "✗", "missing": "✗", "mismatch": "✗"}


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
        self.months: dict[str, list[list[str]]] = {}  # preset -> its ledger shards not read yet, by month
        self.ledger: ledger.LedgerMap | None = None
        self.known: set[str] = set()  # the ids of the done results read or queued

    def load(self, presets: Iterable[str], snap: Snapshot | None = None, subject: str | None = None) -> Shelf:
        """Read the done results of `presets`: with `subject`, those indexed under it (refs/kakeya/by-subject/
        <subject>/, what `gate pr` needs), else every done ref of them (for baselines). One prefix-scoped
        listing unless `snap`, one fetch by object id of what is not here yet, one batch read."""
        wanted = set(presets)
        if snap is None:  # the live requests too: a done result for a request still pending is checked on it
            where = [f"{B.SUBJECT_PREFIX}{subject}/"] if subject else [B.DONE_PREFIX]
            kind = "subject" if subject else "preset"
            snap = self.bus.ls_remote(*where, ledger.map_ref(kind), B.REQ_PREFIX)
        if subject is not None:
            found = [
                Entry(rid, e.label if (e := snap.entries.get(rid)) else None, e.req if e else None, done=sha)
                for rid, (subj, sha) in snap.index.items()
                if subj == subject
            ]
            # and those in the ledger: one small tree, fetched by id
            if ledger.map_ref("subject") in snap.refs:
                shelved = ledger.read(
                    self.bus,
                    ledger.read_map(self.bus, snap, "subject"),
                    [ledger.subject_shard(subject)],
                    subject,
                )
                known = {e.id for e in found}
                found += [e for e in ledger.as_entries(shelved).values() if e.id not in known]
        else:
            found = [e for e in snap.entries.values() if e.done]
        entries = sorted((e for e in found if e.preset in wanted), key=lambda e: e.id)
        self.dones.update({name: [] for name in wanted})
        if subject is None:  # for baselines, newest first: a batch now, older ones when asked (`more`)
            self.known |= {e.id for e in entries}
            if ledger.map_ref("preset") in snap.refs:  # then the ledger, a month at a time (`more`)
                self.ledger = ledger.read_map(self.bus, snap, "preset")
            for name in wanted:
                self.later[name] = [e for e in entries if e.preset == name]
                self.months[name] = ledger.preset_months(self.ledger, name)
                self.more(name)
            return self
        self.dones.update(self.done_results(entries))
        return self

    def load_subjects(
        self, presets: Iterable[str], subjects: Sequence[str], snap: Snapshot | None = None
    ) -> Shelf:
        """Read the done results of `presets` indexed under any of `subjects` (`load(subject=...)` for many
        subjects at once: `kakeya history` and `kakeya bisect` read a whole branch): one listing scoped to
        those subjects' index refs and ledger shards unless `snap`, one fetch by object id of what is not here
        yet, one batch read."""
        wanted, among = set(presets), set(subjects)
        if snap is None:  # the live requests too: a done result for a request still pending is checked on it
            snap = self.bus.ls_remote(
                *(f"{B.SUBJECT_PREFIX}{s}/" for s in sorted(among)), *self._shards(among), B.REQ_PREFIX
            )
        found = [
            Entry(rid, e.label if (e := snap.entries.get(rid)) else None, e.req if e else None, done=sha)
            for rid, (subj, sha) in snap.index.items()
            if subj in among
        ]
        known = {e.id for e in found}
        found += ledger.as_entries(e for e in self._shelved(snap, among) if e.id not in known).values()
        entries = sorted((e for e in found if e.preset in wanted), key=lambda e: e.id)
        self.dones.update({name: [] for name in wanted})
        self.dones.update(self.done_results(entries))
        return self

    @staticmethod
    def _shards(subjects: set[str]) -> list[str]:
        """The ledger refs to list for `subjects`' results moved into the ledger: its subject map."""
        return [ledger.map_ref("subject")]

    def _shelved(self, snap: Snapshot, subjects: set[str]) -> list[ledger.LedgerEntry]:
        """The ledger's entries of `subjects` (each shard a small tree, fetched by id; one subject: only its
        directory)."""
        if ledger.map_ref("subject") not in snap.refs:
            return []
        shards = sorted({ledger.subject_shard(s) for s in subjects})
        under = next(iter(subjects)) if len(subjects) == 1 else ""
        found = ledger.read(self.bus, ledger.read_map(self.bus, snap, "subject"), shards, under)
        return [e for e in found if e.subject in subjects]

    def more(self, preset: str) -> bool:
        """Read the next (older) batch of `preset`'s done results not read yet; False when none is left."""
        rest = self.later.get(preset, [])
        while not rest and self.months.get(preset):  # the refs are read: the ledger's next month
            month = ledger.read(self.bus, self.ledger, self.months[preset].pop(0))
            rest = [e for e in ledger.as_entries(month).values() if e.id not in self.known]
            self.known |= {e.id for e in rest}
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
        files = self.read([f"{e.done}:{B.results_path(e.id)}/result.json" for e in entries])
        found = B.read_manifests(self.bus.repos(), {c for e in entries for c in (e.done, e.req) if c})
        manifests = {c: m for c, m in found.items() if isinstance(m, Manifest)}
        out: dict[str, list[Done]] = {}
        for e in entries:  # oldest first
            assert e.done is not None
            manifest = manifests.get(e.done)
            result = B.parse_or_none(RunResult, files.get(f"{e.done}:{B.results_path(e.id)}/result.json"))
            label = manifest.runner if manifest else e.label
            requested = manifests.get(e.req) if e.req else None
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
        accept: Callable[[Done], bool] | None = None,
    ) -> tuple[Done, dict[str, Any]] | None:
        """The newest run of `preset` on `label` (with the same `params`, when given: a run of another model
        or context length is no baseline; one that `accept`s, when given) created before request `before`
        that passed: it succeeded, its
        runner's verdict was pass (so it had no regression either) and its report still passes the checks of
        this registry; with signers, it is also a runner's signed done commit made on its request (a forged
        baseline could otherwise fail a genuine run, or hide its regression). Failing, errored, unreadable and
        untrusted runs are skipped, never used as a baseline. Older batches are read only while none is found."""
        checked = 0
        while True:
            found = self._pass_among(self.of(preset.name, label)[checked:], preset, before, params, accept)
            if found is not None:
                return found
            checked = len(self.of(preset.name, label))
            if not self.more(preset.name):
                return None

    def _pass_among(
        self,
        dones: Sequence[Done],
        preset: Preset,
        before: str | None,
        params: dict[str, Any] | None,
        accept: Callable[[Done], bool] | None = None,
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
                or (self.signers is not None and not self.trusted(done))
                or (accept is not None and not accept(done))
            ):
                continue
            raw = self.report(done)
            try:
                report = gates.parse_report(raw, "report.json") if raw is not None else None
            except gates.ReportError:
                continue
            if report is not None and regate(report, preset, done.label).passed:
                return done, report
        return None

    def trusted(self, done: Done) -> bool:
        """Whether `done` is a runner's signed done commit for its label, made on its request commit."""
        assert self.signers is not None
        repo = self.repo_with(done.sha)
        _, problem = trust.signed_done(repo, done.sha, None, done.label, self.signers)  # yes or no: no walk
        return problem is None and trust.request_problem(repo, done.id, done.sha, done.req) is None


def regate(report: dict[str, Any], preset: Preset, label: str | None) -> gates.Verdict:
    """The report of a run on runner label `label` gated with `preset`'s checks for that label (`gate`, then
    `gate_on[label]`: e.g. on h200 its models ran on CUDA), kind and schema version (no baseline)."""
    return gates.evaluate(
        report,
        preset.checks_for(label),
        kind=preset.report.kind,
        schema_version=preset.report.schema_version,
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


def gate_for_label(preset: Preset, label: str | None, outcome: RunOutcome) -> RunOutcome:
    """The run's verdict with the preset's checks for runner label `label` (`gate_on`), as `kakeya gate pr`
    gates it; a preset without them, or a run without a verdict, is returned as it is."""
    if not preset.gate_on.get(label or "") or outcome.verdict is None or outcome.report is None:
        return outcome
    verdict = regate(outcome.report, preset, label)
    return replace(
        outcome, result=outcome.result.model_copy(update={"verdict": verdict.status}), verdict=verdict
    )


def apply_baseline(bus: Bus, preset: Preset, label: str | None, outcome: RunOutcome) -> RunOutcome:
    """After the runner gated a run: gate it for its runner label (`gate_for_label`), then compare its report
    with the previous pass on the bus, record the comparison in the verdict, and fail the verdict on a
    regression (in memory; the outcome is written once, afterwards). A preset without `baseline:` or a run
    without a verdict is not compared. The bus being unreachable is recorded, never raised: a run is not
    lost for want of its baseline."""
    outcome = gate_for_label(preset, label, outcome)
    result = outcome.result
    if preset.baseline is None or outcome.verdict is None or outcome.report is None:
        return outcome
    try:  # the runner's trusted checkout names the runners whose passes may be a baseline
        shelf = Shelf(bus, trust.trusted_signers(project_root())).load([preset.name])
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

Op = Literal["==", ">=", "<=", ">", "<"]
_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    "<=": operator.le,
    ">": operator.gt,
    "<": operator.lt,
}
_ORDERED_TYPES = ("int", "float", "int_list")  # parameter types that take >=, <=, >, <


@dataclass(frozen=True)
class Pin:
    """A requirement's parameter pin, `samples>=5`: the run's value of `param` must meet `op value`.

    ==            the value, whole (an int_list: the same items in the same order)
    >= <= > <     int and float parameters; for an int_list, EVERY item must meet it (`contexts>=65536`:
                  no rung below 65536), i.e. `>=`/`>` bound its smallest item and `<=`/`<` its largest
    """

    param: str
    op: Op
    value: Any  # typed by the preset's parameter: int, float, str, bool, or a tuple of ints (int_list ==)

    def met_by(self, seen: Any) -> bool:
        if self.op == "==":
            if isinstance(seen, bool) or isinstance(self.value, bool):
                return seen is self.value
            return (tuple(seen) if isinstance(seen, list) else seen) == self.value
        items = seen if isinstance(seen, list) else [seen]
        numbers = all(isinstance(i, (int, float)) and not isinstance(i, bool) for i in items)
        return bool(items) and numbers and all(_ORDER[self.op](i, self.value) for i in items)

    def __str__(self) -> str:
        value = self.value
        if isinstance(value, tuple):
            text = ",".join(str(v) for v in value)
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = str(value)
        return f"{self.param}{self.op}{text}"


@dataclass(frozen=True)
class Requirement:
    """What must pass: a preset, on a runner label (None: any), with its parameters pinned (none: any
    allowed values). Written `niah-ladder@h200 contexts>=65536 samples>=5`; parsed once, typed against the
    preset's parameters (`parse`)."""

    preset: str
    label: str | None = None
    pins: tuple[Pin, ...] = ()

    @classmethod
    def parse(cls, text: str, registry: Mapping[str, Preset]) -> Requirement:
        """`PRESET[@LABEL] [PARAM OP VALUE ...]`, checked against `registry`: the preset exists, may run on
        the label, and each pin names one of its parameters with an operator its type takes and a value it
        allows. InvalidRequest says what is wrong."""
        m = REQUIREMENT_RE.fullmatch(text.strip())
        if not m:
            raise InvalidRequest(
                f"requirement {text!r} must look like PRESET, PRESET@LABEL or PRESET@LABEL PARAM>=VALUE ... "
                "(operators == >= <= > <, no spaces inside a pin), e.g. probe@cpu or "
                "'niah-ladder@h200 samples>=5'"
            )
        name, label = m.group(1), m.group(2)
        preset = get_preset(registry, name)
        where = f"{name}@{label}" if label else name
        if label is not None:
            try:
                preset.check_runs_on(label)
            except InvalidRequest as exc:
                raise InvalidRequest(f"requirement {where}: {exc}") from None
        pins: list[Pin] = []
        for token in m.group(3).split():
            pm = PIN_RE.fullmatch(token)
            assert pm is not None  # REQUIREMENT_RE matched it
            param, op, raw = pm.group(1), pm.group(2), pm.group(3)
            spec = preset.params.get(param)
            if spec is None:
                raise InvalidRequest(
                    f"requirement {where}: preset {name} has no parameter {param!r} "
                    f"(its parameters: {', '.join(sorted(preset.params)) or 'none'})"
                )
            if any(p.param == param and p.op == op for p in pins):
                raise InvalidRequest(f"requirement {where}: {param}{op} is pinned twice")
            if op != "==" and spec.type not in _ORDERED_TYPES:
                raise InvalidRequest(
                    f"requirement {where}: {token}: parameter {param} is {spec.type}; it takes == only"
                )
            try:
                value = spec.parse(raw)
            except ValueError as exc:
                raise InvalidRequest(f"requirement {where}: {token}: {param} {exc}") from None
            if isinstance(value, list):
                if op != "==" and len(value) != 1:
                    raise InvalidRequest(
                        f"requirement {where}: {token}: {op} takes one number (it bounds every item)"
                    )
                value = tuple(value) if op == "==" else value[0]
            pins.append(Pin(param, op, value))  # type: ignore[arg-type]  # op is one of Op
        return cls(name, label, tuple(pins))

    def unmet(self, params: Mapping[str, Any]) -> list[str]:
        """The pins a run's parameters do not meet, each saying what the run had."""
        out = []
        for pin in self.pins:
            if pin.param not in params:
                out.append(f"{pin}: it has no {pin.param}")
            elif not pin.met_by(params[pin.param]):
                seen = params[pin.param]
                shown = ",".join(map(str, seen)) if isinstance(seen, list) else json.dumps(seen)
                out.append(f"{pin}: it ran {pin.param}={shown}")
        return out

    def __str__(self) -> str:
        head = f"{self.preset}@{self.label}" if self.label else self.preset
        return " ".join([head, *(str(p) for p in self.pins)])


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

    def facts(self) -> list[str]:
        """What a row says of the evidence besides its verdict: who signed it, forced labels, accelerator."""
        out = [self.trust] if self.trust else []
        if self.forced:
            out.append(f"labels forced without their hardware: {', '.join(self.forced)}")
        if self.evidence is not None:
            out.append(f"accelerator: {self.accelerator or 'none'}")
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
            "ignored": [{"request_id": i.id, "kind": i.kind, "reason": i.reason} for i in self.ignored],
            "verdict": self.verdict.model_dump(mode="json") if self.verdict else None,
        }


def check_requirements(texts: Sequence[str], registry: Mapping[str, Preset]) -> list[Requirement]:
    """Parsed (`Requirement.parse`), each naming a preset of `registry`, a label it may run on and pins its
    parameters take; duplicates dropped."""
    out: list[Requirement] = []
    for text in texts:
        req = Requirement.parse(text, registry)
        if req not in out:
            out.append(req)
    return out


def judge(shelf: Shelf, subject: str, req: Requirement, preset: Preset) -> Outcome:
    """The newest trusted, executed done result of `req` that names `subject`, verified and re-gated. The
    newer ones that name it but are no evidence (untrusted, not run, not belonging to it, not meeting the
    pins) are listed as ignored, with why: none of them can mask the evidence."""
    candidates = shelf.of(req.preset, req.label)
    ignored: list[Ignored] = []
    for found in judged_runs(shelf, subject, req, preset):
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


def judged_runs(shelf: Shelf, subject: str, req: Requirement, preset: Preset) -> Iterator[Outcome | Ignored]:
    """Every done result of `req` that names `subject`, newest first: each trusted, executed run of it
    verified and re-gated (an Outcome), each other one Ignored, with why (`kakeya history` keeps every run
    of a subject, `judge` the newest)."""
    for done in (d for d in shelf.of(req.preset, req.label) if d.names(subject)):
        signer, why = screen(shelf, done, subject, req, preset)
        if why is not None:
            yield why
            continue
        outcome = regate_evidence(shelf, done, subject, req, preset)
        outcome.trust = trust_words(signer) if shelf.signers is not None else UNSIGNED
        yield outcome


def screen(
    shelf: Shelf, done: Done, subject: str, req: Requirement, preset: Preset
) -> tuple[str | None, Ignored | None]:
    """(the principal that signed it, None) when `done` is evidence for `req` on `subject`: a runner's signed
    done commit for its label (when the shelf has signers), a run that executed, belonging to the subject and
    its request, of this registry's preset definition (when signed), with parameters that meet the pins.
    (None, why not) otherwise."""
    signer = None
    if shelf.signers is not None:
        repo = shelf.repo_with(done.sha)
        signer, problem = trust.signed_done(repo, done.sha, subject, done.label, shelf.signers)
        if problem:
            return None, Ignored(done.id, "untrusted", problem)
    r = done.result
    if r is not None and r.status in NOT_RAN:
        return None, Ignored(done.id, "not-run", f"{r.status}: {r.reason}" if r.reason else r.status)
    problems = provenance(shelf, done, subject, req, preset)
    if shelf.signers is not None and r and r.preset_hash != preset.content_hash:
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
    verdict = regate(report, preset, done.label)
    if preset.baseline is not None:
        params = done.result.params if done.result else None
        verdict = verdict.with_comparison(
            *compare_to_previous(shelf, preset, done.label, done.id, report, params)
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


def _cell(text: str, limit: int = 400, code: bool = False) -> str:
    """`text` for one line of a markdown table or list: no newline, no `|`; outside a code span (`code`) no
    `<` either, so that what a result.json says cannot open HTML (a `</details>`) in the job summary."""
    text = text.replace("|", "\\|").replace("\n", " ")
    text = text if code else text.replace("<", "&lt;")
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
            f"| {MARK[o.status]} | `{_cell(str(o.requirement), 200, code=True)}` | {o.status} | {ev} | "
            f"{_cell(o.trust or '—', 200)} | {_cell(details)} |\n"
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
            + "".join(f"- `{i.id}` ({i.kind}): {_cell(i.reason, 2000)}\n" for i in o.ignored)
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
    return json.dumps([o.as_dict() for o in outcomes])
