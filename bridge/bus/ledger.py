"""The ledger: finished requests moved out of refs, so the bus's refs stay bounded by live work plus a few days.

    refs/kakeya/ledger              a commit chain: each commit's parents are the previous ledger commit and
                                    the done commits it took in (they stay reachable); its tree is the index
    refs/kakeya/ledger-map/<kind>   a blob (LedgerMap) for each kind of map (date, preset, and subject-<h> for
                                    each first hex digit <h> of a subject): the ledger commit it describes and
                                    the tree id of each of its shards
    refs/kakeya/lease/compact       the compaction lease (CompactLease): who compacts, and until when no
                                    other runner starts to

The index (each entry a LedgerEntry, JSON): date/<YYYYMMDD>/<id>, subject/<ab>/<subject>/<id>,
preset/<preset>/<label>/<YYYYMM>/<id>. A shard is one directory: date/<day>, subject/<ab> (<ab>: the subject's
first two hex digits) or preset/<preset>/<label>/<month>, under 3,000 entries at 2,000 requests a day. 20
refs, whatever the history: a reader lists the map ref of the kind it reads, fetches that map blob by id, then
only the shard trees it needs, by object id (protocol v2 upload-pack serves any object reachable from a ref;
`read` falls back to a depth-1 fetch of the ledger where a server refuses). One subject's entries
(`read_subjects`, what `gate pr` reads) cost the same at any size: its map (the 16 shards of its first hex
digit), its shard's tree alone (`--filter=tree:0`: one line per subject of that shard, not their entries), then
its own directory.

`compact` (`kakeya bus compact`, and the runners on their own: `Compaction.maybe`) moves done results older
than a few days in: per chunk, one atomic push moves the ledger and its map (leased on what it saw), renews the
lease (leased on its own last lease commit, when it holds one: two compactors never both write) and deletes the
chunk's done and index refs (leased on their shas: a done ref that moved is never lost). A race loses cleanly:
nothing of the losing push lands, and the next compaction starts from what the bus holds then.
"""

from __future__ import annotations

import datetime as dt
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from pydantic import AwareDatetime, Field, field_validator

from bridge.bus.bus import LEDGER_STORE, Bus
from bridge.bus.records import (
    DONE_PREFIX,
    NS,
    SUBJECT_PREFIX,
    Entry,
    IdStr,
    Manifest,
    Snapshot,
    Update,
    _File,
    done_ref,
    indexed_subject,
    parse_or_none,
    read_manifests,
    results_path,
    subject_ref,
    utcnow,
)
from bridge.config import MAX_TTL
from bridge.core.errors import BusError, BusUnreachable, KakeyaError
from bridge.core.names import SHA_PATTERN
from bridge.core.result import RunResult
from bridge.wire import git

LEDGER_REF = NS + "ledger"
MAP_PREFIX = NS + "ledger-map/"
HEX = "0123456789abcdef"
KINDS = ("date", "preset", *(f"subject-{h}" for h in HEX))  # the maps: subject-<h> for the subjects <h>...
OLD_MAPS = (
    MAP_PREFIX + "subject",
)  # the one subject map of an earlier ledger (256 shards): compaction deletes it
LEASE_REF = NS + "lease/compact"
# the shard refs of an earlier ledger (one ref per shard): compaction deletes them
SHARD_PREFIX = NS + "shard/"
LEASE_PATH = ".kakeya/lease.json"
CHUNK = 400  # done commits per ledger commit (its parents)
PUSH_CHUNK = 2000  # done results per push at most (each push downloads the bus's ref advertisement once)
PUSH_PAIRS = (
    10_000_000  # over http(s) only (`git push`): refspecs x refs on the bus per push at most. git push
)
# matches each refspec against every ref the bus advertises (about 1.5 us a pair on a busy 2-core host), so a push
# of 4,000 deletions on a bus of 20,000 refs takes minutes: pushes get smaller as the bus holds more refs. The
# other transports push in receive-pack's protocol (bridge/wire/receive_pack.py), where an update costs the same
# whatever the bus holds: PUSH_CHUNK a push.


class LedgerEntry(_File):
    """One finished request in the ledger's index."""

    id: IdStr
    done: str = Field(pattern=SHA_PATTERN)
    subject: str | None = Field(default=None, pattern=SHA_PATTERN)
    label: str | None = None
    preset: str
    status: str | None = None
    verdict: str | None = None


