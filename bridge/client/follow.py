"""Following one request until it is done, as a stream of events: what `kakeya wait` and `request --wait`
show a person (one line per change) and an agent (`--json`: one JSON object per line).

    for event in Follower(client, request_id).events(): ...     # the last one is a Finished
    event.dump()      # the JSON object `wait --json` prints: {"event": "finished", "id": ..., "at": ..., "done": ...}

Events are a small typed union (`Event`, one pydantic model a kind; `parse_event` reads a line back). Every
one has "event", "id" and "at", the time it was seen:
    queued     not claimed yet: "position" in its label's queue (1 = next), "ahead" running, "runners" live
    no-runner  no live runner serves the label (at once, then every `nag_s`); --no-runner-timeout ends the wait
    claimed    "runner" on "host" claimed it at "claimed_at" (again after a takeover)
    running    a heartbeat's progress: "phase", "elapsed_s", "workload" {done,total,what}, "log_tail", "scheduler" (a Slurm job's state)
    queued     (also) claimed, and its job waits in the scheduler's queue: a heartbeat's progress as `running`'s,
               with "phase": "queued" and "scheduler" ("pending (Resources)")
    stale      the holder's lease ran out (it may be dead; another runner may take it over)
    cancelling a cancel marker while a runner holds it
    finished   the done commit is on the bus ("done": its sha); the command adds the "verdict" event
    cancelled  (last) cancelled before any runner claimed it: the wait ends at once, nothing ran
    expired    (last) its expires_at passed before any runner claimed it ("expires_at"): the wait ends at once
"""

from __future__ import annotations

import datetime as dt
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, TypeAdapter

from bridge.bus.presence import read_presences
from bridge.bus.records import (
    CANCEL_PREFIX,
    CLAIM_PATH,
    CLAIM_PREFIX,
    REQ_PREFIX,
    RUNNERS_PREFIX,
    Claim,
    Entry,
    Manifest,
    Snapshot,
    id_time,
    parse_or_none,
    read_manifests,
    utcnow,
)
from bridge.bus.trust import Signers, trusted_signers
from bridge.client.client import Client
from bridge.core.errors import KakeyaError, NoRunner, WaitTimeout
from bridge.core.result import iso_time

NAG_S = 30.0  # how often "no live runner" is said again
NEVER = dt.datetime.max.replace(tzinfo=dt.UTC)  # the expiry of a request whose manifest cannot be read


class _Event(BaseModel):
    model_config = ConfigDict(extra="forbid")
    event: str
    id: str
    at: str  # when it was seen (iso_time)

    def dump(self) -> dict[str, Any]:
        """The JSON object of the event: the fields it was made with (every field of its kind; an optional
        one only when set), in the order above."""
        return self.model_dump(mode="json", exclude_unset=True)


class Queued(_Event):
    """Not claimed yet: its place in its label's queue, the claimed ones ahead, the live runners."""

    event: Literal["queued"] = "queued"
    label: str | None
    position: int
    ahead: int
    runners: list[str]
    created_at: str


class NoRunnerSeen(_Event):
    """No live runner serves the label (said at once, then every `nag_s`)."""

    event: Literal["no-runner"] = "no-runner"
    label: str | None
    waited_s: float
    seen: list[str]


class Claimed(_Event):
    event: Literal["claimed"] = "claimed"
    runner: str
    host: str | None
    claimed_at: str
    takeover_of: str | None


class Running(_Event):
    """A heartbeat's progress; "queued" here: claimed, its job waits in a scheduler's queue."""

    event: Literal["running", "gating", "queued"]
    runner: str
    phase: str
    started_at: str
    progress_at: str
    elapsed_s: float
    workload: dict[str, Any] | None
    log_tail: list[str]
    scheduler: str | None


class Stale(_Event):
    event: Literal["stale"] = "stale"
    runner: str
    lease_until: str


class Cancelling(_Event):
    event: Literal["cancelling"] = "cancelling"


class Finished(_Event):
    event: Literal["finished"] = "finished"
    done: str  # the done commit


class Cancelled(_Event):
    """Cancelled before any runner claimed it (last: nothing ran)."""

    event: Literal["cancelled"] = "cancelled"
    state: Literal["cancelled"] = "cancelled"
    exit_code: int | None = None  # `wait` sets it on its last line


class Expired(_Event):
    """Its expires_at passed before any runner claimed it (last: nothing ran)."""

    event: Literal["expired"] = "expired"
    state: Literal["expired"] = "expired"
    expires_at: str
    exit_code: int | None = None  # `wait` sets it on its last line


Ended = Cancelled | Expired  # a request that will never run


