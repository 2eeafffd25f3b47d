"""Runner faults and run isolation (issues 17 + 21), with real processes and `git daemon` on 127.0.0.1:
setsid daemons die with their run (at exit, at the time limit, with a SIGKILLed runner), a private HOME,
takeover of a SIGKILLed runner's request, a remote killed mid-push, skewed clocks, caps on a huge result,
and a workload that tries to steal the runner's secrets (isolation 'user' as root)."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from bridge.bus.bus import Bus
from bridge.bus.records import STAGE_PREFIX, done_ref, results_path
from bridge.cli.main import main
from bridge.client.client import Client
from bridge.config import load_config
from bridge.core.errors import KakeyaError
from bridge.run.isolation import userns_available
from bridge.run.proc import descendants
from bridge.wire import git as G
from tests.bridge.bus_support import (
    DETACH_PY,
    WRITE_REPORT_PY,
    Daemon,
    Env,
    done_result,
    git,
    kill_pid,
    make_runner,
    pid_alive,
    runner_process,
    stop,
    wait_for,
)
from tests.bridge.test_sandbox import searchable_by_others

LINUX = sys.platform.startswith("linux")
ROOT = hasattr(os, "geteuid") and os.geteuid() == 0

HOSTILE_PY = (
    WRITE_REPORT_PY
    + DETACH_PY
    + textwrap.dedent("""
    import base64, subprocess, sys, time

    mode, marks = sys.argv[1], os.environ["MARKS"]

    def daemonize(name):
        if detach():
            with open(os.path.join(marks, name + ".pid"), "w") as fh:
                fh.write(str(os.getpid()))
            time.sleep(20)
            open(os.path.join(marks, name + ".alive"), "w").close()
            os._exit(0)
        while not os.path.exists(os.path.join(marks, name + ".pid")):
            time.sleep(0.01)

    if mode == "daemon":
        daemonize("daemon")
    elif mode == "hang":
        daemonize("hang")
        time.sleep(120)
    elif mode == "home":
        path = os.path.expanduser("~/.hostile_write")
        with open(path, "w") as fh:
            fh.write("x")
        print("wrote", path, "HOME", os.environ["HOME"], "TMPDIR", os.environ["TMPDIR"])
    elif mode == "big":
        with open(os.path.join(os.environ["KAKEYA_RUN_DIR"], "huge.bin"), "wb") as fh:
            fh.truncate(200 * 1024 * 1024)
        with open(os.path.join(os.environ["KAKEYA_RUN_DIR"], "small.txt"), "w") as fh:
            fh.write("kept")
        open(os.path.join(marks, "big." + str(time.time())), "w").close()
    elif mode == "steal":
        loot = []
        for pid in [str(os.getppid())] + [p for p in os.listdir("/proc") if p.isdigit()]:
            try:
                with open(f"/proc/{pid}/environ", "rb") as fh:
                    loot.append(fh.read())
            except OSError as exc:
                print("environ", pid, type(exc).__name__)
        try:
            with open(os.environ["PROBE_FILE"], "rb") as fh:
                loot.append(fh.read())
        except OSError as exc:
            print("file", type(exc).__name__)
        raw = b"\\n".join(loot)
        blob = raw + b"\\n" + base64.b64encode(raw) + b"\\n" + raw[::-1]
        sys.stdout.buffer.write(blob)
        sys.stderr.buffer.write(blob)
        with open(os.path.join(os.environ["KAKEYA_RUN_DIR"], "loot.bin"), "wb") as fh:
            fh.write(blob)
        write_report()
        with open(os.environ["KAKEYA_REPORT"]) as fh:
            report = json.load(fh)
        report["loot"] = blob.decode(errors="replace")
        with open(os.environ["KAKEYA_REPORT"], "w") as fh:
            json.dump(report, fh)
        print("steal done")
        sys.exit(0)
    with open(os.environ["COUNTER"], "a") as fh:
        fh.write(mode + "\\n")
    write_report()