class LedgerMap(_File):
    """refs/kakeya/ledger-map/<kind>: the shard trees of one kind of the ledger commit `ledger`, by shard name."""

    schema_version: int = 1
    ledger: str = Field(pattern=SHA_PATTERN)
    shards: dict[str, str] = {}

    @field_validator("shards")
    @classmethod
    def _shards(cls, value: dict[str, str]) -> dict[str, str]:
        for name, sha in value.items():
            if not re.fullmatch(SHA_PATTERN, sha) or shard_depth(name) is None:
                raise ValueError(f"{name!r}: {sha!r} is not a shard and its tree id")
        return value

    def of(self, kind: str) -> LedgerMap:
        """The shards of map `kind` only (KINDS)."""
        return LedgerMap(
            ledger=self.ledger, shards={n: t for n, t in self.shards.items() if map_kind(n) == kind}
        )


class CompactLease(_File):
    """refs/kakeya/lease/compact's .kakeya/lease.json: `holder` compacts; nobody else starts before `until`."""

    schema_version: int = 1
    holder: str
    until: AwareDatetime


def map_ref(kind: str) -> str:
    """The map ref of the shards of `kind` (KINDS)."""
    return MAP_PREFIX + kind


def shard_depth(name: str) -> int | None:
    """How many path components a shard name of each kind has (None: not a shard name)."""
    depth = {"date": 2, "subject": 2, "preset": 4}.get(name.split("/")[0])
    return depth if depth == len(name.split("/")) and all(name.split("/")) else None


def paths(entry: LedgerEntry) -> list[str]:
    """Where `entry` lives in the index tree."""
    out = [f"date/{entry.id[:8]}/{entry.id}"]
    if entry.subject:
        out.append(f"subject/{entry.subject[:2]}/{entry.subject}/{entry.id}")
    out.append(f"{preset_shard(entry.preset, entry.label, entry.id[:6])}/{entry.id}")
    return out


def map_kind(shard: str) -> str:
    """The map (KINDS) that names shard `shard`: date, preset, or subject-<h> (the subject's first hex digit)."""
    kind = shard.split("/")[0]
    return f"subject-{shard[len('subject/')]}" if kind == "subject" else kind


def subject_map(subject: str) -> str:
    """The map that names the shard of `subject`."""
    return map_kind(subject_shard(subject))


def date_shard(request_id: str) -> str:
    return f"date/{request_id[:8]}"


def subject_shard(subject: str) -> str:
    return f"subject/{subject[:2]}"


def preset_shard(preset: str, label: str | None, month: str) -> str:
    return f"preset/{preset}/{label or '-'}/{month}"


# --- reading -----------------------------------------------------------------------------------------


def read_map(bus: Bus, snap: Snapshot, kind: str) -> LedgerMap | None:
    """The ledger map of `kind` that the listing `snap` (which asked for its map_ref) names, fetched by id;
    None: no ledger."""
    return read_maps(bus, snap, [kind]).get(kind)


def read_maps(
    bus: Bus, snap: Snapshot, kinds: Sequence[str], along: Sequence[str] = (), subjects: Iterable[str] = ()
) -> dict[str, LedgerMap]:
    """The ledger maps of `kinds` that the listing `snap` names (those it has), fetched by id in one go, with
    the done results `along` of `subjects` (what the caller reads anyway: one round trip for both;
    `Bus.fetch_results`). Any pusher can write a map ref: one that is not a ledger map of its kind is left out
    with a warning on stderr (as a ref that is not a bus ref is), never fatal for the subjects it does not
    hold; compaction writes it again."""
    shas = {kind: sha for kind in kinds if (sha := snap.refs.get(map_ref(kind)))}
    if along:
        bus.fetch_results(along, "ledger maps and results", subjects, sorted(set(shas.values())))
    else:
        bus.fetch_ids(sorted(set(shas.values())), "ledger maps", standalone=True)
    blobs = git.read_blobs_in(bus.repos(), sorted(set(shas.values())))
    found = {}
    for kind, sha in shas.items():
        got = parse_or_none(LedgerMap, blobs.get(sha))
        if got is None or any(map_kind(name) != kind for name in got.shards):
            print(
                f"kakeya: warning: {map_ref(kind)} ({sha[:12]}) on {bus.url} is not a ledger map: ignored "
                "(the results it would name are not read; compaction writes it again)",
                file=sys.stderr,
            )
            continue
        found[kind] = got
    return found


