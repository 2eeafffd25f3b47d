"""The git bus: requests, claims, results and cancels as refs under refs/heads/kakeya/.

    kakeya/req/<label>/<id>   request commit: parent = the subject; adds .kakeya/request.json
    kakeya/claim/<id>         claim commit on top of the request (then heartbeats, then the done commit);
                              adds .kakeya/claim.json; created only if absent
    kakeya/done/<id>          result commit on top of the claim; adds .kakeya/results/<id>/...
    kakeya/cancel/<id>        cancel marker on top of the request; adds .kakeya/cancel.json

One `git ls-remote` gives the state of every request (`Bus.ls_remote` -> `Snapshot`). Every write is
a compare-and-swap push (`--force-with-lease=<ref>:<expected>`, empty = the ref must not exist), so
two writers can never both win; `Bus.swap` retries transient failures and tells a lost race from a
won one by looking at what the bus holds afterwards. Commits are built with GitPython straight into
an object store (the user's repository or a runner's mirror): no working tree, index or branch is
touched.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import re
import secrets
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from typing import Literal, TypeVar

import git
from gitdb import IStream, LooseObjectDB
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue, ValidationError

from bridge.errors import KakeyaError

PREFIX = "refs/heads/kakeya/"
MANIFEST_PATH = ".kakeya/request.json"
CLAIM_PATH = ".kakeya/claim.json"
CANCEL_PATH = ".kakeya/cancel.json"
RESULTS_DIR = ".kakeya/results"
ID_RE = re.compile(r"^(\d{8}T\d{6}\.\d{3}Z)-([a-z][a-z0-9-]{0,62})-([0-9a-f]{6})$")
LABEL_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
SHA_PATTERN = r"^([0-9a-f]{40}|[0-9a-f]{64})$"
TREE_MODE = b"40000"
FILE_MODE = b"100644"


class BusError(KakeyaError):
    """A git operation against the bus failed (the message carries git's own words)."""


class BusUnreachable(BusError):
    """The bus remote could not be reached; nothing was written."""


# --- ids and refs -----------------------------------------------------------------------------------


def new_id(preset: str, now: dt.datetime | None = None) -> str:
    """`20260614T101502.123Z-probe-a1b2c3`: sorts by creation time (UTC, milliseconds)."""
    now = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)
    return f"{now:%Y%m%dT%H%M%S}.{now.microsecond // 1000:03d}Z-{preset}-{secrets.token_hex(3)}"


