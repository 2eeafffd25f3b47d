"""Helpers for the bus tests: a project with a test program, test presets, `git daemon` (fixtures: conftest.py).

The test program (work.py, committed in the project, so it is what the subject runs) appends its tag
to $COUNTER — the side effect that counts executions — and writes a valid probe report.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

from bridge.bus.bus import Bus
from bridge.bus.records import (
    MANIFEST_PATH,
    SUBJECT_PREFIX,
    Manifest,
    Update,
    done_ref,
    req_ref,
    results_path,
    subject_ref,
    utcnow,
)
from bridge.client.client import Client
from bridge.config import load_config
from bridge.run.runner import Runner
from bridge.wire import git as G

# Included at the top of the test programs: writes a valid probe report to $KAKEYA_REPORT.
WRITE_REPORT_PY = textwrap.dedent("""
    import json, os

    def write_report(cpu_count=1, memory_bytes=None):
        env = {"python": "3", "os": "test", "machine": "x", "hostname": "h", "cpu_count": 1, "memory_bytes": None,
               "versions": {"python": "3"}}
        report = {"kind": "probe", "schema_version": 1, "created_at": "2026-01-01T00:00:00+00:00",
                  "environment": env, "subject": os.environ.get("KAKEYA_SUBJECT"),
                  "probe": {"python": "3", "os": "test", "cpu_count": cpu_count, "memory_bytes": memory_bytes,
                            "packages": {"torch": None, "transformers": None, "mlx": None, "mlx_lm": None},
                            "accelerators": {"cuda": {"available": False, "devices": []}, "mps": {"available": False},
                                             "metal": {"available": False}},
                            "mlx_default_device": None}}
        with open(os.environ["KAKEYA_REPORT"], "w") as fh:
            json.dump(report, fh)
""")

# For test programs that leave processes behind: `detach()` forks a process in a session of its own whose
# parent exits (no longer a descendant of the run), stdio on /dev/null; True in it, False in the caller.
DETACH_PY = textwrap.dedent("""
    import os

    def detach():
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(devnull, fd)
                return True
            os._exit(0)
        os.wait()
        return False
""")

WORK_PY = WRITE_REPORT_PY + textwrap.dedent("""
    import sys, time

    mode, tag, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    marks = os.environ["MARKS"]
    outside = os.path.isdir(marks)  # the test's files; a sandbox (isolation bwrap) shows none of them

    def mark(name, text=""):
        if outside:
            with open(os.path.join(marks, f"{tag}.{name}"), "w") as fh:
                fh.write(text)

    if mode == "once" and os.path.exists(os.path.join(marks, f"{tag}.first")):
        seconds = 0  # a second attempt (after a takeover) finishes at once
    elif mode == "once":
        mark("first", str(os.getpid()))
    mark("started", f"{os.getpid()} {time.time()!r}")
    if mode in ("sleep", "once"):
        time.sleep(seconds)
    if outside:
        with open(os.environ["COUNTER"], "a") as fh:
            fh.write(tag + "\\n")
    write_report()
    print(f"work {mode} {tag} done")
""")

_WORK = {
    "description": "test program",
    "timeout_s": 60,
    "argv": ["{python}", "work.py", "{mode}", "{tag}", "{seconds}"],
    "params": {
        "mode": {"type": "enum", "choices": ["count", "sleep", "once"], "default": "count"},
        "tag": {"type": "str", "pattern": "[a-z0-9-]+", "max_length": 40, "default": "x"},
        "seconds": {"type": "float", "min": 0, "max": 120, "default": 0},
    },
    # a run's label in the tests: evidence at any tag (mode and seconds: the defaults only)
    "verdict_free": ["tag"],
    "env": {"COUNTER": "${ENV:KAKEYA_TEST_COUNTER}", "MARKS": "${ENV:KAKEYA_TEST_MARKS}"},
    "report": {"kind": "probe", "schema_version": 1},
}
PRESETS = {
    "work": {
        **_WORK,
        "runners": ["cpu", "gpu"],
        "gate": [{"check": "min", "path": "/probe/cpu_count", "value": 1}],
    },
    "strict": {
        **_WORK,
        "runners": ["cpu"],
        "gate": [{"check": "min", "path": "/probe/cpu_count", "value": 4096}],
    },
    "cpuonly": {**_WORK, "runners": ["cpu"]},
}


def probe_preset(name: str, description: str, argv: list[str], **more: object) -> dict:
    """A test preset that runs `argv` on cpu, 60 s at most, and writes a probe report; `more`: its other
    fields (params, env, gate) or different ones (timeout_s, runners)."""
    return {
        "name": name,
        "description": description,
        "runners": ["cpu"],
        "timeout_s": 60,
        "argv": argv,
        "report": {"kind": "probe", "schema_version": 1},
        **more,
    }


def script_preset(name: str, description: str, script: str, param: str, spec: dict, **more: object) -> dict:
    """A `probe_preset` that runs `{python} SCRIPT {PARAM}` (one parameter, `spec`)."""
    return probe_preset(
        name, description, ["{python}", script, "{" + param + "}"], params={param: spec}, **more
    )


def client(url: str) -> Client:
    """A client of the bus at `url`, with the test world's config (its presets, fast polls)."""
    return Client(load_config(), remote=url)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


