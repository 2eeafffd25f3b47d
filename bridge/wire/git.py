"""Every git operation the bridge performs on a local repository, by name, as plain `git` subprocesses (argv,
never a shell); the bus's wire is bridge/wire/transport.py.

One way to run git (`run`: a clean environment that no GIT_DIR of a calling hook can redirect, no
prompt, C locale, a time limit, BusError with git's own words), one way to read objects (`Reader`: one
`git cat-file --batch-command` kept running per repository), one way to write them (`tree_with` + `commit`:
blobs, a temporary index and `commit-tree` straight into an object store; no working tree, index or branch is
touched).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, NamedTuple

from bridge.core.errors import BusError, KakeyaError

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
# Every git call of the bridge looks for hooks here (nowhere): a hook a run planted in a repository never runs.
NO_HOOKS = ("-c", f"core.hooksPath={os.devnull}")
FILE_MODE = "100644"
FILE_MODES = ("100644", "100755")


# --- running git ------------------------------------------------------------------------------------


def run(
    cwd: Path | str,
    *args: str,
    input: bytes | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = 300,
    check: bool = True,
) -> subprocess.CompletedProcess[bytes]:
    """`git <args>` in `cwd` (no hooks: NO_HOOKS); BusError with git's message when it fails (and `check`)."""
    proc = _spawn("git", ["git", *NO_HOOKS, *args], f"git {args[0]}", cwd, input, env, timeout)
    if check and proc.returncode != 0:
        raise BusError(f"git {' '.join(args[:2])} failed: {message(proc.stderr)}")
    return proc


def _spawn(
    program: str,
    argv: list[str],
    what: str,
    cwd: Path | str,
    input: bytes | None,
    env: Mapping[str, str] | None,
    timeout: float | None,
) -> subprocess.CompletedProcess[bytes]:
    """`argv` (git, or ssh to a git server) run to its end with `_env(env)`; BusError when `what` times out
    or `program` cannot start."""
    try:
        # In a process group of its own: a Ctrl-C at the terminal (or a signal to kakeya's group) reaches
        # kakeya, which finishes what it is doing, never a git helper half-way through a push or a read.
        return subprocess.run(
            argv, cwd=cwd, input=input, capture_output=True, env=_env(env), timeout=timeout, process_group=0
        )
    except subprocess.TimeoutExpired:
        raise BusError(f"{what} timed out after {timeout:.0f} s") from None
    except OSError as exc:
        raise BusError(f"cannot run {program}: {exc}") from None


