"""Issue 18: runner presence, progress on the claim, waiting that tells (real bus, real runner processes)."""

from __future__ import annotations

import datetime as dt
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import yaml

from bridge.bus.bus import Bus
from bridge.bus.presence import PRESENCE_PATH, Presence
from bridge.bus.progress import PROGRESS_CAP, Tracker, progress_line, read_workload
from bridge.bus.records import Update, runner_ref, utcnow
from bridge.bus.trust import ALLOWED_SIGNERS, principal
from bridge.cli.main import main
from bridge.client.client import Client
from bridge.client.follow import Claimed, Finished, Follower
from bridge.config import load_config
from bridge.wire import git as G
from tests.bridge.bus_support import (
    WRITE_REPORT_PY,
    Daemon,
    Env,
    git,
    kill_pid,
    runner_process,
    stop,
    wait_for,
)
from tests.bridge.test_signing import allow, keygen, signed_runner

# Counts to N, one step a `pause` seconds, telling KAKEYA_PROGRESS and stdout as it goes.
STEPS_PY = WRITE_REPORT_PY + textwrap.dedent("""
    import sys, time

    n, pause = int(sys.argv[1]), float(sys.argv[2])
    for i in range(n):
        time.sleep(pause)
        with open(os.environ["KAKEYA_PROGRESS"] + ".tmp", "w") as fh:
            json.dump({"done": i + 1, "total": n, "what": f"step {i + 1} of {n}"}, fh)
        os.replace(os.environ["KAKEYA_PROGRESS"] + ".tmp", os.environ["KAKEYA_PROGRESS"])
        print(f"step {i + 1} of {n}", flush=True)
    if len(sys.argv) > 3:  # a workload that misbehaves: a huge progress file, then a malformed one
        with open(os.environ["KAKEYA_PROGRESS"], "w") as fh:
            fh.write("x" * 100000 if sys.argv[3] == "huge" else '{"done": "three"')
        time.sleep(pause * 3)
    write_report()
""")
STEPS = {
    "name": "steps",
    "description": "counts, telling its progress",
    "runners": ["cpu", "gpu"],
    "timeout_s": 60,
    "argv": ["{python}", "steps.py", "{n}", "{pause}", "{bad}"],
    "params": {
        "n": {"type": "int", "min": 1, "max": 50, "default": 5},
        "pause": {"type": "float", "min": 0, "max": 5, "default": 0.8},
        "bad": {"type": "enum", "choices": ["none", "huge", "malformed"], "default": "none"},
    },
    "report": {"kind": "probe", "schema_version": 1},
    "gate": [{"check": "min", "path": "/probe/cpu_count", "value": 1}],
}


def with_steps(world: Env) -> None:
    (world.presets / "steps.yaml").write_text(yaml.safe_dump(STEPS))
    (world.project / "steps.py").write_text(STEPS_PY)
    git(world.project, "add", "-A")
    git(world.project, "commit", "-q", "-m", "steps")


