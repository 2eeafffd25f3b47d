"""The runner against a real bus: end to end over git://, exactly-once under 4 runner processes, lease
takeover after SIGKILL, a stalled runner that loses its lease, cancels, rejections, LFS, signals, outbox."""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from pathlib import Path

from bridge.bus.bus import Bus
from bridge.bus.records import (
    CLAIM_PATH,
    DONE_PREFIX,
    LIVE,
    SUBJECT_PREFIX,
    Claim,
    Update,
    claim_ref,
    done_ref,
    new_id,
    results_path,
    subject_ref,
)
from bridge.cli.main import main
from bridge.client.client import Client
from bridge.config import load_config
from bridge.presets.registry import load_registry
from bridge.run.runner import Runner
from bridge.wire import git as G
from tests.bridge.bus_support import (
    Daemon,
    Env,
    done_result,
    git,
    kill_pid,
    make_runner,
    manifest_dict,
    pid_alive,
    push_raw_request,
    runner_process,
    stop,
    wait_for,
)


def done_claim(store: Path, url: str, request_id: str) -> Claim:
    bus = Bus(url, store)
    sha = bus.ls_remote(done_ref(request_id)).refs[done_ref(request_id)]
    bus.fetch([done_ref(request_id)])
    repo = store
    return Claim.model_validate_json(G.read_path(repo, sha, CLAIM_PATH) or b"")


def test_request_runner_results_end_to_end_over_git_daemon(world: Env, daemon: Daemon, capsys):
    url = daemon.repo()
    assert main(["request", "work", "-p", "tag=e2e", "--runner", "cpu", "--remote", url]) == 0
    rid = capsys.readouterr().out.strip()
    assert main(["status", rid, "--remote", url]) == 0 and "state      requested" in capsys.readouterr().out
    assert main(["runner", "once", "--labels", "cpu", "--name", "gpu-box", "--remote", url]) == 0
    assert capsys.readouterr().out.strip() == f"{rid}: succeeded, verdict pass"
    assert main(["results", rid, "--remote", url, "--out", "res"]) == 0
    result = json.loads((world.project / "res" / rid / "result.json").read_text())
    assert (result["status"], result["runner_name"], result["runner_labels"]) == (
        "succeeded",
        "gpu-box",
        ["cpu"],
    )
    assert result["subject"] == git(world.project, "rev-parse", "HEAD") and result["preset"] == "work"
    assert (
        json.loads((world.project / "res" / rid / "report.json").read_text())["subject"] == result["subject"]
    )
    assert world.count() == ["e2e"]
    # the done push deleted the request and claim refs and indexed the result under its subject; the done
    # commit descends from the claim, the request and the subject
    snap = Bus(url, world.project).ls_remote(*LIVE, DONE_PREFIX, SUBJECT_PREFIX)
    entry = snap.entries[rid]
    assert (entry.req, entry.claim, entry.cancel) == (None, None, None) and entry.done
    assert snap.index == {rid: (result["subject"], entry.done)}
    assert set(snap.refs) == {done_ref(rid), subject_ref(result["subject"], rid)}
    assert G.parents(world.project, G.parents(world.project, entry.done)[0]) != []
    assert G.read_path(world.project, entry.done, CLAIM_PATH) is not None
    assert main(["runner", "once", "--labels", "cpu", "--remote", url, "--request", rid]) == 0
    assert "nothing to do" in capsys.readouterr().out
    other = Client(load_config(), remote=url).request("work", {}, "cpu", subject="HEAD").id
    assert main(["runner", "once", "--labels", "cpu-b", "--remote", url, "--request", other]) == 1
    assert "is for runner label 'cpu'; this runner serves cpu-b" in capsys.readouterr().err
    assert main(["runner", "once", "--labels", "cpu", "--remote", url, "--request", new_id("work")]) == 1
    assert world.count() == ["e2e"]
    # worktrees are removed after the run; the mirror keeps no per-request refs
    mirror = world.project / ".kakeya" / "runners" / "gpu-box"
    assert not any((mirror / "work").iterdir())
    assert git(mirror / "mirror.git", "for-each-ref", "--format=%(refname)") == "refs/kakeya/last"


