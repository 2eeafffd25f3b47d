"""The ledger: finished requests moved out of refs, so the bus's refs stay bounded by live work plus a few days.

    refs/kakeya/ledger                   a commit chain: each commit's parents are the previous ledger commit
                                         and the done commits it took in (they stay reachable); its tree is
                                         the sharded index below
    refs/kakeya/shard/subject/<ab>       the index's subject/<ab> tree (what `gate pr` reads for a subject
                                         whose ab is its first two hex digits)
    refs/kakeya/shard/date/<YYYYMMDD>    the index's date/<YYYYMMDD> tree (what `results ID` and `status --all`
                                         read)

The index (each entry a LedgerEntry, JSON): date/<YYYYMMDD>/<id>, subject/<ab>/<subject>/<id>,
preset/<preset>/<label>/<YYYYMM>/<id>; a directory holds one day, one subject, or one month of a preset on a
label (under 3,000 entries at 2,000 requests a day). The shard refs point at trees, so a reader fetches only
the shard it needs, by object id. `Client.compact` (`kakeya bus compact`) moves done results older than a few
days in: one atomic push per chunk that moves the ledger (leased on the tip seen), sets the shard refs, and
deletes the chunk's done and index refs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import Field, field_validator

from bridge import bus as B
from bridge import git
from bridge.bus import Bus, Entry, _File
from bridge.names import SHA_PATTERN

LEDGER_REF = B.NS + "ledger"
SHARD_PREFIX = B.NS + "shard/"
CHUNK = 400  # done commits per ledger commit (its parents) and per push


class LedgerEntry(_File):
    """One finished request in the ledger's index."""

    id: str
    done: str = Field(pattern=SHA_PATTERN)
    subject: str | None = Field(default=None, pattern=SHA_PATTERN)
    label: str | None = None
    preset: str
    status: str | None = None
    verdict: str | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        if B.parse_id(value) is None:
            raise ValueError(f"{value!r} is not a request id")
        return value


def subject_shard(subject: str) -> str:
    return f"{SHARD_PREFIX}subject/{subject[:2]}"


def date_shard(request_id: str) -> str:
    return f"{SHARD_PREFIX}date/{request_id[:8]}"


def paths(entry: LedgerEntry) -> list[str]:
    """Where `entry` lives in the index tree."""
    out = [f"date/{entry.id[:8]}/{entry.id}"]
    if entry.subject:
        out.append(f"subject/{entry.subject[:2]}/{entry.subject}/{entry.id}")
    out.append(f"preset/{entry.preset}/{entry.label or '-'}/{entry.id[:6]}/{entry.id}")
    return out


def tree_with_entries(repo, base: str | None, entries: Iterable[LedgerEntry]) -> str:
    """The index tree of commit/tree `base` (None: empty) with `entries` added."""
    files = {path: e.dump() for e in entries for path in paths(e)}
    return git.tree_with(repo, base, files)


def shard_refs(repo, tree: str, touched: Iterable[str]) -> dict[str, str]:
    """shard ref -> tree sha, for the shard directories `touched` (e.g. 'subject/ab', 'date/20261125')."""
    out = {}
    for shard in sorted(set(touched)):
        top = git.ls_tree(repo, f"{tree}:{shard.split('/')[0]}")
        entry = top.get(shard.split("/")[1])
        if entry is not None and entry[1] == "tree":
            out[f"{SHARD_PREFIX}{shard}"] = entry[2]
    return out


def read_shard(bus: Bus, tree: str, under: str = "") -> list[LedgerEntry]:
    """The entries of shard tree `tree` (fetched by id if not here), those under `under` only."""
    bus.fetch_ids([tree], "a ledger shard")
    repo = git.repo_having(bus.repos(), tree)
    names = git.ls_tree(repo, f"{tree}:{under}" if under else tree, recursive=True)
    blobs = git.read_blobs(repo, sorted({sha for _, kind, sha in names.values() if kind == "blob"}))
    out = []
    for _, kind, sha in names.values():
        entry = B.parse_or_none(LedgerEntry, blobs.get(sha)) if kind == "blob" else None
        if entry is not None:
            out.append(entry)
    return sorted(out, key=lambda e: e.id)


def as_entries(found: Iterable[LedgerEntry]) -> dict[str, Entry]:
    """Ledger entries as bus entries (done only), by id."""
    return {e.id: Entry(e.id, e.label, done=e.done) for e in found}


def subjects_of(index: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    """id -> subject of a Snapshot's index refs."""
    return {rid: subject for rid, (subject, _) in index.items()}
