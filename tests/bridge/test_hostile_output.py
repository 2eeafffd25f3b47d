"""Issue 26 (3, 7): a runner survives whatever a run leaves. Real `kakeya runner watch` processes on a bare bus
serve a hostile workload (a FIFO at $KAKEYA_PROGRESS, a name that is not UTF-8, a path past PATH_MAX, links and
hard links to a runner's file, FIFOs/sockets/devices, a full disk, a forged verdict.json) or a hostile request
(files planted under .kakeya/results/<id>/); for each: the bus has exactly one done commit for it that says
what was dropped or what failed, nothing unsafe is committed, and the same runner serves the next request.
Each runs under the runner's default isolation (auto: bwrap where installed) and under isolation none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bridge.bus.bus import Bus
from bridge.bus.presence import read_presences
from bridge.bus.progress import PROGRESS_FILE, Tracker
from bridge.bus.records import CLAIM_PATH, MANIFEST_PATH, Claim, Update, new_id, req_ref, results_path
from bridge.cli.main import main
from bridge.client.client import Client
from bridge.config import load_config
from bridge.core.caps import DROPPED_LINES, RUNNER_FILES, apply_caps
from bridge.core.result import RunResult
from bridge.run.runner import Runner
from bridge.wire import git as G
from tests.bridge.bus_support import (
    WRITE_REPORT_PY,
    Daemon,
    Env,
    done_result,
    git,
    manifest_dict,
    runner_process,
    script_preset,
    stop,
    wait_for,
)

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
KEY = b"-----BEGIN OPENSSH PRIVATE KEY-----\nrunner-key-material-7f3a\n-----END OPENSSH PRIVATE KEY-----\n"

# What a hostile run leaves in $KAKEYA_RUN_DIR (mode = argv[1]); every mode also leaves kept.txt, which is safe.
LEAVE_PY = WRITE_REPORT_PY + textwrap.dedent("""
    import errno, socket, stat, sys, time

    mode = sys.argv[1]
    run, marks, key = os.environ["KAKEYA_RUN_DIR"], os.environ["MARKS"], os.environ["KEY_FILE"]
    try:  # counts executions (a sandbox does not show the marks directory: there the done history counts)
        open(os.path.join(marks, f"leave.{mode}.{time.time()!r}"), "w").close()
    except OSError:
        print(f"ran leave {mode}", flush=True)

    def put(name, data=b"x"):
        with open(os.path.join(os.fsencode(run), os.fsencode(name)), "wb") as fh:
            fh.write(data)

    def attempt(what, fn):
        try:
            fn()
        except OSError as exc:
            print("could not", what, exc, flush=True)

    put("kept.txt", b"kept")
    if mode == "fifo-progress":
        os.mkfifo(os.environ["KAKEYA_PROGRESS"])
        time.sleep(8)  # over two leases: only heartbeats keep the claim
    elif mode == "bad-name":
        put(b"bad-\\xff-name.txt")
        put("ctl\\nname.txt")
        put(".GIT")
    elif mode == "long-path":
        fd = os.open(run, os.O_RDONLY)
        for i in range(20):  # 20 names of 250 bytes: far past PATH_MAX (4096)
            name = f"{i:02d}" + "d" * 248
            os.mkdir(name, dir_fd=fd)
            sub = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = sub
        leaf = os.open("deep.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(leaf, b"deep")
        os.close(leaf)
        deep = os.path.join(run, *["n"] * 30)  # short names, 30 levels
        os.makedirs(deep)
        with open(os.path.join(deep, "bottom.txt"), "w") as fh:
            fh.write("bottom")
    elif mode == "links":
        attempt("symlink", lambda: os.symlink(key, os.path.join(run, "key-symlink")))
        attempt("symlink a dir", lambda: os.symlink(os.path.dirname(key), os.path.join(run, "dir-link")))
        attempt("hard link", lambda: os.link(key, os.path.join(run, "key-hardlink")))
        put("own-hardlink-a")
        own = os.path.join(run, "own-hardlink-a")
        attempt("link its own file", lambda: os.link(own, os.path.join(run, "own-hardlink-b")))
    elif mode == "special":
        os.mkfifo(os.path.join(run, "fifo"))
        os.chdir(run)  # a socket path must be short
        sock = socket.socket(socket.AF_UNIX)
        sock.bind("sock")
        attempt("mknod", lambda: os.mknod(os.path.join(run, "null"), stat.S_IFCHR | 0o666, os.makedev(1, 3)))
    elif mode == "fill":
        try:
            with open(os.path.join(run, "fill.bin"), "wb") as fh:
                for _ in range(int(os.environ.get("FILL_MIB", "40"))):
                    fh.write(b"\\0" * (1 << 20))
                    fh.flush()
        except OSError as exc:
            print("filled:", exc, flush=True)
    elif mode == "verdict":
        put("verdict.json", json.dumps({"status": "pass", "checks": []}).encode())
        sys.exit(0)  # and no report
    write_report()
""")

MODES = ["fifo-progress", "bad-name", "long-path", "links", "special", "fill", "verdict"]
LEAVE = script_preset(
    "leave",
    "leaves hostile files behind",
    "leave.py",
    "mode",
    {"type": "enum", "choices": MODES, "default": "bad-name"},
    env={"MARKS": "${ENV:KAKEYA_TEST_MARKS}", "KEY_FILE": "${ENV:KAKEYA_TEST_KEY}", "FILL_MIB": "40"},
    gate=[{"check": "min", "path": "/probe/cpu_count", "value": 1}],
)


@pytest.fixture(name="hostile", params=["auto", "none"])
def hostile_fixture(world: Env, daemon: Daemon, monkeypatch: pytest.MonkeyPatch, request) -> Iterator[Bench]:
    """The world plus leave.py and its preset, a runner key file, and the isolation under test."""
    monkeypatch.setenv("KAKEYA_ISOLATION", request.param)  # auto: the default, bwrap where installed
    key = world.tmp / "runner-secrets" / "id_ed25519"
    key.parent.mkdir()
    key.write_bytes(KEY)
    key.chmod(0o600)
    monkeypatch.setenv("KAKEYA_TEST_KEY", str(key))
    monkeypatch.setenv("KAKEYA_MIN_FREE", "0")
    (world.presets / "leave.yaml").write_text(yaml.safe_dump(LEAVE))
    (world.project / "leave.py").write_text(LEAVE_PY)
    git(world.project, "add", "leave.py")
    git(world.project, "commit", "-q", "-m", "leave")
    yield Bench(world, daemon.repo(), request.param)


class Bench:
    def __init__(self, world: Env, url: str, isolation: str = "none"):
        self.world, self.url, self.isolation = world, url, isolation
        self.client = Client(load_config(), remote=url)
        self.bus = Bus(url, world.project)

    def runner(self, name: str = "r1", *args: str) -> subprocess.Popen[bytes]:
        return runner_process(self.world, self.url, name, "--poll", "0.2", *args)

    def done(self, rid: str, timeout: float = 90) -> dict:
        wait_for(lambda: self.bus.ls_remote().entries[rid].done, timeout, f"{rid} done", step=0.2)
        return done_result(self.world.project, self.url, rid)

    def files(self, rid: str) -> dict[str, bytes]:
        """Every file of the done commit under .kakeya/results/<id>/."""
        done = self.bus.ls_remote().entries[rid].done or ""
        return G.read_dir(self.world.project, done, results_path(rid))

    def one_done(self, rid: str) -> None:
        """Exactly one done commit: the done push took the request and claim refs, and the done commit's history
        holds one `kakeya done`."""
        entry = self.bus.ls_remote().entries[rid]
        assert entry.done and entry.claim is None and entry.req is None
        subjects = G.out(self.world.project, "log", "--format=%s", entry.done).splitlines()
        assert sum(s.startswith(f"kakeya done {rid}") for s in subjects) == 1, subjects

    def runs(self, mode: str) -> int:
        """How many times the program ran in `mode`: its marks where it can leave them; in a sandbox (which
        does not show the marks directory), the done results of `mode` whose program started (an exit code),
        plus any takeover (a run the done commit would not show)."""
        marks = len(list(self.world.marks.glob(f"leave.{mode}.*")))
        if marks or self.isolation == "none":
            return marks
        count = 0
        for rid, entry in self.bus.ls_remote().entries.items():
            if not entry.done:
                continue
            files = G.read_dir(self.world.project, entry.done, results_path(rid))
            result = json.loads(files.get("result.json", b"{}"))
            if result.get("params", {}).get("mode") == mode and result.get("exit_code") is not None:
                history = G.out(self.world.project, "log", "--format=%s", entry.done)
                count += 1 + history.count(" takes over ")
        return count

    def leave(self, mode: str) -> str:
        return self.client.request("leave", {"mode": mode}, "cpu").id

    def next_is_served(self, tag: str = "next") -> dict:
        """The runner serves an honest request after the hostile one."""
        result = self.done(self.client.request("work", {"tag": tag}, "cpu").id)
        assert (result["status"], result["verdict"]) == ("succeeded", "pass"), result
        return result

    def log(self, name: str = "r1") -> str:
        return (self.world.tmp / f"{name}.log").read_text(errors="replace")


def no_secret(files: dict[str, bytes]) -> None:
    for name, data in files.items():
        assert b"runner-key-material" not in data, name


def serve_hostile(bench: Bench, mode: str) -> tuple[dict, dict[str, bytes]]:
    """One hostile request then an honest one, through one `kakeya runner watch`; the hostile result."""
    proc = bench.runner()
    try:
        rid = bench.leave(mode)
        result = bench.done(rid)
        bench.next_is_served()
    finally:
        code = stop(proc)
    assert code == 0, bench.log()
    assert "Traceback" not in bench.log(), bench.log()
    bench.one_done(rid)
    assert bench.runs(mode) == 1
    files = bench.files(rid)
    no_secret(files)
    assert files["kept.txt"] == b"kept"
    return result, files


def test_a_fifo_at_the_progress_path_blocks_no_heartbeat(hostile: Bench):
    other = hostile.runner("r2")  # would take over a claim whose heartbeats stopped
    try:
        result, _ = serve_hostile(hostile, "fifo-progress")
    finally:
        assert stop(other) == 0
    assert result["status"] == "succeeded" and result["verdict"] == "pass"
    rid = result["request_id"]
    done = hostile.bus.ls_remote().entries[rid].done or ""
    claim = Claim.model_validate_json(G.read_path(hostile.world.project, done, CLAIM_PATH) or b"")
    assert claim.runner == result["runner_name"] and claim.heartbeat >= 3  # 8 s run, 3 s lease, 1 s beats
    assert "takes over" not in hostile.log("r1") + hostile.log("r2")


def test_names_that_are_not_utf8_or_have_control_characters_are_dropped(hostile: Bench):
    result, files = serve_hostile(hostile, "bad-name")
    assert result["status"] == "succeeded"
    assert "bad-\\xff-name.txt: its name is not UTF-8" in result["dropped"]
    assert "ctl\\nname.txt: its name has control or invisible characters" in result["dropped"]
    assert ".GIT: git refuses this name in a tree" in result["dropped"]
    assert not [f for f in files if "name" in f or f.lower() == ".git"]


def test_a_path_past_path_max_and_deep_nesting_are_dropped(hostile: Bench):
    result, files = serve_hostile(hostile, "long-path")
    assert result["status"] == "succeeded"
    long_dir = "/".join(f"{i:02d}" + "d" * 248 for i in range(3))
    assert any(
        d.startswith(long_dir[:100]) and "its path is longer than 512 bytes" in d for d in result["dropped"]
    )
    assert f"{'n/' * 8}n/: nested deeper than 8 directories" in result["dropped"]
    assert set(files) == {"kept.txt", "report.json", *RUNNER_FILES}  # nothing of either tree


def test_symlinks_and_hard_links_to_a_runner_file_are_never_read(hostile: Bench):
    result, files = serve_hostile(hostile, "links")
    assert result["status"] == "succeeded"
    dropped = "\n".join(result["dropped"])
    said = files["logs/stdout.log"].decode()  # what the program could not make (its isolation refused)
    assert "key-symlink: a symbolic link, not followed" in dropped
    assert "dir-link: a symbolic link, not followed" in dropped
    if "could not hard link" not in said:
        assert "key-hardlink: a hard link (2 names of one file), not read" in dropped
    assert "own-hardlink-a: a hard link (2 names of one file), not read" in dropped
    assert "own-hardlink-b: a hard link (2 names of one file), not read" in dropped
    assert not {"key-symlink", "dir-link", "key-hardlink", "own-hardlink-a", "own-hardlink-b"} & set(files)
    key = Path(os.environ["KAKEYA_TEST_KEY"])
    assert key.read_bytes() == KEY and key.stat().st_nlink == 1  # never written through, and its link gone


def test_fifos_sockets_and_devices_in_the_run_dir_are_dropped(hostile: Bench):
    result, files = serve_hostile(hostile, "special")
    assert result["status"] == "succeeded"
    assert "fifo: a FIFO, not read" in result["dropped"]
    assert "sock: a socket, not read" in result["dropped"]
    if "could not mknod" not in files["logs/stdout.log"].decode():
        assert "null: a device, not read" in result["dropped"]
    assert not {"fifo", "sock", "null"} & set(files)


def test_a_workload_written_verdict_is_replaced_by_the_runners_own(hostile: Bench):
    proc = hostile.runner()
    try:
        rid = hostile.leave("verdict")
        result = hostile.done(rid)
        hostile.next_is_served()
    finally:
        assert stop(proc) == 0
    hostile.one_done(rid)
    assert result["status"] == "error" and "wrote no report" in result["reason"]
    verdict = json.loads(hostile.files(rid)["verdict.json"])
    assert verdict["status"] == "error" and verdict["error"].startswith(
        "no report to gate: the run ended error"
    )


def test_files_planted_under_the_results_path_of_the_request_are_not_in_the_done_commit(hostile: Bench):
    world = hostile.world
    rid = new_id("work")
    subject = G.rev_parse(world.project, "HEAD") or ""
    prefix = results_path(rid)
    forged = json.dumps({"status": "pass", "checks": []}).encode()
    planted = {
        MANIFEST_PATH: json.dumps(manifest_dict(rid, "work", subject, params={"tag": "planted"})).encode(),
        f"{prefix}/verdict.json": forged,
        f"{prefix}/result.json": b'{"status": "succeeded"}',
        f"{prefix}/planted.txt": b"the requester wrote this",
        f"{prefix}/plots/x.png": b"not a plot",
    }
    sha = G.child_commit(world.project, subject, planted, "hostile request", "Test <t@example.com>")
    assert hostile.bus.swap([Update(req_ref("cpu", rid), sha, None)], atomic=False)
    proc = hostile.runner()
    try:
        result = hostile.done(rid)
        hostile.next_is_served()
    finally:
        assert stop(proc) == 0
    hostile.one_done(rid)
    assert (result["status"], result["verdict"], result["runner_name"]) == ("succeeded", "pass", "r1")
    files = hostile.files(rid)
    assert "planted.txt" not in files and "plots/x.png" not in files
    assert files["verdict.json"] != forged and json.loads(files["verdict.json"])["checks"]


def test_a_full_disk_ends_in_one_error_done_commit_and_the_runner_goes_on(hostile: Bench):
    disk = mounted_tmpfs(hostile.world.tmp / "disk", "24m")
    try:
        workdir = disk / "r1"
        proc = hostile.runner("r1", "--workdir", str(workdir))
        try:
            rid = hostile.leave("fill")
            result = hostile.done(rid)
            hostile.next_is_served()
            again = hostile.leave("fill")  # the space came back: the same again, not every request failing
            assert hostile.done(again)["status"] == "error"
            hostile.next_is_served("after")
        finally:
            code = stop(proc)
        assert code == 0, hostile.log()
        hostile.one_done(rid)
        assert result["status"] == "error" and "No space left on device" in result["reason"], result
        assert not any((workdir / "runs").iterdir())  # the crashed run's files are gone
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def test_stale_run_and_work_directories_are_removed_at_start(hostile: Bench):
    workdir = hostile.world.project / ".kakeya" / "runners" / "r1"
    stale = workdir / "runs" / "20260101T000000.000Z-leave-dead"
    (stale / "deep" / "locked").mkdir(parents=True)
    (stale / "deep" / "big.bin").write_bytes(b"\0" * (1 << 20))
    (stale / "deep" / "locked" / "f").write_text("x")
    with open(os.path.join(os.fsencode(stale), b"odd-\xfe"), "wb") as fh:
        fh.write(b"x")
    os.mkfifo(stale / "fifo")
    (stale / "deep" / "locked").chmod(0)
    (workdir / "work" / "20260101T000000.000Z-leave-dead").mkdir(parents=True)
    proc = hostile.runner()
    try:
        hostile.next_is_served()
    finally:
        assert stop(proc) == 0
    assert list((workdir / "runs").iterdir()) == [] and list((workdir / "work").iterdir()) == []
    assert "removing 1 stale directory in" in hostile.log()


def test_below_the_free_space_floor_a_runner_claims_nothing_and_says_so(hostile: Bench, monkeypatch):
    disk = mounted_tmpfs(hostile.world.tmp / "floor", "16m")
    try:
        ballast = disk / "ballast"
        ballast.write_bytes(b"\0" * (12 << 20))
        monkeypatch.setenv("KAKEYA_MIN_FREE", str(8 << 20))
        proc = hostile.runner("r1", "--workdir", str(disk / "r1"))
        try:
            rid = hostile.client.request("work", {"tag": "waits"}, "cpu").id

            def paused() -> str | None:
                snap = hostile.bus.ls_remote()
                seen = [s for s in read_presences(hostile.bus, snap.runners) if s.name == "r1"]
                return seen[0].presence.paused if seen and seen[0].presence else None

            why = wait_for(paused, 30, "the presence to say the runner is paused")
            assert "not claiming" in str(why) and "under the floor of 8 MiB (min_free_bytes)" in str(why)
            assert not hostile.bus.ls_remote().entries[rid].claim  # nothing claimed meanwhile
            ballast.unlink()
            result = hostile.done(rid)
            wait_for(lambda: paused() is None, 30, "the presence to say it claims again")
        finally:
            assert stop(proc) == 0
        assert result["status"] == "succeeded"
        assert "claiming again" in hostile.log()
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def mounted_tmpfs(path: Path, size: str) -> Path:
    """A small tmpfs at `path` (skips when this host does not let the test mount one)."""
    if not sys.platform.startswith("linux") or not ROOT:
        pytest.skip("mounting a small tmpfs needs root on Linux")
    path.mkdir(parents=True)
    done = subprocess.run(
        [
            "mount",
            "-t",
            "tmpfs",
            "-o",
            f"size={size},mode=755",
            f"kakeya-test-{uuid.uuid4().hex[:8]}",
            str(path),
        ],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    return path


def test_any_exception_after_a_claim_ends_in_an_error_done_commit_and_watch_goes_on(hostile: Bench):
    logged: list[str] = []
    runner = Runner(
        hostile.url,
        config=load_config(),
        name="r1",
        labels=["cpu"],
        workdir=hostile.world.tmp / "runners" / "r1",
        log=logged.append,
    )
    real_tree, real_ls = runner.delivery.result_tree, runner.bus.ls_remote
    faults = {"tree": 1, "ls": 1}

    def broken_tree(*args, **kw):  # what a tree writer that meets a name it cannot encode did
        if faults["tree"]:
            faults["tree"] -= 1
            raise UnicodeEncodeError("utf-8", "bad-\udcff", 4, 5, "surrogates not allowed")
        return real_tree(*args, **kw)

    def broken_ls(*args, **kw):  # a bug outside serving: the loop logs it and goes on
        if faults["ls"]:
            faults["ls"] -= 1
            raise ValueError("not a KakeyaError")
        return real_ls(*args, **kw)

    runner.delivery.result_tree, runner.bus.ls_remote = broken_tree, broken_ls  # type: ignore[method-assign]
    thread = threading.Thread(target=runner.watch, kwargs={"poll_s": 0.2})
    thread.start()
    try:
        rid = hostile.leave("bad-name")
        result = hostile.done(rid)
        hostile.next_is_served()
    finally:
        runner.stop()
        thread.join(60)
    hostile.one_done(rid)
    assert result["status"] == "error" and result["reason"] == (
        "runner r1: committing the result failed: UnicodeEncodeError: 'utf-8' codec can't encode character "
        "'\\udcff' in position 4: surrogates not allowed"
    )
    assert result["exit_code"] == 0 and result["argv"][1:] == ["leave.py", "bad-name"]  # its provenance kept
    assert "bad-\\xff-name.txt: its name is not UTF-8" in result["dropped"]
    files = hostile.files(rid)
    assert set(files) == {"result.json", "verdict.json", "summary.md", "report.html"}
    assert json.loads(files["verdict.json"])["error"].startswith("no report to gate")
    assert any("unexpected ValueError: not a KakeyaError; retrying in" in line for line in logged)
    assert hostile.runs("bad-name") == 1 and faults == {"tree": 0, "ls": 0}


def test_the_progress_record_never_waits_on_nor_follows_what_a_run_put_at_its_paths(tmp_path: Path):
    outside = tmp_path / "runner"
    outside.mkdir()
    (outside / "stdout.log").write_text("runner-key-material\n")
    (outside / "progress.json").write_text('{"done": 1, "total": 2, "what": "runner-key-material"}')
    out = tmp_path / "out"
    out.mkdir()
    (out / "logs").symlink_to(outside)  # the log tail would read the runner's file
    os.mkfifo(out / PROGRESS_FILE)  # an open() without O_NONBLOCK waits here for a writer forever
    records: list = []
    reader = threading.Thread(target=lambda: records.append(Tracker(out).record()), daemon=True)
    reader.start()
    reader.join(30)
    assert records, "the progress record blocked on a FIFO"
    assert records[0].workload is None and records[0].log_tail == []
    (out / PROGRESS_FILE).unlink()
    os.link(outside / "progress.json", out / PROGRESS_FILE)  # a hard link: another name of the runner's file
    assert Tracker(out).record().workload is None
    (out / PROGRESS_FILE).unlink()
    (out / PROGRESS_FILE).write_text('{"done": 1, "total": 2, "what": "its own"}')
    (out / "logs").unlink()
    (out / "logs").mkdir()
    (out / "logs" / "stdout.log").write_text("a line\n")
    record = Tracker(out).record()
    assert record.workload is not None and record.workload.what == "its own"
    assert record.log_tail == ["stdout: a line"]


def test_kakeya_run_below_the_floor_says_why_instead_of_waiting(world: Env, monkeypatch, capsys):
    monkeypatch.setenv("KAKEYA_MIN_FREE", str(1 << 60))
    assert main(["run", "work", "-p", "tag=floor"]) == 1
    err = capsys.readouterr().err
    assert "is not claiming:" in err and "under the floor of" in err and "(min_free_bytes)" in err, err
    assert world.count() == []


def test_a_run_that_leaves_thousands_of_fifos_gets_a_short_dropped_list(tmp_path: Path):
    for i in range(2000):
        os.mkfifo(tmp_path / f"f{i:04d}")
    (tmp_path / "kept.txt").write_text("kept")
    dropped = apply_caps(tmp_path, report_cap=1 << 20, files_cap=1 << 20, result_cap=1 << 20)
    assert len(dropped) == 2000 and sorted(p.name for p in tmp_path.iterdir()) == ["kept.txt"]
    result = RunResult(status="succeeded", preset="leave")
    result.dropped += dropped
    assert len(result.dropped) == DROPPED_LINES and result.dropped[0] == "f0000: a FIFO, not read"
    assert result.dropped[-1] == f"... and {2000 - DROPPED_LINES + 1} more, not listed"