""")
)


def hostile_preset(timeout_s: int = 60, python: str = "{python}", **extra: object) -> dict:
    return {
        "description": "a hostile test program",
        "runners": ["cpu"],
        "timeout_s": timeout_s,
        "argv": [python, "hostile.py", "{mode}"],
        "params": {
            "mode": {
                "type": "enum",
                "choices": ["daemon", "hang", "home", "big", "steal"],
                "default": "daemon",
            }
        },
        "env": {"COUNTER": "${ENV:KAKEYA_TEST_COUNTER}", "MARKS": "${ENV:KAKEYA_TEST_MARKS}", **extra},
        "report": {"kind": "probe", "schema_version": 1},
    }


def add_hostile(env: Env, name: str = "hostile", **kw: object) -> None:
    """Commit hostile.py in the project and add its preset."""
    (env.presets / f"{name}.yaml").write_text(yaml.safe_dump({"name": name, **hostile_preset(**kw)}))
    if not (env.project / "hostile.py").exists():
        (env.project / "hostile.py").write_text(HOSTILE_PY)
        git(env.project, "add", "hostile.py")
        git(env.project, "commit", "-q", "-m", "hostile")


def exec_result(out: Path) -> dict:
    return json.loads((out / "result.json").read_text())


# --- no process outlives its run -------------------------------------------------------------------


def exec_hostile(world: Env, mode: str, exit_code: int) -> tuple[float, dict, int]:
    """`kakeya exec hostile -p mode=MODE` (exiting `exit_code`): the seconds it took, its result and the pid
    of the daemon it left."""
    started = time.monotonic()
    assert main(["exec", "hostile", "-p", f"mode={mode}", "--out", str(world.tmp / "o")]) == exit_code
    took = time.monotonic() - started
    return took, exec_result(world.tmp / "o"), int(world.mark(mode, "pid").read_text())


def test_a_setsid_daemon_dies_when_its_program_exits(world: Env):
    add_hostile(world)
    took, result, daemon = exec_hostile(world, "daemon", 0)
    print(f"\nFIGURE setsid daemon at exit: run took {took:.2f} s, strays killed {result['strays_killed']}")
    assert result["status"] == "succeeded" and result["strays_killed"] == 1
    assert not pid_alive(daemon) and took < 15
    if LINUX:
        assert result["isolation"] == "none" and result["network"] == "none"  # a preset's default (issue 40)


def test_a_5_s_time_limit_ends_within_10_s_with_nothing_left(world: Env):
    add_hostile(world, timeout_s=5)
    took, result, daemon = exec_hostile(world, "hang", 1)
    print(f"\nFIGURE 5 s time limit: ended after {took:.2f} s, strays killed {result['strays_killed']}")
    assert result["status"] == "timed-out" and took < 10
    assert result["strays_killed"] >= 1 and not pid_alive(daemon)


def test_a_run_writes_its_own_home_not_the_runners(world: Env, monkeypatch: pytest.MonkeyPatch):
    home = world.tmp / "runner-home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    add_hostile(world)
    assert main(["exec", "hostile", "-p", "mode=home", "--out", str(world.tmp / "o")]) == 0
    line = (world.tmp / "o" / "logs" / "stdout.log").read_text().split()
    assert line[0] == "wrote" and line[1].endswith("/home/.hostile_write")
    run_home, run_tmp = Path(line[3]), Path(line[5])
    assert run_home.name == "home" and run_home.parent.name.startswith("kakeya-run-")
    assert run_tmp.parent == run_home.parent and not run_home.parent.exists()  # removed after the run
    assert not (home / ".hostile_write").exists() and list(home.iterdir()) == []


@pytest.mark.skipif(not LINUX, reason="network namespaces are Linux-only")
def test_network_none_runs_without_a_network(world: Env, daemon: Daemon):
    add_hostile(world)
    spec = yaml.safe_load((world.presets / "hostile.yaml").read_text())
    spec.update(name="offline", network="none", argv=["{python}", "-c", NET_PY, str(daemon.port)], params={})
    (world.presets / "offline.yaml").write_text(yaml.safe_dump(spec))
    code = main(["exec", "offline", "--out", str(world.tmp / "o")])
    result = exec_result(world.tmp / "o")
    log = (world.tmp / "o" / "logs" / "stdout.log").read_text()
    if result["network"] != "none":
        pytest.skip(f"no network namespace here: {result['network']}")
    assert code == 1 and "no network: " in log  # the daemon on 127.0.0.1 is out of reach


NET_PY = (
    "import socket, sys\n"
    "try:\n socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=2); print('connected')\n"
    "except OSError as exc:\n print('no network:', exc); sys.exit(1)\n"
)


# --- takeover of a SIGKILLed runner ----------------------------------------------------------------


@pytest.mark.parametrize("watchers", [1, 3])
def test_a_sigkilled_runners_request_is_taken_over_and_done_once(world: Env, daemon: Daemon, watchers: int):
    url = daemon.repo()
    rid = (
        Client(load_config(), remote=url)
        .request("work", {"tag": "k", "mode": "once", "seconds": "60"}, "cpu")
        .id
    )
    victim = runner_process(world, url, "a", "--poll", "0.2", "--lease", "2")
    program = int(
        wait_for(
            lambda: world.mark("k", "first").exists() and world.mark("k", "first").read_text(), 60, "the run"
        )
    )
    others = [runner_process(world, url, f"w{i}", "--poll", "0.3", "--lease", "2") for i in range(watchers)]
    try:
        time.sleep(1.0)  # the watchers see the live claim move
        victim.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        victim.wait(10)
        wait_for(lambda: not pid_alive(program), 5, "the run to die with its runner")
        died = time.monotonic() - killed
        bus = Bus(url, world.project)
        done = wait_for(lambda: bus.ls_remote().entries[rid].done, 60, "the takeover's done commit", step=0.1)
        took = time.monotonic() - killed
    finally:
        codes = [stop(p) for p in others]
    assert codes == [0] * watchers
    result = done_result(world.project, url, rid)
    print(
        f"\nFIGURE takeover with {watchers} watcher(s): workload dead {died:.2f} s after SIGKILL, "
        f"done commit {took:.2f} s after SIGKILL (lease 2 s, poll 0.3 s), by {result['runner_name']}"
    )
    assert result["status"] == "succeeded" and result["runner_name"] != "a"
    assert took < 2 + 0.3 + 8  # lease + one poll (+ a start-up and the run and push, on 2 busy cores)
    assert world.count() == ["k"]  # the killed run never finished; the takeover ran it once
    dones = [e for e in bus.ls_remote().entries.values() if e.done]
    assert len(dones) == 1 and dones[0].done == done


# --- a remote killed mid-push ----------------------------------------------------------------------


def test_a_result_whose_push_the_remote_dropped_is_pushed_after_restart(world: Env, daemon: Daemon):
    url = daemon.repo()
    add_hostile(world)
    spec = yaml.safe_load((world.presets / "hostile.yaml").read_text())
    payload = "import os; open(os.path.join(os.environ['KAKEYA_RUN_DIR'], 'noise.bin'), 'wb').write(os.urandom(48 << 20))"
    spec.update(
        name="noisy", argv=["{python}", "-c", WRITE_REPORT_PY + "\nwrite_report()\n" + payload], params={}
    )
    (world.presets / "noisy.yaml").write_text(yaml.safe_dump(spec))
    rid = Client(load_config(), remote=url).request("noisy", {}, "cpu").id
    runner = runner_process(world, url, "p", "--poll", "0.2", "--lease", "30")

    noise = world.project / ".kakeya" / "runners" / "p" / "runs" / rid / "noise.bin"

    def receiving() -> bool:  # the result's push is in flight: a receive-pack under our daemon
        assert daemon.proc is not None
        for pid in descendants(daemon.proc.pid):
            try:
                if b"receive-pack" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
            except OSError:
                pass
        return False

    try:
        wait_for(lambda: noise.exists() and noise.stat().st_size == 48 << 20, 60, "the run", step=0.05)
        wait_for(receiving, 30, "the push", step=0.01)
        assert daemon.proc is not None
        connections = descendants(daemon.proc.pid)
        daemon.stop()  # the remote drops mid-push, with its connections
        for pid in connections:
            kill_pid(pid)
        log = world.tmp / "p.log"
        wait_for(lambda: "not pushed yet" in log.read_text(), 30, "the runner to keep its result")
        assert done_ref(rid) not in Bus(str(daemon.base / "bus.git"), world.project).ls_remote().refs
        daemon.start()
        restarted = time.monotonic()
        bus = Bus(url, world.project)
        wait_for(lambda: bus.ls_remote().entries[rid].done, 60, "the delayed push", step=0.2)
        print(
            f"\nFIGURE remote killed mid-push: result pushed {time.monotonic() - restarted:.2f} s after restart"
        )
    finally:
        assert stop(runner) == 0
    assert "delayed result pushed" in (world.tmp / "p.log").read_text()
    assert done_result(world.project, url, rid)["status"] == "succeeded"
    bus.fetch([done_ref(rid)])
    done = bus.ls_remote().entries[rid].done
    noise = G.read_path(world.project, done or "", f"{results_path(rid)}/noise.bin")
    assert noise is not None and len(noise) == 48 << 20  # nothing lost


# --- clock skew ------------------------------------------------------------------------------------


def serve_until(procs: list[subprocess.Popen[bytes]], done: Callable[[], bool], timeout: float) -> float:
    """Let the runner processes serve until `done()` (within `timeout` s), then stop them (each must exit 0);
    the seconds it took."""
    started = time.monotonic()
    try:
        wait_for(done, timeout, "the requests done", step=0.5)
        took = time.monotonic() - started
    finally:
        codes = [stop(p) for p in procs]
    assert codes == [0] * len(procs)
    return took


def test_two_runners_with_skewed_clocks_run_20_requests_once_each(world: Env, daemon: Daemon):
    url = daemon.repo()
    staging = G.init_bare(world.tmp / "staging.git")
    client = Client(load_config(), remote=str(staging))
    for i in range(20):
        client.request("work", {"tag": f"s{i}", "mode": "sleep", "seconds": "0.3"}, "cpu")
    git(staging, "push", "-q", url, "refs/heads/kakeya/*:refs/heads/kakeya/*")
    procs = []
    for name, offset in (("ahead", "120"), ("behind", "-120")):
        os.environ["KAKEYA_CLOCK_OFFSET"] = offset
        try:
            procs.append(runner_process(world, url, name, "--poll", "0.2", "--lease", "2"))
        finally:
            del os.environ["KAKEYA_CLOCK_OFFSET"]
    bus = Bus(url, world.project)
    took = serve_until(procs, lambda: sum(1 for e in bus.ls_remote().entries.values() if e.done) == 20, 150)
    runs = world.count()
    names = {done_result(world.project, url, rid)["runner_name"] for rid in bus.ls_remote().entries}
    takeovers = sum((world.tmp / f"{n}.log").read_text().count("takes over") for n in ("ahead", "behind"))
    print(
        f"\nFIGURE skew +120 s / -120 s: 20 requests, {len(runs)} executions, {takeovers} takeovers, "
        f"{took:.1f} s, runners {sorted(names)}"
    )
    assert sorted(runs) == sorted(f"s{i}" for i in range(20))  # each ran exactly once
    assert takeovers == 0 and names == {"ahead", "behind"}


# --- caps ------------------------------------------------------------------------------------------


def test_a_200_mib_result_is_capped_done_once_and_starves_nobody(world: Env, daemon: Daemon):
    url = daemon.repo()
    add_hostile(world)
    client = Client(load_config(), remote=url)
    big = client.request("hostile", {"mode": "big"}, "cpu").id
    small = [client.request("work", {"tag": f"n{i}"}, "cpu").id for i in range(3)]
    bus_dir = daemon.base / "bus.git"
    before = sum(p.stat().st_size for p in bus_dir.rglob("*") if p.is_file())
    os.environ["KAKEYA_FILES_CAP"] = str(1 << 20)
    try:
        procs = [runner_process(world, url, f"c{i}", "--poll", "0.2", "--lease", "2") for i in range(2)]
    finally:
        del os.environ["KAKEYA_FILES_CAP"]
    bus = Bus(url, world.project)
    took = serve_until(procs, lambda: all(bus.ls_remote().entries[r].done for r in [big, *small]), 90)
    grew = sum(p.stat().st_size for p in bus_dir.rglob("*") if p.is_file()) - before
    result = done_result(world.project, url, big)
    print(
        f"\nFIGURE 200 MiB workload: {took:.1f} s for it and 3 others, bus grew {grew / 1e6:.2f} MB, "
        f"dropped {result['dropped']}"
    )
    assert result["status"] == "succeeded"
    assert result["dropped"] == [
        f"huge.bin ({200 << 20} bytes): over the cap of {1 << 20} bytes on the program's other files"
    ]
    assert len(list(world.marks.glob("big.*"))) == 1  # done once
    assert sorted(world.count()) == ["big", "n0", "n1", "n2"]
    assert grew < 2 << 20
    bus.fetch([done_ref(big)])
    files = G.read_dir(world.project, bus.ls_remote().entries[big].done or "", results_path(big))
    assert files["small.txt"] == b"kept" and "huge.bin" not in files


BIG_RANDOM_PY = WRITE_REPORT_PY + textwrap.dedent("""
    import sys, time
    time.sleep(2)  # the other runner is up and watching the claim
    with open(os.path.join(os.environ["KAKEYA_RUN_DIR"], "blob.bin"), "wb") as fh:
        fh.write(os.urandom(3 << 20))  # incompressible: the push carries 3 MiB
    with open(os.environ["COUNTER"], "a") as fh:
        fh.write("big\\n")
    write_report()