def _kind(value: Any) -> str:
    """The union's tag: the event's name, but "queued" is two shapes (in the label's queue, or claimed and
    in a scheduler's queue: a progress event)."""
    get = value.get if isinstance(value, dict) else lambda k, d=None: getattr(value, k, d)
    kind = str(get("event"))
    return "progress" if kind in ("running", "gating") or (kind == "queued" and get("phase")) else kind


Event = Annotated[
    Annotated[Queued, Tag("queued")]
    | Annotated[NoRunnerSeen, Tag("no-runner")]
    | Annotated[Claimed, Tag("claimed")]
    | Annotated[Running, Tag("progress")]
    | Annotated[Stale, Tag("stale")]
    | Annotated[Cancelling, Tag("cancelling")]
    | Annotated[Finished, Tag("finished")]
    | Annotated[Cancelled, Tag("cancelled")]
    | Annotated[Expired, Tag("expired")],
    Discriminator(_kind),
]
EVENT: TypeAdapter[Event] = TypeAdapter(Event)


def parse_event(data: str | bytes | dict[str, Any]) -> Event:
    """One event from its JSON line (or object): pydantic.ValidationError when it is none of the kinds."""
    return EVENT.validate_python(data) if isinstance(data, dict) else EVENT.validate_json(data)


class Follower:
    def __init__(
        self,
        client: Client,
        request_id: str,
        *,
        poll_s: float | None = None,
        timeout: float | None = None,
        no_runner_timeout: float | None = None,
        nag_s: float = NAG_S,
    ):
        self.c, self.id = client, request_id
        self.poll_s = poll_s or client.config.poll_interval_s
        self.timeout, self.no_runner_timeout, self.nag_s = timeout, no_runner_timeout, nag_s
        self.signers: Signers | None = trusted_signers(client.root) if client.in_repo else None
        self.last: dict[str, Any] = {}  # the last event of each kind, to tell a change
        self.no_runner_since: float | None = None
        self.nagged_at: float | None = None
        self.expires_at: dt.datetime | None = None

    def events(self) -> Iterator[Event]:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        id_time(self.id)
        label = None
        while True:  # each look lists only this request's refs (and its label's queue while it is queued)
            entry = self.c.entry(self.id, label)
            label = entry.label or label
            if entry.req is None and entry.done is None:
                raise KakeyaError(f"no request {self.id} on the bus at {self.c.url}", code="not-found")
            if entry.done:
                if "queued" in self.last and "claimed" not in self.last:  # it ran between two looks
                    self.c.ensure([entry], ("done",))
                    if claim := self.claim_in(entry.done):  # a done commit carries its claim
                        yield self.claimed(claim)
                yield self.event("finished", done=entry.done)
                return
            if ended := self.ended(entry):
                yield ended
                return
            yield from self.look(entry)
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeout(
                    f"timed out after {self.timeout:g} s waiting for {self.id} (state: {entry.state}); "
                    f"it goes on (`kakeya wait {self.id}` follows it again)",
                    id=self.id,
                    state=entry.state,
                    waited_s=self.timeout,
                )
            pause = (
                self.poll_s if deadline is None else max(0.0, min(self.poll_s, deadline - time.monotonic()))
            )
            time.sleep(pause)

    def ended(self, entry: Entry) -> Event | None:
        """The last event of a request no runner claimed that can no longer run (cancelled, expired)."""
        if entry.claim is not None or entry.req is None:
            return None
        if entry.cancel:
            return self.event("cancelled", state="cancelled")
        if self.expires_at is None:  # read once from the request commit
            self.c.ensure([entry], ("req",))
            manifest = read_manifests(self.c.bus.repos(), [entry.req]).get(entry.req)
            self.expires_at = manifest.expires_at if isinstance(manifest, Manifest) else NEVER
        if self.expires_at < utcnow():
            return self.event("expired", state="expired", expires_at=iso_time(self.expires_at))
        return None

    def event(self, kind: str, **fields: Any) -> Event:
        """The event `kind` of this request, seen now; pydantic.ValidationError when `fields` do not fit it."""
        return EVENT.validate_python({"event": kind, "id": self.id, "at": iso_time(utcnow()), **fields})

    def changed(self, kind: str, key: object) -> bool:
        if self.last.get(kind) == key:
            return False
        self.last[kind] = key
        return True

    def look(self, entry: Entry) -> Iterator[Event]:
        now = utcnow()
        if entry.claim is None:
            snap = self.c.bus.ls_remote(
                f"{REQ_PREFIX}{entry.label}/", CLAIM_PREFIX, CANCEL_PREFIX, RUNNERS_PREFIX
            )
            yield from self.queued(snap, entry, now)
            return
        self.no_runner_since = None
        if entry.cancel and self.changed("cancelling", entry.cancel):
            yield self.event("cancelling")
        self.c.ensure([entry], ("claim",))
        claim = self.claim_in(entry.claim)
        if claim is None:
            return
        if self.changed("claimed", (claim.runner, claim.claimed_at)):
            yield self.claimed(claim)
        p = claim.progress
        if p is not None and self.changed("running", (p.phase, p.at, p.scheduler)):
            yield self.event(
                p.phase if p.phase in ("queued", "gating") else "running",
                runner=claim.runner,
                phase=p.phase,
                started_at=iso_time(p.started_at),
                progress_at=iso_time(p.at),
                elapsed_s=round(max(p.elapsed_s, (now - p.started_at).total_seconds()), 1),
                workload=p.workload.model_dump() if p.workload else None,
                log_tail=p.log_tail,
                scheduler=p.scheduler,
            )
        stale = claim.lease_until < now
        if self.changed("stale", stale) and stale:
            yield self.event("stale", runner=claim.runner, lease_until=iso_time(claim.lease_until))

    def claim_in(self, sha: str) -> Claim | None:
        """The claim a claim (or done) commit here carries; None when it has none that parses."""
        spec = f"{sha}:{CLAIM_PATH}"
        return parse_or_none(Claim, self.c.local_files([spec]).get(spec))

    def claimed(self, claim: Claim) -> Event:
        return self.event(
            "claimed",
            runner=claim.runner,
            host=claim.host,
            claimed_at=iso_time(claim.claimed_at),
            takeover_of=claim.takeover_of,
        )

    def queued(self, snap: Snapshot, entry: Entry, now: dt.datetime) -> Iterator[Event]:
        same = [e for e in snap.entries.values() if e.label == entry.label and e.req and not e.done]
        before = [e for e in same if e.claim is None and not e.cancel and e.id < entry.id]
        if before:  # an expired request no runner has closed yet is in no queue (its commit: fetched once)
            self.c.ensure(before, ("req",))
            manifests = read_manifests(self.c.bus.repos(), [e.req for e in before if e.req])
            before = [
                e
                for e in before
                if not (isinstance(m := manifests.get(e.req or ""), Manifest) and m.expires_at < now)
            ]
        position = 1 + len(before)
        ahead = sum(1 for e in same if e.claim is not None)
        seen = read_presences(self.c.bus, snap.runners, self.signers)
        live = sorted(s.name for s in seen if entry.label and s.serves(entry.label, now))
        if self.changed("queued", (position, ahead, tuple(live))):
            yield self.event(
                "queued",
                label=entry.label,
                position=position,
                ahead=ahead,
                runners=live,
                created_at=iso_time(entry.created_at),
            )
        clock = time.monotonic()
        if live:
            self.no_runner_since = self.nagged_at = None
            return
        if self.no_runner_since is None:
            self.no_runner_since = clock
        waited = clock - self.no_runner_since
        if self.nagged_at is None or clock - self.nagged_at >= self.nag_s:
            self.nagged_at = clock
            others = sorted(f"{s.name} ({s.state(now)})" for s in seen)
            yield self.event("no-runner", label=entry.label, waited_s=round(waited, 1), seen=others)
        if self.no_runner_timeout is not None and waited >= self.no_runner_timeout:
            raise NoRunner(
                f"no live runner serves label {entry.label!r} (waited {waited:.0f} s); request {self.id} "
                f"stays queued on the bus (`kakeya runners` lists runners, `kakeya cancel {self.id}` cancels)"
            )


