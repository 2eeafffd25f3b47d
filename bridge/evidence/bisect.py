"""Hardware bisect: the first commit of a first-parent range whose trusted run of PRESET@LABEL is bad.

    b = Bisect(client, state, registry, max_in_flight=2)      # state: a new State, or the one in .kakeya/
    for event in b.events(): ...                               # the last one: {"event": "first-bad", ...}

The range is `git rev-list --first-parent GOOD..BAD` (GOOD is good and BAD bad, as the user says; neither is
run). A commit is judged from the evidence `kakeya gate pr` would count (bridge/evidence/judge.py `judge`: trusted,
executed, re-gated): with `--verdict` it is bad when the re-gated verdict fails, with `--metric P
--threshold X` when the value at P is below X (above X with `--lower-is-better`). A run that did not succeed
(the subject fails to build or crashes, times out, is rejected, expires or is cancelled) or has no such
number makes its commit untestable: skipped, like `git bisect skip`. Evidence already on the bus for a commit
is used, never run again; a request still pending on the bus for a commit of the range (made by an earlier,
interrupted bisect, or by anyone) is followed instead of a new one.

Up to `max_in_flight` commits (at most one per live runner of the label) are requested at once
(multisection): each new one splits the widest gap of untested commits between the last good, the first bad
and those in flight. Once a result narrows the range, requests in flight outside it are cancelled. Every
change is saved to .kakeya/bisect.json (`State`) before anything else happens, so Ctrl-C loses nothing: the
same command again picks up the requests already made.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from bridge import evidence as E
from bridge.bus.presence import read_presences
from bridge.bus.records import (
    REQ_PREFIX,
    RUNNERS_PREFIX,
    Manifest,
    claim_ref,
    done_ref,
    read_manifests,
    req_ref,
    subject_ref,
    utcnow,
)
from bridge.bus.trust import Signers
from bridge.client.client import Client
from bridge.core.errors import InvalidRequest, KakeyaError, problems
from bridge.evidence import DoneResults, Outcome, Requirement
from bridge.evidence.history import report_value
from bridge.presets.preset import Preset
from bridge.wire import git

STATE_FILE = "bisect.json"
NAG_S = 30.0  # how often a `waiting` event says where the requests in flight are
Verdict = Literal["good", "bad", "skip"]


class Probe(BaseModel):
    """What is known of one commit of the range."""

    model_config = ConfigDict(extra="forbid")
    request_id: str | None = None  # the run that decides it (or the request in flight)
    requested: bool = False  # this bisect made the request (else: evidence or a request found on the bus)
    outcome: Verdict | None = None  # None: in flight
    value: float | None = None
    reason: str | None = None


class State(BaseModel):
    """.kakeya/bisect.json: one bisect, resumable."""

    model_config = ConfigDict(extra="forbid")
    version: Literal[1] = 1
    requirement: str
    good: str
    bad: str
    bus: str  # the bus URL it requested on
    metric: str | None = None  # None: --verdict
    threshold: float | None = None
    lower_is_better: bool = False
    params: dict[str, Any] = {}  # the requests' parameters, as given
    commits: list[str]  # the range, oldest first: GOOD (excluded) .. BAD (included)
    probes: dict[str, Probe] = {}  # commit -> what is known of it
    requested: int = 0  # requests this bisect pushed
    first_bad: str | None = None
    candidates: list[str] = []  # when skips leave it ambiguous: the first bad is one of these

    def same_as(self, other: State) -> bool:
        keys = ("requirement", "good", "bad", "bus", "metric", "threshold", "lower_is_better", "params")
        return all(getattr(self, k) == getattr(other, k) for k in keys)

    @property
    def answered(self) -> bool:
        return bool(self.first_bad or self.candidates)


def state_path(state_dir: Path) -> Path:
    return state_dir / STATE_FILE


def load_state(path: Path) -> State | None:
    if not path.exists():
        return None
    try:
        return State.model_validate_json(path.read_bytes())
    except (OSError, ValidationError) as exc:
        why = problems(exc, "the file") if isinstance(exc, ValidationError) else str(exc)
        raise InvalidRequest(
            f"{path} is not a bisect state ({why}); `kakeya bisect --reset` removes it"
        ) from None


def save_state(path: Path, state: State) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(state.model_dump_json(indent=2))
    tmp.replace(path)


def commit_range(repo: Path, good: str, bad: str) -> list[str]:
    """GOOD (excluded) .. BAD (included) along BAD's first parents, oldest first."""
    if not git.is_ancestor(repo, good, bad):
        raise InvalidRequest(f"--good {good[:12]} is not an ancestor of --bad {bad[:12]}")
    commits = git.out(repo, "rev-list", "--first-parent", "--reverse", bad, f"^{good}", "--").split()
    if not commits:
        raise InvalidRequest("--good and --bad are the same commit: nothing to bisect")
    return commits