def read(bus: Bus, ledger: LedgerMap | None, shards: Iterable[str]) -> list[LedgerEntry]:
    """The entries of the ledger's shards named `shards`, oldest first: one fetch by object id of the shard
    trees not here yet."""
    if ledger is None:
        return []
    trees = sorted({ledger.shards[s] for s in shards if s in ledger.shards})
    return entries_in(fetch_trees(bus, ledger, trees), trees) if trees else []


def read_subjects(
    bus: Bus, snap: Snapshot, subjects: Iterable[str], along: Sequence[str] = ()
) -> list[LedgerEntry]:
    """The ledger's entries of `subjects` (the listing `snap` asked for their maps: `subject_map`), oldest
    first, at a cost that does not grow with the ledger: their maps (16 shards each), their shards' trees
    alone (`--filter=tree:0`: one line per subject of the shard, none of their entries), then their own
    directories; each step one fetch by object id. A server that does not filter sends the whole shards. The
    done results `along` (of `subjects`) come with the maps."""
    among = sorted(set(subjects))
    maps = read_maps(bus, snap, sorted({subject_map(s) for s in among}), along, among)
    shard = {s: m.shards.get(subject_shard(s)) for s in among if (m := maps.get(subject_map(s)))}
    shards = sorted({t for t in shard.values() if t})
    if not shards:
        return []
    ledger = next(iter(maps.values()))
    repos = fetch_trees(bus, ledger, shards, tree_filter="tree:0")
    listed = {t: git.ls_tree(git.repo_having(repos, t), t) for t in shards}
    dirs = sorted(
        {got[2] for s, t in shard.items() if t and (got := listed[t].get(s)) is not None and got[1] == "tree"}
    )
    if not dirs:
        return []
    found = entries_in(fetch_trees(bus, ledger, dirs), dirs)
    return [e for e in found if e.subject in among]


def entries_in(repos: Sequence[Path], trees: Sequence[str]) -> list[LedgerEntry]:
    """The ledger entries (blobs) anywhere under `trees`, from the first of `repos` that has each, by id."""
    specs = []
    for tree in trees:
        listed = git.ls_tree(git.repo_having(repos, tree), tree, recursive=True)
        specs += [sha for _, kind, sha in listed.values() if kind == "blob"]
    blobs = git.read_blobs_in(repos, sorted(set(specs)))
    found = {e.id: e for sha in specs if (e := parse_or_none(LedgerEntry, blobs.get(sha))) is not None}
    return sorted(found.values(), key=lambda e: e.id)


def fetch_trees(
    bus: Bus, ledger: LedgerMap, trees: Sequence[str], tree_filter: str | None = None
) -> list[Path]:
    """Fetch the `trees` by object id (`tree_filter`: git's --filter, e.g. tree:0 for the trees alone); where
    the server refuses objects that no ref names (protocol v0/v1 without uploadpack.allowReachableSHA1InWant),
    the ledger commit at depth 1 into the ledger store instead (its whole index, no history). The local
    repositories that hold them."""
    try:
        bus.fetch_ids(trees, "ledger shards", tree_filter=tree_filter, standalone=True)
        return bus.repos()
    except BusError as exc:
        if not refused(exc):
            raise
    side = bus.side(LEDGER_STORE)
    side.fetch_ids([ledger.ledger], "the ledger (depth 1)", in_store=True, depth=1)
    return side.repos()


def refused(exc: BusError) -> bool:
    """Did the server refuse objects that no ref names (protocol v0/v1 without
    uploadpack.allowReachableSHA1InWant)?"""
    return any(why in str(exc) for why in ("not our ref", "unadvertised object", "upload-pack"))


def as_entries(found: Iterable[LedgerEntry]) -> dict[str, Entry]:
    """Ledger entries as bus entries (done only), by id."""
    return {e.id: Entry(e.id, e.label, done=e.done) for e in found}


def preset_months(ledger: LedgerMap | None, preset: str) -> list[list[str]]:
    """The preset's shards in the ledger (every label), a month at a time, newest month first: a baseline
    lookup reads one month more while it has found no previous pass."""
    months: dict[str, list[str]] = {}
    for name in sorted(ledger.shards if ledger else {}):
        kind, *rest = name.split("/")
        if kind == "preset" and rest[0] == preset:
            months.setdefault(rest[2], []).append(name)
    return [months[m] for m in sorted(months, reverse=True)]


# --- writing -----------------------------------------------------------------------------------------


