"""Issue 33 item 5, operations: a runner whose own output goes away (EPIPE), progress on a TTY and not,
doctor on an embedded bus, an unsigned request refused up front (real bus, real runner processes)."""

from __future__ import annotations

import signal
import subprocess
import sys

from bridge import bus as B
from bridge.client import Client
from bridge.config import load_config
from bridge.presence import read_presences
from tests.bridge.bus_support import Daemon, Env, done_result, stop, wait_for


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
    return bool(B.Bus(url, world.project).ls_remote(B.done_ref(rid)).refs)


def left_refs(url: str, world: Env) -> list[str]:
    """Refs other than done, index and presence refs: a claim, a request, a stage ref left behind."""
    refs = B.Bus(url, world.project).ls_remote().refs
    return [r for r in refs if not r.startswith((B.DONE_PREFIX, B.SUBJECT_PREFIX, "refs/kakeya/runners/"))]


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
    bus = B.Bus(url, world.project)
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