def id_time(request_id: str) -> dt.datetime:
    m = ID_RE.match(request_id)
    if not m:
        raise KakeyaError(
            f"{request_id!r} is not a request id (expected e.g. 20260614T101502.123Z-probe-a1b2c3)"
        )
    return dt.datetime.strptime(m.group(1), "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=dt.UTC)


def id_preset(request_id: str) -> str:
    m = ID_RE.match(request_id)
    return m.group(2) if m else ""


def check_label(label: str) -> str:
    if not LABEL_RE.match(label):
        raise KakeyaError(
            f"runner label {label!r} must be lowercase letters, digits, '-' or '_' (e.g. cpu, h200)"
        )
    return label


def req_ref(label: str, request_id: str) -> str:
    return f"{PREFIX}req/{label}/{request_id}"


def claim_ref(request_id: str) -> str:
    return f"{PREFIX}claim/{request_id}"


def done_ref(request_id: str) -> str:
    return f"{PREFIX}done/{request_id}"


def cancel_ref(request_id: str) -> str:
    return f"{PREFIX}cancel/{request_id}"


def results_path(request_id: str) -> str:
    return f"{RESULTS_DIR}/{request_id}"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# --- files the bus carries --------------------------------------------------------------------------


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid")

    def dump(self) -> bytes:
        return (self.model_dump_json(indent=2) + "\n").encode()


class Manifest(_File):
    """.kakeya/request.json: what was asked for. `params` are raw, as given; the runner re-validates."""

    schema_version: Literal[1] = 1
    id: str = Field(pattern=ID_RE.pattern)
    preset: str
    params: dict[str, JsonValue] = {}
    subject: str = Field(pattern=SHA_PATTERN)
    runner: str = Field(pattern=LABEL_RE.pattern)
    requester: str
    created_at: AwareDatetime
    expires_at: AwareDatetime
    nonce: str
    snapshot_of: str | None = None  # the HEAD a dirty working tree was snapshotted on


class Claim(_File):
    """.kakeya/claim.json: who holds a request and until when (heartbeats extend `lease_until`)."""

    schema_version: Literal[1] = 1
    id: str
    runner: str
    labels: list[str]
    host: str
    pid: int
    claimed_at: AwareDatetime
    lease_until: AwareDatetime
    heartbeat: int = 0
    takeover_of: str | None = None  # the runner whose expired lease this claim took over


class CancelMarker(_File):
    """.kakeya/cancel.json."""

    schema_version: Literal[1] = 1
    id: str
    by: str
    at: AwareDatetime
    reason: str = ""


_M = TypeVar("_M", bound=BaseModel)


def parse_or_none(cls: type[_M], data: bytes | None) -> _M | None:
    """`data` (JSON read from the bus) as a `cls`, or None when it is missing or not a valid `cls`."""
    if data is None:
        return None
    try:
        return cls.model_validate_json(data)
    except ValidationError:
        return None


# --- the state of the bus from one ls-remote ---------------------------------------------------------


@dataclass
class Entry:
    """The refs of one request."""

    id: str
    label: str | None = None
    req: str | None = None
    claim: str | None = None
    done: str | None = None
    cancel: str | None = None

    @property
    def preset(self) -> str:
        return id_preset(self.id)

    @property
    def created_at(self) -> dt.datetime:
        return id_time(self.id)

    @property
    def state(self) -> str:
        """What the refs alone say: done, cancelling, cancelled, claimed or requested."""
        if self.done:
            return "done"
        if self.cancel:
            return "cancelling" if self.claim else "cancelled"
        return "claimed" if self.claim else "requested"


@dataclass
class Snapshot:
    refs: dict[str, str]
    entries: dict[str, Entry]
    ignored: list[str]  # refs under the prefix that are not bus refs (malformed names)

    @classmethod
    def parse(cls, text: str) -> Snapshot:
        refs: dict[str, str] = {}
        entries: dict[str, Entry] = {}
        ignored: list[str] = []
        for line in text.splitlines():
            sha, _, ref = line.partition("\t")
            if not ref.startswith(PREFIX) or not re.fullmatch(SHA_PATTERN, sha):
                continue
            refs[ref] = sha
            parts = ref[len(PREFIX) :].split("/")
            kind, rid = parts[0], parts[-1]
            shape_ok = (len(parts) == 3 and kind == "req" and LABEL_RE.match(parts[1])) or (
                len(parts) == 2 and kind in ("claim", "done", "cancel")
            )
            if not shape_ok or not ID_RE.match(rid):
                ignored.append(ref)
                continue
            entry = entries.setdefault(rid, Entry(rid))
            if kind == "req":
                if entry.req is not None:  # the same id under two labels: keep the first, flag the second
                    ignored.append(ref)
                    continue
                entry.label, entry.req = parts[1], sha
            else:
                setattr(entry, kind, sha)
        return cls(refs, dict(sorted(entries.items())), ignored)


# --- running git ------------------------------------------------------------------------------------

GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "LANGUAGE": "C"}
# Variables that would point our git commands at some other repository (e.g. when run from a git hook).
_REPO_VARS = (
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_OBJECT_DIRECTORY",
    "GIT_COMMON_DIR",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_NAMESPACE",
    "GIT_PREFIX",
)