def shard_trees(repo: Path | str, tree: str) -> dict[str, str]:
    """Every shard of index tree `tree`: its name -> its tree id."""
    text = git.out(repo, "ls-tree", "-r", "-d", "-z", "--format=%(objectname) %(path)", tree)
    return {
        name: sha for sha, _, name in (item.partition(" ") for item in text.split("\0")) if shard_depth(name)
    }


def write_maps(repo: Path | str, tip: str, shards: dict[str, str] | None = None) -> dict[str, str]:
    """The map blobs (KINDS) of ledger commit `tip` (its `shards`, name -> tree id; default: read from its
    whole index), written into `repo`: kind -> blob id."""
    whole = LedgerMap(
        ledger=tip, shards=dict(sorted((shard_trees(repo, tip) if shards is None else shards).items()))
    )
    return dict(zip(KINDS, git.write_blobs(repo, [whole.of(kind).dump() for kind in KINDS]), strict=True))


def shard_of(path: str) -> str:
    """The shard (date/<day>, subject/<ab>, preset/<preset>/<label>/<month>) that index path `path` is in."""
    parts = path.split("/")
    return "/".join(parts[: {"date": 2, "subject": 2, "preset": 4}.get(parts[0], len(parts))])


def maps_shards(side: Bus, snap: Snapshot, tip: str | None) -> dict[str, str] | None:
    """Every shard of ledger commit `tip` (name -> tree id) as the maps that `snap` lists name them (their
    blobs, fetched by id), or None where there is no ledger, a map is missing, unreadable or describes
    another commit: then the whole index is read and the maps written again."""
    if tip is None or any(map_ref(kind) not in snap.refs for kind in KINDS):
        return None
    try:
        maps = read_maps(side, snap, list(KINDS))
    except BusError as exc:
        if isinstance(exc, BusUnreachable):
            raise
        return None
    if len(maps) != len(KINDS) or any(m.ledger != tip for m in maps.values()):
        return None
    return {name: tree for m in maps.values() for name, tree in m.shards.items()}


def fetch_index_dirs(side: Bus, tip: str, dirs: Iterable[str]) -> None:
    """Fetch ledger commit `tip` and, of its index, only the directories `dirs` and those above them: the trees
    alone (`--filter=tree:0`), level by level, by object id. What `ledger_commits` rewrites when it adds files
    in `dirs`, at a cost that grows with the results moved, not with the ledger (the whole index at depth 1
    is every entry ever moved: 33 MB at 100,000 results)."""
    store = side.store
    side.fetch_ids([tip], "the ledger commit", in_store=True, depth=1, tree_filter="tree:0")
    wanted = {"/".join(parts[:i]) for d in dirs for parts in [d.split("/")] for i in range(1, len(parts) + 1)}
    level = {"": git.out(store, "cat-file", "commit", tip).split("\n", 1)[0].removeprefix("tree ")}
    while level:
        trees = sorted(set(level.values()))
        side.fetch_ids(
            trees, "the ledger's index trees", in_store=True, tree_filter="tree:0", standalone=True
        )
        listed = git.tree_entries(store, trees)
        level = {
            child: sha
            for path, tree in level.items()
            for name, (mode, sha) in listed.get(tree, {}).items()
            if mode == "40000" and (child := f"{path}/{name}" if path else name) in wanted
        }


def lease_commit(repo: Path | str, holder: str, until: dt.datetime, who: str) -> str:
    lease = CompactLease(holder=holder, until=until)
    tree = git.tree_with(repo, None, {LEASE_PATH: lease.dump()})
    return git.commit(repo, tree, [], f"kakeya compaction lease: {holder}", who)


def read_lease(bus: Bus, sha: str | None) -> CompactLease | None:
    """The compaction lease commit `sha` (fetched by id), or None (no lease, or not a valid one)."""
    if sha is None:
        return None
    bus.fetch_ids([sha], "the compaction lease", in_store=True)
    return parse_or_none(CompactLease, git.read_path(bus.store, sha, LEASE_PATH))


