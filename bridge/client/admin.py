"""Administering the bus, over a client's connection to it: `gc` (the refs of finished requests, left-over side
refs and stale idempotency keys), `migrate` (a bus of layout 1 to layout 2) and `compact` (old done results
into the ledger, bridge/bus/ledger.py).

    admin = Admin(Client(load_config()))
    admin.gc(30, dry_run=True)          # the refs it would delete
    admin.compact(3)                    # the done refs of results older than 3 days, moved into the ledger
"""

from __future__ import annotations

import datetime as dt

from bridge.bus import ledger as L
from bridge.bus.records import (
    DONE_PREFIX,
    LAYOUT,
    LIVE,
    NS,
    OLD_PREFIXES,
    PREFIX,
    STAGE_PREFIX,
    SUBJECT_PREFIX,
    Manifest,
    Snapshot,
    Update,
    archive_ref,
    cancel_ref,
    claim_ref,
    done_ref,
    layout_ref,
    parse_id,
    parse_or_none,
    read_manifests,
    req_ref,
    runner_ref,
    subject_ref,
    utcnow,
)
from bridge.client.client import Client
from bridge.client.request import IDEM_PATH, IDEM_PREFIX, Idempotency, layout_marker
from bridge.config import MAX_TTL

# refs a gc push carries: through git push (http(s)) each is matched against every ref on the bus, so few; in
# receive-pack's protocol (bridge/wire/receive_pack.py) each costs the same whatever the bus holds, and only the
# advertisement of every ref, downloaded once a push, is worth sharing among many
GC_CHUNK = 500
GC_CHUNK_RECEIVE_PACK = 5000


