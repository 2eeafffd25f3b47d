"""Issue 40 (1, 9, 10): nothing the runner reads after a run blocks it, reads without bound or follows a link,
and what a run leaves is capped in number. Real `kakeya runner watch` processes on a `git daemon` bus serve a
program that plants a FIFO, a symbolic link to /dev/zero, a directory or a huge (sparse) file at every path the
runner reads after a run: the launcher's status (and its temporary file, so the launcher cannot write it), the
report, the logs (where the run can reach them: isolation none), and one that leaves 20,000 files. For each:
one done commit that says what happened, and the same runner serves the next request. Each runs under the
runner's default isolation (auto: bwrap where installed) and under isolation none."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bridge.bus.bus import Bus
from bridge.client.client import Client
from bridge.config import load_config
from bridge.core.caps import RUNNER_FILES
from bridge.presets.registry import load_registry
from bridge.run.isolation import bwrap_available
from bridge.run.slurm import LauncherStatus, read_model
from tests.bridge.bus_support import WRITE_REPORT_PY, Daemon, Env, git, script_preset, stop, wait_for
from tests.bridge.test_hostile_output import ROOT, Bench, no_secret
from tests.bridge.test_sandbox import (
    TEST_USER,
    as_user,
    committed,
    ensure_user,
    make_side,
    searchable_by_others,
)

KINDS = ["fifo", "zero", "dir", "huge"]
MANY = 20_000

PLANT_PY = WRITE_REPORT_PY + textwrap.dedent("""
    import sys

    kind = sys.argv[1]
    run = os.environ["KAKEYA_RUN_DIR"]
    scratch = os.path.dirname(os.environ["TMPDIR"])  # the run's private directories: the launcher's status too

    def attempt(what, fn, *args):
        try:
            fn(*args)
        except OSError as exc:
            print("could not", what, exc, flush=True)

    def plant(path):
        if kind == "fifo":
            os.mkfifo(path)
        elif kind == "zero":
            os.symlink("/dev/zero", path)
        elif kind == "dir":
            os.makedirs(os.path.join(path, "sub"))
        elif kind == "huge":
            with open(path, "wb") as fh:
                fh.truncate(1 << 30)  # sparse: a GiB that costs no disk

    with open(os.path.join(run, "kept.txt"), "w") as fh:
        fh.write("kept")
    if kind == "ok":
        write_report()
        sys.exit(0)
    if kind == "link":  # a link to a file of the runner's user (its path, not shown in a sandbox), left locked
        locked = os.path.join(run, "locked")
        os.mkdir(locked)
        os.symlink(os.environ["VICTIM"], os.path.join(locked, "link"))
        os.chmod(locked, 0o500)
        write_report()
        sys.exit(0)
    if kind == "many":
        for i in range(int(os.environ.get("MANY", "20000"))):
            open(os.path.join(run, f"z{i:05d}"), "wb").close()
        write_report()
        sys.exit(0)
    if kind in ("bigint", "deep"):  # a report json.loads raises on (not a JSON error): 10,000 digits, deep
        body = "1" * 10_000 if kind == "bigint" else "[" * 100_000 + "]" * 100_000
        with open(os.environ["KAKEYA_REPORT"], "w") as fh:
            fh.write('{"kind": "probe", "x": ' + body + "}")
        sys.exit(0)
    # the launcher writes its status to launcher.json.tmp, then renames it: make both something else
    attempt("plant the launcher's temporary file", os.mkdir, os.path.join(scratch, "launcher.json.tmp"))
    attempt("plant the launcher's status", plant, os.path.join(scratch, "launcher.json"))
    for name in ("stdout.log", "stderr.log"):  # reachable where the run writes in the runner's out dir
        log = os.path.join(run, "logs", name)
        if os.path.exists(log):
            attempt("remove a log", os.unlink, log)
            attempt("plant a log", plant, log)
    plant(os.environ["KAKEYA_REPORT"])  # instead of a report
