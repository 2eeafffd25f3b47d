"""Issue 33 item 5, operations: a runner whose own output goes away (EPIPE), progress on a TTY and not,
doctor on an embedded bus, an unsigned request refused up front (real bus, real runner processes)."""

from __future__ import annotations

import fcntl
import io
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import textwrap
import threading
from pathlib import Path

import yaml

from bridge.bus.bus import Bus
from bridge.bus.presence import PRESENCE_PATH, read_presences
from bridge.bus.progress import View, say
from bridge.bus.records import DONE_PREFIX, REQ_PREFIX, RUNNERS_PREFIX, SUBJECT_PREFIX, done_ref
from bridge.cli.commands._common import line as wait_line
from bridge.cli.main import main
from bridge.client.client import Client
from bridge.config import load_config
from bridge.run.runner import Runner
from bridge.wire import git as G
from tests.bridge.bus_support import (
    WRITE_REPORT_PY,
    Daemon,
    Env,
    done_result,
    git,
    make_runner,
    runner_process,
    script_preset,
    stop,
    wait_for,
)
from tests.bridge.test_signing import allow, keygen


def piped_runner(
    world: Env, url: str, name: str, reader: list[str]
) -> tuple[subprocess.Popen, subprocess.Popen]:
    """`kakeya runner watch 2>&1 | READER` as two real processes (the runner's stdout and stderr: the pipe)."""
    argv = [sys.executable, "-m", "bridge.cli", "runner", "watch", "--labels", "cpu", "--name", name]
    runner = subprocess.Popen(
        [*argv, "--remote", url, "--poll", "0.2"],
        cwd=world.project,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        # Ctrl-C as at a terminal, even when the tests run as a background job (SIGINT inherited ignored)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert runner.stdout is not None
    other = subprocess.Popen(reader, stdin=runner.stdout, stdout=subprocess.DEVNULL)
    runner.stdout.close()  # the reader holds the only read end: when it ends, the runner's writes fail
    return runner, other


def is_done(url: str, world: Env, rid: str) -> bool:
    return bool(Bus(url, world.project).ls_remote(done_ref(rid)).refs)


def left_refs(url: str, world: Env) -> list[str]:
    """Refs other than done, index and presence refs: a claim, a request, a stage ref left behind."""
    refs = Bus(url, world.project).ls_remote().refs
    return [r for r in refs if not r.startswith((DONE_PREFIX, SUBJECT_PREFIX, "refs/kakeya/runners/"))]


def test_a_runner_whose_reader_left_serves_on(world: Env, daemon: Daemon):
    """`runner watch 2>&1 | head -1`: every log line after the first hits EPIPE, from the first claim on. The
    runner ran each request as if it were heard (was: exit 141 before claiming, its presence left live)."""
    url = daemon.repo()
    client = Client(load_config(), remote=url)
    first = client.request("work", {"tag": "a", "mode": "sleep", "seconds": "1"}, "cpu").id
    runner, head = piped_runner(world, url, "p", ["head", "-1"])
    try:
        assert head.wait(30) == 0
        wait_for(lambda: is_done(url, world, first), 60, "the first request done")
        second = client.request("work", {"tag": "b"}, "cpu").id
        wait_for(lambda: is_done(url, world, second), 60, "the second request done")
    finally:
        code = stop(runner)
    assert code == 0  # SIGTERM: a service stop
    for rid in (first, second):
        result = done_result(world.project, url, rid)
        assert (result["status"], result["verdict"], result["reason"]) == ("succeeded", "pass", None)
    assert sorted(world.count()) == ["a", "b"] and left_refs(url, world) == []
    bus = Bus(url, world.project)
    assert [s.presence.state for s in read_presences(bus, bus.ls_remote().runners) if s.presence] == [
        "stopped"
    ]


def test_ctrl_c_on_runner_watch_piped_to_tee_finishes_the_run(world: Env, daemon: Daemon):
    """`runner watch 2>&1 | tee log`, Ctrl-C mid-run (the terminal signals both): tee is gone when the runner
    says it is stopping. The run finishes and is recorded as it ended (was: `error: Broken pipe`)."""
    url = daemon.repo()
    client = Client(load_config(), remote=url)
    rid = client.request("work", {"tag": "a", "mode": "sleep", "seconds": "2"}, "cpu").id
    runner, tee = piped_runner(world, url, "t", ["tee", str(world.tmp / "log")])
    try:
        wait_for(lambda: world.mark("a", "started").exists(), 60, "the run")
        tee.send_signal(signal.SIGINT)
        assert tee.wait(10) != 0
        runner.send_signal(signal.SIGINT)
        code = runner.wait(60)
    finally:
        stop(runner)
    result = done_result(world.project, url, rid)
    assert (result["status"], result["verdict"], result["reason"]) == ("succeeded", "pass", None)
    assert code == 130  # stopped by Ctrl-C, after the request it held was done
    assert world.count() == ["a"] and left_refs(url, world) == []
    assert f"{rid}: running work" in (world.tmp / "log").read_text()  # what tee got before it left


# Counts to N like a real workload: KAKEYA_PROGRESS with long words, its own tqdm-style bar on stderr (\r
# frames, as tqdm writes to a file) and a long line on stdout at each step.
BARS_PY = WRITE_REPORT_PY + textwrap.dedent("""
    import sys, time

    n = int(sys.argv[1])
    for i in range(n):
        time.sleep(0.7)
        with open(os.environ["KAKEYA_PROGRESS"] + ".tmp", "w") as fh:
            json.dump({"done": i + 1, "total": n, "what": f"rung {i + 1} of {n} " + "w" * 150}, fh)
        os.replace(os.environ["KAKEYA_PROGRESS"] + ".tmp", os.environ["KAKEYA_PROGRESS"])
        print(f"line {i + 1} " + "x" * 300, flush=True)
        filled = "#" * (10 * (i + 1) // n)
        sys.stderr.write(f"\\rrungs: {100 * (i + 1) // n:3d}%|{filled:<10}| {i + 1}/{n} [00:0{i}<00:01, 1.4it/s]")
        sys.stderr.flush()
    write_report()
""")
BARS = script_preset(
    "bars",
    "counts, telling its progress three ways",
    "bars.py",
    "n",
    {"type": "int", "min": 1, "max": 20, "default": 5},
)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def pty_process(argv: list[str], cwd: Path, columns: int) -> tuple[subprocess.Popen, int]:
    """`argv` with its stdout and stderr on a terminal `columns` wide (a pty); returns it and the master fd."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    proc = subprocess.Popen(argv, cwd=cwd, stdout=slave, stderr=slave, env={**env, "TERM": "xterm"})
    os.close(slave)
    return proc, master


def read_all(fd: int) -> str:
    chunks = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def test_progress_is_one_bar_on_a_terminal_and_short_plain_lines_elsewhere(world: Env, daemon: Daemon):
    (world.presets / "bars.yaml").write_text(yaml.safe_dump(BARS))
    (world.project / "bars.py").write_text(BARS_PY)
    git(world.project, "add", "-A")
    git(world.project, "commit", "-q", "-m", "bars")
    url = daemon.repo()
    rid = Client(load_config(), remote=url).request("bars", {"n": 6}, "cpu").id
    wait = [sys.executable, "-m", "bridge.cli", "wait", rid, "--remote", url]
    term, master = pty_process([*wait, "--out", "tty-out"], world.project, 80)
    screen: list[str] = []
    reader = threading.Thread(target=lambda: screen.append(read_all(master)), daemon=True)
    reader.start()
    plain = subprocess.Popen(
        [*wait, "--out", "plain-out"],
        cwd=world.project,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "COLUMNS": "100"},
    )
    runner = runner_process(world, url, "r1", "--poll", "0.2", "--lease", "3")
    try:
        lines = plain.communicate(timeout=90)[0].splitlines()
        assert plain.returncode == 0 and term.wait(30) == 0
    finally:
        stop(runner)
    reader.join(10)
    # plain: a line per heartbeat, our bar, never the workload's own, never past the width
    progress = [ln for ln in lines if " running " in ln]
    assert len(progress) >= 3 and all(len(ln) <= 100 for ln in progress), progress
    assert all(re.search(r" running  \[#+-*\] (\d)/6 rung \1 of 6 w+\u2026$", ln) for ln in progress[1:]), (
        progress
    )
    assert not any("%|" in ln for ln in lines)  # tqdm's bar from the log tail
    assert lines[-1].startswith("summary: ")
    # terminal: one bar redrawn in place; no log echo; nothing past 80 columns
    out = ANSI.sub("", screen[0])
    rows = [r for r in re.split(r"[\r\n]", out) if "elapsed" in r]  # each drawing of the bar
    assert rows and all(len(r) <= 80 for r in rows), [r for r in rows if len(r) > 80]
    assert "\u2501" in out and "rung " in out and "elapsed" in out  # rich's bar, the workload's words
    assert "line 1 xxx" not in out and "%|" not in out and "stdout:" not in out
    bars = [r for r in out.split("\n") if "\u2501" in r]  # each redraw is on the same row: no new line
    assert len(bars) == 1, bars
    assert "done: " in out and f"{rid}: bars succeeded, verdict pass" in out


def test_doctor_says_the_embedded_bus_has_no_runner_and_how_to_share_one(world: Env, monkeypatch, capsys):
    monkeypatch.setattr("bridge.cli.commands.doctor.check_engine", lambda: "not checked here")

    def runners_line() -> str:
        main(["doctor"])
        return next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("ok    runners "))

    line = runners_line()
    assert "the bus is the embedded one" in line and "no runner can see it" in line
    assert "kakeya runner watch --remote URL" in line and "KAKEYA_REMOTE" in line
    runner = make_runner(str(world.project / ".kakeya" / "bus.git"), world, "here")
    runner.start_presence()  # a runner of this project on this host: it does see the embedded bus
    try:
        wait_for(lambda: runner.presence.beacon and runner.presence.beacon.sha, 20, "the presence")
        line = runners_line()
    finally:
        runner.stop_presence()
    assert "1 live runner(s): here (cpu)" in line and "no runner can see it" not in line
    assert "no runner can see it" in runners_line()  # stopped: gone again


def test_an_unsigned_request_to_runners_that_take_only_signed_ones_is_refused_up_front(
    world: Env, daemon: Daemon, monkeypatch, capsys
):
    url = daemon.repo()
    alice = keygen(world.tmp / "alice")
    requesters = allow(world.tmp / "requesters", ("alice@example.com", alice))
    strict = load_config().model_copy(
        update={"require_signed_requests": True, "allowed_requesters": str(requesters)}
    )
    bus = Bus(url, world.project)

    def presence(name: str) -> str:
        sha = bus.ls_remote(RUNNERS_PREFIX).runners[name]
        bus.fetch_ids([sha], "presence")
        return (G.read_path(world.project, sha, PRESENCE_PATH) or b"").decode()

    def start(name: str, config) -> Runner:
        runner = Runner(url, config=config, name=name, labels=["cpu"], workdir=world.tmp / "runners" / name)
        runner.start_presence()
        wait_for(lambda: runner.presence.beacon and runner.presence.beacon.sha, 20, f"{name}'s presence")
        return runner

    request = ["request", "work", "--runner", "cpu", "--remote", url]
    runners = [start("s1", strict), start("s2", strict)]
    try:
        assert '"require_signed_requests": true' in presence("s1")
        assert main(request) == 2  # nothing pushed: no request sits there until a runner rejects it
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err == (
            "kakeya: error: the runners of label cpu (s1, s2) take only signed requests, and this one would be "
            "unsigned: set signing_key (KAKEYA_SIGNING_KEY) to your SSH key, listed in their "
            "allowed_requesters file, and request again"
        )
        assert not bus.ls_remote(REQ_PREFIX).entries
        monkeypatch.setenv("KAKEYA_SIGNING_KEY", str(alice))  # signed: it goes to them
        assert main(request) == 0
        signed = capsys.readouterr().out.strip()
        monkeypatch.delenv("KAKEYA_SIGNING_KEY")
        assert main([*request[:3], "gpu", *request[4:]]) == 0  # no live runner there: queued as ever
        runners.append(start("open", load_config()))  # one live runner takes unsigned requests: not refused
        assert "require_signed_requests" not in presence("open")  # read as before by older clients
        assert main(request) == 0
    finally:
        for runner in runners:
            runner.stop_presence()
    served = runners[0].once(request_id=signed)
    assert served is not None and (served.status, served.verdict) == ("succeeded", "pass")


def progress_event(done: int, what: str, tail: list[str]) -> dict:
    return {
        "event": "running",
        "at": "2026-01-01T00:00:07.000+00:00",
        "elapsed_s": 7.0,
        "workload": {"done": done, "total": 4, "what": what},
        "log_tail": tail,
        "scheduler": None,
    }


def test_the_view_in_process_narrow_terminal_workload_bars_and_a_reader_gone(monkeypatch):
    """The same rules in process, at their edges: a 40-column terminal, each kind of workload bar, EPIPE."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 40, 0, 0))
    monkeypatch.setenv(
        "COLUMNS", "40"
    )  # in process rich sizes the terminal of stdout: pytest's, not this one
    monkeypatch.setenv("TERM", "xterm")
    with open(slave, "w") as term:
        view = View(wait_line, term)
        assert view.live
        view.show(progress_event(1, "rung " + "w" * 100, ["stdout: a line of the run's own"]))
        at = "2026-01-01T00:00:07.500+00:00"
        view.show({"event": "stale", "at": at, "runner": "r1", "lease_until": "2026-01-01T00:00:05+00:00"})
        view.show(progress_event(2, "rung " + "w" * 100, ["stdout: a line of the run's own"]))
        view.show({"event": "finished", "at": "2026-01-01T00:00:08.000+00:00", "id": "x", "done": "f" * 40})
        view.close()
    out = ANSI.sub("", read_all(master))
    drawn = [r for r in re.split(r"[\r\n]", out) if "elapsed" in r]
    assert drawn and all(len(r) <= 40 for r in drawn) and "2/4" in out, drawn
    assert "a line of the run's own" not in out and "00:00:08 done: ffffffffffff" in out
    assert "00:00:07 the lease of r1 ran out at 00:00:05" in out  # a line above the bar
    plain = io.StringIO()
    monkeypatch.setenv("COLUMNS", "89")
    view = View(wait_line, plain)
    assert not view.live
    bars = [
        "stderr: 50%|#####     | 2/4 [00:02<00:02]",
        "stderr: \u2588\u2588\u258c  2/4",
        "stdout: [####----------] 2",
    ]
    view.show(progress_event(2, "rung 2", ["stdout: last real line", *bars]))
    view.show(progress_event(3, "rung 3", bars))
    assert plain.getvalue().splitlines() == [
        "00:00:07 running  [##########----------] 2/4 rung 2  elapsed 0:07  | stdout: last real l\u2026",
        "00:00:07 running  [###############-----] 3/4 rung 3  elapsed 0:07",
    ]
    # a reader that left: the line is dropped, the stream pointed at /dev/null, nothing raised
    read, write = os.pipe()
    os.close(read)
    with open(write, "w") as gone:
        say("one", gone)
        say("two", gone)
        assert os.path.samestat(os.fstat(gone.fileno()), os.stat(os.devnull))