class Env:
    """Paths of one test's world."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.project = tmp / "project"
        self.presets = tmp / "presets"
        self.counter = tmp / "counter.txt"
        self.marks = tmp / "marks"

    def count(self) -> list[str]:
        return self.counter.read_text().split() if self.counter.exists() else []

    def mark(self, tag: str, name: str) -> Path:
        return self.marks / f"{tag}.{name}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """`git daemon` on 127.0.0.1 serving bare repositories under `base`; counts connections from its log."""

    def __init__(self, base: Path):
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.log = base.parent / "daemon.log"
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def repo(self, name: str = "bus.git") -> str:
        G.init_bare(self.base / name)
        return f"git://127.0.0.1:{self.port}/{name}"

    def start(self) -> Daemon:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    "git",
                    "daemon",
                    "--reuseaddr",
                    "--export-all",
                    "--enable=receive-pack",
                    "--informative-errors",
                    "--verbose",
                    f"--base-path={self.base}",
                    "--listen=127.0.0.1",
                    f"--port={self.port}",
                    "--max-connections=64",
                    str(self.base),
                ],
                stderr=log,
                stdout=log,
            )
        wait_for(self._accepts, 20, "git daemon to listen")
        return self

    def _accepts(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            return True
        except OSError:
            return False

    def connections(self) -> int:
        return self.log.read_text(errors="replace").count("Connection from")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


class FakeServer:
    """A socket on 127.0.0.1 that answers each connection with `answer(conn)`: a git daemon gone wrong."""

    def __init__(self, answer: Callable[[socket.socket], None]):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.answer = answer
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                try:
                    self.answer(conn)
                except OSError:
                    pass

    def close(self) -> None:
        """Stop accepting (a shutdown wakes the accept; a close alone would leave it waiting on a descriptor
        that the next socket of the process may reuse), then close."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(10)
        self.sock.close()


class _Server(http.server.ThreadingHTTPServer):
    # no SO_REUSEADDR: port 0 then never hands out a port that a lingering connection of an earlier test holds
    allow_reuse_address = False
    request_queue_size = 64


class HttpGit:
    """`git http-backend` (smart HTTP) behind a small threaded HTTP server on 127.0.0.1, serving the bare
    repositories under `base` with push enabled; `v2=False` drops the client's Git-Protocol header, as a server
    that speaks only protocol v0 does. Counts the requests it answered (`requests`)."""

    def __init__(self, base: Path, v2: bool = True):
        self.base, self.v2, self.requests = base, v2, 0
        base.mkdir(parents=True, exist_ok=True)
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def repo(self, name: str = "bus.git", port: int | None = None) -> str:
        G.init_bare(self.base / name)
        G.run(self.base / name, "config", "http.receivepack", "true")
        return f"http://127.0.0.1:{port or self.port}/{name}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                self._cgi(b"")

            def do_POST(self) -> None:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    body = b""
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        body += self.rfile.read(size)
                        self.rfile.readline()
                    self.rfile.readline()
                else:
                    body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._cgi(body)

            def _cgi(self, body: bytes) -> None:
                outer.requests += 1
                path, _, query = self.path.partition("?")
                env = {
                    **{k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
                    "GIT_PROJECT_ROOT": str(outer.base),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "REQUEST_METHOD": self.command,
                    "PATH_INFO": path,
                    "QUERY_STRING": query,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "REMOTE_ADDR": "127.0.0.1",
                    "HTTP_CONTENT_ENCODING": self.headers.get("Content-Encoding", ""),
                }
                if outer.v2 and self.headers.get("Git-Protocol"):
                    env["GIT_PROTOCOL"] = self.headers["Git-Protocol"]
                proc = subprocess.run(["git", "http-backend"], input=body, capture_output=True, env=env)
                head, _, content = proc.stdout.partition(b"\r\n\r\n")
                status, headers = 200, []
                for line in head.decode(errors="replace").splitlines():
                    name, _, value = line.partition(":")
                    if name.lower() == "status":
                        status = int(value.split()[0])
                    elif name:
                        headers.append((name, value.strip()))
                self.send_response(status)
                for name, value in headers:
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(content)))
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(content)

        return Handler


