"""Taking requests: which pending ones a runner may claim, and the claim itself.

    claims = Claims(runner)
    for entry, old in claims.candidates(snapshot, request_id)[:MAX_TRIES]:   # oldest few first, shuffled
        claimed = claims.claim(entry, old)      # (claim sha, Claim), or None: another runner was faster

Claim = create refs/kakeya/claim/<id> only if absent. A lease is judged expired by how long this runner has
seen the claim unchanged on its own monotonic clock (longer than the claim's lease_s), never by comparing
another host's timestamp with ours, so clock skew cannot run a request twice; a runner that finds an expired
lease takes it over with a lease on the sha it saw.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import random
import time

from pydantic import ValidationError

from bridge.bus.records import CLAIM_PATH, Claim, Entry, Snapshot, Update, claim_ref, done_ref
from bridge.core.errors import BusError, KakeyaError
from bridge.run.owner import Owner
from bridge.wire import git

CLAIM_WINDOW = 8  # runners pick at random among the oldest few pending requests, so they rarely collide
PREFETCH = 16  # requests fetched ahead in one fetch
MAX_TRIES = 4  # claims tried per poll before looking at the bus again


class Claims:
    def __init__(self, runner: Owner):
        self.runner = runner
        self.leases: dict[str, Claim | None] = {}  # claim sha -> its claim.json (immutable, so cached)
        self.seen: dict[str, float] = {}  # claim sha -> when (time.monotonic) this runner first saw it

    def prefetch(self, entries: list[Entry]) -> None:
        """Fetch the requests we may claim (and their subjects) in one go; a backlog costs one fetch, not one each."""
        mirror = self.runner.mirror
        shas = [e.req for e in entries if e.req]
        missing = sorted(set(shas) - git.present(mirror, shas))
        if missing:
            self.runner.bus.fetch_ids(missing, "requests", in_store=True)
            # One local ref, moved to a fetched request, keeps the subjects' history as `have`s for the next fetch.
            git.update_ref(mirror, "refs/kakeya/last", missing[0])

    def candidates(
        self, snap: Snapshot, request_id: str | None
    ) -> list[tuple[Entry, tuple[str, Claim] | None]]:
        """Requests we may claim, oldest first: unclaimed ones, and claimed ones whose lease has expired."""
        pool = self.pool(snap, request_id)
        self.learn([e for e in pool if e.claim])
        live = {e.claim for e in snap.entries.values() if e.claim}
        self.leases = {sha: c for sha, c in self.leases.items() if sha in live}
        now = time.monotonic()
        self.seen = {sha: t for sha, t in self.seen.items() if sha in live}
        out: list[tuple[Entry, tuple[str, Claim] | None]] = []
        for e in pool:
            if e.claim is None:
                out.append((e, None))
                continue
            first_seen = self.seen.setdefault(e.claim, now)
            claim = self.leases.get(e.claim)
            if claim is None:  # unreadable or missing claim (logged when learnt): treat as expired
                wall = self.runner.now()
                unknown = Claim(
                    id=e.id, runner="unknown", labels=[], host="", pid=0, claimed_at=wall, lease_until=wall
                )
                out.append((e, (e.claim, unknown)))
            elif now - first_seen > (claim.lease_s or self.runner.config.lease_s):
                out.append((e, (e.claim, claim)))
        head = out[:CLAIM_WINDOW]
        random.shuffle(head)
        return head + out[CLAIM_WINDOW:]

    def pool(self, snap: Snapshot, request_id: str | None) -> list[Entry]:
        """The pending requests of our labels in `snap` (or just `request_id`, which must be one)."""
        labels = self.runner.labels
        if not request_id:
            return [e for e in snap.entries.values() if e.req and not e.done and e.label in labels]
        entry = snap.entries.get(request_id)
        if entry is not None and entry.done:  # finished (its request ref went with the done push)
            return []
        if entry is None or entry.req is None:
            raise KakeyaError(f"no request {request_id} on the bus at {self.runner.bus.url}")
        if entry.label not in labels:
            raise KakeyaError(
                f"request {request_id} is for runner label {entry.label!r}; this runner serves {', '.join(labels)}"
            )
        return [entry]

    def learn(self, claimed: list[Entry]) -> None:
        """Read the claim.json of each claim not seen before (one fetch); an unreadable one counts as expired."""
        r = self.runner
        unknown = [e for e in claimed if e.claim not in self.leases]
        if not unknown:
            return
        try:
            r.bus.fetch_ids([e.claim for e in unknown if e.claim], "claims", in_store=True)
        except BusError as exc:  # a claim moved or went away meanwhile: look again next time
            r.log(f"could not read claims: {exc}")
            return
        present = git.present(r.mirror, [e.claim for e in unknown if e.claim])
        for e in unknown:
            assert e.claim is not None
            if e.claim not in present:
                r.log(
                    f"{e.id}: claim {e.claim[:12]} could not be read after the fetch; treating it as expired"
                )
                self.leases[e.claim] = None
                continue
            raw = git.read_path(r.mirror, e.claim, CLAIM_PATH)
            try:
                self.leases[e.claim] = Claim.model_validate_json(raw or b"")
            except ValidationError:
                r.log(f"{e.id}: claim {e.claim[:12]} has no valid {CLAIM_PATH}; treating it as expired")
                self.leases[e.claim] = None

    def holder(self, request_id: str, sha: str | None) -> str:
        """Who holds the claim now, for messages."""
        r = self.runner
        try:
            snap = r.bus.ls_remote(claim_ref(request_id), done_ref(request_id))
            if done_ref(request_id) in snap.refs:
                return "the request was finished by another runner"
            sha = snap.refs.get(claim_ref(request_id))
            if sha is None:
                return "the claim was deleted"
            r.bus.fetch_ids([sha], "the claim", in_store=True)
            raw = git.read_path(r.mirror, sha, CLAIM_PATH)
            return f"taken over by runner {Claim.model_validate_json(raw or b'').runner}"
        except (KakeyaError, ValidationError):
            return f"the claim is now {sha or 'gone'}"

    def claim(self, entry: Entry, old: tuple[str, Claim] | None) -> tuple[str, Claim] | None:
        """Create (or take over) the claim; None if another runner got there first."""
        r = self.runner
        assert entry.req is not None and entry.label is not None
        if not git.has_object(r.mirror, entry.req):
            self.prefetch([entry])
        now = r.now()
        claim = Claim(
            id=entry.id,
            runner=r.name,
            labels=r.labels,
            host=platform.node(),
            pid=os.getpid(),
            claimed_at=now,
            lease_until=now + dt.timedelta(seconds=r.config.lease_s),
            takeover_of=old[1].runner if old else None,
            lease_s=r.config.lease_s,
        )
        base = old[0] if old else entry.req
        verb = f"takes over {entry.id} from {old[1].runner}" if old else f"claims {entry.id}"
        sha = git.child_commit(
            r.mirror, base, {CLAIM_PATH: claim.dump()}, f"kakeya: {r.name} {verb}", r.who, r.sign_key
        )
        if not r.bus.swap([Update(claim_ref(entry.id), sha, old[0] if old else None)]):
            r.log(f"{entry.id}: another runner claimed it first")
            return None
        r.log(f"{verb} ({entry.preset} on {entry.label})")
        return sha, claim
