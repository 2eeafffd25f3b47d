"""The run launcher: the parent of every process a run starts, and their end.

    python -I bridge/run/launcher.py --status-fd FD --lifeline FD [--uid U --gid G]
        [--memory BYTES] [--processes N] [--file BYTES] -- ARGV...

It becomes a child subreaper (Linux `prctl(PR_SET_CHILD_SUBREAPER)`), so processes that call setsid and
whose parent exits re-parent to it instead of to init; it asks for SIGTERM when the runner dies
(`PR_SET_PDEATHSIG`) and also watches a pipe whose write end only the runner holds (EOF = the runner is
gone, on any platform). It starts ARGV in a new session (as uid/gid U/G when given: the runner's identity
stays out of the workload's reach), waits for it, and when it exits (or at SIGTERM: the time limit, a
cancel, the runner's death) kills every process left below it and reaps them. The status pipe FD (only the
runner reads it: no file the run could replace with a FIFO or a link) gets
{"exit_code": the program's returncode (negative: killed by that signal), "strays": processes killed
that were not the program, "subreaper": bool, "start_error": why ARGV could not start, or null, "limits":
the limits it set (memory and file in bytes, processes), "limit": "memory", "processes" or "file" when the
run reached that limit, or null, "why": what showed it (a signal, a refused allocation or write, the count of
tasks)}.

How a limit is known, from what the launcher itself sees (never from a file the run could write): memory, the
program died of SIGKILL it was not sent by the launcher while the kernel's OOM kill count (/proc/vmstat
oom_kill) rose, or it failed and the last lines it wrote to stderr (which passes through the launcher, and
on, unchanged) end in a refused allocation (Python's MemoryError, C++'s std::bad_alloc, ENOMEM); file, it
died of SIGXFSZ or failed after a write refused with EFBIG; processes, its user's tasks reached the limit.

Limits (bridge/run/isolation.py's `run_limits`), set on the program before it starts and inherited by all it
starts: --memory is each process's RLIMIT_DATA (its heap and private mappings; not RLIMIT_AS, which
accelerator runtimes exhaust by reserving address space), --processes RLIMIT_NPROC (the tasks, threads
included, of the program's user: given only where that user is the run's own), --file RLIMIT_FSIZE (the
largest file it may write: SIGXFSZ past it). The program's oom_score_adj is 1000: at a shortage of memory
the kernel's OOM killer takes the run's processes before the runner's.

On macOS there is no subreaper: processes that left the tree (setsid and an exited parent) are out of
reach; the lifeline and the tree walk still end everything that stayed below the launcher.

Standard library only, and run with `python -I` by path: the subject's PYTHONPATH never reaches it.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
GRACE_S = 2.0
TAIL = 8192  # bytes of the program's stderr kept to read a refused allocation or write in
# The last lines of a program whose allocation or write an rlimit refused (Python, libc's strerror, C++).
LIMIT_SIGNS = {
    "memory": (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc", b"[Errno 12]"),
    "file": (b"File too large", b"[Errno 27]"),
}


def children_map() -> dict[int, list[int]]:
    """ppid -> pids, from /proc (Linux) or `ps` (macOS)."""
    children: dict[int, list[int]] = {}
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    else:
        text = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
        for line in text.splitlines():
            pid, ppid = (int(x) for x in line.split())
            children.setdefault(ppid, []).append(pid)
    return children


def descendants(pid: int) -> list[int]:
    children, out, todo = children_map(), [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _prctl(option: int, value: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(option, value, 0, 0, 0) == 0


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _reap(codes: dict[int, int], keep: int | None = None) -> None:
    """Collect every exited child (ours, and orphans re-parented to us); `keep`: a pid left a zombie, and the
    reaping stopped at it, until its caller has looked at it (Linux: `waitid` peeks first)."""
    while True:
        try:
            if keep is not None:
                peek = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                if peek is None or peek.si_pid == keep:
                    return
            pid, status = os.waitpid(-1 if keep is None else peek.si_pid, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        codes[pid] = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def end_everything(codes: dict[int, int]) -> set[int]:
    """SIGTERM everything below us, then SIGKILL what is left, until nothing is; the pids seen."""
    seen: set[int] = set()
    deadline = time.monotonic() + GRACE_S
    sig = signal.SIGTERM
    while True:
        _reap(codes)
        alive = [p for p in descendants(os.getpid()) if p not in codes]
        if not alive:
            return seen
        seen.update(alive)
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        _signal_all(alive, sig)
        time.sleep(0.05)


RLIMITS = {"memory": resource.RLIMIT_DATA, "processes": resource.RLIMIT_NPROC, "file": resource.RLIMIT_FSIZE}


def limits_to_set(opts: dict[str, str]) -> dict[str, int]:
    """The rlimits the program gets: each asked for, at most this process's hard limit (which it inherits)."""
    out: dict[str, int] = {}
    for name, res in RLIMITS.items():
        if (value := opts.get(f"--{name}")) is not None:
            hard = resource.getrlimit(res)[1]
            out[name] = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
    return out


def _limiter(limits: dict[str, int]) -> object:
    """What the program's process runs before exec: the rlimits asked for, and first in line for the OOM killer."""

    def apply() -> None:
        for name, limit in limits.items():
            try:
                resource.setrlimit(RLIMITS[name], (limit, limit))
            except (OSError, ValueError):  # a limit this platform refuses (macOS's RLIMIT_DATA): not set
                pass
        try:
            with open("/proc/self/oom_score_adj", "w") as fh:
                fh.write("1000")
        except OSError:
            pass

    return apply


def tasks_of(uid: int) -> int:
    """How many tasks (threads included) of real uid `uid` this /proc shows: what RLIMIT_NPROC counts."""
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            real = int(status.split("\nUid:", 1)[1].split()[0])
            if real == uid:
                count += int(status.split("\nThreads:", 1)[1].split()[0])
        except (OSError, IndexError, ValueError):
            continue
    return count