def wait_for(cond: Callable[[], object], timeout: float, what: str, step: float = 0.05) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def make_runner(url: str, env: Env, name: str = "r1", labels: tuple[str, ...] = ("cpu",)) -> Runner:
    """An in-process runner for the bus at `url`, working in <tmp>/runners/<name>."""
    return Runner(
        url, config=load_config(), name=name, labels=list(labels), workdir=env.tmp / "runners" / name
    )


def runner_process(env: Env, url: str, name: str, *args: str, mode: str = "watch") -> subprocess.Popen[bytes]:
    """`kakeya runner MODE` as its own process (cwd = the project; output to <tmp>/<name>.log)."""
    log = (env.tmp / f"{name}.log").open("ab")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bridge.cli",
            "runner",
            mode,
            "--labels",
            "cpu",
            "--name",
            name,
            "--remote",
            url,
            *args,
        ],
        cwd=env.project,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    return proc.wait(timeout)


def pid_alive(pid: int) -> bool:
    """Is `pid` a live process (not gone, not a zombie)? /proc on Linux, `ps` elsewhere (macOS)."""
    if Path("/proc").is_dir():
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):  # gone before, or while, /proc was read
            return False
    else:
        state = subprocess.run(
            ["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True
        ).stdout.strip()
        if not state:
            return False
    return not state.startswith("Z")


def processes_with(token: str) -> list[int]:
    """The pids of the processes whose command line holds `token` (Linux /proc; none elsewhere)."""
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        try:
            if entry.name.isdigit() and token.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone while /proc was read
            continue
    return found


def kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def done_result(store: Path, url: str, request_id: str) -> dict:
    """result.json of a done commit, fetched into `store`."""
    bus = Bus(url, store)
    sha = bus.ls_remote(done_ref(request_id)).refs[done_ref(request_id)]
    bus.fetch([done_ref(request_id)])
    raw = G.read_path(store, sha, f"{results_path(request_id)}/result.json")
    assert raw is not None
    return json.loads(raw)


def push_raw_request(
    url: str, store: Path, label: str, request_id: str, manifest: bytes | dict, parent: str | None = None
) -> str:
    """A request commit with any manifest at all (as a misbehaving client would push it)."""
    data = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
    parent = parent or G.rev_parse(store, "HEAD") or ""
    sha = G.child_commit(store, parent, {MANIFEST_PATH: data}, "raw request", "Test <t@example.com>")
    assert Bus(url, store).swap([Update(req_ref(label, request_id), sha, None)], atomic=False)
    return sha


def manifest_dict(
    request_id: str,
    preset: str,
    subject: str,
    label: str = "cpu",
    params: dict | None = None,
    ttl_s: float = 3600,
) -> dict:
    now = utcnow()
    return Manifest(
        id=request_id,
        preset=preset,
        params=params or {},
        subject=subject,
        runner=label,
        requester="test",
        created_at=now,
        expires_at=now + dt.timedelta(seconds=ttl_s),
        nonce="n",
    ).model_dump(mode="json")


def move_done(
    url: str, store: Path, request_id: str, sha: str | None, subjects: tuple[str, ...] = ()
) -> None:
    """Point the done ref of `request_id` and every index ref of it at `sha` (None deletes them), and index it
    under `subjects` too, as anyone with push access to the bus could."""
    bus = Bus(url, store)
    snap = bus.ls_remote(done_ref(request_id), SUBJECT_PREFIX)
    refs = {ref: old for ref, old in snap.refs.items() if ref.endswith("/" + request_id)}
    wanted = set(refs) | {done_ref(request_id)} | {subject_ref(s, request_id) for s in subjects}
    updates = [Update(ref, sha, refs.get(ref)) for ref in sorted(wanted) if refs.get(ref) != sha]
    assert not updates or bus.swap(updates, atomic=False)