""")

# A slow link: a push whose objects exceed 1 MiB takes 6 s more (the hook sees them in quarantine).
SLOW_HOOK = """#!/bin/sh
kb=$(du -sk "$GIT_QUARANTINE_PATH" | cut -f1)
if [ "$kb" -gt 1024 ]; then echo "$kb" >>"{marks}/slow-push"; sleep 6; fi
"""


def test_a_push_longer_than_the_lease_keeps_the_lease_and_is_done_once(
    world: Env, daemon: Daemon, monkeypatch: pytest.MonkeyPatch
):
    url = daemon.repo()
    hook = daemon.base / "bus.git" / "hooks" / "pre-receive"
    hook.write_text(SLOW_HOOK.format(marks=world.marks))
    hook.chmod(0o755)
    spec = {**hostile_preset(), "argv": ["{python}", "-c", BIG_RANDOM_PY], "params": {}}
    (world.presets / "bigrand.yaml").write_text(yaml.safe_dump({"name": "bigrand", **spec}))
    rid = Client(load_config(), remote=url).request("bigrand", {}, "cpu").id
    monkeypatch.setenv("KAKEYA_LEASE", "2")
    runner = make_runner(url, world, "a")
    served: list = []
    thread = threading.Thread(target=lambda: served.append(runner.once()))
    thread.start()
    bus = Bus(url, world.project)
    wait_for(lambda: bus.ls_remote().entries[rid].claim, 30, "the claim")
    other = runner_process(world, url, "b", "--poll", "0.2", "--lease", "2")
    try:
        thread.join(90)
        time.sleep(3)  # the other runner would now take over a claim that stopped moving
    finally:
        assert stop(other) == 0
    slow = (world.marks / "slow-push").read_text().split()
    print(f"\nFIGURE slow push: {len(slow)} push(es) of {slow} KiB took 6 s more each (lease 2 s)")
    assert len(slow) == 1 and int(slow[0]) > 3000  # the result's objects, once, for 3 times the lease
    assert served and served[0].status == "succeeded" and served[0].pushed, served
    result = done_result(world.project, url, rid)
    assert result["status"] == "succeeded" and result["runner_name"] == "a"
    assert world.count() == ["big"]  # ran once: the lease was never lost to the other runner
    assert "takes over" not in (world.tmp / "b.log").read_text()
    done = bus.ls_remote().entries[rid].done or ""
    assert len(G.read_path(world.project, done, f"{results_path(rid)}/blob.bin") or b"") == 3 << 20
    assert G.out(daemon.base / "bus.git", "for-each-ref", STAGE_PREFIX) == ""  # the side ref is gone


def test_report_and_result_caps_drop_and_list(tmp_path: Path):
    from bridge.core.caps import apply_caps

    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "stdout.log").write_bytes(b"x" * 100)
    (tmp_path / "report.json").write_bytes(b"{}" * 1000)
    (tmp_path / "a.txt").write_bytes(b"a" * 10)
    (tmp_path / "b.txt").write_bytes(b"b" * 5000)
    (tmp_path / "link").symlink_to("/etc/passwd")
    dropped = apply_caps(tmp_path, report_cap=1024, files_cap=100_000, result_cap=3000)
    assert dropped == [
        "link: a symbolic link, not followed",
        "report.json (2000 bytes): over the report cap of 1024 bytes",
        "b.txt (5000 bytes): over the cap of 3000 bytes on the whole result",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "logs"]


# --- secrets ---------------------------------------------------------------------------------------

SECRETS = {
    "GITHUB_TOKEN": "ghp_runnerSecretToken0001",
    "GH_TOKEN": "gho_runnerSecretToken0002",
    "HF_TOKEN": "hf_runnerSecretToken0003",
    "AWS_ACCESS_KEY_ID": "AKIARUNNERSECRET0004",
    "AWS_SECRET_ACCESS_KEY": "awsRunnerSecretValue/0005+xyz",
    "OPENAI_API_KEY": "sk-runnerSecretOpenAI0006",
}


RUN_UID = 64123  # a uid with no passwd entry: nothing on the host belongs to it


def python_for(uid: int) -> str | None:
    """An interpreter that `uid` may execute (a venv under root's home may not be one)."""
    for candidate in (
        sys.executable,
        os.path.realpath(sys.executable),
        shutil.which("python3"),
        "/usr/bin/python3",
    ):
        try:
            if (
                candidate
                and subprocess.run([candidate, "-c", ""], user=uid, group=uid, extra_groups=[]).returncode
                == 0
            ):
                return candidate
        except OSError:
            continue
    return None


@pytest.mark.skipif(not (LINUX and ROOT), reason="isolation 'user' needs a Linux runner started as root")
def test_a_workload_cannot_steal_the_runners_secrets(world: Env, daemon: Daemon):
    python = python_for(RUN_UID)
    if python is None:
        pytest.skip(f"no Python interpreter here that uid {RUN_UID} may run")
    url = daemon.repo()
    shared = Path(tempfile.mkdtemp(prefix="kakeya-test-marks-"))  # the program's uid may write here
    shared.chmod(0o777)
    (shared / "counter.txt").touch()
    (shared / "counter.txt").chmod(0o666)
    cred = world.tmp / "git-credentials"
    cred.write_text("https://runner:ghp_fileOnlySecret0007@github.com\n")
    cred.chmod(0o600)
    add_hostile(world, python=python, PROBE_FILE="${ENV:KAKEYA_TEST_SECRET_FILE}")
    rid = Client(load_config(), remote=url).request("hostile", {"mode": "steal"}, "cpu").id
    header = "AUTHORIZATION: basic " + base64.b64encode(b"x-access-token:ghs_extraHeader0008").decode()
    env = {
        **os.environ,
        **SECRETS,
        "KAKEYA_SECRETS": "GITHUB_TOKEN,GH_TOKEN,HF_TOKEN,OPENAI_API_KEY",
        "KAKEYA_TEST_SECRET_FILE": str(cred),
        "KAKEYA_TEST_MARKS": str(shared),
        "KAKEYA_TEST_COUNTER": str(shared / "counter.txt"),
        "KAKEYA_ISOLATION": "user",
        "KAKEYA_RUN_USER": str(RUN_UID),
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "http.extraheader",
        "GIT_CONFIG_VALUE_0": header,
    }
    cmd = [
        sys.executable,
        "-m",
        "bridge.cli",
        "runner",
        "once",
        "--labels",
        "cpu",
        "--name",
        "s",
        "--remote",
        url,
    ]
    proc = subprocess.run(cmd, cwd=world.project, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    bus = Bus(url, world.project)
    bus.fetch([done_ref(rid)])
    done = bus.ls_remote().entries[rid].done or ""
    tree = G.ls_tree(world.project, done, recursive=True)
    blobs = G.read_blobs(world.project, sorted({sha for _mode, _kind, sha in tree.values()}))
    committed = b"\n".join(blobs.values()) + G.out(world.project, "log", "--format=%B", done).encode()
    result = json.loads(blobs[tree[f"{results_path(rid)}/result.json"][2]])
    stdout = blobs[tree[f"{results_path(rid)}/logs/stdout.log"][2]].decode()
    assert result["status"] == "succeeded" and result["isolation"] == f"user (uid {RUN_UID})", (
        result["reason"],
        stdout,
    )
    assert "steal done" in stdout and "file PermissionError" in stdout  # it tried, and was refused
    assert re.search(r"^environ \d+ PermissionError$", stdout, re.M)  # the launcher's and the runner's
    values = [*SECRETS.values(), "ghp_fileOnlySecret0007", header, "ghs_extraHeader0008"]
    for value in values:
        for form in (value.encode(), base64.b64encode(value.encode()), value.encode()[::-1]):
            assert form not in committed, f"{value} leaked as {form!r}"
    assert blobs[tree[f"{results_path(rid)}/loot.bin"][2]]  # its loot was committed: it held no secret


def test_a_secret_the_runner_reads_from_a_file_never_reaches_a_run(
    world: Env, daemon: Daemon, monkeypatch: pytest.MonkeyPatch
):
    url = daemon.repo()
    token = "ghp_fileOnlyRunnerToken0009"
    secrets = world.tmp / "secrets"
    secrets.mkdir(mode=0o700)
    (secrets / "git-credentials").write_text(f"https://x-access-token:{token}@github.com\n")
    (secrets / "git-credentials").chmod(0o600)
    monkeypatch.setenv("KAKEYA_SECRETS_DIR", str(secrets))
    add_hostile(world, PROBE_FILE="/nonexistent")
    rid = Client(load_config(), remote=url).request("hostile", {"mode": "steal"}, "cpu").id
    runner = make_runner(url, world, "s")
    # the runner's git has the token, from the file: what it pushes to an https bus with
    asked = G.run(runner.mirror, "credential", "fill", input=b"protocol=https\nhost=github.com\n\n")
    assert f"password={token}" in asked.stdout.decode()
    assert token not in "".join(os.environ.values())  # and its process environment does not
    served = runner.once()
    assert served is not None and served.status == "succeeded" and served.pushed, served
    bus = Bus(url, world.project)
    bus.fetch([done_ref(rid)])
    done = bus.ls_remote().entries[rid].done or ""
    tree = G.ls_tree(world.project, done, recursive=True)
    blobs = G.read_blobs(world.project, sorted({sha for _mode, _kind, sha in tree.values()}))
    stdout = blobs[tree[f"{results_path(rid)}/logs/stdout.log"][2]]
    assert b"steal done" in stdout and len(blobs[tree[f"{results_path(rid)}/loot.bin"][2]]) > 1000
    committed = b"\n".join(blobs.values())  # every environment the run could read, raw and encoded
    for form in (token.encode(), base64.b64encode(token.encode()), token.encode()[::-1]):
        assert form not in committed
    # a secrets file others may read is refused, with the fix
    (secrets / "git-credentials").chmod(0o644)
    with pytest.raises(KakeyaError, match=r"readable by others .*chmod 600"):
        make_runner(url, world, "s2")


def test_untrusted_labels_need_isolation(world: Env, monkeypatch: pytest.MonkeyPatch, capsys):
    monkeypatch.setenv("KAKEYA_UNTRUSTED_LABELS", "cpu")
    with pytest.raises(KakeyaError, match="marked untrusted-subjects"):
        make_runner(Client(load_config()).url, world)
    assert main(["doctor"]) == 1
    assert (
        "FAIL  isolation labels cpu are untrusted-subjects but runs have no isolation"
        in capsys.readouterr().out
    )
    if LINUX and ROOT:  # isolation 'user' as root is in force: the runner serves the label
        monkeypatch.setenv("KAKEYA_ISOLATION", "user")
        monkeypatch.setenv("KAKEYA_RUN_USER", str(RUN_UID))
        assert make_runner(Client(load_config()).url, world).isolation.describe == f"user (uid {RUN_UID})"
        main(["doctor"])
        out = capsys.readouterr().out
        if searchable_by_others(Path(os.path.realpath(sys.executable)).parent):
            assert f"ok    isolation user (uid {RUN_UID}) (config isolation = user)" in out
        else:  # the run user could not start this Python (root's pyenv): the doctor's trial says so
            assert f"FAIL  isolation the run user uid {RUN_UID} cannot start" in out, out
    if not ROOT:
        monkeypatch.setenv("KAKEYA_ISOLATION", "user")
        with pytest.raises(KakeyaError, match="needs the runner to start as root"):
            make_runner(Client(load_config()).url, world)


PIDS_PY = "import os\nprint(os.getppid(), sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))\n"


@pytest.mark.skipif(not (LINUX and userns_available()), reason="unshare --user --pid is not permitted here")
def test_userns_isolation_hides_the_runners_processes(world: Env, monkeypatch: pytest.MonkeyPatch):
    add_hostile(world)
    spec = yaml.safe_load((world.presets / "hostile.yaml").read_text())
    spec.update(name="pids", argv=["{python}", "-c", PIDS_PY], params={})
    (world.presets / "pids.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("KAKEYA_ISOLATION", "userns")
    main(["exec", "pids", "--out", str(world.tmp / "o")])
    assert exec_result(world.tmp / "o")["isolation"] == "userns"
    ppid, pids = (world.tmp / "o" / "logs" / "stdout.log").read_text().split(" ", 1)
    assert ppid == "1" and os.getpid() not in json.loads(pids)  # the launcher is its init; we are invisible
    assert len(json.loads(pids)) <= 3
