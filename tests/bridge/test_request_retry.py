"""Requests an agent can retry, on real buses (`git daemon`) with real runners: the idempotency key (same key
and content -> the first id, queued, running or done; other content refused; concurrent retries make one
request; a forged key ref is refused), the runner label fallback (`--runner gpu,cpu`) and the queue timeout
(`--queue-timeout`: expired, never run, `wait` returns at once with the state)."""

from __future__ import annotations

import datetime as dt
import json
import threading

import pytest

from bridge.bus.records import REQ_PREFIX, RUNNERS_PREFIX, Update, parse_id
from bridge.cli.main import main
from bridge.client.admin import Admin
from bridge.client.client import Client
from bridge.client.request import IDEM_PATH, IDEM_PREFIX, Idempotency
from bridge.config import load_config
from bridge.core.errors import BusError, InvalidRequest
from bridge.wire import git as G
from tests.bridge.bus_support import Daemon, Env, make_runner, wait_for


def requests_on(c: Client) -> list[str]:
    return sorted(c.bus.ls_remote(REQ_PREFIX).entries)


def test_a_retried_request_returns_the_first_id_queued_running_and_done(world: Env, daemon: Daemon):
    c = Client(load_config(), remote=daemon.repo())
    first = c.request("work", {"tag": "a", "mode": "sleep", "seconds": "2"}, "cpu", idempotency_key="k-1")
    again = c.request("work", {"tag": "a", "mode": "sleep", "seconds": 2.0}, "cpu", idempotency_key="k-1")
    assert again.id == first.id and requests_on(c) == [first.id]  # queued; "2" and 2.0 are the same value
    with pytest.raises(InvalidRequest, match=f"idempotency key 'k-1' was used for request {first.id}"):
        c.request("work", {"tag": "b", "mode": "sleep", "seconds": 2}, "cpu", idempotency_key="k-1")
    with pytest.raises(InvalidRequest, match=f"request {first.id} with other content"):  # another label
        c.request("work", {"tag": "a", "mode": "sleep", "seconds": 2}, "gpu", idempotency_key="k-1")

    runner = make_runner(c.url, world)
    serving = threading.Thread(target=runner.once)
    serving.start()
    wait_for(lambda: world.mark("a", "started").exists(), 30, "the run to start")
    assert c.status_one(first.id).state == "claimed"
    assert c.request(
        "work", {"tag": "a", "mode": "sleep", "seconds": 2}, "cpu", idempotency_key="k-1"
    ).id == (first.id)  # running
    serving.join(60)
    assert c.status_one(first.id).state == "succeeded"
    done = c.request("work", {"tag": "a", "mode": "sleep", "seconds": 2}, "cpu", idempotency_key="k-1")
    assert done.id == first.id and requests_on(c) == [] and world.count() == ["a"]  # done: nothing new
    # the CLI: the same key prints the same id, and a new key makes a new request
    assert main(["request", "work", "-p", "tag=a", "-p", "mode=sleep", "-p", "seconds=2", "--runner", "cpu",
                 "--remote", c.url, "--idempotency-key", "k-1"]) == 0  # fmt: skip
    second = c.request("work", {"tag": "a"}, "cpu", idempotency_key="k-2")
    assert second.id != first.id
    # `bus gc` forgets the keys of finished requests older than its cutoff, never those of live ones
    keys = {Idempotency.key_hash(k): k for k in ("k-1", "k-2")}
    gone = [r for r in Admin(c).gc(0) if r.startswith(IDEM_PREFIX)]
    assert [keys[r.removeprefix(IDEM_PREFIX)] for r in gone] == ["k-1"]
    assert c.request("work", {"tag": "a"}, "cpu", idempotency_key="k-2").id == second.id
    assert c.request(
        "work", {"tag": "a", "mode": "sleep", "seconds": 2}, "cpu", idempotency_key="k-1"
    ).id not in (
        first.id,
        second.id,
    )


