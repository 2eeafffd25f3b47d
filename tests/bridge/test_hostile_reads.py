"""Issue 40 (1, 9, 10): nothing the runner reads after a run blocks it, reads without bound or follows a link,
and what a run leaves is capped in number. Real `kakeya runner watch` processes on a `git daemon` bus serve a
program that plants a FIFO, a symbolic link to /dev/zero, a directory or a huge (sparse) file at every path the
runner reads after a run: the launcher's status (and its temporary file, so the launcher cannot write it), the
report, the logs (where the run can reach them: isolation none), and one that leaves 20,000 files. For each:
one done commit that says what happened, and the same runner serves the next request. Each runs under the
runner's default isolation (auto: bwrap where installed) and under isolation none."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator

import pytest
import yaml

from tests.bridge.bus_support import WRITE_REPORT_PY, Daemon, Env, git, script_preset, stop
from tests.bridge.test_hostile_output import Bench, no_secret

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
    if kind == "many":
        for i in range(int(os.environ.get("MANY", "20000"))):
            open(os.path.join(run, f"f{i:05d}"), "wb").close()
        write_report()
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
    {"type": "enum", "choices": [*KINDS, "many"], "default": "fifo"},
    env={"MANY": str(MANY)},
    gate=[{"check": "min", "path": "/probe/cpu_count", "value": 1}],
)


@pytest.fixture(name="bench", params=["auto", "none"])
def bench_fixture(world: Env, daemon: Daemon, monkeypatch: pytest.MonkeyPatch, request) -> Iterator[Bench]:
    monkeypatch.setenv("KAKEYA_ISOLATION", request.param)  # auto: the default, bwrap where installed
    monkeypatch.setenv("KAKEYA_MIN_FREE", "0")
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
    assert files["kept.txt"] == b"kept"
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
    assert len(files) <= cap, len(files)
    assert {"result.json", "report.json", "verdict.json", "summary.md", "kept.txt"} <= set(files)
    over = [line for line in result["dropped"] if "files_count_cap" in line]
    assert len(over) == 1, result["dropped"]
    kept_program_files = sum(1 for name in files if name.startswith("f") and name[1:].isdigit())
    assert f"{MANY - kept_program_files} " in over[0], (over, kept_program_files)
    assert len(result["dropped"]) <= 2, result["dropped"]
    assert str(bench.world.tmp) not in json.dumps(result) and "/kakeya-run-" not in json.dumps(result)