def run_git(
    cwd: Path | str,
    *args: str,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 300,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """`git <args>` in `cwd`; BusError with git's message when it fails (and `check`)."""
    full_env = {k: v for k, v in os.environ.items() if k not in _REPO_VARS}
    full_env.update({**GIT_ENV, **(env or {})})
    try:
        proc = subprocess.run(
            ["git", *args], cwd=cwd, input=input, capture_output=True, env=full_env, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise BusError(f"git {args[0]} timed out after {timeout:.0f} s") from None
    except OSError as exc:
        raise BusError(f"cannot run git: {exc}") from None
    if check and proc.returncode != 0:
        raise BusError(f"git {' '.join(args[:2])} failed: {git_message(proc.stderr)}")
    return proc


def git_message(stderr: bytes) -> str:
    """The lines of git's stderr that say what went wrong, on one line."""
    lines = [ln.strip() for ln in stderr.decode(errors="replace").splitlines() if ln.strip()]
    useful = [ln for ln in lines if ln.startswith(("fatal:", "error:"))] or lines
    return " ".join(ln.removeprefix("fatal: ").removeprefix("error: ") for ln in useful[:3]) or "no message"


def init_bare(path: Path) -> Path:
    """A bare repository at `path` (created if missing)."""
    if not (path / "HEAD").is_file():
        path.mkdir(parents=True, exist_ok=True)
        run_git(path, "init", "--bare", "-q")
    return path


@contextmanager
def open_repo(path: Path | str) -> Iterator[git.Repo]:
    repo = git.Repo(path)
    try:
        yield repo
    finally:
        repo.close()


# --- objects: built in-process with GitPython, straight into an object store ------------------------


def _store(repo: git.Repo, kind: bytes, data: bytes) -> bytes:
    """Write a loose object in-process (gitdb); GitPython's own `store` would start a git process per object."""
    return LooseObjectDB.store(repo.odb, IStream(kind, len(data), BytesIO(data))).binsha


def _tree_entries(repo: git.Repo, binsha: bytes | None) -> dict[bytes, tuple[bytes, bytes]]:
    """name -> (mode, binsha) of a tree, names kept as raw bytes so any file name survives a rewrite."""
    if binsha is None:
        return {}
    data, out, i = repo.odb.stream(binsha).read(), {}, 0
    while i < len(data):
        space = data.index(b" ", i)
        nul = data.index(b"\0", space)
        out[data[space + 1 : nul]] = (data[i:space], data[nul + 1 : nul + 21])
        i = nul + 21
    return out


def tree_with(repo: git.Repo, base: str | bytes | None, files: Mapping[str, bytes]) -> str:
    """The tree `base` (hex, bin or None for empty) with `files` (posix path -> content) added or replaced."""
    base_bin = bytes.fromhex(base) if isinstance(base, str) else base
    entries = _tree_entries(repo, base_bin)
    nested: dict[bytes, dict[str, bytes]] = {}
    for path, data in files.items():
        head, _, rest = path.partition("/")
        if head in ("", ".", "..", ".git"):
            raise KakeyaError(f"refusing to write {path!r} into a commit")
        if rest:
            nested.setdefault(head.encode(), {})[rest] = data
        else:
            entries[head.encode()] = (FILE_MODE, _store(repo, b"blob", data))
    for name, sub in nested.items():
        mode, sha = entries.get(name, (b"", None))
        entries[name] = (TREE_MODE, bytes.fromhex(tree_with(repo, sha if mode == TREE_MODE else None, sub)))
    ordered = sorted(entries.items(), key=lambda kv: kv[0] + (b"/" if kv[1][0] == TREE_MODE else b""))
    data = b"".join(mode + b" " + name + b"\0" + sha for name, (mode, sha) in ordered)
    return _store(repo, b"tree", data).hex()


def commit(repo: git.Repo, tree: str, parents: Sequence[str], message: str, who: str) -> str:
    """A commit object (no ref moves); `who` is 'Name <email>', used as author and committer."""
    name, _, email = who.partition(" <")
    ident = f"{_clean(name) or 'kakeya'} <{_clean(email.rstrip('>')) or 'kakeya@kakeya.invalid'}> {int(time.time())} +0000"
    lines = [
        f"tree {tree}",
        *(f"parent {p}" for p in parents),
        f"author {ident}",
        f"committer {ident}",
        "",
        message.rstrip("\n") + "\n",
    ]
    return _store(repo, b"commit", "\n".join(lines).encode()).hex()


def _clean(text: str) -> str:
    return re.sub(r"[<>\n\r\0]", "", text).strip()


def child_commit(repo: git.Repo, parent: str, files: Mapping[str, bytes], message: str, who: str) -> str:
    """A commit on top of `parent` whose tree is the parent's plus `files`."""
    return commit(repo, tree_with(repo, repo.commit(parent).tree.binsha, files), [parent], message, who)


def has_object(repo: git.Repo, sha: str) -> bool:
    try:
        return repo.odb.has_object(bytes.fromhex(sha))
    except ValueError:
        return False


def read_path(repo: git.Repo, sha: str, path: str) -> bytes | None:
    """The content of file `path` in commit `sha`, or None if there is no such file."""
    try:
        item = repo.commit(sha).tree / path
    except (KeyError, ValueError):
        return None
    return item.data_stream.read() if item.type == "blob" else None


def read_dir(repo: git.Repo, sha: str, path: str) -> dict[str, bytes]:
    """Every regular file under directory `path` of commit `sha` (relative posix path -> bytes)."""
    try:
        tree = repo.commit(sha).tree / path
    except KeyError:
        return {}
    if tree.type != "tree":
        return {}
    return {
        blob.path[len(path) + 1 :]: blob.data_stream.read()
        for blob in tree.traverse()
        if blob.type == "blob" and blob.mode in (0o100644, 0o100755)
    }


def read_blobs(repo_dir: Path | str, specs: Sequence[str]) -> dict[str, bytes]:
    """`<commit>:<path>` -> content for every spec found, with one `git cat-file --batch` (local, no network)."""
    if not specs:
        return {}
    out = run_git(repo_dir, "cat-file", "--batch", input="".join(s + "\n" for s in specs).encode()).stdout
    found, i = {}, 0
    for spec in specs:
        nl = out.index(b"\n", i)
        header = out[i:nl].split()
        i = nl + 1
        if len(header) == 3 and header[1] == b"blob":
            size = int(header[2])
            found[spec] = out[i : i + size]
            i += size + 1
        elif len(header) == 3:  # a tree or commit where a blob was expected: skip its body
            i += int(header[2]) + 1
    return found


def present(repo_dir: Path | str, shas: Sequence[str]) -> set[str]:
    """Which of `shas` the repository at `repo_dir` has (one `git cat-file --batch-check`)."""
    if not shas:
        return set()
    out = run_git(
        repo_dir, "cat-file", "--batch-check", input="".join(s + "\n" for s in shas).encode()
    ).stdout
    return {line.split()[0] for line in out.decode().splitlines() if not line.endswith(" missing")}


def read_blobs_in(repos: Sequence[Path], specs: Sequence[str]) -> dict[str, bytes]:
    """`read_blobs` over several local repositories (a bus's store, then a local bus), first found wins."""
    found: dict[str, bytes] = {}
    for repo in repos:
        rest = [s for s in specs if s not in found]
        if rest:
            found.update(read_blobs(repo, rest))
    return found


def repo_having(repos: Sequence[Path], sha: str) -> Path:
    """The first of `repos` that has `sha` (the first one when none has it)."""
    return next((r for r in repos if present(r, [sha])), repos[0])


def is_ancestor(repo_dir: Path | str, ancestor: str, sha: str) -> bool:
    return run_git(repo_dir, "merge-base", "--is-ancestor", ancestor, sha, check=False).returncode == 0


# --- the remote -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Update:
    """Set `ref` to `new` (None deletes it) only if it now holds `expect` (None = it must not exist)."""

    ref: str
    new: str | None
    expect: str | None


class Bus:
    """A bus remote (`url`: URL or path) and the local object store (`store`) that reads and writes for it."""

    def __init__(self, url: str, store: Path, timeout_s: float = 120.0):
        self.url, self.store, self.timeout_s = url, store, timeout_s

    def _network(self, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        return run_git(self.store, *args, input=input, timeout=self.timeout_s, check=False)

    def ls_remote(self, *refs: str) -> Snapshot:
        """The bus refs (all of them, or just `refs`) in one round trip."""
        proc = self._network("ls-remote", self.url, *(refs or (PREFIX + "*",)))
        if proc.returncode != 0:
            raise BusUnreachable(f"cannot reach the bus at {self.url}: {git_message(proc.stderr)}")
        return Snapshot.parse(proc.stdout.decode(errors="replace"))

    def fetch(self, refspecs: Sequence[str]) -> None:
        """Fetch `refspecs` ('src' for objects only, '+src:dst' to keep a local ref) into the store, in one go."""
        if not refspecs:
            return
        proc = self._network(
            "fetch",
            "--no-write-fetch-head",
            "--no-auto-gc",
            "--no-tags",
            "--no-recurse-submodules",
            "-q",
            "--stdin",
            self.url,
            input="".join(r + "\n" for r in refspecs).encode(),
        )
        if proc.returncode != 0:
            msg = git_message(proc.stderr)
            cls = BusError if "couldn't find remote ref" in msg else BusUnreachable
            raise cls(f"cannot fetch from the bus at {self.url}: {msg}")

    def push(self, updates: Sequence[Update], atomic: bool = False) -> dict[str, tuple[bool, str]]:
        """One leased push; ref -> (accepted, git's summary). BusUnreachable when nothing got through."""
        args = ["push", "--porcelain", "--no-verify", "--no-recurse-submodules"]
        if atomic and len(updates) > 1:
            args.append("--atomic")
        args += [f"--force-with-lease={u.ref}:{u.expect or ''}" for u in updates]
        args += [self.url, *(f"{u.new or ''}:{u.ref}" for u in updates)]
        proc = self._network(*args)
        status: dict[str, tuple[bool, str]] = {}
        for line in proc.stdout.decode(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) >= 3 and len(parts[0]) == 1 and ":" in parts[1]:
                status[parts[1].rsplit(":", 1)[1]] = (parts[0] in " +-*=", parts[2])
        if not status and proc.returncode != 0:
            raise BusUnreachable(f"cannot push to the bus at {self.url}: {git_message(proc.stderr)}")
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
        raise BusError(f"could not update {', '.join(refs)} on {self.url} after {attempts} attempts: {last}")