class _Stopped(Exception):
    """Raised in a follower's thread once the reader has stopped reading (`follow_all`)."""


class _Follower(Follower):
    """A Follower that ends at its next look once `stop` is set: no thread keeps polling for a reader gone."""

    def __init__(self, c: Client, rid: str, stop: threading.Event, **kw: Any):
        super().__init__(c, rid, **kw)
        self.stop = stop

    def look(self, entry: Entry) -> Iterator[Event]:
        if self.stop.is_set():
            raise _Stopped
        yield from super().look(entry)


def follow_all(
    c: Client, ids: Sequence[str], timeout: float | None = None, no_runner_timeout: float | None = None
) -> Iterator[dict[str, Any]]:
    """The events of every request in `ids`, followed at once (one thread each), as they come; each event
    carries its request's "id", each request ends with its last event ("finished", or how it ended). An error
    while following one (a timeout, no live runner) is raised once read; the other threads then stop at their
    next look."""
    events: queue.Queue[dict[str, Any] | BaseException | None] = queue.Queue()
    stop = threading.Event()

    def follow(rid: str) -> None:
        try:
            for event in _Follower(
                c, rid, stop, timeout=timeout, no_runner_timeout=no_runner_timeout
            ).events():
                events.put(event.dump())
        except _Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 — handed to the reader, which raises it
            events.put(exc)
        events.put(None)

    for rid in ids:
        threading.Thread(target=follow, args=(rid,), daemon=True).start()
    left = len(ids)
    try:
        while left:
            item = events.get()
            if item is None:
                left -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        stop.set()