def test_four_runner_processes_execute_40_requests_exactly_once(world: Env, daemon: Daemon):
    url = daemon.repo()
    staging = G.init_bare(world.tmp / "staging.git")  # queue the 40 requests with one push
    client = Client(load_config(), remote=str(staging))
    ids = [
        client.request("work", {"tag": f"t{i}", "seconds": "0.1", "mode": "sleep"}, "cpu").id
        for i in range(40)
    ]
    git(staging, "push", "-q", url, "refs/heads/kakeya/*:refs/heads/kakeya/*")
    procs = [runner_process(world, url, f"w{i}", "--poll", "0.5", "--lease", "5") for i in range(4)]
    try:
        bus = Bus(url, world.project)
        wait_for(
            lambda: sum(1 for e in bus.ls_remote().entries.values() if e.done) == 40,
            150,
            "40 done refs",
            step=0.5,
        )
    finally:
        codes = [stop(p) for p in procs]
    assert codes == [0, 0, 0, 0]
    assert sorted(world.count()) == sorted(f"t{i}" for i in range(40))  # each executed exactly once
    bus.fetch([done_ref(i) for i in ids])
    names = []
    repo = world.project
    for rid, entry in bus.ls_remote().entries.items():
        result = json.loads(G.read_path(repo, entry.done or "", f"{results_path(rid)}/result.json") or b"")
        assert result["status"] == "succeeded" and result["request_id"] == rid
        names.append(result["runner_name"])
    assert len(set(names)) >= 2, names


def test_a_sigkilled_runner_loses_its_claim_to_another_after_the_lease(world: Env, daemon: Daemon):
    url = daemon.repo()
    client = Client(load_config(), remote=url)
    rid = client.request("work", {"tag": "k", "mode": "once", "seconds": "60"}, "cpu").id
    first = runner_process(world, url, "a", "--poll", "0.2", "--lease", "2")
    program = int(
        wait_for(
            lambda: world.mark("k", "first").exists() and world.mark("k", "first").read_text(),
            60,
            "the first attempt to start",
        )
    )
    bus = Bus(url, world.project)
    wait_for(lambda: world.mark("k", "started").exists(), 10, "the program")
    time.sleep(1.0)  # let a heartbeat or two land
    held = bus.ls_remote(claim_ref(rid)).refs[claim_ref(rid)]
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    kill_pid(program)  # the host died: its run died with it
    second = make_runner(url, world, "b")
    assert second.once() is None  # the lease of the dead runner has not expired yet
    served = wait_for(second.once, 20, "the takeover")
    assert served.status == "succeeded" and served.pushed
    claim = done_claim(world.project, url, rid)
    assert (claim.runner, claim.takeover_of) == ("b", "a")
    done = bus.ls_remote().entries[rid].done
    assert done is not None and G.is_ancestor(world.project, held, done)  # what runner a wrote is kept
    assert world.count() == ["k"]
    assert done_result(world.project, url, rid)["runner_name"] == "b"


def test_a_stalled_runner_that_lost_its_lease_kills_its_run_and_pushes_nothing(world: Env, daemon: Daemon):
    url = daemon.repo()
    client = Client(load_config(), remote=url)
    rid = client.request("work", {"tag": "s", "mode": "once", "seconds": "60"}, "cpu").id
    stalled = runner_process(world, url, "a", "--poll", "0.2", "--lease", "2")
    try:
        program = int(
            wait_for(
                lambda: world.mark("s", "first").exists() and world.mark("s", "first").read_text(),
                60,
                "the first attempt",
            )
        )
        stalled.send_signal(signal.SIGSTOP)
        served = wait_for(make_runner(url, world, "b").once, 20, "the takeover")
        assert served.status == "succeeded" and served.pushed
        assert pid_alive(program)
        stalled.send_signal(signal.SIGCONT)
        wait_for(lambda: not pid_alive(program), 20, "the stalled runner to kill its run")
        wait_for(
            lambda: "result is not pushed" in (world.tmp / "a.log").read_text(),
            20,
            "the stalled runner's log",
        )
    finally:
        stalled.send_signal(signal.SIGCONT)
        assert stop(stalled) == 0
    log = (world.tmp / "a.log").read_text()
    assert f"{rid}: lease lost: the request was finished by another runner; its result is not pushed" in log
    assert done_result(world.project, url, rid)["runner_name"] == "b"
    assert world.count() == ["s"]