class Admin:
    """Bus administration through `client`'s bus (its store, its identity)."""

    def __init__(self, client: Client):
        self.client = client
        self.bus = client.bus

    def gc(self, older_than_days: float, dry_run: bool = False, archive_done: bool = False) -> list[str]:
        """Delete the req/claim/cancel refs of finished requests older than the cutoff (and the branches of
        requests no runner will run: cancelled before a claim, or expired unclaimed); done refs stay, or with
        `archive_done` move to refs/kakeya-archive/done/<id> (kept, but out of every clone's fetch and of
        `kakeya status` and `gate pr`). Result side refs left behind (refs/kakeya-stage/<id>/...) of done or
        vanished requests go too, whatever their age, and the idempotency keys of requests older than the
        cutoff (`stale_keys`). Returns the refs deleted (or that would be)."""
        cutoff = utcnow() - dt.timedelta(days=older_than_days)
        snap = self.bus.ls_remote(*LIVE, DONE_PREFIX, *([SUBJECT_PREFIX] if archive_done else []))
        entries = [e for e in snap.entries.values() if e.done and e.created_at < cutoff]
        # side refs a runner could not delete after its done push (stage_ref): useless once the request
        # is done (the done commit holds the result) or gone; a request still running keeps its own
        stale = [
            Update(ref, None, sha)
            for ref, sha in self.bus.stage_refs().items()
            if (e := snap.entries.get(ref[len(STAGE_PREFIX) :].split("/")[0])) is None or e.done
        ]
        stale += self.stale_keys(cutoff, {rid for rid, e in snap.entries.items() if e.req and not e.done})
        updates = [
            Update(ref, None, sha)
            for e in entries
            for ref, sha in (
                (req_ref(e.label or "", e.id), e.req),
                (claim_ref(e.id), e.claim),
                (cancel_ref(e.id), e.cancel),
                (done_ref(e.id), e.done if archive_done else None),
            )
            if sha
        ]
        # requests no runner will ever run: cancelled before any claim, or unclaimed for longer than any request
        # may wait (MAX_TTL: expired, whatever the manifest says). A runner of their label closes them with a
        # done commit; where no runner serves the label their branches stay under refs/heads: gc deletes them.
        past_ttl = utcnow() - MAX_TTL
        never = [
            e
            for e in snap.entries.values()
            if e.req and not e.claim and not e.done and e.created_at < cutoff
            if e.cancel or e.created_at < past_ttl
        ]
        updates += [
            Update(ref, None, sha)
            for e in never
            for ref, sha in ((req_ref(e.label or "", e.id), e.req), (cancel_ref(e.id), e.cancel))
            if sha
        ]
        # a cancel marker left behind by a request that finished (or went) meanwhile
        updates += [
            Update(cancel_ref(e.id), None, e.cancel)
            for e in snap.entries.values()
            if e.cancel and not e.req and not e.claim and not e.done
        ]
        if archive_done:  # the archive ref is created in the same atomic push that deletes the done ref
            updates += [Update(archive_ref(e.id), e.done, None) for e in entries]
            updates += [  # and the index refs go with it: gate pr reads what is not archived
                Update(subject_ref(subject, e.id), None, sha)
                for e in entries
                if e.id in snap.index
                for subject, sha in [snap.index[e.id]]
            ]
        if dry_run:
            return [u.ref for u in stale + updates if u.new is None]
        deleted = self._push_chunks(stale)
        if archive_done:
            self.client.ensure(
                entries, ("done",), in_store=True
            )  # pushing the archive ref needs its commit here
            of: dict[str, list[Update]] = {}
            for u in updates:
                of.setdefault(u.ref.rsplit("/", 1)[1], []).append(u)
            for i in range(0, len(entries), self._gc_chunk()):
                chunk = [u for e in entries[i : i + self._gc_chunk()] for u in of.get(e.id, [])]
                status = self.bus.push(chunk, atomic=True)
                deleted += [u.ref for u in chunk if u.new is None and status.get(u.ref, (False, ""))[0]]
            return deleted
        return deleted + self._push_chunks(updates)

    def stale_keys(self, cutoff: dt.datetime, live: set[str]) -> list[Update]:
        """Deletions of the idempotency key refs (`IDEM_PREFIX`) of requests made before `cutoff` that are not
        live (a retry after that makes a new request), and of key refs that name no request."""
        text = self.bus.list([IDEM_PREFIX])
        refs = {ref: sha for sha, _, ref in (line.partition("\t") for line in text.splitlines()) if ref}
        self.bus.fetch_ids(sorted(set(refs.values())), "idempotency keys")
        found = self.client.local_files([f"{sha}:{IDEM_PATH}" for sha in refs.values()])
        out = []
        for ref, sha in refs.items():
            key = parse_or_none(Idempotency, found.get(f"{sha}:{IDEM_PATH}"))
            made = parse_id(key.id) if key is not None else None
            if key is None or made is None or (made.time < cutoff and key.id not in live):
                out.append(Update(ref, None, sha))
        return out

    def migrate(self, dry_run: bool = False) -> list[str]:
        """Upgrade a bus of layout 1 (everything under refs/heads/kakeya/) to layout 2: each claim, done, cancel
        and presence ref moves under refs/kakeya/, each done result is indexed under its subject, and the
        request, claim and cancel refs of finished requests go; then the layout marker is written. Every
        update is leased on the sha seen, so a runner of layout 1 that moves a claim meanwhile loses that
        lease (it stops), never a result; run it again (idempotent) until it moves nothing. Returns the refs
        written or deleted (or that would be)."""
        snap = self.bus.ls_remote(*OLD_PREFIXES, *LIVE, DONE_PREFIX, SUBJECT_PREFIX, check=False)
        old = Snapshot.parse("".join(f"{sha}\t{NS}{ref[len(PREFIX) :]}\n" for ref, sha in snap.old.items()))
        updates: list[Update] = []
        dones = [e for e in old.entries.values() if e.done]
        # every commit it pushes must be in the store (a push packs from there), and the done results are read
        self.bus.fetch_ids(sorted(set(snap.old.values())), "layout 1 commits", in_store=True)
        manifests = read_manifests(self.bus.repos(), [e.done for e in dones if e.done])
        for e in old.entries.values():
            now = snap.entries.get(e.id)
            for kind in ("claim", "done", "cancel"):
                sha = getattr(e, kind)
                if sha is None:
                    continue
                ref = f"{NS}{kind}/{e.id}"
                keep = kind == "done" or not e.done  # a finished request keeps only its done ref
                if keep and (now is None or getattr(now, kind) is None):
                    updates.append(Update(ref, sha, None))
                updates.append(Update(f"{PREFIX}{kind}/{e.id}", None, sha))
            if e.done:
                manifest = manifests.get(e.done)
                if isinstance(manifest, Manifest) and e.id not in snap.index:
                    updates.append(Update(subject_ref(manifest.subject, e.id), e.done, None))
                if now is not None and now.req:
                    updates.append(Update(req_ref(now.label or "", e.id), None, now.req))
        for name, sha in old.runners.items():
            if name not in snap.runners:
                updates.append(Update(runner_ref(name), sha, None))
            updates.append(Update(f"{PREFIX}runners/{name}", None, sha))
        if str(LAYOUT) not in snap.layouts:
            updates.append(Update(layout_ref(), None if dry_run else layout_marker(self.bus), None))
        if dry_run:
            return [u.ref for u in updates]
        return self._push_chunks(updates)

    def compact(self, older_than_days: float, dry_run: bool = False) -> list[str]:
        """Move the done results made more than `older_than_days` ago into the ledger (bridge/bus/ledger.py), and
        delete the shard refs an earlier ledger kept. Returns the refs deleted (or that would be)."""
        cutoff = utcnow() - dt.timedelta(days=older_than_days)
        return L.compact(self.bus, cutoff, self.client.who(), dry_run=dry_run)

    def _gc_chunk(self) -> int:
        return GC_CHUNK_RECEIVE_PACK if self.bus.receive_pack else GC_CHUNK

    def _push_chunks(self, updates: list[Update]) -> list[str]:
        """Push ref updates (deletions, moves) in chunks, each leased on its sha; the refs the bus took."""
        done: list[str] = []
        for i in range(0, len(updates), self._gc_chunk()):
            chunk = updates[i : i + self._gc_chunk()]
            status = self.bus.push(chunk)
            done += [u.ref for u in chunk if status.get(u.ref, (False, ""))[0]]
        return done
