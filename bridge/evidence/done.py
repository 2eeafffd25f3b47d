"""The done results on the bus, read (nothing verified yet): `Done`, one run's done commit as it says, and
`DoneResults`, those of some presets read in batches from the local object stores; `previous_pass` finds a
baseline among them; `regate` gates a report again with this registry's checks for its label."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gates
import gates.tables
from bridge.bus import ledger, trust
from bridge.bus.bus import Bus
from bridge.bus.records import (
    DONE_PREFIX,
    REQ_PREFIX,
    SUBJECT_PREFIX,
    Entry,
    Manifest,
    Snapshot,
    parse_or_none,
    read_manifests,
    results_path,
)
from bridge.bus.trust import Signers
from bridge.core.errors import BusUnreachable, KakeyaError
from bridge.core.result import RunResult
from bridge.presets.preset import Preset
from bridge.wire import git

BATCH = 16  # done results read at a time when looking for a baseline, newest first


class Background:
    """`call` run in a thread now (its git waits beside the caller's); `join` waits for it and raises what it
    raised, a KakeyaError only (anything else is a bug, and raises in the thread)."""

    def __init__(self, call: Callable[[], None]):
        self.error: KakeyaError | None = None

        def run() -> None:
            try:
                call()
            except KakeyaError as exc:
                self.error = exc

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> KakeyaError | None:
        self.thread.join()
        return self.error


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


class DoneResults:
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

    def load(
        self, presets: Iterable[str], snap: Snapshot | None = None, subject: str | None = None
    ) -> DoneResults:
        """Read the done results of `presets`: with `subject`, those indexed under it (refs/kakeya/by-subject/
        <subject>/, what `gate pr` needs), else every done ref of them (for baselines). One prefix-scoped
        listing unless `snap`, one fetch by object id of what is not here yet, one batch read."""
        wanted = set(presets)
        if subject is not None:
            return self.load_subjects(presets, [subject], snap)
        if snap is None:  # the live requests too: a done result for a request still pending is checked on it
            snap = self.bus.ls_remote(DONE_PREFIX, ledger.map_ref("preset"), REQ_PREFIX)
        found = [e for e in snap.entries.values() if e.done]
        entries = sorted((e for e in found if e.preset in wanted), key=lambda e: e.id)
        self.dones.update({name: [] for name in wanted})
        # for baselines, newest first: a batch now, older ones when asked (`more`)
        self.known |= {e.id for e in entries}
        if ledger.map_ref("preset") in snap.refs:  # then the ledger, a month at a time (`more`)
            self.ledger = ledger.read_map(self.bus, snap, "preset")
        for name in wanted:
            self.later[name] = [e for e in entries if e.preset == name]
            self.months[name] = ledger.preset_months(self.ledger, name)
            self.more(name)
        return self

    def load_subjects(
        self, presets: Iterable[str], subjects: Sequence[str], snap: Snapshot | None = None
    ) -> DoneResults:
        """Read the done results of `presets` indexed under any of `subjects` (`load(subject=...)` for many
        subjects at once: `kakeya history` and `kakeya bisect` read a whole branch): one listing scoped to
        those subjects' index refs and ledger shards unless `snap`, one fetch by object id of what is not here
        yet, one batch read."""
        wanted, among = set(presets), set(subjects)
        if snap is None:  # the live requests too: a done result for a request still pending is checked on it
            snap = self.bus.ls_remote(
                *(f"{SUBJECT_PREFIX}{s}/" for s in sorted(among)), *self._shards(among), REQ_PREFIX
            )
        found = [
            Entry(rid, e.label if (e := snap.entries.get(rid)) else None, e.req if e else None, done=sha)
            for rid, (subj, sha) in snap.index.items()
            if subj in among
        ]
        known = {e.id for e in found}
        # their done results come with their history down to the subjects, never further (`Bus.fetch_results`):
        # the subjects missing here (a PR gate's checkout is the base) come first, at depth 1, beside the
        # ledger's reads; with all of them here, the recent results come with the ledger's maps
        missing = self.bus.missing(among)
        subjects = Background(lambda: self.bus.fetch_shallow(missing, "the subjects")) if missing else None
        recent = [c for e in found for c in (e.done, e.req) if c] if subjects is None else []
        shelved = ledger.read_subjects(self.bus, snap, among, recent)
        found += ledger.as_entries(e for e in shelved if e.id not in known).values()
        entries = sorted((e for e in found if e.preset in wanted), key=lambda e: e.id)
        if subjects is not None and isinstance(error := subjects.join(), BusUnreachable):
            raise error  # any other error: the bus lacks a subject, and no result descends from it (provenance)
        self.dones.update({name: [] for name in wanted})
        self.dones.update(self.done_results(entries, among))
        return self

    @staticmethod
    def _shards(subjects: set[str]) -> list[str]:
        """The ledger refs to list for `subjects`' results moved into the ledger: their subject maps."""
        return sorted({ledger.map_ref(ledger.subject_map(s)) for s in subjects})

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

    def done_results(
        self, entries: Sequence[Entry], subjects: Sequence[str] | None = None
    ) -> dict[str, list[Done]]:
        """`entries` (oldest first) read as done results, by preset: one fetch by object id of what is not here
        yet (with `subjects`, theirs: down to those subjects only, `Bus.fetch_results`), one batch read."""
        commits = [e.done for e in entries if e.done] + [e.req for e in entries if e.req]
        if subjects is None:
            self.bus.fetch_ids(commits, "done results")
        else:  # what no local repository has yet, down to the subjects
            self.bus.fetch_results(commits, "done results", subjects)
        files = self.read([f"{e.done}:{results_path(e.id)}/result.json" for e in entries])
        found = read_manifests(self.bus.repos(), {c for e in entries for c in (e.done, e.req) if c})
        manifests = {c: m for c, m in found.items() if isinstance(m, Manifest)}
        out: dict[str, list[Done]] = {}
        for e in entries:  # oldest first
            assert e.done is not None
            manifest = manifests.get(e.done)
            result = parse_or_none(RunResult, files.get(f"{e.done}:{results_path(e.id)}/result.json"))
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
        return self.read([f"{done.sha}:{results_path(done.id)}/report.json"]).get(
            f"{done.sha}:{results_path(done.id)}/report.json"
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