def test_rejections_end_in_done_commits_and_run_nothing(world: Env):
    client = Client(load_config())
    url = client.url
    head = git(world.project, "rev-parse", "HEAD")
    cases = {}

    def raw(preset: str, manifest) -> str:
        rid = new_id(preset)
        push_raw_request(url, world.project, "cpu", rid, manifest(rid) if callable(manifest) else manifest)
        return rid

    cases[raw("ghost", lambda r: manifest_dict(r, "ghost", head))] = "unknown preset 'ghost'"
    cases[raw("work", lambda r: manifest_dict(r, "work", head, params={"seconds": "999"}))] = (
        "bad parameters: preset work: parameter seconds='999' must be between"
    )
    cases[raw("work", lambda r: manifest_dict(r, "work", head, params={"shell": "rm -rf /"}))] = (
        "unknown parameter 'shell'"
    )
    cases[raw("work", b"{not json")] = "invalid manifest: manifest: Invalid JSON"
    cases[raw("work", lambda r: manifest_dict(new_id("work"), "work", head))] = "invalid manifest: id is"
    cases[raw("work", lambda r: manifest_dict(r, "work", head, label="gpu"))] = (
        "invalid manifest: runner is 'gpu'"
    )
    cases[raw("work", lambda r: {**manifest_dict(r, "work", head), "schema_version": 2})] = "schema_version"
    other = git(world.project, "commit-tree", f"{head}^{{tree}}", "-m", "other")
    cases[raw("work", lambda r: manifest_dict(r, "work", other))] = "is not the request commit's parent"
    # a preset this runner's own registry does not allow on its label (the requester's registry said yes)
    lenient = dict(load_registry())
    lenient["cpuonly"] = lenient["cpuonly"].model_copy(update={"runners": ["cpu", "cpu-b"]})
    cases[client.request("cpuonly", {}, "cpu-b", registry=lenient).id] = "may not run on runner label 'cpu-b'"
    runner = make_runner(url, world, labels=("cpu", "cpu-b"))
    served = [runner.once() for _ in range(len(cases))]
    assert runner.once() is None
    assert {s.id: s.status for s in served if s} == {rid: "rejected" for rid in cases}
    for rid, why in cases.items():
        result = done_result(world.project, url, rid)
        assert result["status"] == "rejected" and why in result["reason"], (rid, result["reason"])
        assert result["argv"] == [] and result["started_at"] is None
    assert world.count() == [] and not any(world.marks.iterdir())
    assert main(["wait", list(cases)[0], "--timeout", "5"]) == 2  # rejected = invalid: exit 2


def test_cancel_during_a_run_kills_it(world: Env):
    client = Client(load_config())
    rid = client.request("work", {"tag": "c", "mode": "sleep", "seconds": "60"}, "cpu").id
    runner = make_runner(client.url, world)
    served: list = []
    thread = threading.Thread(target=lambda: served.append(runner.once()))
    thread.start()
    started = wait_for(
        lambda: world.mark("c", "started").exists() and world.mark("c", "started").read_text(), 30, "the run"
    )
    assert client.cancel(rid) == "claimed"
    thread.join(30)
    assert not thread.is_alive() and served[0].status == "cancelled" and served[0].pushed
    assert not pid_alive(int(started.split()[0]))
    result = done_result(world.project, client.url, rid)
    assert (result["status"], result["reason"]) == ("cancelled", "cancelled while running")
    assert world.count() == []


def test_lfs_pointer_files_are_refused(world: Env):
    (world.project / "model.bin").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:" + "0" * 64 + "\nsize 123\n"
    )
    git(world.project, "add", "model.bin")
    git(world.project, "commit", "-qm", "lfs")
    client = Client(load_config())
    rid = client.request("work", {"tag": "l"}, "cpu").id
    served = make_runner(client.url, world).once()
    assert served is not None and served.status == "error"
    reason = done_result(world.project, client.url, rid)["reason"]
    assert (
        "1 Git LFS pointer file(s) that were not fetched (model.bin)" in reason
        and "git lfs install" in reason
    )
    assert world.count() == []


