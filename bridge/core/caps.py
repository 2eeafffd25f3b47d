"""What a runner may read and commit of what a run left: the one place that decides, for the collection of a
run's files, the caps, the progress and log readers, and the tree writer.

A run's directory is hostile: any name, any kind of file, any depth. Only regular files with one link, a
UTF-8 name without control characters, a bounded path and nesting, and within the caps are committed;
everything else is deleted from the run's directory (never followed, never read) and listed in result.json
(`dropped`, one line each with its reason), so that whatever a run leaves ends in one small done commit:

    symbolic links        could point at the runner's files (its key)
    hard links            st_nlink > 1: another name of a file that may be the runner's (its key)
    FIFOs, sockets, devices   reading one blocks or reads what is not the run's
    non-UTF-8 names, control or invisible characters, names git refuses (.git, git~1)   git, JSON, clients
    paths over MAX_PATH bytes, nesting over MAX_DEPTH   git, PATH_MAX and the gate's readers choke on them
    files over the caps   report_cap_bytes, files_cap_bytes, result_cap_bytes (config)
    entries past the count cap   files_count_cap (config): the walk stops looking past it, the rest is
                          dropped unread and said in one line

The walk looks at no more than the count cap of entries (the runner's own files, report.json and logs/ aside)
and only counts what lies past it, so a run that leaves 100,000 files costs one directory listing, not 100,000
reads and a tree of 100,000 entries on the bus.

Files are opened with O_NOFOLLOW|O_NONBLOCK, each directory of the path too, and checked with fstat on the
opened descriptor (a regular file with one link), and read capped: a name swapped for a FIFO or a link after
the walk is refused, never followed and never waited on.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bridge.core.errors import KakeyaError

RUNNER_FILES = (
    "result.json",
    "verdict.json",
    "summary.md",
    "report.html",
    "logs/stdout.log",
    "logs/stderr.log",
)
REPORT = "report.json"
MAX_DEPTH = 8  # directories below the run directory
MAX_PATH = 512  # bytes of a path relative to the run directory (git, PATH_MAX and Windows clients hold it)
MAX_NAME = 255  # bytes of one name
DROPPED_LINES = 100  # result.json lists at most this many dropped paths
COUNT_CAP = 5000  # files and directories a run may leave, by default (config: files_count_cap)
GIT_NAMES = (".git", "git~1", ".gitmodules")  # names git (fsck on the bus) refuses in a tree, any case

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0)


class Unsafe(KakeyaError):
    """A path the runner will not read: what it is and why."""


@dataclass
class Found:
    """A walk of a run's directory: its safe regular files and what is to be dropped, with the reason."""

    files: dict[str, int] = field(default_factory=dict)  # relative path -> size
    unsafe: dict[str, str] = field(default_factory=dict)  # relative path (as the OS names it) -> reason
    dirs: set[str] = field(default_factory=set)  # the directories walked (relative paths)
    limit: int | None = None  # the count cap: entries looked at, the runner's own aside
    seen: int = 0  # entries looked at, counted against `limit`
    over: int = 0  # entries past `limit`: not looked at (a directory among them counts as one)

    def over_line(self) -> list[str]:
        """The one line that says what the count cap dropped (none when nothing was past it)."""
        if not self.over:
            return []
        return [
            f"{self.over} more files and directories than the cap of {self.limit} a run may leave "
            "(files_count_cap): not looked at, not committed"
        ]


# Names the runner writes (or reads) at the top of a run's directory: walked first, never counted or capped.
OWN_TOP = frozenset({*(r.split("/")[0] for r in RUNNER_FILES), REPORT})


def shown(rel: str, limit: int = 160) -> str:
    """A path as one printable line: bytes that are not UTF-8 as \\xNN, control characters escaped, cut short."""
    text = os.fsencode(rel).decode("utf-8", "backslashreplace")
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def name_problem(name: str) -> str | None:
    """Why a file name cannot be committed, or None."""
    raw = os.fsencode(name)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return "its name is not UTF-8"
    if len(raw) > MAX_NAME:
        return f"its name is longer than {MAX_NAME} bytes"
    if not all(c.isprintable() or c == " " for c in text):
        return "its name has control or invisible characters"
    bare = text.lower().split(":")[0].rstrip(". ")  # as NTFS and HFS+ would see it (git's fsck checks both)
    if bare in GIT_NAMES or bare.startswith("gitmod~"):
        return "git refuses this name in a tree"
    return None


def kind_problem(mode: int, nlink: int) -> str | None:
    """Why a file of this mode and link count is never read, or None for a regular file with one link."""
    if stat.S_ISREG(mode):
        return None if nlink <= 1 else f"a hard link ({nlink} names of one file), not read"
    if stat.S_ISLNK(mode):
        return "a symbolic link, not followed"
    if stat.S_ISFIFO(mode):
        return "a FIFO, not read"
    if stat.S_ISSOCK(mode):
        return "a socket, not read"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device, not read"
    return "not a regular file"


