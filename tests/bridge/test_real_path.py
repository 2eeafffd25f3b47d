"""The real path (issue 20): the bus is the clone's remote, Ctrl-C never loses a run, and the small things a
person trips on. Real clones with `origin` on `git daemon`, real `kakeya` processes and real signals sent
to their process groups."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bridge.bus.bus import Bus
from bridge.bus.records import archive_ref, done_ref, layout_ref, req_ref
from bridge.cli.main import main
from bridge.wire import git as G
from tests.bridge.bus_support import Daemon, Env, done_result, free_port, git, pid_alive, wait_for


def kakeya(cwd: Path, *args: str, session: bool = False) -> subprocess.Popen[str]:
    """`kakeya ARGS` as its own process in `cwd` (in a session and process group of its own when `session`,
    as a shell runs a foreground job)."""
    return subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=session,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def finish(proc: subprocess.Popen[str], timeout: float = 90) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def test_in_a_clone_the_bus_is_origin_and_every_command_says_so(world: Env, daemon: Daemon, capsys):
    origin = daemon.repo("team.git")
    git(world.project, "remote", "add", "origin", origin)
    git(world.project, "push", "-q", "origin", "main")
    assert main(["request", "work", "-p", "tag=o", "--runner", "cpu"]) == 0
    captured = capsys.readouterr()
    rid = captured.out.strip()
    assert captured.err == f"kakeya: bus: remote origin ({origin})\n"
    assert not (world.project / ".kakeya").exists()  # nothing went to an embedded bus
    assert req_ref("cpu", rid) in Bus(origin, world.project).ls_remote().refs

    # a runner host's own clone of the project serves it with no --remote: its bus is its origin too
    host = world.tmp / "host"
    git(world.tmp, "clone", "-q", origin, str(host))
    code, out, err = finish(kakeya(host, "runner", "once", "--labels", "cpu", "--name", "h200-1"))
    assert code == 0 and out == f"{rid}: succeeded, verdict pass\n"
    assert err.startswith(f"kakeya: bus: remote origin ({origin})\n")
    assert done_result(world.project, origin, rid)["runner_name"] == "h200-1"
    assert world.count() == ["o"]

    assert main(["wait", rid, "--out", "res"]) == 0
    assert capsys.readouterr().err == f"kakeya: bus: remote origin ({origin})\n"
    # `kakeya run` keeps to the embedded bus, and says so
    assert main(["run", "work", "-p", "tag=e"]) == 0
    embedded = world.project / ".kakeya" / "bus.git"
    assert capsys.readouterr().err.startswith(f"kakeya: bus: {embedded} (embedded)\n")
    assert world.count() == ["o", "e"]


def test_the_configured_remote_wins_over_origin(world: Env, daemon: Daemon, capsys):
    git(world.project, "remote", "add", "origin", daemon.repo("origin.git"))
    team = daemon.repo("team.git")
    git(world.project, "remote", "add", "bus", team)
    (world.project / "kakeya.toml").write_text('remote = "bus"\n')
    git(world.project, "add", "kakeya.toml")
    git(world.project, "commit", "-qm", "config")
    assert main(["request", "work", "--runner", "cpu"]) == 0
    rid = capsys.readouterr().out.strip()
    assert rid in Bus(team, world.project).ls_remote().entries
    assert Bus(daemon.repo("origin.git"), world.project).ls_remote().entries == {}


def test_ctrl_c_to_the_group_of_kakeya_run_ends_the_run_in_one_done_commit(world: Env):
    proc = kakeya(
        world.project, "run", "work", "-p", "mode=sleep", "-p", "tag=c", "-p", "seconds=60", session=True
    )
    started = wait_for(
        lambda: world.mark("c", "started").exists() and world.mark("c", "started").read_text(), 60, "the run"
    )
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal does on Ctrl-C: the whole foreground group
    code, out, err = finish(proc)
    lines = err.strip().splitlines()
    assert code == 130 and "Traceback" not in err, err
    rid = out.split(":")[0]
    assert lines[-1].startswith(f"kakeya: interrupted by SIGINT: request {rid} ended in its done commit ")
    assert out.startswith(f"{rid}: work error (interrupted by SIGINT)")
    bus = str(world.project / ".kakeya" / "bus.git")
    result = done_result(world.project, bus, rid)
    assert (result["status"], result["reason"]) == ("error", "interrupted by SIGINT")
    entry = Bus(bus, world.project).ls_remote().entries[rid]
    assert entry.done and entry.claim is None and entry.req is None  # one done commit; the live refs went
    assert not pid_alive(int(started.split()[0])) and world.count() == []


def test_ctrl_c_to_the_group_of_runner_watch_finishes_the_request_and_never_reruns_it(world: Env, capsys):
    assert main(["run", "work", "-p", "tag=warm"]) == 0  # creates the embedded bus
    bus = str(world.project / ".kakeya" / "bus.git")
    capsys.readouterr()
    assert (
        main(["request", "work", "-p", "mode=sleep", "-p", "tag=w", "-p", "seconds=2", "--runner", "cpu"])
        == 0
    )
    rid = capsys.readouterr().out.strip()
    proc = kakeya(
        world.project, "runner", "watch", "--labels", "cpu", "--name", "svc", "--poll", "0.2", session=True
    )
    wait_for(lambda: world.mark("w", "started").exists(), 60, "the run")
    os.killpg(proc.pid, signal.SIGINT)
    code, out, err = finish(proc)
    assert code == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == (
        "kakeya: interrupted by SIGINT: runner svc stopped; no request was left half-done"
    )
    assert done_result(world.project, bus, rid)["status"] == "succeeded"  # finished and pushed
    # the next runner finds nothing to redo
    code, out, _ = finish(kakeya(world.project, "runner", "once", "--labels", "cpu", "--name", "next"))
    assert code == 0 and out.startswith("nothing to do")
    assert world.count() == ["warm", "w"]


def test_a_stop_grace_ends_a_long_run_after_the_first_sigterm(world: Env, capsys):
    assert (
        main(["request", "work", "-p", "mode=sleep", "-p", "tag=g", "-p", "seconds=60", "--runner", "cpu"])
        == 0
    )
    rid = capsys.readouterr().out.strip()
    bus = str(world.project / ".kakeya" / "bus.git")
    os.environ["KAKEYA_STOP_GRACE"] = "1"
    try:
        proc = kakeya(world.project, "runner", "watch", "--labels", "cpu", "--name", "svc", session=True)
    finally:
        del os.environ["KAKEYA_STOP_GRACE"]
    started = wait_for(
        lambda: world.mark("g", "started").exists() and world.mark("g", "started").read_text(), 60, "the run"
    )
    proc.send_signal(signal.SIGTERM)  # systemd's KillMode=mixed: the main process only
    code, _, err = finish(proc)
    assert code == 0, err  # a service stop is a clean stop
    result = done_result(world.project, bus, rid)
    assert (result["status"], result["reason"]) == (
        "error",
        "runner svc stopped by SIGTERM; the run ended after 1 s",
    )
    assert not pid_alive(int(started.split()[0])) and world.count() == []


def test_git_helpers_run_in_a_process_group_of_their_own(world: Env):
    """So a terminal's Ctrl-C (sent to kakeya's foreground group) never reaches them."""
    shown = G.out(world.project, "-c", "alias.pgid=!ps -o pgid= -p $$", "pgid")
    assert int(shown) != os.getpgrp()


def test_small_things(world: Env, daemon: Daemon, capsys, tmp_path: Path):
    # "did you mean" for presets and parameters
    assert main(["request", "wrok", "--runner", "cpu"]) == 2
    assert "unknown preset 'wrok'; did you mean 'work'?" in capsys.readouterr().err
    assert main(["request", "work", "-p", "tga=x", "--runner", "cpu"]) == 2
    assert "unknown parameter 'tga'; did you mean 'tag'?" in capsys.readouterr().err
    # --expires needs a unit
    assert main(["request", "work", "--runner", "cpu", "--expires", "90"]) == 2
    assert "a number and a unit" in capsys.readouterr().err
    # an unknown remote name is reported as such, not taken as a path
    git(world.project, "remote", "add", "origin", daemon.repo())
    assert main(["request", "work", "--runner", "cpu", "--remote", "upstream"]) == 2
    assert "'upstream' is not a git remote of" in capsys.readouterr().err
    # a dirty tree: exit 2 (nothing ran), and a failed request leaves no .kakeya/ behind
    git(world.project, "remote", "remove", "origin")
    (world.project / "work.py").write_text("changed")
    assert main(["request", "work", "--runner", "cpu"]) == 2
    assert "uncommitted changes (work.py)" in capsys.readouterr().err
    assert not (world.project / ".kakeya").exists()
    # not a repository: exit 2
    plain = tmp_path / "plain"
    plain.mkdir()
    os.chdir(plain)
    assert main(["request", "work", "--runner", "cpu", "--remote", str(daemon.base / "bus.git")]) == 2
    assert "not in a git project: pass --project DIR" in capsys.readouterr().err
    assert list(plain.iterdir()) == []  # no .kakeya/ written there
    os.chdir(world.project)
    # --version
    code, out, _ = finish(kakeya(world.project, "--version"))
    assert code == 0 and out.startswith("kakeya ")


def test_a_reader_that_leaves_early_gets_a_quiet_exit(world: Env):
    proc = kakeya(world.project, "presets", "--json")
    assert proc.stdout is not None
    proc.stdout.close()  # like `kakeya presets --json | head -0`
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.wait(60) == 141 and err == ""


def test_a_succeeded_run_whose_gate_failed_says_ran_gate_failed(world: Env, capsys):
    assert main(["run", "strict", "-p", "tag=s"]) == 1
    line = capsys.readouterr().out.splitlines()[0]
    assert line.endswith(": strict ran, gate failed")
    rid = line.split(":")[0]
    assert json.loads((world.project / "out" / rid / "result.json").read_text())["verdict"] == "fail"


@pytest.mark.parametrize("remote", ["bus.git", "./relative"])
def test_paths_that_look_like_names_stay_paths(world: Env, remote: str):
    from bridge.client.remote import resolve_remote
    from bridge.config import load_config

    if remote == "./relative":
        G.init_bare(world.project / "relative")
    assert resolve_remote(remote, world.project, load_config()) == str((world.project / remote).resolve())


def test_summary_has_results_stderr_tail_and_absolute_links_for_a_job_summary(world: Env, capsys):
    boom = {
        "name": "boom",
        "description": "fails loudly",
        "timeout_s": 60,
        "runners": ["cpu"],
        "argv": [
            "{python}",
            "-c",
            "import sys\nfor i in range(30): print(f'problem {i}', file=sys.stderr)\nsys.exit(3)",
        ],
        "report": {"kind": "probe", "schema_version": 1},
    }
    (world.presets / "boom.yaml").write_text(yaml.safe_dump(boom))
    assert main(["run", "boom"]) == 1
    rid = capsys.readouterr().out.split(":")[0]
    summary = (world.project / "out" / rid / "summary.md").read_text()
    tail = summary.split("## Last lines of stderr\n\n```\n", 1)[1].split("```", 1)[0].splitlines()
    assert tail == [f"problem {i}" for i in range(10, 30)]

    assert main(["run", "work", "-p", "tag=r"]) == 0
    rid = capsys.readouterr().out.split(":")[0]
    out = world.project / "out" / rid
    summary = (out / "summary.md").read_text()
    results = summary.split("## Results\n\n", 1)[1].split("\n## ", 1)[0]
    assert (
        "| cpu_count | 1 |" in results and "| accelerators.cuda.available | false |" in results
    )  # every depth
    assert "Last lines of stderr" not in summary  # only when the run did not succeed
    assert "- [logs/stdout.log](logs/stdout.log)" in summary

    base = "https://github.com/org/kakeya"
    assert main(["results", rid, "--out", "gh", "--link-base", base + "/"]) == 0
    capsys.readouterr()
    done = Bus(str(world.project / ".kakeya" / "bus.git"), world.project).ls_remote().entries[rid].done
    linked = (world.project / "gh" / rid / "summary.md").read_text()
    where = f"{done}/.kakeya/results/{rid}/"
    assert f"- [logs/stdout.log]({base}/blob/{where}logs/stdout.log)" in linked
    assert linked.replace(f"{base}/blob/{where}", "") == summary  # nothing else changed


def test_results_section_shows_a_kinds_key_table():
    from bridge.results.render import absolute_links, results_markdown

    report = {
        "kind": "throughput",
        "prompts": [
            {
                "prompt_tokens": 16,
                "greedy": {"decode_tok_s": 10.5},
                "speculative": {"decode_tok_s": 21.0},
                "speedup": 2.0,
                "exact": True,
                "samples": [1, 2],
            },
            {
                "prompt_tokens": 64,
                "greedy": {"decode_tok_s": 9.0},
                "speculative": {"decode_tok_s": 13.5},
                "speedup": 1.5,
                "exact": True,
                "samples": [],
            },
        ],
        "summary": {"mean_speedup": 1.75},
    }
    assert results_markdown(report) == [
        "## Results",
        "",
        "### Decoding by prompt and method",
        "",
        "| prompt tokens | greedy decode tok/s | speculative decode tok/s | speedup | exact |",
        "|---|---|---|---|---|",
        "| 16 | 10.5 | 21.0 | 2.00× | yes |",
        "| 64 | 9.0 | 13.5 | 1.50× | yes |",
        "",
        "### Summary",
        "",
        "| | |",
        "|---|---|",
        "| mean_speedup | 1.75 |",
        "",
    ]
    md = "![plot.png](plot.png) [a](https://x/y) [b](#gate) [c](logs/c.log)"
    assert (
        absolute_links(md, "B/", "R/")
        == "![plot.png](R/plot.png) [a](https://x/y) [b](#gate) [c](B/logs/c.log)"
    )


def test_doctor_checks_what_each_label_promises_push_access_and_bus_fetching(
    world: Env, daemon: Daemon, capsys, monkeypatch, tmp_path: Path
):
    origin = daemon.repo("team.git")
    git(world.project, "remote", "add", "origin", origin)
    git(world.project, "push", "-q", "origin", "main")
    models = tmp_path / "models"
    (models / "gemma-3-1b").mkdir(parents=True)
    (models / "gemma-3-1b" / "config.json").write_text("{}")
    monkeypatch.setenv("KAKEYA_MODELS", str(models))
    monkeypatch.setenv("KAKEYA_LABELS", "cpu,h200")
    code = main(["doctor"])
    out = capsys.readouterr().out
    assert "ok    push     a dry-run push of refs/heads/kakeya/doctor/" in out
    assert "ok    clock    not measurable for this bus (a path, file://, git:// or ssh remote" in out
    assert f"ok    models   {models}: 1 model(s): gemma-3-1b" in out
    cuda = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
    )
    if cuda.stdout.strip() == "True":  # a GPU host: the label's devices are named
        assert code == 0 and "ok    h200     CUDA: " in out
    else:  # an h200 runner with no CUDA is not healthy
        assert code == 1 and "FAIL  h200     label h200 needs CUDA" in out and "1 check(s) failed" in out
    # bus branches in every teammate's `git fetch`, until --no-bus-fetch sets the negative refspec
    assert main(["request", "work", "--runner", "cpu"]) == 0
    rid = capsys.readouterr().out.strip()
    assert "also pulls every bus branch" in out
    monkeypatch.setenv("KAKEYA_LABELS", "cpu")
    assert main(["doctor", "--no-bus-fetch"]) == 0
    assert (
        "ok    fetch    `git fetch origin` skips the bus branches (^refs/heads/kakeya/*)"
        in capsys.readouterr().out
    )
    assert "^refs/heads/kakeya/*" in git(world.project, "config", "--get-all", "remote.origin.fetch")
    git(world.project, "fetch", "-q", "origin")
    assert git(world.project, "for-each-ref", "refs/remotes/origin/") == git(
        world.project, "for-each-ref", "refs/remotes/origin/main"
    )
    # the client still reads and writes the bus in such a clone
    from bridge.config import load_config
    from bridge.run.runner import Runner

    served = Runner(origin, config=load_config(), name="r", labels=["cpu"], workdir=tmp_path / "r").once()
    assert served is not None and served.id == rid and served.pushed
    assert main(["results", rid, "--out", "res"]) == 0
    assert json.loads((world.project / "res" / rid / "result.json").read_text())["status"] == "succeeded"
    capsys.readouterr()

    # a bus that takes no pushes (git daemon without receive-pack) fails the push check
    port = free_port()
    ro = subprocess.Popen(
        [
            "git",
            "daemon",
            "--reuseaddr",
            "--export-all",
            f"--base-path={daemon.base}",
            "--listen=127.0.0.1",
            f"--port={port}",
            str(daemon.base),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"git://127.0.0.1:{port}/team.git"
        wait_for(
            lambda: subprocess.run(["git", "ls-remote", url], capture_output=True).returncode == 0,
            20,
            "daemon",
        )
        assert main(["doctor", "--remote", url]) == 1
        assert f"FAIL  push     a dry-run push to {url} was refused" in capsys.readouterr().out
    finally:
        ro.terminate()
        ro.wait(10)


def test_bus_gc_archives_old_done_refs_out_of_every_clones_fetch(world: Env, daemon: Daemon, capsys):
    url = daemon.repo()
    git(world.project, "remote", "add", "origin", url)
    assert main(["request", "work", "-p", "tag=a", "--runner", "cpu"]) == 0
    rid = capsys.readouterr().out.strip()
    from bridge.config import load_config
    from bridge.run.runner import Runner

    Runner(url, config=load_config(), name="r", labels=["cpu"], workdir=world.tmp / "r").once()
    done = Bus(url, world.project).ls_remote().entries[rid].done
    assert main(["bus", "gc", "--older-than", "0", "--archive-done", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert done_ref(rid) in out and "would delete 2 refs" in out  # the done ref and its index ref
    assert main(["bus", "gc", "--older-than", "0", "--archive-done"]) == 0
    assert "deleted 2 refs" in capsys.readouterr().out
    refs = dict(
        reversed(line.split("\t"))
        for line in git(world.project, "ls-remote", url).splitlines()
        if "\t" in line
    )
    marker = refs.pop(layout_ref())
    assert refs == {archive_ref(rid): done}  # only the archive ref is left, on the same done commit
    assert G.read_path(world.project, marker, ".kakeya/layout.txt").startswith(b"kakeya bus layout 2")
    assert main(["status"]) == 0 and rid not in capsys.readouterr().out
    clone = world.tmp / "clone"
    git(world.tmp, "clone", "-q", "--mirror", url, str(clone))  # even a mirror clone's refs/heads have none
    assert "kakeya/" not in git(clone, "for-each-ref", "refs/heads/")


def test_doctor_measures_clock_skew_from_an_http_bus_date_header():
    """A real HTTP server whose clock runs 120 s ahead (its Date header); the answer is a 401, as from a
    private repository, which still carries the Date."""
    import email.utils
    import http.server
    import re
    import threading
    import time

    from bridge.cli.commands.doctor import clock_skew

    class Ahead(http.server.BaseHTTPRequestHandler):
        def date_time_string(self, timestamp=None):
            return email.utils.formatdate(time.time() + 120, usegmt=True)

        def do_HEAD(self):
            self.send_response(401)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ahead)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        said = clock_skew(f"http://127.0.0.1:{server.server_address[1]}/team/bus.git")
    finally:
        server.shutdown()
    m = re.match(r"the bus's clock is ([+-]\d+) s from this host's \(HTTP Date, ± [\d.]+ s\)", said)
    assert m and 119 <= int(m.group(1)) <= 121, said
    assert clock_skew(f"http://127.0.0.1:{free_port()}/x.git").startswith("not measurable: ")
    assert clock_skew("git://127.0.0.1/x.git").startswith("not measurable for this bus")