""")

PLANT = script_preset(
    "plant",
    "plants what blocks or never ends where the runner reads",
    "plant.py",
    "kind",
    {"type": "enum", "choices": [*KINDS, "many", "bigint", "deep", "ok", "link"], "default": "fifo"},
    env={"MANY": str(MANY), "VICTIM": "${ENV:KAKEYA_TEST_VICTIM}"},
    gate=[{"check": "min", "path": "/probe/cpu_count", "value": 1}],
)


@pytest.fixture(name="bench", params=["auto", "none"])
def bench_fixture(world: Env, daemon: Daemon, monkeypatch: pytest.MonkeyPatch, request) -> Iterator[Bench]:
    monkeypatch.setenv("KAKEYA_ISOLATION", request.param)  # auto: the default, bwrap where installed
    monkeypatch.setenv("KAKEYA_MIN_FREE", "0")
    monkeypatch.setenv("KAKEYA_TEST_VICTIM", str(world.tmp / "victim"))  # the preset's env (kind link only)
    (world.presets / "plant.yaml").write_text(yaml.safe_dump(PLANT))
    (world.project / "plant.py").write_text(PLANT_PY)
    git(world.project, "add", "plant.py")
    git(world.project, "commit", "-q", "-m", "plant")
    yield Bench(world, daemon.repo(), request.param)


def serve(bench: Bench, kind: str) -> tuple[dict, dict[str, bytes]]:
    """One planting request then an honest one, through one `kakeya runner watch`; the planting result."""
    proc = bench.runner()
    try:
        rid = bench.client.request("plant", {"kind": kind}, "cpu").id
        result = bench.done(rid, timeout=60)
        bench.next_is_served()
    finally:
        code = stop(proc, timeout=15)
    assert code == 0, bench.log()
    assert "Traceback" not in bench.log(), bench.log()
    bench.one_done(rid)
    files = bench.files(rid)
    no_secret(files)
    assert files.get("kept.txt") == b"kept", (result, sorted(files))
    return result, files


@pytest.mark.parametrize("kind", KINDS)
def test_what_a_run_plants_where_the_runner_reads_blocks_nothing_and_is_said(bench: Bench, kind: str):
    result, files = serve(bench, kind)
    # the program exited 0; its status came from the launcher (never from a file the run could plant)
    assert result["exit_code"] == 0 and result["strays_killed"] == 0, result
    assert result["isolation"] and result["status"] == "error", result
    assert (
        result["reason"].startswith("the report was dropped: report.json")
        or "report.json" in result["reason"]
    )
    assert "report.json" not in files
    for name in ("stdout.log", "stderr.log"):  # the runner's own logs, or what the run made of them: dropped
        data = files.get(f"logs/{name}")
        assert data is None or len(data) < (1 << 20), name
    # nothing published names the runner's own directories (its state dir, the run's scratch)
    for text in (files["result.json"], files["summary.md"], files["verdict.json"]):
        assert str(bench.world.tmp).encode() not in text and b"/kakeya-run-" not in text, text.decode()


def test_a_run_that_leaves_20000_files_commits_at_most_the_cap_and_says_how_many_went(bench: Bench):
    result, files = serve(bench, "many")
    assert (result["status"], result["verdict"]) == ("succeeded", "pass"), result
    cap = 5000
    assert len([f for f in files if f not in RUNNER_FILES and f != "report.json"]) <= cap, len(files)
    assert {"result.json", "report.json", "verdict.json", "summary.md", "kept.txt"} <= set(files)
    over = [line for line in result["dropped"] if "files_count_cap" in line]
    assert len(over) == 1, result["dropped"]
    kept_program_files = sum(1 for name in files if name.startswith("z") and name[1:].isdigit())
    assert f"{MANY - kept_program_files} " in over[0], (over, kept_program_files)
    assert len(result["dropped"]) <= 2, result["dropped"]
    assert str(bench.world.tmp) not in json.dumps(result) and "/kakeya-run-" not in json.dumps(result)


@pytest.mark.parametrize("kind", ["bigint", "deep"])
def test_a_report_the_parser_raises_on_keeps_the_exit_code_isolation_and_strays(bench: Bench, kind: str):
    result, files = serve(bench, kind)
    assert (result["status"], result["exit_code"], result["strays_killed"]) == ("error", 0, 0), result
    assert result["isolation"] and result["network"] and result["argv"], result
    assert result["reason"].startswith("report.json is not valid: "), result["reason"]
    assert "runner r1:" not in result["reason"] and len(result["reason"]) <= 2000
    assert str(bench.world.tmp).encode() not in files["summary.md"]


def test_the_start_up_sweep_of_a_crashed_runs_files_runs_in_the_background(world: Env, daemon: Daemon):
    """Issue 40 (9): a runner killed mid-run left 20,000 files; the next start serves at once while they go."""
    bench = Bench(world, daemon.repo())
    workdir = world.project / ".kakeya" / "runners" / "r1"
    stale = workdir / "runs" / "20260101T000000.000Z-plant-dead"
    (stale / "deep").mkdir(parents=True)
    for i in range(MANY):
        (stale / "deep" / f"z{i:05d}").touch()
    proc = bench.runner()
    try:
        bench.next_is_served()
        wait_for(lambda: not stale.exists(), 60, "the stale directory removed")
    finally:
        assert stop(proc) == 0
    log = bench.log()
    assert f"removing 1 stale directory in {workdir / 'runs'} in the background" in log, log
    assert "removed 1 stale directory in" in log, log


@pytest.mark.skipif(not ROOT, reason="a runner as another user needs root to make (CI runs as root)")
def test_cleanup_never_changes_the_mode_of_a_file_a_planted_link_points_at():
    """Issue 40 (7): a run (the runner's own user: bubblewrap as a non-root runner) leaves, in a directory it
    made unwritable, a symbolic link to a file of the runner's user. The runner's cleanup (caps.remove, run as
    that unprivileged user) removes it all and leaves the file's mode as it was."""
    user = ensure_user(TEST_USER)
    ids = pwd.getpwnam(user)
    base = Path(os.path.realpath(sys.base_prefix)) / "bin"
    if not searchable_by_others(base):
        trick = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
        if trick.returncode:
            pytest.skip(f"{base} is closed to other users and no mount namespace may show it here")
    home = Path(tempfile.mkdtemp(prefix="kakeya-rm-"))
    try:
        home.chmod(0o755)
        key, scratch = home / "key", home / "scratch"
        key.write_text("the runner's key")
        locked = scratch / "out" / "locked"
        locked.mkdir(parents=True)
        (locked / "link").symlink_to(key)
        (scratch / "out" / "dir-link").symlink_to(home)  # a link to a directory of the runner's too
        for p in [home, key, *scratch.rglob("*"), scratch]:
            os.lchown(p, ids.pw_uid, ids.pw_gid)
        key.chmod(0o600)
        home.chmod(0o755)
        locked.chmod(0o500)  # its entries cannot be unlinked until it is opened up
        code = "import sys; from pathlib import Path; from bridge.core import caps; caps.remove(Path(sys.argv[1]))"
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        subprocess.run(as_user(user, [sys.executable, "-c", code, str(scratch)]), env=env, check=True)
        assert not scratch.exists()
        assert (key.stat().st_mode & 0o777, home.stat().st_mode & 0o777) == (0o600, 0o755)
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.skipif(not ROOT, reason="a runner as another user needs root to make (CI runs as root)")
def test_an_unprivileged_runner_in_its_sandbox_reads_nothing_planted_and_follows_no_link(
    world: Env, daemon: Daemon
):
    """Issue 40 (1, 7) as an unprivileged runner (auto: bubblewrap, the run as the runner's own user, so the
    run can write its scratch: the launcher's status there, its temporary file): a FIFO there and a directory
    in its way block nothing; a link left in a locked directory to a file of the runner's user does not change
    that file's mode at cleanup; 20,000 files are capped in one line, with no runner path in what is published.
    The same runner serves the next request."""
    if not bwrap_available():
        pytest.skip("bubblewrap is not installed here")
    user = ensure_user(TEST_USER)
    base = Path(os.path.realpath(sys.base_prefix)) / "bin"
    if not searchable_by_others(base):
        trick = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True)
        if trick.returncode:
            pytest.skip(f"{base} is closed to other users and no mount namespace may show it here")
    side = make_side(world, "auto", user)
    ids = pwd.getpwnam(user)
    try:
        presets = side.home / "presets"
        presets.mkdir()
        (presets / "plant.yaml").write_text(yaml.safe_dump(PLANT))
        victim = side.home / "victim"
        victim.write_text("the runner user's file")
        for p in (presets, presets / "plant.yaml", victim):
            os.chown(p, ids.pw_uid, ids.pw_gid)
        victim.chmod(0o600)
        (world.project / "plant.py").write_text(PLANT_PY)
        git(world.project, "add", "plant.py")
        git(world.project, "commit", "-q", "-m", "plant")
        url = daemon.repo()
        env = {k: v for k, v in os.environ.items() if not k.startswith("KAKEYA_")} | {
            "KAKEYA_PRESETS": str(presets),
            "KAKEYA_LEASE": "10",
            "KAKEYA_MIN_FREE": "0",
            "KAKEYA_TEST_VICTIM": str(victim),
            "HOME": str(side.home),
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        }
        argv = [sys.executable, "-m", "bridge.cli", "runner", "watch", "--poll", "0.2", "--labels", "cpu"]
        flags = ["--name", "sbx", "--remote", url, "--workdir", str(side.home / "runner")]
        log = (side.home / "runner.log").open("ab")
        runner = subprocess.Popen(
            as_user(user, [*argv, *flags]), env=env, cwd=side.home, stdout=log, stderr=subprocess.STDOUT
        )
        client = Client(load_config(), remote=url)
        registry = load_registry(presets)
        bus = Bus(url, world.project)

        def serve(kind: str) -> dict:
            rid = client.request("plant", {"kind": kind}, "cpu", registry=registry).id
            wait_for(lambda: bus.ls_remote().entries[rid].done, 60, f"{kind} done", step=0.2)
            return committed(world.project, url, rid)[0]

        try:
            fifo = serve("fifo")
            assert (fifo["status"], fifo["exit_code"], fifo["strays_killed"]) == ("error", 0, 0), fifo
            assert fifo["isolation"].startswith("bwrap"), fifo
            link = serve("link")
            assert (link["status"], link["verdict"]) == ("succeeded", "pass"), link
            assert victim.stat().st_mode & 0o777 == 0o600
            many = serve("many")  # 20,000 files: the cap, said in one line; no runner path published
            assert (many["status"], many["verdict"]) == ("succeeded", "pass"), many
            assert len([line for line in many["dropped"] if "files_count_cap" in line]) == 1, many["dropped"]
            assert str(side.home) not in json.dumps(many) and "/kakeya-run-" not in json.dumps(many), many
            assert serve("ok")["verdict"] == "pass"
            assert runner.poll() is None
        finally:
            code = stop(runner)
            print((side.home / "runner.log").read_text()[-3000:])
        assert code == 0
        assert victim.stat().st_mode & 0o777 == 0o600
    finally:
        shutil.rmtree(side.home, ignore_errors=True)


@pytest.mark.parametrize("kind", KINDS)
def test_the_slurm_runner_reads_a_jobs_control_files_as_caps_reads(tmp_path: Path, kind: str):
    """Issue 40 (1): the files a Slurm job leaves in its control directory (launcher.json, alloc.json), which a
    run without bubblewrap can reach: a FIFO, a link to /dev/zero, a directory or a huge file there is read as
    nothing (None), at once."""
    path = tmp_path / "launcher.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        path.symlink_to("/dev/zero")
    elif kind == "dir":
        path.mkdir()
    else:
        with path.open("wb") as fh:
            fh.truncate(1 << 30)
    got: list[object] = []
    reader = threading.Thread(target=lambda: got.append(read_model(LauncherStatus, path)), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive() and got == [None]
