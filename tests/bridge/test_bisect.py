"""`kakeya bisect` as its own process against a real bus and real runner processes, on a real branch where
a planted commit makes the preset fail its gate (or slows its metric), a commit does not build, evidence
already exists, and the bisect is interrupted and run again. Each run appends its subject to a counter file:
the runs that really happened are counted there, the requests on the bus."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bridge.bus.bus import Bus
from bridge.bus.records import (
    REQ_PREFIX,
    RUNNERS_PREFIX,
    SUBJECT_PREFIX,
    Update,
    done_ref,
    read_manifests,
    req_ref,
)
from bridge.cli.commands.bisect import show
from bridge.cli.main import main
from bridge.evidence import bisect as BI
from bridge.presets.registry import load_registry
from tests.bridge.bus_support import Env, move_done, runner_process, stop, wait_for
from tests.bridge.test_history import LocalBus, commit, setup_bench


def bisect_process(env: Env, url: str, *args: str) -> subprocess.Popen[str]:
    """`kakeya bisect ... --json` as its own process (cwd = the project), its events on stdout."""
    return subprocess.Popen(
        [sys.executable, "-m", "bridge.cli", "bisect", *args, "--remote", url, "--allow-unsigned", "--json"],
        cwd=env.project,
        stdout=subprocess.PIPE,
        stderr=(env.tmp / "bisect.log").open("a"),
        text=True,
    )


def bisect(capsys, url: str, *args: str, as_json: bool = True) -> tuple[int, list[dict] | str]:
    """`kakeya bisect ...` in this process (a runner process serves it): exit code, events (or the text)."""
    capsys.readouterr()
    code = main(["bisect", *args, "--remote", url, "--allow-unsigned", *(["--json"] if as_json else [])])
    out = capsys.readouterr().out
    return code, [json.loads(line) for line in out.splitlines()] if as_json else out


def branch(env: Env, n: int, planted: int, speed: int) -> list[str]:
    """c0 (speed 100, good) and c1..cn, where c<planted> sets speed to `speed`."""
    return [commit(env, "good", speed=100)] + [
        commit(env, f"c{i}", speed=speed if i == planted else None) for i in range(1, n + 1)
    ]


def requests_on_bus(url: str, project: Path) -> dict[str, str]:
    """request id -> subject, of every bench request the bus holds (live or done)."""
    bus = Bus(url, project)
    snap = bus.ls_remote(REQ_PREFIX, SUBJECT_PREFIX)
    done = {rid: subject for rid, (subject, _) in snap.index.items()}
    live = [e for e in snap.entries.values() if e.req and e.id not in done]
    bus.fetch_ids([e.req for e in live if e.req])
    manifests = read_manifests(bus.repos(), [e.req for e in live if e.req])
    return {**done, **{e.id: manifests[e.req].subject for e in live}}  # type: ignore[union-attr,index]


@pytest.fixture(name="bus")
def bus_fixture(world: Env) -> LocalBus:
    setup_bench(world)
    return LocalBus(world)


def test_bisect_finds_the_planted_failure_in_log2_runs_then_again_from_evidence_alone(
    world: Env, bus: LocalBus, capsys
):
    c = branch(world, 8, planted=5, speed=30)  # c5 fails the gate (min 50)
    runner = runner_process(world, bus.url, "r1")
    try:
        code, events = bisect(
            capsys, bus.url, "--good", c[0], "--bad", c[8], "--require", "bench@cpu", "--verdict"
        )
    finally:
        stop(runner)
    assert code == 0
    last = events[-1]
    assert last["event"] == "first-bad" and last["commit"] == c[5] and last["title"] == "c5"
    # 8 commits: at most ceil(log2 8) = 3 runs, each of another commit; the evidence of both sides is named
    ran = world.count()
    assert last["requested"] == len(ran) == 3 <= math.ceil(math.log2(8)) and len(set(ran)) == 3
    assert [e["commit"] for e in events if e["event"] == "request"] == [c[4], c[6], c[5]]
    verdicts = {e["commit"]: (e["event"], e["id"]) for e in events if e["event"] in ("good", "bad")}
    assert verdicts == {
        c[4]: ("good", verdicts[c[4]][1]),
        c[6]: ("bad", verdicts[c[6]][1]),
        c[5]: ("bad", last["bad_run"]),
    }
    assert last["good"] == c[4] and last["good_run"] == verdicts[c[4]][1]
    state = json.loads((world.project / ".kakeya" / "bisect.json").read_text())
    assert state["first_bad"] == c[5] and state["requested"] == 3

    # the same command again: answered from the state, nothing requested
    code, events = bisect(
        capsys, bus.url, "--good", c[0], "--bad", c[8], "--require", "bench@cpu", "--verdict"
    )
    assert code == 0 and events[-1]["commit"] == c[5] and len(events) == 2
    # forgotten, then bisected anew with no runner at all: the evidence on the bus answers it
    assert main(["bisect", "--reset", "--remote", bus.url]) == 0
    code, text = bisect(
        capsys, bus.url, "--good", c[0], "--bad", c[8], "--require", "bench@cpu", as_json=False
    )
    assert code == 0 and f"first bad commit: {c[5]} c5" in text and "runs requested: 0" in text
    assert f"{c[4][:12]} good: {verdicts[c[4]][1]} (reused)" in text
    assert (
        f"  bad run: {last['bad_run']}" in text
        and f"  last good: {c[4][:12]}, run {verdicts[c[4]][1]}" in text
    )
    assert len(world.count()) == 3 and len(requests_on_bus(bus.url, world.project)) == 3


def test_skipped_commits_next_to_the_first_bad_one_leave_it_ambiguous(world: Env, bus: LocalBus, capsys):
    c = [commit(world, "good", speed=100), commit(world, "c1 breaks the build", broken=True)]
    c.append(commit(world, "c2 fixes it, slowly", speed=30, broken=False))
    runner = runner_process(world, bus.url, "r1")
    try:
        code, text = bisect(
            capsys, bus.url, "--good", c[0], "--bad", c[2], "--require", "bench@cpu", as_json=False
        )
    finally:
        stop(runner)
    assert code == 1  # like git bisect: the first bad commit is one of the skipped ones or the bad one
    assert f"{c[1][:12]} skip: " in text and "status failed" in text
    assert f"the first bad commit is one of:\n  {c[1]}\n  {c[2]}" in text


def test_a_commit_that_does_not_build_is_skipped_and_existing_evidence_saves_runs(
    world: Env, bus: LocalBus, capsys
):
    c = [commit(world, "good", speed=100)]
    c.append(commit(world, "c1 breaks the build", broken=True))
    c.append(commit(world, "c2 fixes it", broken=False))
    c.append(commit(world, "c3 slow", speed=30))
    c += [commit(world, f"c{i}") for i in (4, 5, 6, 7)]
    bus.run(c[6])  # evidence that c6 is bad is on the bus already
    bus.run(c[0])  # and that c0 is good (it is --good: never run again, never in flight)
    runner = runner_process(world, bus.url, "r1")
    try:
        code, events = bisect(capsys, bus.url, "--good", c[0], "--bad", c[7], "--require", "bench@cpu")
    finally:
        stop(runner)
    assert code == 0 and events[-1]["commit"] == c[3]
    kinds = [(e["event"], e["commit"]) for e in events if e["event"] in ("good", "bad", "skip")]
    assert kinds[0] == ("bad", c[6]) and events[1]["reused"] is True  # not run again
    assert kinds[1:] == [("bad", c[3]), ("skip", c[1]), ("good", c[2])]
    skip = next(e for e in events if e["event"] == "skip")
    assert "status failed" in skip["reason"]  # the run that could not build is why
    assert world.count().count(c[6]) == world.count().count(c[0]) == 1  # run once, before the bisect
    assert events[-1]["requested"] == 3 and events[-1]["good"] == c[2]


def test_a_slowed_metric_with_two_requests_in_flight_on_two_runners(world: Env, bus: LocalBus, capsys):
    c = branch(world, 8, planted=3, speed=80)  # 20 % slower from c3 on, still passing the gate
    runners = [runner_process(world, bus.url, name) for name in ("r1", "r2")]
    try:  # (as many in flight as live runners serve the label: both are live first)
        wait_for(
            lambda: len(Bus(bus.url, world.project).ls_remote(RUNNERS_PREFIX).runners) == 2, 30, "runners"
        )
        code, events = bisect(
            capsys, bus.url, "--good", c[0], "--bad", c[8], "--require", "bench@cpu",
            "--metric", "/probe/cpu_count", "--threshold", "90", "--max-in-flight", "2",
        )  # fmt: skip
    finally:
        for r in runners:
            stop(r)
    assert code == 0 and events[-1]["commit"] == c[3]
    kinds = [e["event"] for e in events]
    assert kinds[1:3] == ["request", "request"]  # two at once before any result
    asked = [e["commit"] for e in events if e["event"] == "request"]
    assert len(asked) == len(set(asked)) <= 4  # never a commit twice
    assert {e["commit"]: e["value"] for e in events if e["event"] == "bad"}[c[3]] == 80


def test_an_interrupted_bisect_resumes_with_the_requests_already_made(world: Env, bus: LocalBus, capsys):
    c = branch(world, 8, planted=5, speed=30)
    args = ("--good", c[0], "--bad", c[8], "--require", "bench@cpu")
    proc = bisect_process(world, bus.url, *args)  # no runner yet: its first request waits
    assert proc.stdout is not None
    events = [json.loads(proc.stdout.readline()) for _ in range(2)]
    assert [e["event"] for e in events] == ["start", "request"] and events[1]["commit"] == c[4]
    first = events[1]["id"]
    assert stop(proc, signal.SIGINT) == 130  # Ctrl-C
    assert "Run the same command again to resume" in (world.tmp / "bisect.log").read_text()
    state = json.loads((world.project / ".kakeya" / "bisect.json").read_text())
    assert state["probes"][c[4]]["request_id"] == first and state["requested"] == 1
    # another bisect with other arguments is refused while this one is unfinished
    assert main(["bisect", "--good", c[1], "--bad", c[8], "--require", "bench@cpu", "--remote", bus.url]) == 2
    # restarted, still with no runner: it waits on the request it made, then is killed outright
    proc = bisect_process(world, bus.url, *args)
    assert proc.stdout is not None and json.loads(proc.stdout.readline())["event"] == "start"
    time.sleep(1)  # several polls
    assert stop(proc, signal.SIGKILL) == -signal.SIGKILL
    assert proc.stdout.read() == "" and list(requests_on_bus(bus.url, world.project)) == [first]
    # meanwhile someone requested c6 with the same parameters (followed, not requested again), and c7 with
    # other ones (no evidence for this bisect's question: never followed)
    other = bus.client.request("bench", {"seed": "0"}, "cpu", subject=c[6]).id
    bus.client.request("bench", {"seed": "1"}, "cpu", subject=c[7])
    b = BI.Bisect(bus.client, BI.State.model_validate(state), world.tmp / "x.json", load_registry(), None)
    assert b.pending_on_bus([c[4], c[6], c[7]]) == {c[4]: first, c[6]: other}

    runner = runner_process(world, bus.url, "r1")
    try:
        code, events = bisect(capsys, bus.url, *args)
    finally:
        stop(runner)
    assert code == 0 and events[-1]["commit"] == c[5]
    assert [e["commit"] for e in events if e["event"] == "request"] == [c[5]]  # c4's request was reused
    # c6 is decided by the other request: followed while pending, or its evidence once done
    [six] = [e for e in events if e.get("commit") == c[6] and e["event"] == "bad"]
    assert six["id"] == other and not any(e["event"] == "request" and e["commit"] == c[6] for e in events)
    assert events[-1]["requested"] == 2  # c4's and c5's; c6's was someone else's
    on_bus = requests_on_bus(bus.url, world.project)
    assert sorted(on_bus.values()) == sorted([c[4], c[5], c[6], c[7]])  # no duplicate request
    assert first in on_bus and sorted(world.count()) == sorted([c[4], c[5], c[6], c[7]])


def test_bisect_refuses_what_it_cannot_bisect(world: Env, bus: LocalBus, capsys):
    c = branch(world, 2, planted=2, speed=30)

    def refused(*args: str) -> str:
        capsys.readouterr()
        assert main(["bisect", *args, "--remote", bus.url, "--allow-unsigned"]) == 2
        return capsys.readouterr().err

    both = ("--good", c[0], "--bad", c[2])
    assert "give --good REV" in refused("--good", c[0], "--require", "bench@cpu")
    assert "needs --threshold" in refused(*both, "--require", "bench@cpu", "--metric", "/probe/cpu_count")
    assert "goes with --metric" in refused(*both, "--require", "bench@cpu", "--threshold", "3")
    assert "at least 1" in refused(*both, "--require", "bench@cpu", "--max-in-flight", "0")
    assert "not an ancestor" in refused("--good", c[2], "--bad", c[0], "--require", "bench@cpu")
    assert "nothing to bisect" in refused("--good", c[1], "--bad", c[1], "--require", "bench@cpu")
    assert "name the runner label" in refused(*both, "--require", "bench")
    # runs whose parameters do not meet the requirement's pins would be no evidence: refused up front
    assert "make no evidence" in refused(*both, "--require", "bench@cpu seed>=5", "-p", "seed=1")
    (world.project / ".kakeya" / "bisect.json").write_text('{"version": 9}')  # not a state: say how to go on
    assert "kakeya bisect --reset" in refused(*both, "--require", "bench@cpu")
    assert world.count() == [] and requests_on_bus(bus.url, world.project) == {}


def test_a_run_indexed_under_a_commit_it_did_not_run_is_no_evidence(world: Env, bus: LocalBus, capsys):
    c = branch(world, 2, planted=2, speed=30)
    failing = bus.run(c[2])  # c2's real, failing run ...
    mallory = Bus(bus.url, world.project)
    sha = mallory.ls_remote(done_ref(failing)).refs[done_ref(failing)]
    mallory.fetch_ids([sha], in_store=True)
    move_done(bus.url, world.project, failing, sha, subjects=(c[1],))  # ... indexed under c1 as well
    runner = runner_process(world, bus.url, "r1")
    try:
        code, events = bisect(capsys, bus.url, "--good", c[0], "--bad", c[2], "--require", "bench@cpu")
    finally:
        stop(runner)
    # had the forged index counted, c1 would be the answer; c1 is run instead, and is good
    assert code == 0 and events[-1]["commit"] == c[2] and events[-1]["bad_run"] == failing
    [one] = [e for e in events if e.get("commit") == c[1] and e["event"] in ("good", "bad", "skip")]
    assert one["event"] == "good" and not one.get("reused") and one["id"] != failing
    assert events[-1]["requested"] == 1 and world.count().count(c[1]) == 1


def test_waiting_says_where_requests_are_and_one_deleted_from_the_bus_is_asked_again(
    world: Env, bus: LocalBus, capsys
):
    c = branch(world, 4, planted=4, speed=30)
    path = world.tmp / "bisect.json"
    state = BI.State(requirement="bench@cpu", good=c[0], bad=c[4], bus=bus.url, commits=c[1:])
    b = BI.Bisect(bus.client, state, path, load_registry(), None, max_in_flight=3, poll_s=0.05, nag_s=0)
    events = b.events()
    assert next(events)["event"] == "start"
    asked = next(events)
    assert asked["event"] == "request" and asked["commit"] == c[2]
    # no live runner: one request at a time whatever --max-in-flight says; it says so, and where it is
    waiting = next(events)
    assert waiting == {"event": "waiting", "requests": {asked["id"]: "queued"}}
    # Mallory deletes the request ref: the bisect does not wait forever, it forgets it and asks again
    mallory = Bus(bus.url, world.project)
    ref = req_ref("cpu", asked["id"])
    assert mallory.swap([Update(ref, None, mallory.ls_remote(ref).refs[ref])])
    lost = next(events)
    assert lost["event"] == "lost" and lost["id"] == asked["id"] and lost["commit"] == c[2]
    again = next(events)
    assert again["event"] == "request" and again["commit"] == c[2] and again["id"] != asked["id"]
    assert json.loads(path.read_text())["probes"][c[2]]["request_id"] == again["id"]
    show(waiting)
    show(lost)
    out = capsys.readouterr().out
    assert (
        f"waiting: {asked['id']} queued" in out
        and f"{c[2][:12]} lost {asked['id']}: its request is gone" in out
    )