def popen(
    program: str, argv: list[str], cwd: Path | str, err: IO[bytes], env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """`argv` (git, ssh to a git server, git's remote helper) started with pipes to talk to it, its stderr to
    `err`, the environment of `run` (with `env`) and a process group of its own (as `_spawn`); BusError when
    `program` cannot start."""
    try:
        return subprocess.Popen(
            argv,
            cwd=cwd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
            env=_env(env),
            process_group=0,
        )
    except OSError as exc:
        raise BusError(f"cannot run {program}: {exc}") from None


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The environment of every git we start: ours without the variables that would redirect it, plus GIT_ENV."""
    full = {k: v for k, v in os.environ.items() if k not in _REPO_VARS}
    full.update({**GIT_ENV, **(env or {})})
    return full


def out(cwd: Path | str, *args: str, input: bytes | None = None, env: Mapping[str, str] | None = None) -> str:
    """The stripped stdout of `git <args>` (raises like `run`)."""
    return run(cwd, *args, input=input, env=env).stdout.decode(errors="replace").strip()


def message(stderr: bytes) -> str:
    """The lines of git's stderr that say what went wrong, on one line."""
    lines = [ln.strip() for ln in stderr.decode(errors="replace").splitlines() if ln.strip()]
    useful = [ln for ln in lines if ln.startswith(("fatal:", "error:"))] or lines
    return " ".join(ln.removeprefix("fatal: ").removeprefix("error: ") for ln in useful[:3]) or "no message"


def version() -> str:
    """`git --version` (raises BusError when git cannot run)."""
    return out(".", "--version")


# --- repositories -----------------------------------------------------------------------------------


def init_bare(path: Path) -> Path:
    """A bare repository at `path` (created if missing)."""
    if not (path / "HEAD").is_file():
        path.mkdir(parents=True, exist_ok=True)
        run(path, "init", "--bare", "-q")
    return path


def is_repo(path: Path) -> bool:
    return run(path, "rev-parse", "--git-dir", check=False).returncode == 0


def toplevel(path: Path) -> Path | None:
    """The working tree's top level of `path`, or None outside one (or when git cannot run)."""
    try:
        proc = run(path, "rev-parse", "--show-toplevel", check=False, timeout=30)
    except BusError:
        return None
    top = proc.stdout.decode().strip()
    return Path(top) if proc.returncode == 0 and top else None


def remote_url(repo: Path, name: str) -> str | None:
    """The URL of remote `name` of `repo`, or None when it has no such remote."""
    proc = run(repo, "remote", "get-url", name, check=False)
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def remote_names(repo: Path) -> list[str]:
    """The names of `repo`'s remotes."""
    return run(repo, "remote", check=False).stdout.decode().split()


def fetch_refspecs(repo: Path, remote: str) -> list[str]:
    """`remote.<remote>.fetch` of `repo` (its configured refspecs, negative ones included)."""
    return run(repo, "config", "--get-all", f"remote.{remote}.fetch", check=False).stdout.decode().split()


def add_negative_refspec(repo: Path, remote: str, refspec: str) -> None:
    """Add `refspec` (e.g. ^refs/heads/kakeya/*) to `remote.<remote>.fetch` unless it is there already."""
    if refspec not in fetch_refspecs(repo, remote):
        run(repo, "config", "--add", f"remote.{remote}.fetch", refspec)


def push_dry_run(repo: Path, url: str, rev: str, ref: str) -> None:
    """`git push --dry-run url rev:ref`: raises BusError (git's words) when the bus would refuse it."""
    try:
        run(repo, "push", "--dry-run", "--porcelain", url, f"{rev}:{ref}", timeout=120)
    except BusError as exc:
        raise BusError(f"a dry-run push to {url} was refused: {exc}") from None


def rev_parse(repo: Path | str, rev: str) -> str | None:
    """The commit `rev` names in `repo`, or None."""
    proc = run(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    return proc.stdout.decode().strip() if proc.returncode == 0 else None


def ident(repo: Path | str) -> str:
    """`GIT_AUTHOR_IDENT` as git would sign a commit in `repo` ('' when it has none)."""
    return run(repo, "var", "GIT_AUTHOR_IDENT", check=False).stdout.decode().strip()


def dirty_paths(root: Path, untracked: bool = True) -> list[str]:
    """Changed and (`untracked`) untracked, not ignored, paths of the working tree at `root`."""
    which = "normal" if untracked else "no"
    text = run(root, "status", "--porcelain=v1", "-z", f"--untracked-files={which}").stdout.decode()
    return [e[3:] for e in text.split("\0") if len(e) > 3 and e[2] == " "]


def working_tree(root: Path) -> str:
    """The tree of the working tree at `root` (tracked and untracked, minus ignored), made with a temporary
    index: the user's index and files stay as they are."""
    index = Path(out(root, "rev-parse", "--git-path", "index"))
    index = index if index.is_absolute() else root / index
    with tempfile.TemporaryDirectory(prefix="kakeya-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if index.is_file():
            shutil.copyfile(index, env["GIT_INDEX_FILE"])
        run(root, "add", "-A", "--", ".", env=env)
        return out(root, "write-tree", env=env)


# --- reading objects --------------------------------------------------------------------------------


KEEP_S = 10.0  # a reader is started again when older: one never outlives by much a gc or new alternates
READERS_MAX = 16  # readers kept at once (past that, the one started longest ago goes)
CHUNK_BYTES = 16384  # commands written at once, then answered: far under the 64 kB a pipe holds
_OBJECT = re.compile(rb"([0-9a-f]{40}|[0-9a-f]{64}) (blob|tree|commit|tag) (\d+)\n")


class Found(NamedTuple):
    """An object a `Reader` found: its id, type, size and (for `contents`) content."""

    oid: str
    kind: str
    size: int
    body: bytes | None


class Reader:
    """One `git cat-file --batch-command --buffer` kept running for a repository: every object read and
    presence check is a round trip on its pipes, not a process each (git rescans its packs when an object
    is not found, so what was fetched meanwhile is seen). One command batch at a time (`lock`); `forget`
    drops it where a repository is emptied or borrows new objects."""

    def __init__(self, repo: str):
        self.repo, self.pid = repo, os.getpid()  # a forked child never shares its parent's pipes
        self.started = time.monotonic()
        self.lock = threading.Lock()
        self.said: str | None = None  # once closed: what it said on stderr
        try:
            self.proc = subprocess.Popen(
                ["git", *NO_HOOKS, "cat-file", "--batch-command", "--buffer"],
                cwd=repo,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=_env(None),
                process_group=0,
            )
        except OSError as exc:
            raise BusError(f"cannot read objects in {repo}: {exc}") from None

    def ask(self, command: str, specs: Sequence[str]) -> list[Found | None]:
        """For each spec (an object id or `<commit>:<path>`, any name git takes): what it names here, or None.
        BrokenPipeError when git is gone."""
        stdin, stdout = self.proc.stdin, self.proc.stdout
        assert stdin is not None and stdout is not None
        sendable = ["\n" not in spec and spec.strip() == spec and spec != "" for spec in specs]
        lines = [f"{command} {spec}\n" for spec, ok in zip(specs, sendable, strict=True) if ok]
        if not lines:
            return [None] * len(specs)
        stdin.write("".join(lines).encode(errors="surrogateescape") + b"flush\n")
        stdin.flush()
        answers: list[Found | None] = []
        for ok in sendable:
            if not ok:
                answers.append(None)
                continue
            header = stdout.readline()
            if not header.endswith(b"\n"):
                raise BrokenPipeError(f"git cat-file ended in {self.repo}")
            found = _OBJECT.fullmatch(header)
            if found is None:  # `<spec> missing` or `<spec> ambiguous`
                answers.append(None)
                continue
            size = int(found.group(3))
            body = None
            if command == "contents":
                body = stdout.read(size + 1)
                if len(body) != size + 1:
                    raise BrokenPipeError(f"git cat-file ended in {self.repo}")
                body = body[:size]
            answers.append(Found(found.group(1).decode(), found.group(2).decode(), size, body))
        return answers

    def close(self) -> str:
        """Stop it (once the batch it is answering is over); what it said on stderr."""
        with self.lock:
            if self.said is not None:
                return self.said
            with contextlib.suppress(OSError):
                if self.proc.stdin is not None:
                    self.proc.stdin.close()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            said = self.proc.stderr.read() if self.proc.stderr is not None else b""
            for pipe in (self.proc.stdout, self.proc.stderr):
                if pipe is not None:
                    pipe.close()
            self.said = message(said) if said.strip() else ""
        return self.said


_READERS: dict[str, Reader] = {}
_READERS_LOCK = threading.Lock()


def _reader(repo: Path | str) -> Reader:
    key = os.path.abspath(repo)
    with _READERS_LOCK:
        now = time.monotonic()
        stale = [k for k, r in _READERS.items() if now - r.started > KEEP_S or r.pid != os.getpid()]
        while len(_READERS) - len(stale) >= READERS_MAX and key not in _READERS:
            stale.append(min((k for k in _READERS if k not in stale), key=lambda k: _READERS[k].started))
        for k in stale:
            _READERS.pop(k).close()
        if key not in _READERS:
            _READERS[key] = Reader(key)
        return _READERS[key]


def forget(repo: Path | str) -> None:
    """Stop the reader of `repo`, if any: it is emptied, deleted, or borrows other objects now."""
    with _READERS_LOCK:
        reader = _READERS.pop(os.path.abspath(repo), None)
    if reader is not None:
        reader.close()


@atexit.register
def _stop_readers() -> None:
    with _READERS_LOCK:
        readers = list(_READERS.values())
        _READERS.clear()
    for reader in readers:
        reader.close()


def chunks(specs: Sequence[str]) -> list[Sequence[str]]:
    """`specs` in runs whose commands take CHUNK_BYTES at most (one spec at least)."""
    out: list[Sequence[str]] = []
    start, size = 0, 0
    for i, spec in enumerate(specs):
        if i > start and size + len(spec) + 10 > CHUNK_BYTES:
            out.append(specs[start:i])
            start, size = i, 0
        size += len(spec) + 10
    return [*out, specs[start:]] if start < len(specs) else out


def cat(repo: Path | str, command: str, specs: Sequence[str]) -> list[Found | None]:
    """`Reader.ask` on the reader of `repo`, a chunk at a time (`chunks`): its commands always fit in the pipe
    to git, so writing them never waits on git, which may be waiting on us to read its answers. A reader that
    died is started again once; BusError (with git's words) when that one fails too (no repository there)."""
    answers: list[Found | None] = []
    for chunk in chunks(specs):
        for attempt in range(2):
            reader = _reader(repo)
            try:
                with reader.lock:
                    answers += reader.ask(command, chunk)
                break
            except (OSError, ValueError) as exc:  # git is gone (or its pipes were closed under us)
                forget(repo)
                if attempt:
                    raise BusError(f"cannot read objects in {repo}: {reader.close() or exc}") from None
    return answers


def read_blobs(repo: Path | str, specs: Sequence[str]) -> dict[str, bytes]:
    """`<object>` or `<commit>:<path>` -> content for every spec that names a blob (local, no network)."""
    return {
        spec: got.body
        for spec, got in zip(specs, cat(repo, "contents", specs), strict=True)
        if got is not None and got.kind == "blob" and got.body is not None
    }


def read_path(repo: Path | str, sha: str, path: str) -> bytes | None:
    """The content of file `path` in commit `sha`, or None if there is no such file."""
    return read_blobs(repo, [f"{sha}:{path}"]).get(f"{sha}:{path}")


def read_blobs_in(repos: Sequence[Path], specs: Sequence[str]) -> dict[str, bytes]:
    """`read_blobs` over several local repositories (a bus's store, then a local bus), first found wins."""
    found: dict[str, bytes] = {}
    for repo in repos:
        rest = [s for s in specs if s not in found]
        if rest:
            found.update(read_blobs(repo, rest))
    return found


def blob_sizes(repo: Path | str, specs: Sequence[str]) -> dict[str, int]:
    """`<object>` or `<commit>:<path>` -> size in bytes, for every spec that names a blob here: nothing is
    read, so a reader can refuse a blob by its size first."""
    return {
        spec: got.size
        for spec, got in zip(specs, cat(repo, "info", specs), strict=True)
        if got is not None and got.kind == "blob"
    }


def ls_tree(repo: Path | str, treeish: str, recursive: bool = False) -> dict[str, tuple[str, str, str]]:
    """path -> (mode, type, sha) of the entries of `treeish` (a tree, a commit, `<commit>:<dir>`), as
    `git ls-tree [-r]` prints them (with `recursive`, the files below its trees, not the trees), read through
    the repository's `Reader`; {} when it is not a tree here (a subtree missing here is left out)."""
    entries: dict[str, tuple[str, str, str]] = {}
    level = {"": treeish if ":" in treeish else f"{treeish}^{{tree}}"}  # `<commit>:<dir>` names a tree
    while level:
        listed = tree_entries(repo, list(level.values()))
        deeper = {}
        for prefix, tree in level.items():
            for name, (mode, sha) in listed.get(tree, {}).items():
                mode = mode.rjust(6, "0")
                kind = "tree" if mode == "040000" else "commit" if mode == "160000" else "blob"
                path = f"{prefix}{name}"
                if recursive and kind == "tree":
                    deeper[f"{path}/"] = sha
                else:
                    entries[path] = (mode, kind, sha)
        level = deeper if recursive else {}
    return dict(sorted(entries.items()))


def tree_entries(repo: Path | str, trees: Sequence[str]) -> dict[str, dict[str, tuple[str, str]]]:
    """tree -> {name: (mode as the tree object has it, sha)} for each of `trees` (a tree id, or any name of
    a tree: `<commit>^{tree}`) here, read through the repository's `Reader`; a tree missing here is left out."""
    found: dict[str, dict[str, tuple[str, str]]] = {}
    for tree, got in zip(trees, cat(repo, "contents", trees), strict=True):
        if got is None or got.kind != "tree" or got.body is None:
            continue
        body, width, entries, j = got.body, len(got.oid) // 2, {}, 0
        while j < len(body):
            space, nul = body.index(b" ", j), body.index(b"\0", j)
            entries[body[space + 1 : nul].decode(errors="surrogateescape")] = (
                body[j:space].decode(),
                body[nul + 1 : nul + 1 + width].hex(),
            )
            j = nul + 1 + width
        found[tree] = entries
    return found


def read_dir(repo: Path | str, sha: str, path: str) -> dict[str, bytes]:
    """Every regular file under directory `path` of commit `sha` (relative posix path -> bytes)."""
    files = {
        name: blob
        for name, (mode, kind, blob) in ls_tree(repo, f"{sha}:{path}", recursive=True).items()
        if kind == "blob" and mode in FILE_MODES
    }
    blobs = read_blobs(repo, sorted(set(files.values())))
    return {name: blobs[blob] for name, blob in files.items() if blob in blobs}


def present(repo: Path | str, shas: Sequence[str]) -> set[str]:
    """Which of `shas` the repository at `repo` has."""
    return {sha for sha, got in zip(shas, cat(repo, "info", shas), strict=True) if got is not None}


def has_object(repo: Path | str, sha: str) -> bool:
    return bool(re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", sha)) and sha in present(repo, [sha])


def repo_having(repos: Sequence[Path], sha: str) -> Path:
    """The first of `repos` that has `sha` (the first one when none has it)."""
    return next((r for r in repos if present(r, [sha])), repos[0])


def parents(repo: Path | str, sha: str) -> list[str]:
    return out(repo, "rev-list", "--parents", "-n", "1", sha, "--").split()[1:]


def is_ancestor(repo: Path | str, ancestor: str, sha: str) -> bool:
    return run(repo, "merge-base", "--is-ancestor", ancestor, sha, check=False).returncode == 0


# --- writing objects --------------------------------------------------------------------------------


def write_blobs(repo: Path | str, contents: Sequence[bytes]) -> list[str]:
    """Store `contents` as blobs (one `git hash-object`); their shas, in order."""
    if not contents:
        return []
    with tempfile.TemporaryDirectory(prefix="kakeya-blobs-") as tmp:
        paths = []
        for i, data in enumerate(contents):
            path = Path(tmp) / str(i)
            path.write_bytes(data)
            paths.append(str(path))
        text = out(
            repo, "hash-object", "-w", "--no-filters", "--stdin-paths", input="\n".join(paths).encode()
        )
    return text.split()


def tree_with(
    repo: Path | str, base: str | None, files: Mapping[str, bytes], without: str | None = None
) -> str:
    """The tree of `base` (a tree or commit, None for empty) without anything at or under the path `without`,
    with `files` (posix path -> content) added or replaced."""
    for path in files:
        if any(part in ("", ".", "..", ".git") for part in path.split("/")):
            raise KakeyaError(f"refusing to write {path!r} into a commit")
    shas = write_blobs(repo, list(files.values()))
    with tempfile.TemporaryDirectory(prefix="kakeya-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        run(repo, "read-tree", *([base] if base else ["--empty"]), env=env)
        gone = (
            run(repo, "ls-tree", "-r", "-z", "--name-only", base, "--", without).stdout
            if base and without
            else b""
        )
        info = b"".join(f"0 {'0' * 40}\t".encode() + path + b"\0" for path in gone.split(b"\0") if path)
        info += b"".join(
            f"{FILE_MODE} {sha}\t".encode() + path.encode() + b"\0"
            for path, sha in zip(files, shas, strict=True)
        )
        run(repo, "update-index", "--add", "--replace", "-z", "--index-info", input=info, env=env)
        return out(repo, "write-tree", env=env)


def commit(
    repo: Path | str, tree: str, parents: Sequence[str], message: str, who: str, sign_key: str | None = None
) -> str:
    """A commit object (no ref moves); `who` is 'Name <email>', used as author and committer; signed with the
    SSH key `sign_key` (a private key file) when given."""
    name, _, email = who.partition(" <")
    name, email = _clean(name) or "kakeya", _clean(email.rstrip(">")) or "kakeya@kakeya.invalid"
    date = f"{int(time.time())} +0000"
    env = {}
    for role in ("AUTHOR", "COMMITTER"):
        env.update({f"GIT_{role}_NAME": name, f"GIT_{role}_EMAIL": email, f"GIT_{role}_DATE": date})
    sign = [*ssh_signing(sign_key), "commit-tree", "-S"] if sign_key else ["commit-tree", "--no-gpg-sign"]
    argv = [*sign, tree, *(a for p in parents for a in ("-p", p))]
    try:
        return out(repo, *argv, input=(message.rstrip("\n") + "\n").encode(), env=env)
    except BusError as exc:
        if not sign_key:
            raise
        raise KakeyaError(
            f"cannot sign with the SSH key {sign_key} (signing_key / KAKEYA_SIGNING_KEY): {exc}"
        ) from None


def import_commits(
    repo: Path | str,
    base: str | None,
    commits: Sequence[tuple[Mapping[str, bytes], Sequence[str], str]],
    who: str,
) -> str:
    """A chain of commits on `base` (a commit, None: the first is a root), each (files: posix path -> content
    added or replaced on the tree before it, its other parents, its message), written with one `git
    fast-import`: it rewrites only the directories the files are in, where `tree_with` reads and writes the
    whole tree (an index of it), so a large tree costs what changes, not what it holds. The last commit's sha;
    no ref moves (a temporary one is deleted)."""
    name, _, email = who.partition(" <")
    ident = f"{_clean(name) or 'kakeya'} <{_clean(email.rstrip('>')) or 'kakeya@kakeya.invalid'}> {int(time.time())} +0000"
    ref = f"refs/kakeya-import/{os.getpid()}-{time.monotonic_ns()}"
    stream, blobs = [f"reset {ref}\n".encode()], {}
    for mark, (files, parents, message) in enumerate(commits, start=1):
        for path, data in files.items():
            if (
                any(part in ("", ".", "..", ".git") for part in path.split("/"))
                or path[0] == '"'
                or "\n" in path
            ):
                raise KakeyaError(f"refusing to write {path!r} into a commit")
            if data not in blobs:
                blobs[data] = f":{len(commits) + len(blobs) + 1}"
                stream.append(f"blob\nmark {blobs[data]}\ndata {len(data)}\n".encode() + data + b"\n")
        text = message.encode()
        first = f":{mark - 1}" if mark > 1 else base
        stream.append(
            f"commit {ref}\nmark :{mark}\nauthor {ident}\ncommitter {ident}\ndata {len(text)}\n".encode()
            + text
            + b"\n"
            + (f"from {first}\n".encode() if first else b"")
            + b"".join(f"merge {p}\n".encode() for p in parents)
            + b"".join(f"M {FILE_MODE} {blobs[d]} {p}\n".encode() for p, d in files.items())
            + b"\n"
        )
    run(repo, "fast-import", "--quiet", "--done", input=b"".join(stream) + b"done\n")
    sha = out(repo, "rev-parse", "--verify", ref)
    run(repo, "update-ref", "-d", ref, sha)
    return sha


def ssh_signing(key: str) -> list[str]:
    """`git -c` options that sign with the SSH key file `key` (no global config is written)."""
    return ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key}"]


def verify_commit(repo: Path | str, sha: str, allowed_signers: Path) -> tuple[bool, str, str, str]:
    """`git verify-commit` of `sha` against an allowed-signers file: (verified, git's signature code — G good,
    B bad, U/E a key that no principal matches, N none —, the principal, the key's fingerprint)."""
    cfg = ["-c", f"gpg.ssh.allowedSignersFile={Path(allowed_signers).resolve()}"]
    ok = run(repo, *cfg, "verify-commit", sha, check=False).returncode == 0
    code, principal, key = (
        out(repo, *cfg, "log", "-1", "--format=%G?%x00%GS%x00%GK", sha).split("\0") + ["", ""]
    )[:3]
    return ok and code == "G", code, principal, key


def first_parents(repo: Path | str, sha: str, stop: str, limit: int = 32) -> list[str]:
    """`sha` and its first-parent ancestors down to (not including) `stop`, newest first, at most `limit`."""
    return out(repo, "rev-list", "--first-parent", f"--max-count={limit}", sha, f"^{stop}", "--").split()


def _clean(text: str) -> str:
    return re.sub(r"[<>\n\r\0]", "", text).strip()


def child_commit(
    repo: Path | str,
    parent: str,
    files: Mapping[str, bytes],
    message: str,
    who: str,
    sign_key: str | None = None,
) -> str:
    """A commit on top of `parent` whose tree is the parent's plus `files` (signed with `sign_key`, if any)."""
    return commit(repo, tree_with(repo, parent, files), [parent], message, who, sign_key)


# --- refs and housekeeping in a local repository -----------------------------------------


def use_credential_store(repo: Path, path: Path) -> None:
    """`repo`'s git reads its credentials from the credential-store file `path` (never from an environment)."""
    if "'" in str(path):
        raise KakeyaError(
            f"credential file {path}: a path with a ' cannot be given to git's credential helper"
        )
    run(repo, "config", "credential.helper", f"store --file='{path}'")


def update_ref(repo: Path, ref: str, sha: str | None) -> None:
    """Point `ref` at `sha` (None deletes it)."""
    run(repo, "update-ref", *([ref, sha] if sha else ["-d", ref]))


def refs_under(repo: Path, prefix: str) -> dict[str, str]:
    """ref -> sha for every ref under `prefix`."""
    text = out(repo, "for-each-ref", "--format=%(refname) %(objectname)", prefix)
    return dict(line.split(" ", 1) for line in text.splitlines())


def export(repo: Path, sha: str, dest: Path) -> None:
    """The files of commit `sha` written into the new directory `dest`: a plain copy with no .git and no link
    back into `repo` (git's own checkout-index, which refuses unsafe paths, from a throwaway index)."""
    dest.mkdir(parents=True)
    with tempfile.TemporaryDirectory(prefix="kakeya-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        run(repo, "read-tree", sha, env=env)
        run(repo, f"--work-tree={dest}", "checkout-index", "--all", "--force", env=env)


def borrow_objects(repo: Path, objects: Path) -> None:
    """`repo` reads the objects of the object directory `objects` too (git's alternates), copying none."""
    info = repo / "objects" / "info"
    info.mkdir(parents=True, exist_ok=True)
    path = info / "alternates"
    if not path.is_file() or path.read_text().strip() != str(objects):
        path.write_text(f"{objects}\n")
        forget(repo)


def shallow_commits(git_dir: Path) -> list[str]:
    """The commits whose parents the repository at `git_dir` lacks (its `shallow` file)."""
    path = git_dir / "shallow"
    return path.read_text().split() if path.is_file() else []


def add_shallow(repo: Path, commits: Sequence[str]) -> None:
    """Mark `commits` as having no parents here (the bare repository `repo`'s `shallow` file)."""
    have = shallow_commits(repo)
    if new := sorted(set(commits) - set(have)):
        (repo / "shallow").write_text("".join(f"{c}\n" for c in [*have, *new]))


def gc_auto(repo: Path) -> None:
    run(repo, "gc", "--auto", "--quiet", check=False)
    forget(repo)  # its objects may be gone from where its reader had them