def due(bus: Bus, cutoff: dt.datetime, now: dt.datetime) -> bool:
    """Is there anything to compact: a done result made before `cutoff`, or a shard ref or the one subject map
    of an earlier ledger?
    While compactions run (a lease renewed within MAX_TTL), everything older was moved already: only the done
    refs of the days just before `cutoff` are listed (a few, whatever the rate); else every done ref."""
    days = [f"{DONE_PREFIX}{cutoff - dt.timedelta(days=d):%Y%m%d}" for d in range(MAX_TTL.days + 3)]
    snap = bus.ls_remote(*days, SHARD_PREFIX, *OLD_MAPS, LEASE_REF)
    lease = read_lease(bus, snap.refs.get(LEASE_REF))
    if lease is None or lease.until < now - MAX_TTL:
        snap = bus.ls_remote(DONE_PREFIX, SHARD_PREFIX, *OLD_MAPS)
    old = any(e.done and e.created_at < cutoff for e in snap.entries.values())
    return old or any(ref.startswith(SHARD_PREFIX) or ref in OLD_MAPS for ref in snap.refs)


def take_lease(bus: Bus, holder: str, hold_s: float, who: str, now: dt.datetime) -> str | None:
    """Take the compaction lease for `hold_s` (one listing, one small fetch, one leased push): its new sha, or
    None when another holder's lease runs (or another runner took it first)."""
    sha = bus.ls_remote(LEASE_REF).refs.get(LEASE_REF)
    held = read_lease(bus, sha)
    if held is not None and held.until > now and held.holder != holder:
        return None
    new = lease_commit(bus.store, holder, now + dt.timedelta(seconds=hold_s), who)
    return new if bus.swap([Update(LEASE_REF, new, sha)], atomic=False) else None