def walk(root: Path, limit: int | None = None) -> Found:
    """Every entry under `root` (never following a link), sorted into safe files and what is to be dropped;
    with `limit`, at most that many entries are looked at (the runner's own files aside: OWN_TOP and the
    logs) and the rest only counted (`Found.over`)."""
    found = Found(limit=limit)
    try:
        top = os.open(root, _DIR)
    except FileNotFoundError:
        return found
    try:
        _walk(top, "", 0, found)
    finally:
        os.close(top)
    return found


def _walk(dfd: int, prefix: str, depth: int, found: Found) -> None:
    with os.scandir(dfd) as listing:
        entries = sorted(listing, key=lambda e: (e.name not in OWN_TOP if not prefix else True, e.name))
    for entry in entries:
        rel = prefix + entry.name
        own = (not prefix and entry.name in OWN_TOP) or rel in RUNNER_FILES
        if not own and found.limit is not None:
            if found.seen >= found.limit:
                found.over += 1
                continue
            found.seen += 1
        why = name_problem(entry.name)
        if why is None and len(os.fsencode(rel)) > MAX_PATH:
            why = f"its path is longer than {MAX_PATH} bytes"
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as exc:
            found.unsafe[rel] = why or f"cannot be read: {exc.strerror}"
            continue
        if stat.S_ISDIR(st.st_mode):
            if why is None and depth + 1 > MAX_DEPTH:
                why = f"nested deeper than {MAX_DEPTH} directories"
            if why is not None:
                found.unsafe[rel + "/"] = why
                continue
            try:
                sub = os.open(entry.name, _DIR, dir_fd=dfd)
            except OSError as exc:
                found.unsafe[rel + "/"] = f"cannot be read: {exc.strerror}"
                continue
            found.dirs.add(rel)
            try:
                _walk(sub, rel + "/", depth + 1, found)
            finally:
                os.close(sub)
            continue
        why = why or kind_problem(st.st_mode, st.st_nlink)
        if why is None:
            found.files[rel] = st.st_size
        else:
            found.unsafe[rel] = why