def kakeya(world: Env, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", *args],
        cwd=world.project,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as at a terminal, even when the tests run as a background job (which inherits SIGINT
        # ignored: Python then never raises KeyboardInterrupt)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


class Lines(threading.Thread):
    """Reads a process's stdout line by line as it comes."""

    def __init__(self, proc: subprocess.Popen[str]):
        super().__init__(daemon=True)
        self.proc, self.lines = proc, []

    def run(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def events(self) -> list[dict]:
        return [json.loads(ln) for ln in list(self.lines)]


def parse(t: str) -> dt.datetime:
    return dt.datetime.fromisoformat(t)


def test_a_waiting_client_sees_queued_claimed_running_done(world: Env, daemon: Daemon):
    with_steps(world)
    url = daemon.repo()
    agent = kakeya(world, "request", "steps", "--runner", "cpu", "--remote", url, "--wait", "--json")
    seen = Lines(agent)
    seen.start()
    wait_for(lambda: any('"no-runner"' in ln for ln in seen.lines), 20, "the no-runner event")
    first = seen.events()
    assert [e["event"] for e in first[:3]] == ["requested", "queued", "no-runner"]  # within one poll
    rid = first[0]["id"]
    assert first[1]["position"] == 1 and first[1]["runners"] == [] and first[2]["label"] == "cpu"
    person = kakeya(world, "wait", rid, "--remote", url, "--out", "person-out")
    said = Lines(person)
    said.start()
    wait_for(lambda: any("no live runner" in ln for ln in said.lines), 20, "the person's no-runner line")

    runner = runner_process(world, url, "r1", "--poll", "0.2", "--lease", "3")
    try:
        running = wait_for(lambda: [e for e in seen.events() if e["event"] == "running"], 40, "running")
        assert main(["status", "--remote", url, "--fetch"]) == 0
        assert main(["runners", "--remote", url, "--json"]) == 0
        assert agent.wait(60) == 0
    finally:
        stop(runner)
    seen.join(5)
    events = seen.events()
    kinds = [e["event"] for e in events]
    assert kinds[:3] == ["requested", "queued", "no-runner"] and kinds[-2:] == ["finished", "verdict"]
    assert kinds.index("claimed") < kinds.index("running") < kinds.index("finished")
    live = events[1]
    claimed = next(e for e in events if e["event"] == "claimed")
    assert claimed["runner"] == "r1" and claimed["host"]
    running = [e for e in events if e["event"] == "running"]
    steps = [e["workload"]["done"] for e in running if e["workload"]]
    assert len(set(steps)) >= 2 and steps == sorted(steps)  # the workload's own progress advances
    assert all(e["workload"]["total"] == 5 for e in running if e["workload"])
    assert any(ln.startswith("stdout: step ") for e in running for ln in e["log_tail"])
    verdict = events[-1]
    assert (verdict["status"], verdict["verdict"], verdict["exit_code"]) == ("succeeded", "pass", 0)
    assert verdict["checks"]["status"] == "pass" and verdict["runner"] == "r1"
    # timestamps: the request, then the claim, then the run, then its end; events in the order seen
    created, claimed_at = parse(live["created_at"]), parse(claimed["claimed_at"])
    started, ended = parse(running[0]["started_at"]), parse(verdict["ended_at"])
    assert created <= claimed_at <= started <= ended
    ats = [parse(e["at"]) for e in events]
    assert ats == sorted(ats)
    assert all(parse(e["progress_at"]) <= parse(e["at"]) for e in running)

    # what a person sees: the same changes as lines, then the verdict table
    assert person.wait(30) == 0
    said.join(5)
    text = said.lines
    assert any("queued: position 1 in the cpu queue" in ln for ln in text)
    assert any("no live runner serves label 'cpu'" in ln for ln in text)
    assert any("claimed by r1 on " in ln for ln in text)
    assert any(" running  [" in ln and "/5 step " in ln and "elapsed 0:0" in ln for ln in text)
    assert any(ln.startswith(f"{rid}: steps succeeded, verdict pass") for ln in text)
    assert any(ln.startswith("| ") and "cpu_count" in ln for ln in text)  # the verdict table


@pytest.mark.parametrize("isolation", ["none", "auto"])
def test_status_shows_progress_elapsed_and_the_holders_liveness(
    world: Env, daemon: Daemon, capsys, monkeypatch: pytest.MonkeyPatch, isolation: str
):
    """Under the default sandbox too (auto: bwrap where installed), whose program writes its progress file in
    its own run directory, not in the directory the runner commits."""
    monkeypatch.setenv("KAKEYA_ISOLATION", isolation)
    with_steps(world)
    url = daemon.repo()
    runner = runner_process(world, url, "r1", "--poll", "0.2", "--lease", "3")
    try:
        assert main(["request", "steps", "-p", "n=8", "--runner", "cpu", "--remote", url]) == 0
        rid = capsys.readouterr().out.strip()

        def progressed() -> str | None:
            main(["status", "--remote", url, "--fetch"])
            text = capsys.readouterr().out
            return text if "step 2 of 8" in text or "step 3 of 8" in text else None

        text = str(wait_for(progressed, 40, "progress in kakeya status", step=0.3))
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{rid}: running"))
        assert "/8 step " in line and "elapsed 0:0" in line and "held by r1 (lease live)" in line
        assert main(["status", rid, "--remote", url, "--json"]) == 0
        row = json.loads(capsys.readouterr().out)
        assert row["holder"] == "r1" and row["holder_live"] is True and row["elapsed_s"] > 0
        assert row["progress"]["phase"] == "running" and row["progress"]["workload"]["total"] == 8
    finally:
        stop(runner)


def test_a_bad_progress_file_is_ignored_and_never_fails_the_run(world: Env, daemon: Daemon, tmp_path: Path):
    for bad in ("huge", "malformed"):
        path = tmp_path / f"{bad}.json"
        path.write_text("x" * (PROGRESS_CAP + 1) if bad == "huge" else '{"done": -1}')
        assert read_workload(path) is None
    (tmp_path / "logs").mkdir()
    (tmp_path / "progress.json").write_text('{"done": 2, "total": 4, "what": "rung 2 of 4", "extra": 1}')
    (tmp_path / "logs" / "stdout.log").write_text("a\n" + "line\n" * 2000 + "last\n")
    record = Tracker(tmp_path).record()
    assert record.workload is not None and (record.workload.done, record.workload.total) == (2, 4)
    assert record.log_tail == ["stdout: line", "stdout: line", "stdout: last"]
    # and through a real runner: the run succeeds, and no progress file lands in the results
    with_steps(world)
    url = daemon.repo()
    for bad in ("huge", "malformed"):
        assert (
            main(
                [
                    "request",
                    "steps",
                    "-p",
                    "n=2",
                    "-p",
                    "pause=0.5",
                    "-p",
                    f"bad={bad}",
                    "--runner",
                    "cpu",
                    "--remote",
                    url,
                ]
            )
            == 0
        )
    runner = runner_process(world, url, "r1", "--poll", "0.2", "--lease", "3")
    try:
        bus = Bus(url, world.project)
        wait_for(lambda: sum(1 for e in bus.ls_remote().entries.values() if e.done) == 2, 60, "both runs")
    finally:
        stop(runner)
    for rid in bus.ls_remote().entries:
        assert main(["results", rid, "--remote", url, "--out", f"res-{rid}"]) == 0
        out = world.project / f"res-{rid}" / rid
        assert json.loads((out / "result.json").read_text())["status"] == "succeeded"
        assert not (out / "progress.json").exists()


def test_the_bar_stays_at_its_last_value_once_the_progress_file_is_gone(tmp_path: Path):
    """A run that ended (its sandbox gone, its progress file with it) while the phase is still `running` keeps
    its last bar: a heartbeat then never falls back to a bare log line."""
    tracker = Tracker(tmp_path)
    assert tracker.record().workload is None  # nothing told yet
    (tmp_path / "progress.json").write_text('{"done": 6, "total": 6, "what": "rung 6 of 6"}')
    assert tracker.record().workload == read_workload(tmp_path / "progress.json")
    (tmp_path / "progress.json").unlink()
    kept = tracker.record().workload
    assert kept is not None and (kept.done, kept.total, kept.what) == (6, 6, "rung 6 of 6")
    (tmp_path / "progress.json").write_text('{"done": -1}')  # unreadable now: the last good one stays too
    assert tracker.record().workload == kept
    assert Tracker(tmp_path).record().workload is None  # a new request's tracker starts empty


def push_presence(url: str, store: Path, name: str, data: bytes) -> None:
    tree = G.tree_with(store, None, {PRESENCE_PATH: data})
    sha = G.commit(store, tree, [], "presence", "Test <t@example.com>")
    assert Bus(url, store).swap([Update(runner_ref(name), sha, None)], atomic=False)


def idle_gpu_runner(name: str, seen_at: dt.datetime, every_s: int) -> Presence:
    """The presence of an idle runner on label gpu, started and last seen at `seen_at`, beating every `every_s`."""
    return Presence(
        name=name,
        labels=["gpu"],
        host="h",
        accelerator="none",
        version="0",
        pid=1,
        started_at=seen_at,
        seen_at=seen_at,
        every_s=every_s,
        state="idle",
    )


def test_no_live_runner_is_said_at_once_and_ends_the_wait_with_its_own_code(
    world: Env, daemon: Daemon, capsys
):
    url = daemon.repo()
    now = utcnow()
    old = now - dt.timedelta(minutes=10)
    gone = idle_gpu_runner("old", old, every_s=10)
    push_presence(url, world.project, "old", gone.dump())  # stale: seen 10 minutes ago
    push_presence(url, world.project, "junk", b'{"name": "junk", "labels": ["gpu"]}')  # malformed
    liar = gone.model_copy(update={"name": "someone-else", "seen_at": now})
    push_presence(url, world.project, "liar", liar.dump())  # names another runner
    assert main(["request", "work", "--runner", "gpu", "--remote", url]) == 0
    rid = capsys.readouterr().out.strip()
    started = time.monotonic()
    assert main(["wait", rid, "--remote", url, "--json", "--no-runner-timeout", "1"]) == 3
    assert time.monotonic() - started < 15
    captured = capsys.readouterr()
    events = [json.loads(ln) for ln in captured.out.splitlines()]
    assert [e["event"] for e in events[:2]] == ["queued", "no-runner"]
    assert events[1]["seen"] == ["junk (malformed)", "liar (untrusted)", "old (stale)"]
    assert "no live runner serves label 'gpu'" in captured.err and "exit" not in captured.err
    # One line for the error, after the line that names the bus every bus command prints.
    lines = captured.err.splitlines()
    assert lines[0].startswith("kakeya: bus: ") and len(lines) == 2

    assert main(["runners", "--remote", url, "--all"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["NAME", "STATE", "LABELS"]
    states = {ln.split()[0]: ln.split()[1] for ln in table[1:]}
    assert states == {"junk": "malformed", "liar": "untrusted", "old": "stale"}
    assert (
        main(["runners", "--remote", url]) == 0
    )  # stale ones age out of the list; untrusted ones stay, flagged
    assert {ln.split()[0] for ln in capsys.readouterr().out.splitlines()[1:]} == {"junk", "liar"}

    # Ctrl-C stops waiting, never the request: exit 130, one line
    waiter = kakeya(world, "wait", rid, "--remote", url)
    said = Lines(waiter)
    said.start()  # Ctrl-C once it is waiting (a fixed sleep raced a slow start on a loaded machine)
    wait_for(lambda: any(" queued: " in ln for ln in said.lines), 30, "the waiter's queued line")
    waiter.send_signal(signal.SIGINT)
    assert waiter.stderr is not None
    try:
        waiter.wait(timeout=20)
    except subprocess.TimeoutExpired:
        waiter.kill()
        raise AssertionError(
            f"kakeya wait went on 20 s after SIGINT; stderr: {waiter.stderr.read()!r}"
        ) from None
    err = waiter.stderr.read()
    lines = err.splitlines()  # the bus line every bus command prints, then one line
    assert waiter.returncode == 130 and len(lines) == 2 and lines[0].startswith("kakeya: bus: "), err
    assert "stopped waiting" in lines[1], err
    entry = Bus(url, world.project).ls_remote().entries[rid]
    assert entry.req and not entry.cancel and not entry.claim


def test_presence_is_listed_then_ages_out_after_the_runner_stops(world: Env, daemon: Daemon, capsys):
    url = daemon.repo()
    proc = runner_process(world, url, "r1", "--poll", "0.2", "--lease", "3")
    clean = runner_process(world, url, "r2", "--poll", "0.2", "--lease", "3")

    def listed() -> list[dict]:
        main(["runners", "--remote", url, "--json"])
        return json.loads(capsys.readouterr().out)

    try:
        rows = wait_for(lambda: len(listed()) == 2 and listed(), 30, "two runners present")
        r1 = next(r for r in rows if r["name"] == "r1")
        assert (r1["state"], r1["labels"], r1["every_s"], r1["pid"]) == ("idle", ["cpu"], 6.0, proc.pid)
        assert r1["version"] and r1["accelerator"] and r1["host"]
        assert stop(clean) == 0  # a clean stop says so at once
        wait_for(lambda: [r["name"] for r in listed()] == ["r1"], 10, "r2 to leave the list")
        kill_pid(proc.pid)  # a killed runner says nothing: it ages out
        proc.wait(10)
        killed_at = time.monotonic()
        wait_for(lambda: listed() == [], 40, "r1 to age out")
        # an unchanged presence is refreshed every two leases (6 s): it ages out after three intervals without
        # one, so not before 12 s after the kill (its last refresh was at most one interval before)
        assert time.monotonic() - killed_at >= 12.0
        assert main(["runners", "--remote", url, "--all", "--json"]) == 0
        states = {r["name"]: r["state"] for r in json.loads(capsys.readouterr().out)}
        assert states == {"r1": "stale", "r2": "stopped"}
    finally:
        stop(proc)
        stop(clean)


def test_with_allowed_signers_only_a_runner_key_for_its_labels_makes_a_live_presence(
    world: Env, daemon: Daemon, tmp_path: Path, capsys
):
    (tmp_path / "keys").mkdir()
    keys = {n: keygen(tmp_path / "keys" / n) for n in ("r1", "stranger")}
    allow(world.project / ALLOWED_SIGNERS, (principal("r1", ["gpu"]), keys["r1"]))
    git(world.project, "add", "-A")
    git(world.project, "commit", "-qm", "allowed signers")
    url = daemon.repo()
    runners = [
        signed_runner(world, url, "r1", ("gpu",), keys["r1"]),
        signed_runner(
            world, url, "wide", ("gpu", "cpu"), keys["r1"]
        ),  # r1's key, more labels than it may serve
        signed_runner(world, url, "thief", ("gpu",), keys["stranger"]),
    ]
    now = utcnow()
    plain = idle_gpu_runner("plain", now, every_s=60)
    push_presence(url, world.project, "plain", plain.dump())  # unsigned
    for r in runners:
        r.start_presence()
    try:

        def states() -> dict[str, str]:
            main(["runners", "--remote", url, "--json"])
            return {
                r["name"]: r["state"] + ":" + r.get("problem", "")
                for r in json.loads(capsys.readouterr().out)
            }

        wait_for(lambda: len(states()) == 4, 20, "four presences")
        got = states()
        assert got["r1"] == "idle:" and got["plain"] == "untrusted:unsigned"
        assert got["wide"] == "untrusted:r1@gpu may not serve cpu"
        assert got["thief"].startswith("untrusted:not signed by a known runner key")
        assert main(["request", "work", "--runner", "cpu", "--remote", url]) == 0
        rid = capsys.readouterr().out.strip()
        assert (
            main(["wait", rid, "--remote", url, "--no-runner-timeout", "0.5"]) == 3
        )  # `wide` does not count
        assert "no live runner serves label 'cpu'" in capsys.readouterr().out
    finally:
        for r in runners:
            r.stop_presence()


def test_a_progress_line_echoes_the_runs_stdout_never_its_stderr():
    event = {"event": "running", "workload": None, "elapsed_s": 12.0, "scheduler": None}
    tail = ["stdout: rung 2 of 5", "stderr: UserWarning: TypedStorage is deprecated", "stderr: Traceback"]
    assert progress_line({**event, "log_tail": tail}) == "running  elapsed 0:12  | stdout: rung 2 of 5"
    assert progress_line({**event, "log_tail": tail[1:]}) == "running  elapsed 0:12"


def test_a_run_that_ends_between_two_looks_is_still_seen_claimed(world: Env, daemon: Daemon, monkeypatch):
    """A request queued at one look and done at the next: the follower reads the claim its done commit
    carries and says `claimed` before `finished` (a waiter counts both; it once saw only `finished`)."""
    monkeypatch.chdir(world.project)
    url = daemon.repo()
    c = Client(load_config(), remote=url)
    rid = c.request("work", {"tag": "between"}, "cpu").id
    follow = Follower(c, rid, poll_s=0.05).events()
    assert next(follow).event == "queued"
    assert next(follow).event == "no-runner"
    runner = runner_process(world, url, "r1", mode="once")
    assert runner.wait(120) == 0  # claimed, run and delivered while the follower sleeps
    claimed, finished = list(follow)
    assert isinstance(claimed, Claimed) and claimed.runner == "r1" and claimed.host
    assert isinstance(finished, Finished) and finished.done == c.entry(rid, "cpu").done
    # a request already done at the first look: only its end (nothing was followed)
    assert [e.event for e in Follower(c, rid).events()] == ["finished"]
