"""`Bus`: a bus remote and the local object store that reads and writes for it (the refs and the files they
carry: bridge/bus/records.py).

The done push is one atomic push that creates the done ref and its index ref and deletes the request, claim
and cancel refs (the done commit has the request and every claim commit as ancestors): the live namespaces
hold only live work. Every read asks for the refs under a few prefixes (`Bus.ls_remote`: protocol v2
`ref-prefix`, so the bytes are those of the refs asked for), and objects are fetched by id (`Bus.fetch_ids`).
Every write is a compare-and-swap push (each ref leased on the sha expected, none = the ref must not exist:
receive-pack's own check of each command's old sha, bridge/wire/receive_pack.py; `git push --force-with-lease`
over http(s)), so two writers can never both win; `Bus.swap` retries transient failures and tells a lost
race from a won one by looking at what the bus holds afterwards. Commits are built by bridge/wire/git.py
straight into an object store (the user's repository or a runner's mirror): no working tree, index or branch
is touched.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from functools import cached_property
from pathlib import Path

from bridge.bus.records import (
    DONE_PREFIX,
    LAYOUT_PREFIX,
    LIVE,
    OLD_PREFIXES,
    RUNNERS_PREFIX,
    STAGE_PREFIX,
    Snapshot,
    Update,
)
from bridge.core.errors import BusError, BusUnreachable
from bridge.wire import git, receive_pack, upload_pack
from bridge.wire.transport import Daemon, Transport, for_url, is_path


def is_local_path(url: str) -> bool:
    """A bus named by a plain path on this host (not file://, not scp-like host:path: `transport.is_path`)."""
    return is_path(url)


# side stores, in the bus store's git directory, reading its objects too: what is fetched at depth 1 goes
# there, so the store itself never becomes shallow
RESULTS_STORE = "kakeya-results.git"  # done results without their subjects' past; every reader reads it
LEDGER_STORE = "kakeya-ledger.git"  # the compactor's: the ledger's tip without its past, some trees alone


class Bus:
    """A bus remote (`url`: URL or path) and the local object store (`store`) that reads and writes for it;
    `transport` is how the bus is reached (bridge/wire/transport.py), chosen once here from the URL (BusError for
    a URL that cannot be a bus, saying what to name instead)."""

    def __init__(self, url: str, store: Path, timeout_s: float = 120.0, transport: Transport | None = None):
        # A path means the user's directory, as it does to git; every git of a bus runs in `store`.
        url = os.path.abspath(url) if is_local_path(url) else url
        self.url, self.store, self.timeout_s = url, store, timeout_s
        self.transport = transport or for_url(url)
        self.main: Bus | None = None  # for a side store's Bus (`side`): the bus it serves
        self._sides: dict[str, Bus] = {}

    @cached_property
    def git_dir(self) -> Path:
        """The store's (common) git directory: itself when bare, else its .git directory (asked of git when
        .git is a file: a linked worktree, a submodule)."""
        store = Path(self.store).absolute()
        for candidate in (store, store / ".git"):
            if (candidate / "HEAD").is_file() and (candidate / "objects").is_dir():
                return candidate
        return Path(git.out(store, "rev-parse", "--path-format=absolute", "--git-common-dir"))

    def side(self, name: str = RESULTS_STORE, empty: bool = False) -> Bus:
        """The same bus with side store `name` (RESULTS_STORE, LEDGER_STORE), which reads the store's objects
        too (git's alternates) and takes what is fetched at depth 1, so the store itself never becomes
        shallow. Every reader of this bus reads RESULTS_STORE too (`repos`). `empty`: emptied first (it only
        caches what the bus holds)."""
        main = self.main or self
        path = main.git_dir / name
        if empty:
            git.forget(path)
            shutil.rmtree(path, ignore_errors=True)
            main._sides.pop(name, None)
        if name not in main._sides:
            git.init_bare(path)
            git.borrow_objects(path, main.git_dir / "objects")
            # the commits it borrows from a shallow store have no parents there either (a depth-1 checkout)
            git.add_shallow(path, git.shallow_commits(main.git_dir))
            main._sides[name] = Bus(self.url, path, self.timeout_s, self.transport)
            main._sides[name].main = main
        return main._sides[name]

    def missing(self, shas: Iterable[str]) -> list[str]:
        """Those of `shas` that no local repository of the bus has."""
        missing = sorted(set(shas))
        for repo in self.repos():
            missing = sorted(set(missing) - git.present(repo, missing)) if missing else []
        return missing

    def fetch_shallow(self, shas: Sequence[str], what: str) -> None:
        """Fetch the commits `shas` at depth 1 into RESULTS_STORE (those no local repository has yet): each
        with its tree, never its history."""
        if missing := self.missing(shas):
            self.side().fetch_ids(missing, what, in_store=True, depth=1, haves=self.ref_tips)

    def fetch_results(
        self, commits: Sequence[str], what: str, subjects: Iterable[str], objects: Sequence[str] = ()
    ) -> None:
        """Fetch done and request commits (with `objects`, e.g. ledger maps, in the same round trip) into
        RESULTS_STORE with their history down to `subjects` and no further: the subjects here
        (`fetch_shallow` brings those missing) are told to the server as commits we have, so it stops there.
        A done commit's history is its heartbeats, its claim, its request, its subject and the subject's whole
        past, which a depth-1 checkout of the base (the PR gate's) does not have."""
        missing = self.missing([*commits, *objects])  # a bus on this host is read in place
        if not missing:
            return
        side = self.side()
        tips = sorted(git.present(side.store, sorted(set(subjects))))  # only what git sees there can be a tip
        side.fetch_ids(missing, what, in_store=True, tips=tips, haves=lambda: tips)

    def ref_tips(self, count: int = 256) -> list[str]:
        """The commits the store's branches (and HEAD) point at, the newest `count`: what a fetch at depth 1
        tells the server it has (as `git fetch` tells it the refs of the repositories it borrows from)."""
        main = self.main or self
        text = git.out(
            main.store,
            "for-each-ref",
            f"--count={count}",
            "--sort=-committerdate",
            "--format=%(objectname) %(objecttype)",
            "refs/heads",
            "refs/remotes",
        )
        head = git.rev_parse(main.store, "HEAD")
        tips = [sha for sha, _, kind in (ln.partition(" ") for ln in text.splitlines()) if kind == "commit"]
        return sorted({*tips, *([head] if head else [])})

    def local_dir(self) -> Path | None:
        """The bus itself when it is a repository on a local path (its objects are read in place)."""
        path = Path(self.url)
        return path if is_local_path(self.url) and path.is_dir() else None

    def repos(self) -> list[Path]:
        """The local repositories that hold bus objects: the store, its RESULTS_STORE when there is one
        (`side`), then the bus itself when it is local."""
        local = self.local_dir()
        results = [] if self.main is not None else [self.git_dir / RESULTS_STORE]
        side = [path for path in results if (path / "HEAD").is_file()]
        return [Path(self.store), *side] + ([local] if local is not None else [])

    def list(self, prefixes: Sequence[str]) -> str:
        """The refs under `prefixes`, as `git ls-remote` prints them, in one round trip that carries only those."""
        try:
            return self.transport.ls_refs(self.store, prefixes, self.timeout_s)
        except BusError as exc:
            raise BusUnreachable(
                f"cannot reach the bus at {self.url} (listing {', '.join(prefixes)}): {exc}"
            ) from None

    def ls_remote(self, *prefixes: str, check: bool = True) -> Snapshot:
        """The bus refs under `prefixes` (an exact ref is a prefix too; default: every request and runner, not
        the index) in one prefix-scoped round trip, with the layout marker checked (`check`)."""
        wanted = prefixes or (*LIVE, DONE_PREFIX, RUNNERS_PREFIX)
        snap = Snapshot.parse(self.list([*wanted, LAYOUT_PREFIX, *OLD_PREFIXES]))
        if check:
            snap.check_layout(self.url)
        return snap

    def stage_refs(self) -> dict[str, str]:
        """The result side refs on the bus (`stage_ref`), ref -> sha."""
        text = self.list([STAGE_PREFIX])
        return {ref: sha for sha, _, ref in (line.partition("\t") for line in text.splitlines()) if ref}

    def fetch(self, refspecs: Sequence[str]) -> None:
        """Fetch `refspecs` ('src' for objects only, '+src:dst' to keep a local ref) into the store, in one go."""
        if not refspecs:
            return
        try:
            msg = self.transport.fetch(self.store, refspecs, self.timeout_s)
        except BusError as exc:  # a time limit: say what was being fetched
            raise BusUnreachable(f"fetching {', '.join(refspecs[:3])} from {self.url}: {exc}") from None
        if msg is not None:
            cls = BusError if "couldn't find remote ref" in msg else BusUnreachable
            raise cls(f"cannot fetch from the bus at {self.url}: {msg}")

    def fetch_ids(
        self,
        shas: Sequence[str],
        what: str = "objects",
        in_store: bool = False,
        depth: int | None = None,
        tree_filter: str | None = None,
        tips: Sequence[str] = (),
        standalone: bool = False,
        haves: Callable[[], Sequence[str]] | None = None,
    ) -> None:
        """Fetch the commits `shas` (objects only) that no local repository of the bus (the store, with
        `in_store`) has yet, by object id in one round trip (never a named refspec each: the server matches
        those one by one); `depth`: only that many commits of each history (the store becomes shallow);
        `tree_filter`, `tips`: git's --filter and --negotiation-tip (`Transport.fetch`). From a git:// bus, blobs and
        trees only (`standalone`: nothing to negotiate), or commits with the `haves` to negotiate in one round,
        come in protocol v2 on a socket of our own (bridge/wire/upload_pack.py: no `git fetch`, no delayed-ACK
        stall)."""
        missing = sorted(set(shas))
        for repo in self.repos()[:1] if in_store else self.repos():
            missing = sorted(set(missing) - git.present(repo, missing))
        if not missing:
            return
        daemon = self.transport if isinstance(self.transport, Daemon) else None
        if daemon and ((standalone and not depth and not tips) or haves is not None):
            try:
                said = haves() if haves is not None else ()
                upload_pack.daemon_fetch(
                    self.store, daemon, missing, self.timeout_s, tree_filter, depth, said
                )
                msg = None
            except BusError as exc:  # classified as git's own message below
                msg = str(exc)
        else:
            try:
                msg = self.transport.fetch(self.store, missing, self.timeout_s, depth, tree_filter, tips)
            except BusError as exc:  # a time limit: say what was being fetched
                raise BusUnreachable(f"fetching {len(missing)} {what} from {self.url}: {exc}") from None
        if msg is not None:
            refused = "not our ref" in msg or "unadvertised object" in msg
            hint = (
                " (this bus sends only objects a ref names, as git protocol v0/v1 does: serve it with protocol "
                "v2, or set uploadpack.allowReachableSHA1InWant=true on it; docs/bus.md)"
                if refused
                else ""
            )
            cls = BusError if refused or "upload-pack" in msg else BusUnreachable
            raise cls(f"cannot fetch {len(missing)} {what} from the bus at {self.url}: {msg}{hint}")

    @cached_property
    def receive_pack(self) -> bool:
        """Whether pushes speak receive-pack here (each update O(1)), not through `git push` (each update
        matched against every ref the bus holds): every transport but http(s), unless the store's git config
        asks for a signed push (bridge/wire/receive_pack.py)."""
        return receive_pack.speaks(self.store, self.transport)

    def push(self, updates: Sequence[Update], atomic: bool = False) -> dict[str, tuple[bool, str]]:
        """One leased push (bridge/wire/receive_pack.py, or `git push` over http(s)); ref -> (accepted, a summary as
        git's). BusUnreachable when nothing got through; BusError when the bus refused what no retry changes (a
        working clone's checked-out branch)."""
        wanted = [(u.ref, u.new, u.expect) for u in updates]
        if self.receive_pack:
            status, error = receive_pack.push(self.store, self.transport, wanted, atomic, self.timeout_s)
        else:
            status, error = self.transport.push(self.store, wanted, atomic, self.timeout_s)
        if not status and error is not None:
            raise BusUnreachable(f"cannot push to the bus at {self.url}: {error}")
        if refusal := self.transport.refusal(status):
            raise BusError(refusal)
        return status

    def swap(self, updates: Sequence[Update], atomic: bool = True, attempts: int = 6) -> bool:
        """Compare-and-swap `updates` (atomically): True when the bus now holds them, False when another
        writer changed a ref first. Transient failures (lock contention, a dropped connection) are retried;
        whether a push landed is judged from what the bus holds afterwards, never from an error message."""
        refs = [u.ref for u in updates]
        last, unreachable = "", 0
        for attempt in range(attempts):
            if attempt:
                time.sleep(min(0.1 * 2**attempt, 2.0) * (0.5 + random.random()))
            try:
                status = self.push(updates, atomic=atomic)
                if all(status.get(r, (False, ""))[0] for r in refs):
                    return True
                last = "; ".join(f"{r}: {status.get(r, (False, 'no answer'))[1]}" for r in refs)
                seen = self.ls_remote(*refs).refs
            except (
                BusUnreachable
            ) as exc:  # one more try for a dropped connection; a bus that is down is an error
                unreachable += 1
                if unreachable > 1:
                    raise
                last = str(exc)
                continue
            if all(seen.get(u.ref) == u.new for u in updates):
                return True
            if any(seen.get(u.ref) not in (u.expect, u.new) for u in updates):
                return False
            if atomic and any(seen.get(u.ref) != u.expect for u in updates):
                return False  # all or nothing: a ref already moved, by another writer, means this one lost
        raise BusError(f"could not update {', '.join(refs)} on {self.url} after {attempts} attempts: {last}")