def test_heartbeats_keep_a_long_run_and_other_runners_wait(world: Env):
    client = Client(load_config())  # lease 3 s (KAKEYA_LEASE): the run outlives it twice over
    rid = client.request("work", {"tag": "h", "mode": "sleep", "seconds": "6.5"}, "cpu").id
    holder = make_runner(client.url, world, "a")
    served: list = []
    thread = threading.Thread(target=lambda: served.append(holder.once()))
    thread.start()
    wait_for(lambda: world.mark("h", "started").exists(), 30, "the run")
    other = make_runner(client.url, world, "b")
    polls = 0
    while thread.is_alive():
        assert other.once() is None
        polls += 1
        time.sleep(0.3)
    assert polls >= 5 and served[0].status == "succeeded" and served[0].pushed
    claim = done_claim(world.project, client.url, rid)
    assert claim.runner == "a" and claim.heartbeat >= 3 and claim.takeover_of is None
    assert world.count() == ["h"]


def test_sigterm_finishes_the_current_run_and_a_second_one_ends_it(world: Env, daemon: Daemon):
    url = daemon.repo()
    client = Client(load_config(), remote=url)
    finish = client.request("work", {"tag": "f", "mode": "sleep", "seconds": "1.5"}, "cpu").id
    proc = runner_process(world, url, "a", "--poll", "0.2")
    wait_for(lambda: world.mark("f", "started").exists(), 60, "the first run")
    later = client.request("work", {"tag": "g"}, "cpu").id
    assert stop(proc, signal.SIGTERM) == 0
    assert done_result(world.project, url, finish)["status"] == "succeeded"
    assert later not in {i for i, e in Bus(url, world.project).ls_remote().entries.items() if e.claim}
    assert world.count() == ["f"]

    killed = client.request("work", {"tag": "k", "mode": "sleep", "seconds": "60"}, "cpu").id
    proc = runner_process(world, url, "b", "--request", killed, mode="once")
    started = wait_for(
        lambda: world.mark("k", "started").exists() and world.mark("k", "started").read_text(),
        60,
        "the second run",
    )
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    assert proc.poll() is None  # the first signal lets the run go on
    assert stop(proc, signal.SIGTERM) == 0
    result = done_result(world.project, url, killed)
    assert (result["status"], result["reason"]) == ("error", "runner b stopped by SIGTERM during the run")
    assert not pid_alive(int(started.split()[0]))
    assert world.count() == ["f"]


def test_a_result_the_bus_could_not_take_is_pushed_later(world: Env):
    client = Client(load_config())
    rid = client.request("work", {"tag": "o", "mode": "sleep", "seconds": "1"}, "cpu").id
    runner = make_runner(client.url, world)
    bus_dir, aside = Path(client.url), Path(client.url + ".away")
    served: list = []
    thread = threading.Thread(target=lambda: served.append(runner.once()))
    thread.start()
    wait_for(lambda: world.mark("o", "started").exists(), 30, "the run")
    bus_dir.rename(aside)  # the bus goes away during the run
    thread.join(60)
    assert served[0].status == "succeeded" and not served[0].pushed
    aside.rename(bus_dir)
    assert runner.once() is None  # flushes the outbox, then finds nothing to do
    assert done_result(world.project, client.url, rid)["status"] == "succeeded"
    assert world.count() == ["o"]
    assert git(runner.mirror, "for-each-ref", "refs/kakeya/outbox/") == ""
    shutil.rmtree(runner.workdir / "runs", ignore_errors=True)