def test_concurrent_retries_make_one_request(world: Env, daemon: Daemon):
    """Six clients at once with one key (a barrier lines them up): one request on the bus, one id for all."""
    url = daemon.repo()
    Client(load_config(), remote=url).request("work", {"tag": "warm"}, "cpu")  # the layout marker is there
    barrier = threading.Barrier(6)
    ids: list[str] = []

    def retry() -> None:
        c = Client(load_config(), remote=url)
        barrier.wait()
        ids.append(c.request("work", {"tag": "c"}, "cpu", idempotency_key="same-key").id)

    threads = [threading.Thread(target=retry) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    c = Client(load_config(), remote=url)
    assert len(ids) == 6 and len(set(ids)) == 1
    assert len(requests_on(c)) == 2 and ids[0] in requests_on(c)  # the warm-up and one


def test_a_snapshot_retried_is_the_same_request(world: Env, daemon: Daemon):
    """--allow-dirty makes a new snapshot commit each time: the same files are the same content."""
    c = Client(load_config(), remote=daemon.repo())
    (world.project / "notes.txt").write_text("draft")
    first = c.request("work", {}, "cpu", allow_dirty=True, idempotency_key="snap")
    assert c.request("work", {}, "cpu", allow_dirty=True, idempotency_key="snap").id == first.id
    (world.project / "notes.txt").write_text("draft 2")
    with pytest.raises(InvalidRequest, match=f"request {first.id} with other content"):
        c.request("work", {}, "cpu", allow_dirty=True, idempotency_key="snap")


def test_a_forged_key_ref_is_refused_not_trusted(world: Env, daemon: Daemon):
    """A key ref someone pushed is read against the request it names, never trusted: one that names no
    request (a plain request commit) is refused, and one whose key file names the right request but claims
    other labels than that request's cannot make a retry of other content return it."""
    c = Client(load_config(), remote=daemon.repo())
    other = c.request("work", {"tag": "x"}, "cpu")
    req = c.bus.ls_remote(REQ_PREFIX).entries[other.id].req
    assert req is not None
    plain = Idempotency.key_hash("k-plain")
    c.bus.push([Update(IDEM_PREFIX + plain, req, None)])
    with pytest.raises(BusError, match="is not a request's; delete it"):
        c.request("work", {"tag": "x"}, "cpu", idempotency_key="k-plain")
    forged = Idempotency.key_hash("k-forged")
    marker = Idempotency(key_sha256=forged, labels=["cpu"], id=other.id).dump()
    sha = G.child_commit(c.bus.store, req, {IDEM_PATH: marker}, "forged", "M <m@example.com>")
    c.bus.push([Update(IDEM_PREFIX + forged, sha, None)])
    with pytest.raises(
        InvalidRequest, match=f"'k-forged' was used for request {other.id} with other content"
    ):
        c.request("work", {"tag": "y"}, "cpu", idempotency_key="k-forged")  # its manifest says tag x
    assert c.request("work", {"tag": "x"}, "cpu", idempotency_key="k-forged").id == other.id  # same content
    with pytest.raises(InvalidRequest, match="must be 1 to 200 printable characters"):
        c.request("work", {"tag": "x"}, "cpu", idempotency_key="a\nb")
    assert requests_on(c) == [other.id]
    assert IDEM_PREFIX + plain in Admin(c).gc(30)  # a key ref that names no request is junk


def test_runner_labels_fall_back_to_the_first_with_a_live_runner(world: Env, daemon: Daemon):
    c = Client(load_config(), remote=daemon.repo())
    assert c.request("work", {}, "gpu,cpu").runner == "gpu"  # none live: the first
    live = make_runner(c.url, world, name="cpu-1", labels=("cpu",))
    live.start_presence()
    wait_for(lambda: "cpu-1" in c.bus.ls_remote(RUNNERS_PREFIX).runners, 30, "the runner's presence")
    try:
        assert c.request("work", {}, "gpu,cpu").runner == "cpu"
        assert c.request("work", {}, ["cpu", "gpu"]).runner == "cpu"
    finally:
        live.stop_presence()
    assert c.request("work", {}, "gpu,cpu").runner == "gpu"  # it said it stopped
    with pytest.raises(InvalidRequest, match="preset cpuonly may not run on runner label 'gpu'"):
        c.request("cpuonly", {}, "cpu,gpu")
    with pytest.raises(InvalidRequest, match="each runner label once"):
        c.request("work", {}, "cpu,cpu")
    with pytest.raises(InvalidRequest, match="must be lowercase"):
        c.request("work", {}, "cpu,GPU;rm")


def test_a_request_past_its_queue_timeout_expires_and_never_runs(world: Env, daemon: Daemon, capsys):
    url = daemon.repo()
    argv = ["request", "work", "-p", "tag=late", "--runner", "cpu", "--remote", url, "--json"]
    assert main([*argv, "--queue-timeout", "1"]) == 0
    event = json.loads(capsys.readouterr().out)
    c = Client(load_config(), remote=url)
    rid = event["id"]
    assert event["runner"] == "cpu" and parse_id(rid) is not None
    wait_for(lambda: c.status_one(rid).state == "expired", 30, "the request to expire")
    assert "no runner started it before" in (c.status_one(rid).reason or "")
    served = make_runner(url, world).once()
    assert served is not None and served.id == rid
    row = c.status_one(rid)
    assert row.state == "expired" and "before a runner started it" in (row.reason or "")
    assert world.count() == [] and not world.mark("late", "started").exists()  # nothing ran
    assert main(["wait", rid, "--remote", url, "--json", "--timeout", "20"]) == 1
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["event"] == "verdict" and last["status"] == "expired"
    try:  # one clock: --expires and --queue-timeout are the same setting (a usage error, exit 2)
        code = main([*argv, "--queue-timeout", "5", "--expires", "1h"])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert G.is_repo(world.project)


def test_the_cli_says_it_reused_a_request_and_which_label_it_fell_back_to(world: Env, daemon: Daemon, capsys):
    """An idempotent retry says on stderr that it reused the first request (`reused` in --json); `--runner
    gpu,cpu` says which label it took and why (`label_note`); `--expires 1h30m` (compound) is taken."""
    url = daemon.repo()
    argv = ["request", "work", "--remote", url, "--idempotency-key", "k-cli", "--expires", "1h30m"]
    assert main([*argv, "--runner", "gpu,cpu", "--json"]) == 0
    out = capsys.readouterr()
    first = json.loads(out.out)
    assert first["reused"] is False and first["runner"] == "gpu"
    assert first["label_note"] == "no live runner serves gpu, cpu: queued on gpu, the first"
    assert "kakeya: runner gpu: no live runner serves gpu, cpu: queued on gpu, the first" in out.err
    made = parse_id(first["id"])
    assert made is not None
    expires = dt.datetime.fromisoformat(first["expires_at"].replace("Z", "+00:00"))
    assert abs((expires - made.time).total_seconds() - 5400) < 5  # 1h30m
    assert main([*argv, "--runner", "gpu,cpu"]) == 0  # the retry
    out = capsys.readouterr()
    assert out.out == f"{first['id']}\n"
    assert (
        f"kakeya: reused request {first['id']} (made earlier with this idempotency key and content)"
        in out.err
    )
    assert "runner gpu" not in out.err
    live = make_runner(url, world, name="cpu-1", labels=("cpu",))
    live.start_presence()
    c = Client(load_config(), remote=url)
    wait_for(lambda: "cpu-1" in c.bus.ls_remote(RUNNERS_PREFIX).runners, 30, "the runner's presence")
    try:
        assert main(["request", "work", "--remote", url, "--runner", "gpu,cpu", "--json"]) == 0
        out = capsys.readouterr()
        assert json.loads(out.out)["runner"] == "cpu"
        assert "kakeya: runner cpu: no live runner serves gpu: fell back to cpu" in out.err
    finally:
        live.stop_presence()
    for bad in ("1h1h", "30m1h", "1h30", "0m"):
        assert main(["request", "work", "--remote", url, "--runner", "cpu", "--expires", bad]) == 2, bad
        assert "must look like 90s, 15m, 2h, 7d or 1h30m" in capsys.readouterr().err


def test_expired_and_cancelled_requests_take_no_place_in_the_queue(world: Env, daemon: Daemon, capsys):
    """Requests no runner has closed yet: one past its queue timeout, one cancelled. A later request's
    position counts neither (1: next), though their request branches are still on the bus."""
    url = daemon.repo()
    c = Client(load_config(), remote=url)
    expired = c.request("work", {"tag": "e"}, "gpu", expires_s=0.5).id
    cancelled = c.request("work", {"tag": "c"}, "gpu").id
    c.cancel(cancelled)
    waiting = c.request("work", {"tag": "w"}, "gpu").id
    wait_for(lambda: c.status_one(expired).state == "expired", 30, "the first request to expire")
    assert main(["wait", waiting, "--remote", url, "--json", "--timeout", "0.5"]) == 4
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    queued = next(e for e in events if e["event"] == "queued")
    assert (queued["position"], queued["ahead"]) == (1, 0), queued
    assert {e.id for e in c.bus.ls_remote(REQ_PREFIX).entries.values()} == {expired, cancelled, waiting}