def compact(
    bus: Bus,
    cutoff: dt.datetime,
    who: str,
    dry_run: bool = False,
    lease: tuple[str, str, float] | None = None,
    log: Callable[[str], None] = lambda _: None,
    limit: int | None = None,
) -> list[str]:
    """Move the done results made before `cutoff` (the oldest `limit` of them, when given) into the ledger;
    the refs deleted (or that would be). `lease`: (holder, the lease sha it holds, seconds each push renews it
    for): every push renews it, leased on the last one, so a compactor whose lease another took pushes nothing
    more. BusError when a push lost."""
    snap = bus.ls_remote(DONE_PREFIX, SUBJECT_PREFIX, LEDGER_REF, MAP_PREFIX, SHARD_PREFIX, LEASE_REF)
    old = [e for e in snap.entries.values() if e.done and e.created_at < cutoff][:limit]
    index = snap.index
    doomed = [done_ref(e.id) for e in old] + [subject_ref(index[e.id][0], e.id) for e in old if e.id in index]
    stale_shards = {
        ref: sha for ref, sha in snap.refs.items() if ref.startswith(SHARD_PREFIX) or ref in OLD_MAPS
    }
    if dry_run or not (old or stale_shards):
        return doomed + (list(stale_shards) if dry_run else [])
    side = bus.side(LEDGER_STORE)
    store = side.store
    per_push = (
        PUSH_CHUNK
        if side.receive_pack
        else max(100, min(PUSH_CHUNK, PUSH_PAIRS // (2 * max(len(snap.refs), 1))))
    )
    tip = snap.refs.get(LEDGER_REF)
    maps = {kind: snap.refs.get(map_ref(kind)) for kind in KINDS}
    shards = maps_shards(side, snap, tip)  # None: the whole index is read, and the maps written anew
    deleted: list[str] = []
    held = lease[1] if lease else None
    for start in range(0, max(len(old), 1), per_push):
        batch = old[start : start + per_push]
        # depth 1: the results' own commits, never their history
        side.fetch_ids([e.done for e in batch if e.done], "done results", in_store=True, depth=1)
        commits = ledger_files(store, batch, index)
        dirs = {path.rsplit("/", 1)[0] for files, _, _ in commits for path in files}
        if tip is not None:
            side, shards = index_here(bus, side, tip, shards, dirs, batch)
        new_tip = git.import_commits(store, tip, commits, who) if commits else tip
        updates = [Update(ref, None, sha) for ref, sha in stale_shards.items()]
        new_maps = dict(maps)
        if new_tip is not None and (new_tip != tip or None in maps.values()):
            shards, new_maps = grown_maps(store, new_tip, shards, dirs)
            updates += [Update(map_ref(kind), new_maps[kind], maps[kind]) for kind in KINDS]
            if new_tip != tip:
                updates.append(Update(LEDGER_REF, new_tip, tip))
        if lease is not None:
            holder, _, hold_s = lease
            renewed = lease_commit(store, holder, utcnow() + dt.timedelta(seconds=hold_s), who)
            updates.append(Update(LEASE_REF, renewed, held))
            held = renewed
        updates += [Update(done_ref(e.id), None, e.done) for e in batch]
        updates += [
            Update(subject_ref(index[e.id][0], e.id), None, index[e.id][1]) for e in batch if e.id in index
        ]
        if not side.swap(updates, atomic=True):
            raise BusError(
                "the ledger, the compaction lease or a done ref moved while compacting: nothing of this push "
                "landed; the next compaction starts again from what the bus holds"
            )
        log(f"moved {len(batch)} done results into the ledger")
        tip, maps, stale_shards = new_tip, new_maps, {}
        deleted += [u.ref for u in updates if u.new is None]
    return deleted


def index_here(
    bus: Bus, side: Bus, tip: str, shards: dict[str, str] | None, dirs: Iterable[str], batch: Sequence[Entry]
) -> tuple[Bus, dict[str, str] | None]:
    """Fetch what of the index at `tip` a batch of results going into `dirs` needs: only those directories
    when the shards are known and the bus serves trees by id; else the whole index at depth 1 (into an emptied
    side store when a partial tip is already there, the batch's results fetched again). The side bus and the
    shards (None: the whole index is here, the maps are written anew)."""
    if shards is not None:
        try:  # of the index, only the directories the results go into
            fetch_index_dirs(side, tip, dirs)
            return side, shards
        except BusError as exc:
            if not refused(exc):
                raise
    if git.has_object(side.store, tip):
        # a tip here may have come with some of its trees only (fetch_index_dirs): start afresh
        side = bus.side(LEDGER_STORE, empty=True)
    # the whole index, at depth 1 (and the results again, if emptied)
    side.fetch_ids([tip, *(e.done for e in batch if e.done)], "the ledger (depth 1)", in_store=True, depth=1)
    return side, None


def grown_maps(
    store: Path | str, tip: str, shards: dict[str, str] | None, dirs: Iterable[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """The shards at `tip` (those written into, at their new trees; all of them when `shards` is None) and
    the maps written for them."""
    if shards is None:
        shards = shard_trees(store, tip)
    else:
        grown = sorted({shard_of(d) for d in dirs})
        specs = [f"{tip}:{name}" for name in grown]
        shards = {**shards, **dict(zip(grown, git.out(store, "rev-parse", *specs).split(), strict=True))}
    return shards, write_maps(store, tip, shards)


def ledger_commits(
    store: Path | str, tip: str | None, done: Sequence[Entry], index: dict[str, tuple[str, str]], who: str
) -> str | None:
    """The ledger commits that take the results `done` in on top of `tip` (CHUNK a commit: its parents are the
    previous ledger commit and those done commits), written in one go (`git.import_commits`: the cost of what
    changes, whatever the ledger holds); the new tip (`tip` when `done` is empty)."""
    commits = ledger_files(store, done, index)
    return git.import_commits(store, tip, commits, who) if commits else tip


def ledger_files(
    store: Path | str, done: Sequence[Entry], index: dict[str, tuple[str, str]]
) -> list[tuple[dict[str, bytes], list[str], str]]:
    """The ledger commits that take the results `done` in, CHUNK a commit: (index files, the done commits as
    its other parents, message)."""
    chunks = [done[i : i + CHUNK] for i in range(0, len(done), CHUNK)]
    return [
        (entries_of(store, c, index), [e.done for e in c if e.done], f"kakeya ledger: {len(c)} done results")
        for c in chunks
    ]


def entries_of(store: Path, chunk: Sequence[Entry], index: dict[str, tuple[str, str]]) -> dict[str, bytes]:
    """The index files (path -> content) of the done results `chunk`, read from their commits in `store`."""
    files = git.read_blobs(store, [f"{e.done}:{results_path(e.id)}/result.json" for e in chunk])
    manifests = read_manifests([store], [e.done for e in chunk if e.done])
    out: dict[str, bytes] = {}
    for e in chunk:
        if e.done is None:
            raise KakeyaError(f"{e.id} has no done commit")
        m = m if isinstance(m := manifests.get(e.done), Manifest) else None
        r = parse_or_none(RunResult, files.get(f"{e.done}:{results_path(e.id)}/result.json"))
        subject = (
            index[e.id][0]
            if e.id in index
            else indexed_subject(m.subject if m else None, r.subject if r else None)
        )
        entry = LedgerEntry(
            id=e.id,
            done=e.done,
            subject=subject,
            label=m.runner if m else None,
            preset=e.preset,
            status=r.status if r else None,
            verdict=r.verdict if r else None,
        )
        out.update({path: entry.dump() for path in paths(entry)})
    return out