def test_a_takeover_during_the_run_stops_the_holder_in_process(world: Env):
    client = Client(load_config())
    rid = client.request("work", {"tag": "t", "mode": "once", "seconds": "60"}, "cpu").id
    holder = make_runner(client.url, world, "a")
    served: list = []
    thread = threading.Thread(target=lambda: served.append(holder.once()))
    thread.start()
    program = int(
        wait_for(
            lambda: world.mark("t", "first").exists() and world.mark("t", "first").read_text(), 30, "the run"
        )
    )
    # another runner takes the claim over with a lease on the sha it saw (as after an expired lease)
    thief = make_runner(client.url, world, "b")
    entry = thief.bus.ls_remote().entries[rid]
    thief.bus.fetch([claim_ref(rid)])
    seen = Claim.model_validate_json(G.read_path(thief.mirror, entry.claim, CLAIM_PATH) or b"")
    took = thief.claims.claim(entry, (entry.claim, seen))
    assert took is not None
    thread.join(30)
    assert not thread.is_alive() and not served[0].pushed
    assert served[0].reason == "lease lost: taken over by runner b"
    assert not pid_alive(program)
    assert thief.serve(entry, *took).pushed
    assert done_result(world.project, client.url, rid)["runner_name"] == "b"
    assert done_claim(world.project, client.url, rid).takeover_of == "a"
    assert world.count() == ["t"]


def test_an_unreadable_claim_is_treated_as_expired(world: Env):
    client = Client(load_config())
    rid = client.request("work", {"tag": "u"}, "cpu").id
    entry = client.entry(rid)
    repo = world.project
    bogus = G.child_commit(repo, entry.req or "", {CLAIM_PATH: b"not json"}, "bogus claim", "X <x@e>")
    assert client.bus.swap([Update(claim_ref(rid), bogus, None)])
    served = make_runner(client.url, world).once()
    assert served is not None and served.status == "succeeded" and served.pushed
    assert done_claim(world.project, client.url, rid).takeover_of == "unknown"
    assert world.count() == ["u"]


def test_watch_serves_until_stopped_and_backs_off_while_the_bus_is_away(world: Env):
    client = Client(load_config())
    ids = [client.request("work", {"tag": f"w{i}"}, "cpu").id for i in range(2)]
    lines: list[str] = []
    runner = Runner(
        client.url, config=load_config(), name="w", labels=["cpu"], workdir=world.tmp / "w", log=lines.append
    )
    thread = threading.Thread(target=runner.watch, kwargs={"poll_s": 0.2, "max_backoff_s": 0.4})
    thread.start()
    bus = Bus(client.url, world.project)
    wait_for(lambda: all(bus.ls_remote().entries[i].done for i in ids), 30, "both requests")
    Path(client.url).rename(client.url + ".away")
    wait_for(lambda: any("retrying in" in ln for ln in lines), 10, "a failed poll")
    Path(client.url + ".away").rename(client.url)
    runner.stop("test")
    thread.join(10)
    assert not thread.is_alive() and lines[-1].endswith("kakeya runner w: stopped")
    assert any("cannot reach the bus" in ln and "retrying in" in ln for ln in lines)
    assert sorted(world.count()) == ["w0", "w1"]


def test_a_claim_taken_while_stopping_is_released_unrun(world: Env):
    client = Client(load_config())
    rid = client.request("work", {"tag": "r"}, "cpu").id
    runner = make_runner(client.url, world)
    entry = runner.bus.ls_remote().entries[rid]
    claimed = runner.claims.claim(entry, None)
    assert claimed is not None
    runner.stop("test")
    assert runner.serve(entry, *claimed).status == "released"
    assert runner.once() is None
    assert runner.bus.ls_remote().entries[rid].claim is None  # back in the queue
    served = make_runner(client.url, world, "r2").once()
    assert served is not None and served.id == rid and served.status == "succeeded"
    assert world.count() == ["r"]


def test_ctrl_c_during_kakeya_run_kills_the_run_and_records_it(world: Env, capsys):
    def interrupt() -> None:
        wait_for(lambda: world.mark("i", "started").exists(), 60, "the run")
        signal.raise_signal(signal.SIGINT)  # handled in the main thread, where `kakeya run` waits

    before = signal.getsignal(signal.SIGINT)
    threading.Thread(target=interrupt, daemon=True).start()
    assert main(["run", "work", "-p", "mode=sleep", "-p", "tag=i", "-p", "seconds=60"]) == 130
    assert "work error (interrupted by SIGINT)" in capsys.readouterr().out
    pid = int(world.mark("i", "started").read_text().split()[0])
    assert not pid_alive(pid) and world.count() == []
    assert signal.getsignal(signal.SIGINT) is before