@contextlib.contextmanager
def open_regular(root: Path, rel: str) -> Iterator[int]:
    """A descriptor of `root/rel`, opened without following a link at any step of `rel` and without blocking,
    checked (fstat) to be a regular file with one link; Unsafe (or OSError) otherwise."""
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise Unsafe(f"{shown(rel)}: not a plain relative path")
    fd = os.open(root, _DIR)
    try:
        for part in parts[:-1]:
            sub = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = sub
        try:
            leaf = os.open(parts[-1], _FILE, dir_fd=fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise Unsafe(f"{shown(rel)}: a symbolic link, not followed") from None
            raise
    finally:
        os.close(fd)
    try:
        st = os.fstat(leaf)
        why = kind_problem(st.st_mode, st.st_nlink)
        if why:
            raise Unsafe(f"{shown(rel)}: {why}")
        yield leaf
    finally:
        os.close(leaf)


def read_capped(fd: int, cap: int) -> bytes:
    """Up to `cap` bytes from `fd`; Unsafe if there are more."""
    chunks, size = [], 0
    while size <= cap:
        chunk = os.read(fd, min(1 << 20, cap + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    if size > cap:
        raise Unsafe(f"more than {cap} bytes")
    return b"".join(chunks)


def read_file(root: Path, rel: str, cap: int) -> bytes:
    """The bytes of `root/rel` (a regular file with one link, at most `cap` bytes; see `open_regular`)."""
    with open_regular(root, rel) as fd:
        try:
            return read_capped(fd, cap)
        except Unsafe as exc:
            raise Unsafe(f"{shown(rel)}: {exc}") from None


def read_tree(root: Path, cap: int) -> dict[str, bytes]:
    """Every file under `root` (relative path -> bytes), at most `cap` bytes in all; Unsafe when anything there
    is not safe to commit (the caps have already removed all such things: something changed them since)."""
    found = walk(root)
    if found.unsafe:
        raise Unsafe("the run's files changed after they were checked: " + "; ".join(lines(found.unsafe)))
    total = sum(found.files.values())
    if total > cap:
        raise Unsafe(f"the run's files grew to {total} bytes after they were checked (cap {cap})")
    return {rel: read_file(root, rel, size) for rel, size in found.files.items()}


def lines(unsafe: dict[str, str]) -> list[str]:
    return [f"{shown(rel)}: {why}" for rel, why in unsafe.items()]


def remove(path: Path) -> None:
    """Delete a file or a whole directory tree (any depth, any names, links not followed); a directory a run
    made unreadable is opened up first. Errors other than 'already gone' are raised."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        path.unlink(missing_ok=True)
        return

    def retry(func: object, failed: str, _exc: object) -> None:
        open_up(os.path.dirname(failed) or ".")
        open_up(failed)
        if os.path.isdir(failed) and not os.path.islink(failed):
            shutil.rmtree(failed)
        elif os.path.lexists(failed):
            os.unlink(failed)

    shutil.rmtree(path, onerror=retry)


def open_up(path: str) -> None:
    """Make a directory a run left unreadable or unwritable ours to empty (0700): a directory only, never through
    a link (a run may have left one to a file of the runner's, whose mode must not change)."""
    try:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            return
        os.chmod(path, 0o700, follow_symlinks=False)  # Linux: fchmodat(AT_SYMLINK_NOFOLLOW), never a link
    except (OSError, NotImplementedError):
        pass


def prune(root: Path, found: Found) -> None:
    """Delete from `root` every entry `found` (a walk of it with a count cap) did not look at: all but its files
    and directories (links never followed)."""
    top = os.open(root, _DIR)
    try:
        extra = _unseen(top, "", found)
    finally:
        os.close(top)
    for rel in extra:
        remove(root / rel)


def _unseen(dfd: int, prefix: str, found: Found) -> list[str]:
    with os.scandir(dfd) as listing:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in listing]
    extra = []
    for name, is_dir in entries:
        rel = prefix + name
        if is_dir and rel in found.dirs:
            sub = os.open(name, _DIR, dir_fd=dfd)
            try:
                extra += _unseen(sub, rel + "/", found)
            finally:
                os.close(sub)
        elif rel not in found.files:  # past the cap (or unsafe: removed here as well, before it is listed)
            extra.append(rel)
    return extra


def atomic_write(path: Path, data: str | bytes) -> None:
    """Write `path` through a fresh temporary file (created, never opened through a link a run left there)."""
    tmp = path.with_name(path.name + ".tmp")
    remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data.encode() if isinstance(data, str) else data)
    tmp.replace(path)


def apply_caps(
    out_dir: Path,
    *,
    report_cap: int,
    files_cap: int,
    result_cap: int,
    count_cap: int = COUNT_CAP,
    log_cap: int | None = None,
) -> list[str]:
    """Delete what is unsafe or exceeds the caps from `out_dir`; one line per dropped path, for result.json
    (what was past the count cap first, in one line). A file at a runner's name larger than the runner writes
    (a log over `log_cap`: a run that writes in out_dir replaced it) is dropped too."""
    found = walk(out_dir, count_cap)
    if found.over:
        prune(out_dir, found)
    dropped = found.over_line()
    for rel in found.unsafe:
        remove(out_dir / rel.rstrip("/"))
    dropped += lines(found.unsafe)
    files = dict(found.files)

    def drop(rel: str, why: str) -> None:
        (out_dir / rel).unlink()
        dropped.append(f"{shown(rel)} ({files.pop(rel)} bytes): {why}")

    own_cap = result_cap if log_cap is None else log_cap + 4096  # the log's cut marker
    for rel in [r for r in RUNNER_FILES if files.get(r, 0) > own_cap]:
        drop(rel, f"larger than the runner writes it ({own_cap} bytes): not the runner's")
    if files.get(REPORT, 0) > report_cap:
        drop(REPORT, f"over the report cap of {report_cap} bytes")
    total = sum(size for rel, size in files.items() if rel in RUNNER_FILES or rel == REPORT)
    extra = 0
    for size, rel in sorted((s, r) for r, s in files.items() if r not in RUNNER_FILES and r != REPORT):
        if extra + size > files_cap:
            drop(rel, f"over the cap of {files_cap} bytes on the program's other files")
        elif total + size > result_cap:
            drop(rel, f"over the cap of {result_cap} bytes on the whole result")
        else:
            extra += size
            total += size
    if total > result_cap and REPORT in files:
        drop(REPORT, f"over the cap of {result_cap} bytes on the whole result")
    return dropped


def collect(run_dir: Path, out_dir: Path, cap: int, count_cap: int = COUNT_CAP) -> list[str]:
    """Copy what a program wrote in its own run directory into `out_dir`: safe regular files only (read through
    `open_regular`, at most `cap` bytes each), never over the runner's own files, at most `count_cap` entries
    looked at (the rest is left, unread, with the run's scratch); one line per path dropped."""
    found = walk(run_dir, count_cap)
    dropped = found.over_line() + lines(found.unsafe)
    for rel, size in found.files.items():
        if rel in RUNNER_FILES:
            dropped.append(f"{shown(rel)}: the runner writes this file itself")
            continue
        if size > cap:
            dropped.append(f"{shown(rel)} ({size} bytes): over the cap of {cap} bytes on the whole result")
            continue
        try:
            data = read_file(run_dir, rel, cap)
        except (Unsafe, OSError) as exc:
            dropped.append(f"{shown(rel)}: {exc}")
            continue
        dest = out_dir / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        remove(dest)
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
    return dropped