def oom_kills() -> int | None:
    """The kernel's count of OOM kills since boot (/proc/vmstat oom_kill, Linux 4.13+), None where unknown."""
    try:
        for line in Path("/proc/vmstat").read_text().splitlines():
            if line.startswith("oom_kill "):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class StderrTail:
    """The program's stderr, passed on to ours unchanged as it comes, its last TAIL bytes kept."""

    def __init__(self, fd: int):
        self.fd, self.tail = fd, b""
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        while chunk := os.read(self.fd, 65536):
            self.tail = (self.tail + chunk)[-TAIL:]
            view = memoryview(chunk)
            while view:
                try:
                    view = view[os.write(2, view) :]
                except OSError:  # nobody reads ours any more: keep reading, so the program never blocks
                    break
        os.close(self.fd)

    def refused(self) -> str | None:
        """The limit the program's last stderr lines say refused it (memory or file), or None."""
        self.thread.join(timeout=2)
        last = b"\n".join(self.tail.splitlines()[-5:])
        return next((k for k, signs in LIMIT_SIGNS.items() if any(s in last for s in signs)), None)


def reached(
    exit_code: int | None,
    signalled: bool,
    oom: tuple[int | None, int | None],
    tail: StderrTail | None,
    limits: dict[str, int],
) -> tuple[str, str] | None:
    """Which limit the program reached and what showed it, by how it ended (not by the processes count)."""
    if exit_code in (0, None):
        return None
    if exit_code == -signal.SIGXFSZ and "file" in limits:
        return "file", "it was killed by SIGXFSZ"
    before, after = oom
    if (
        exit_code == -signal.SIGKILL
        and not signalled
        and before is not None
        and after is not None
        and after > before
    ):
        return "memory", "it was killed by SIGKILL as the kernel's OOM killer ran"
    said = tail.refused() if tail is not None else None
    if said is not None and said in limits:
        sign = "an allocation was refused" if said == "memory" else "a write was refused (EFBIG)"
        return said, f"it exited with code {exit_code} after {sign}"
    return None


def watch(
    child: subprocess.Popen[bytes], codes: dict[int, int], limits: dict[str, int], uid: int, lifeline: int,
    stop: list[bool],
) -> tuple[str, str] | None:  # fmt: skip
    """Wait for the program's end (or the runner's, or a signal), reaping as it goes; the process limit, with
    what showed it, when its user's tasks reached it (counted every 0.2 s and at the program's end)."""
    limit: tuple[str, str] | None = None
    next_count = 0.0
    counting = "processes" in limits and Path("/proc").is_dir()
    while not stop[0]:
        ended = False
        if counting:
            try:  # has the program exited? (not reaped: while a zombie it still counts, as the kernel counts)
                ended = os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
            except ChildProcessError:
                ended = False
            if limit is None and (ended or time.monotonic() >= next_count):
                next_count = time.monotonic() + 0.2
                if (n := tasks_of(uid)) >= limits["processes"]:  # a fork failed or would: at its limit
                    limit = ("processes", f"its user had {n} tasks")
        # the program is reaped only once counted after its end: one that ended between the look above and
        # the reaping would otherwise go uncounted (its children then fewer than the limit)
        _reap(codes, keep=child.pid if counting and not ended else None)
        if child.pid in codes:
            break
        if lifeline >= 0:
            ready, _, _ = select.select([lifeline], [], [], 0.05)
            if ready and not os.read(lifeline, 1):
                break  # the runner is gone
        else:
            time.sleep(0.05)
    return limit


def main(argv: list[str]) -> int:
    args = argv[1:]
    opts: dict[str, str] = {}
    while args and args[0] != "--":
        opts[args[0]], args = args[1], args[2:]
    command = args[1:]
    lifeline = int(opts.get("--lifeline", "-1"))
    parent = os.getppid()
    subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    stop = [os.getppid() != parent]  # the runner died before we could ask to be told

    def on_signal(_signum: int, _frame: object) -> None:
        stop[0] = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    user: dict = {}
    if "--uid" in opts:
        user = {"user": int(opts["--uid"]), "group": int(opts["--gid"]), "extra_groups": []}
    codes: dict[int, int] = {}
    exit_code: int | None = None
    start_error: str | None = None
    limits = limits_to_set(opts)
    uid = int(opts["--uid"]) if "--uid" in opts else os.getuid()
    oom_before = oom_kills()
    err_r, err_w = os.pipe()
    try:
        child = subprocess.Popen(
            command, start_new_session=True, pass_fds=(), preexec_fn=_limiter(limits), stderr=err_w, **user
        )
    except OSError as exc:
        child, exit_code, start_error = None, 127, str(exc)
    os.close(err_w)
    tail = StderrTail(err_r)
    limit = watch(child, codes, limits, uid, lifeline, stop) if child is not None else None
    strays = 0
    if child is not None:
        signalled = child.pid not in codes  # still running: the launcher ends it (time limit, cancel)
        killed = end_everything(codes)
        _reap(codes)
        exit_code = codes.get(child.pid)
        strays = len(killed - {child.pid})
        limit = limit or reached(exit_code, signalled, (oom_before, oom_kills()), tail, limits)
    word = {
        "exit_code": exit_code,
        "strays": strays,
        "subreaper": subreaper,
        "start_error": start_error,
        "limits": limits,
        "limit": limit[0] if limit else None,
        "why": limit[1] if limit else None,
    }
    try:
        os.write(int(opts["--status-fd"]), json.dumps(word).encode())  # a few hundred bytes: at once
    except OSError:  # the runner is gone (EPIPE): nobody to tell
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