def pick(lo: int, hi: int, skipped: set[int], flying: set[int], room: int) -> list[int]:
    """Up to `room` indices in (lo, hi) to request: each splits the widest run of untested indices between
    the bounds and those in flight at its middle (skipped indices are no candidates)."""
    chosen: list[int] = []
    for _ in range(room):
        bounds = sorted({lo, hi} | {i for i in flying | set(chosen) if lo < i < hi})
        best: list[int] = []
        for a, b in zip(bounds, bounds[1:], strict=False):
            free = [i for i in range(a + 1, b) if i not in skipped]
            if len(free) > len(best):
                best = free
        if not best:
            break
        chosen.append(best[(len(best) - 1) // 2])
    return chosen


class Bisect:
    def __init__(
        self,
        client: Client,
        state: State,
        path: Path,
        registry: Mapping[str, Preset],
        signers: Signers | None,
        max_in_flight: int = 1,
        poll_s: float | None = None,
        nag_s: float = NAG_S,
    ):
        self.c, self.state, self.path = client, state, path
        self.req = Requirement.parse(state.requirement, registry)
        if self.req.label is None:
            raise InvalidRequest(f"--require {state.requirement}: name the runner label, PRESET@LABEL")
        self.preset = registry[self.req.preset]
        self.signers, self.max_in_flight = signers, max(1, max_in_flight)
        self.poll_s, self.nag_s = poll_s or client.config.poll_interval_s, nag_s
        self.params = self.preset.validate_params(state.params)
        if unmet := self.req.unmet(self.params):
            raise InvalidRequest(f"these parameters make no evidence for {self.req}: {'; '.join(unmet)}")

    # --- the state -------------------------------------------------------------------------------

    def probe(self, commit: str) -> Probe:
        return self.state.probes.setdefault(commit, Probe())

    def save(self) -> None:
        save_state(self.path, self.state)

    def bounds(self) -> tuple[int, int]:
        """(index of the last good commit, index of the first bad one); -1 is GOOD, the last index BAD."""
        commits, probes = self.state.commits, self.state.probes
        hi = min(
            [i for i, c in enumerate(commits) if (p := probes.get(c)) and p.outcome == "bad"]
            + [len(commits) - 1]
        )
        lo = max(
            [i for i, c in enumerate(commits[:hi]) if (p := probes.get(c)) and p.outcome == "good"] + [-1]
        )
        return lo, hi

    def flying(self) -> dict[str, str]:
        """commit -> request id of the requests in flight."""
        return {c: p.request_id for c, p in self.state.probes.items() if p.outcome is None and p.request_id}

    # --- judging -----------------------------------------------------------------------------------

    def judge(
        self, shelf: DoneResults, commit: str, ours: str | None
    ) -> tuple[Verdict, Outcome, float | None] | None:
        """The commit's verdict from its evidence (None: none yet), with the metric's value. `ours`: the request
        this bisect waits on, whose run ended: when it is no evidence (it did not succeed, was rejected,
        expired, is untrusted), the commit is skipped. Without `ours`, only a run that succeeded decides."""
        outcome = E.judge(shelf, commit, self.req, self.preset)
        done = outcome.evidence
        ran = done is not None and done.result is not None and done.result.status == "succeeded"
        if not ran or outcome.status not in ("pass", "fail"):
            return ("skip", outcome, None) if ours is not None else None
        if self.state.metric is None:
            return ("good" if outcome.passed else "bad"), outcome, None
        value = report_value(shelf, outcome, self.state.metric)
        if value is None:
            return ("skip", outcome, None) if ours is not None else None
        threshold = self.state.threshold
        assert threshold is not None
        worse = value > threshold if self.state.lower_is_better else value < threshold
        return ("bad" if worse else "good"), outcome, value

    def decide(self, commit: str, verdict: Verdict, outcome: Outcome, value: float | None) -> dict[str, Any]:
        p = self.probe(commit)
        done = outcome.evidence
        if verdict != "skip" and done is not None and done.id != p.request_id:
            p.request_id, p.requested = done.id, False  # decided by other evidence than a request it made
        p.outcome, p.value = verdict, value
        p.reason = (
            "; ".join(outcome.reasons + [str(i) for i in outcome.ignored]) if verdict == "skip" else None
        )
        self.save()
        return self.event(verdict, commit, id=p.request_id, value=value, reason=p.reason)

    def event(self, kind: str, commit: str | None = None, **fields: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"event": kind}
        if commit is not None:
            out["commit"] = commit
            if commit in self.state.commits:
                out["index"] = self.state.commits.index(commit)
        return {**out, **fields}

    # --- the loop ----------------------------------------------------------------------------------

    def events(self) -> Iterator[dict[str, Any]]:
        s = self.state
        yield self.event("start", good=s.good, bad=s.bad, commits=len(s.commits), requirement=s.requirement)
        if not s.answered:
            yield from self.reuse()
        while not s.answered:
            lo, hi = self.bounds()
            yield from self.cancel_outside(lo, hi)
            flying = {s.commits.index(c) for c in self.flying()}
            skipped = {i for i, c in enumerate(s.commits) if (p := s.probes.get(c)) and p.outcome == "skip"}
            room = self.room() - len(flying)
            chosen = pick(lo, hi, skipped, flying, room)
            if not chosen and not flying:
                yield self.finish(lo, hi)
                return
            if chosen:
                yield from self.start([s.commits[i] for i in chosen])
            yield from self.wait()
        yield self.finish(*self.bounds())

    def room(self) -> int:
        """How many requests may be in flight: --max-in-flight, at most one per live runner of the label
        (at least one: a request waits on the bus until a runner comes)."""
        if self.max_in_flight == 1:
            return 1
        snap = self.c.bus.ls_remote(RUNNERS_PREFIX)
        now = utcnow()
        live = sum(
            s.serves(self.req.label or "", now)
            for s in read_presences(self.c.bus, snap.runners, self.signers)
        )
        return max(1, min(self.max_in_flight, live))

    def reuse(self) -> Iterator[dict[str, Any]]:
        """Decide every commit that already has evidence; follow what is in flight (ours or on the bus)."""
        s = self.state
        everything = [s.good, *s.commits]
        shelf = DoneResults(self.c.bus, self.signers).load_subjects([self.req.preset], everything)
        for commit in everything:
            p = s.probes.get(commit)
            if p is not None and p.outcome is not None:
                continue
            found = self.judge(shelf, commit, None)
            if found is None:
                continue
            verdict, outcome, value = found
            if commit in (s.good, s.bad):  # good or bad as the user said; its run is only named
                given: Verdict = "good" if commit == s.good else "bad"
                s.probes[commit] = Probe(
                    request_id=outcome.evidence.id if outcome.evidence else None, outcome=given
                )
                self.save()
                continue
            yield {**self.decide(commit, verdict, outcome, value), "reused": True}

    def pending_on_bus(self, commits: Sequence[str]) -> dict[str, str]:
        """commit -> id of a live request on the bus for it, of this preset with these parameters."""
        snap = self.c.bus.ls_remote(f"{REQ_PREFIX}{self.req.label}/")
        live = [e for e in snap.entries.values() if e.req and e.preset == self.req.preset and not e.done]
        if not live:
            return {}
        self.c.ensure(live, ("req",))
        manifests = read_manifests(self.c.bus.repos(), [e.req for e in live if e.req])
        out: dict[str, str] = {}
        for e in live:
            m = manifests.get(e.req or "")
            if not isinstance(m, Manifest) or m.subject not in commits or m.expires_at < utcnow():
                continue
            try:
                same = self.preset.validate_params(m.params) == self.params
            except InvalidRequest:
                same = False
            if same and m.runner == self.req.label:
                out.setdefault(m.subject, e.id)
        return out

    def start(self, commits: list[str]) -> Iterator[dict[str, Any]]:
        """Request `commits`, unless a request for one is pending on the bus (followed) or its evidence
        arrived meanwhile (used); pending requests are looked for first, so that one finishing between the
        two looks is seen by the second."""
        pending = self.pending_on_bus(commits)
        shelf = DoneResults(self.c.bus, self.signers).load_subjects([self.req.preset], commits)
        for commit in commits:
            p = self.probe(commit)
            if (found := self.judge(shelf, commit, None)) is not None:
                yield {**self.decide(commit, *found), "reused": True}
                continue
            if commit in pending:
                p.request_id, p.requested = pending[commit], False
                self.save()
                yield self.event("follow", commit, id=p.request_id)
                continue
            manifest = self.c.request(
                self.req.preset,
                self.state.params,
                self.req.label or "",
                subject=commit,
                registry={self.preset.name: self.preset},
            )
            p.request_id, p.requested = manifest.id, True
            self.state.requested += 1
            self.save()
            yield self.event("request", commit, id=manifest.id)

    def wait(self) -> Iterator[dict[str, Any]]:
        """Until a request in flight ends (or vanished from the bus: forgotten, to be requested again): one
        listing of just their refs per poll; every `nag_s` a `waiting` event says where each one is."""
        nagged = time.monotonic()
        while True:
            flying = self.flying()
            if not flying:
                return
            snap = self.c.bus.ls_remote(
                *(ref for c, i in flying.items() for ref in (done_ref(i), subject_ref(c, i), claim_ref(i))),
                *(req_ref(self.req.label or "", i) for i in flying.values()),
            )
            entries = {c: snap.entries.get(i) for c, i in flying.items()}
            ended = [c for c, i in flying.items() if i in snap.index or ((e := entries[c]) and e.done)]
            gone = [c for c, e in entries.items() if c not in ended and (e is None or not (e.req or e.claim))]
            for commit in gone:  # its request ref was deleted before any runner finished it
                del self.state.probes[commit]
                self.save()
                yield self.event("lost", commit, id=flying[commit])
            if ended:
                shelf = DoneResults(self.c.bus, self.signers).load_subjects([self.req.preset], ended)
                for commit in ended:
                    found = self.judge(shelf, commit, flying[commit])
                    assert found is not None
                    yield self.decide(commit, *found)
            if ended or gone:
                return
            if time.monotonic() - nagged >= self.nag_s:
                nagged = time.monotonic()
                states = {flying[c]: "claimed" if e and e.claim else "queued" for c, e in entries.items()}
                yield self.event("waiting", requests=states)
            time.sleep(self.poll_s)

    def cancel_outside(self, lo: int, hi: int) -> Iterator[dict[str, Any]]:
        """Requests in flight outside (lo, hi) decide nothing any more: cancelled (best effort), forgotten."""
        for commit, rid in self.flying().items():
            i = self.state.commits.index(commit)
            if lo < i < hi:
                continue
            try:
                self.c.cancel(rid, "kakeya bisect: outside the range left to search")
            except KakeyaError:
                pass  # it ended meanwhile: its evidence stays on the bus for the next one who asks
            del self.state.probes[commit]
            self.save()
            yield self.event("cancel", commit, id=rid)

    def finish(self, lo: int, hi: int) -> dict[str, Any]:
        s = self.state
        between = [s.commits[i] for i in range(lo + 1, hi)]
        bad = s.commits[hi]
        good = s.commits[lo] if lo >= 0 else s.good
        if between:  # all skipped
            s.candidates = [*between, bad]
        else:
            s.first_bad = bad
        self.save()
        return self.event(
            "first-bad" if not between else "ambiguous",
            bad,
            candidates=s.candidates,
            bad_run=s.probes[bad].request_id if bad in s.probes else None,
            good=good,
            good_run=s.probes[good].request_id if good in s.probes else None,
            title=git.out(self.c.root, "log", "-1", "--format=%s", bad),
            requested=s.requested,
        )
