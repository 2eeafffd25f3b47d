"""A run's logs as events (what `kakeya logs` prints and the MCP server's logs tool returns): while it runs, what
its runner's heartbeats carried to the bus so far (bridge/bus/livelog.py); once it is done, the final logs of
its done commit, from where the live ones ended (nothing twice).

    follow_logs(c, rid, show, follow=True)     # each event to `show`, until the request is done
    snapshot(c, rid, tail_chars=4000)          # the logs now, in one object
"""

from __future__ import annotations

import time
from typing import Any

from bridge.bus.livelog import Shown, final_logs, live_files
from bridge.bus.records import Entry, parse_or_none, results_path
from bridge.client.client import Client
from bridge.client.follow import Follower
from bridge.core.result import RunResult


def follow_logs(c: Client, rid: str, show: Any, *, follow: bool, poll_s: float | None = None) -> Shown:
    """Show request `rid`'s logs (as events, to `show`): live ones, then (once done) the final ones; without
    `follow`, what there is now."""
    poll_s = poll_s or c.config.poll_interval_s
    shown, label, waiting = Shown(), None, False
    follower = Follower(c, rid)  # for how a request that never ran ended
    while True:
        entry = c.entry(rid, label)
        label = entry.label or label
        if entry.done:
            c.ensure([entry])
            for e in shown.final(final_logs(c.bus.repos(), rid, entry.done)):
                show(e)
            show({"event": "end", "state": "done", "done": entry.done, "status": status(c, rid, entry.done)})
            return shown
        if ended := follower.ended(entry):
            show({"event": "end", "state": ended.event, "done": None})
            return shown
        if entry.claim is not None:
            for e in live(c, entry, shown):
                show(e)
        elif not waiting:
            waiting = True
            show({"event": "waiting", "state": entry.state})
        if not follow:
            show({"event": "end", "state": entry.state, "done": None})
            return shown
        time.sleep(poll_s)


def status(c: Client, rid: str, done: str) -> str | None:
    """The run's status in its result.json (None: unreadable)."""
    spec = f"{done}:{results_path(rid)}/result.json"
    result = parse_or_none(RunResult, c.local_files([spec]).get(spec))
    return result.status if result is not None else None


def live(c: Client, entry: Entry, shown: Shown) -> list[dict[str, Any]]:
    """The events for the heartbeats of `entry`'s claim not read yet."""
    assert entry.claim is not None
    if entry.claim == shown.last:
        return []
    c.ensure([entry], ("claim",))
    after = [s for s in (shown.last, entry.req) if s]
    events = shown.live(live_files(c.bus.repos(), entry.claim, after))
    shown.last = entry.claim
    return events


def snapshot(c: Client, rid: str, tail_chars: int) -> dict[str, Any]:
    """The logs of `rid` now, in one object (the MCP tool `logs`): live while it runs, final once done, the
    last `tail_chars` characters of each stream (`cut`: the streams shortened here)."""
    events: list[dict[str, Any]] = []
    follow_logs(c, rid, events.append, follow=False)
    end = events[-1]
    got: dict[str, Any] = {"id": rid, "state": end["state"], "done": end["done"], "source": None}
    text = {"stdout": "", "stderr": ""}
    notes = []
    for e in events:
        if e["event"] == "log":
            got["source"] = e["source"]
            text[e["stream"]] += e["text"]
        elif e["event"] == "log-cut":
            notes.append(
                f"the live {e['stream']} stopped at {e['bytes']} bytes; the final logs have the rest"
            )
        elif e["event"] == "log-missing":
            notes.append(e["why"])
    got.update({s: t[-tail_chars:] for s, t in text.items()})
    got["cut"] = [s for s, t in text.items() if len(t) > tail_chars]
    got["notes"] = notes
    return got
