"""The done push: one atomic push that finishes a request, and the outbox of done commits the bus did not take.

    outbox = Outbox(bus, mirror, log)
    outbox.push(request_id, claim_sha, done_sha, entry)   # True: pushed; False: lease lost, or kept to retry
    outbox.flush()                                         # before a poll: push what an earlier try could not

The push (`done_updates`) deletes the claim leased on the runner's last claim sha and creates the done ref, so
a runner that lost its lease can never push a result; a done commit the bus could not be reached for waits
under refs/kakeya/outbox/<id> in the runner's mirror, for the next poll.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path

from bridge.bus.bus import Bus
from bridge.bus.records import (
    Entry,
    Manifest,
    Update,
    cancel_ref,
    claim_ref,
    done_ref,
    indexed_subject,
    parse_or_none,
    read_manifests,
    req_ref,
    results_path,
    subject_ref,
)
from bridge.core.errors import KakeyaError
from bridge.core.result import RunResult
from bridge.wire import git

OUTBOX = "refs/kakeya/outbox/"  # in the runner's mirror: done commits waiting for the bus
GC_EVERY = 50  # done pushes between two `git gc --auto` of the mirror


class Outbox:
    def __init__(self, bus: Bus, mirror: Path, log: Callable[[str], None]):
        self.bus, self.mirror, self.log = bus, mirror, log
        self.pending = True  # look once at start; then only after a push failed
        self.pushed = 0  # done pushes tried by this runner (a mirror's gc every GC_EVERY)

    def push(self, request_id: str, claim_sha: str, done_sha: str, entry: Entry | None = None) -> bool:
        """One atomic push (`done_updates`): the done ref and its index ref created, the claim (leased on our
        last sha), request and cancel refs deleted. Kept locally if the bus cannot be reached, and pushed by a
        later `flush`."""
        try:
            pushed = self.bus.swap(self.updates(request_id, claim_sha, done_sha, entry), atomic=True)
        except KakeyaError as exc:
            git.update_ref(self.mirror, f"{OUTBOX}{request_id}", done_sha)
            self.pending = True
            self.log(f"{request_id}: result {done_sha[:12]} not pushed yet ({exc}); will retry")
            return False
        self.log(
            f"{request_id}: done {done_sha[:12]} pushed"
            if pushed
            else f"{request_id}: lease lost before the result could be pushed; result dropped"
        )
        self.pushed += 1
        if self.pushed % GC_EVERY == 0:
            git.gc_auto(self.mirror)
        return pushed

    def updates(self, request_id: str, claim_sha: str, done_sha: str, entry: Entry | None) -> list[Update]:
        """The done push of `done_sha` for `request_id`: the request, claim and cancel refs as the bus holds
        them now (one prefix-scoped listing), the subject from the done commit's request and result."""
        label = entry.label if entry is not None else None
        m = read_manifests([self.mirror], [done_sha]).get(done_sha)
        manifest = m if isinstance(m, Manifest) else None
        label = label or (manifest.runner if manifest else None)
        result = parse_or_none(
            RunResult, git.read_path(self.mirror, done_sha, f"{results_path(request_id)}/result.json")
        )
        # the request's subject (validated with its manifest); a result's only when it is a sha at all
        subject = indexed_subject(manifest.subject if manifest else None, result.subject if result else None)
        index = [subject_ref(subject, request_id)] if subject else []
        wanted = [cancel_ref(request_id)] + ([req_ref(label, request_id)] if label else [])
        refs = self.bus.ls_remote(*wanted, *index).refs
        updates = done_updates(
            request_id,
            claim_sha,
            done_sha,
            subject=subject,
            drop={ref: sha for ref in wanted if (sha := refs.get(ref))},
        )
        # an index ref someone put there first is replaced (leased on what was seen), never a reason to fail
        return [replace(u, expect=refs.get(u.ref)) if u.ref in index else u for u in updates]

    def flush(self) -> None:
        """Push results that an earlier attempt could not deliver; raises while the bus is still unreachable."""
        if not self.pending:
            return
        for ref, done_sha in git.refs_under(self.mirror, OUTBOX).items():
            request_id = ref.rsplit("/", 1)[1]
            claim_sha = git.parents(self.mirror, done_sha)[0]
            pushed = self.bus.swap(self.updates(request_id, claim_sha, done_sha, None), atomic=True)
            self.log(
                f"{request_id}: delayed result pushed"
                if pushed
                else f"{request_id}: lease lost while the result waited; dropped"
            )
            git.update_ref(self.mirror, ref, None)
        self.pending = False


def done_updates(
    request_id: str, claim_sha: str, done_sha: str, subject: str | None = None, drop: Mapping[str, str] = {}
) -> list[Update]:
    """The result push, atomic: the claim (leased on the runner's last claim sha) is deleted and the done ref
    created (it must not exist), so a runner that lost its lease can never push a result; the index ref under
    the subject is created and the request and cancel refs in `drop` (ref -> the sha seen) are deleted. The
    done commit descends from the request and every claim commit, so nothing is lost with them."""
    updates = [
        Update(claim_ref(request_id), None, claim_sha),
        Update(done_ref(request_id), done_sha, None),
    ]
    if subject:
        updates.append(Update(subject_ref(subject, request_id), done_sha, None))
    return updates + [Update(ref, None, sha) for ref, sha in drop.items()]
