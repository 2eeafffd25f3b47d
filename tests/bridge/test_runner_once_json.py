"""`kakeya runner once --json`: one JSON object on stdout for what it did (what the Actions job script reads):
a served request with its state, verdict and done commit; a failing one; idle for a label with nothing to do
and for a request someone else already served. Exit 0 whenever the result was pushed."""

from __future__ import annotations

import json

from bridge.bus.bus import Bus
from bridge.bus.records import done_ref
from bridge.cli.main import main
from bridge.client.client import Client
from bridge.config import load_config
from bridge.wire import git as G
from tests.bridge.bus_support import Env


def once(capsys, url: str, *args: str) -> tuple[int, dict]:
    rc = main(["runner", "once", "--json", "--labels", "cpu", "--remote", url, *args])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1, lines  # one object, nothing else on stdout
    return rc, json.loads(lines[0])


def test_runner_once_json_says_what_it_served_and_when_it_was_idle(world: Env, tmp_path, capsys):
    url = str(G.init_bare(tmp_path / "bus.git"))
    client = Client(load_config(), remote=url)
    rid = client.request("work", {"tag": "j"}, "cpu").id
    failing = client.request("strict", {}, "cpu").id
    capsys.readouterr()

    rc, event = once(capsys, url, "--request", rid)
    done = Bus(url, world.project).ls_remote(done_ref(rid)).refs[done_ref(rid)]
    assert rc == 0
    assert event == {
        "event": "served",
        "id": rid,
        "state": "succeeded",
        "verdict": "pass",
        "done": done,
        "pushed": True,
        "reason": None,
    }
    rc, event = once(capsys, url)
    # pushed: exit 0, the failed gate is in the event
    assert rc == 0 and (event["id"], event["state"], event["verdict"]) == (failing, "succeeded", "fail")

    rc, event = once(capsys, url)
    assert rc == 0 and event["event"] == "idle" and event["request"] is None and event["labels"] == ["cpu"]
    rc, event = once(capsys, url, "--request", rid)  # served already: nothing to do, not an error
    assert rc == 0 and event["event"] == "idle" and event["request"] == rid
    assert "nothing to do for " + rid in event["message"]
