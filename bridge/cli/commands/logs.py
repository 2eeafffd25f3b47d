"""`kakeya logs ID [-f] [--json]`: a run's stdout and stderr. While it runs: what its runner's heartbeats
carried to the bus so far (bridge/bus/livelog.py: redacted, at most BEAT_BYTES of each stream a heartbeat and
TOTAL_BYTES over the run); once it is done: the final logs of its done commit. `-f` follows a queued or running
request until it is done, then shows the final logs from where the live ones ended (nothing twice). The run's
stdout goes to stdout and its stderr to stderr, control characters and escape sequences removed; kakeya's own
notes (skipped bytes, the live cap, the end) are `kakeya:` lines on stderr. `--json`: one object per line:
`log` (`source` live or final, `stream`, `start`/`end` byte offsets in the log, `skipped`, `text`), `log-cut`,
`log-missing`, `restarted` (a takeover started the run again), `waiting` (not claimed yet), last `end`
(`state`, `done`, `status`). ID may be a unique prefix or the six-hex suffix. Exit 0 (whatever the run's outcome),
1 not found; Ctrl-C stops following, never the run.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from bridge.bus.livelog import Shown, final_logs, live_files
from bridge.bus.progress import say
from bridge.bus.records import Entry, parse_or_none, results_path
from bridge.cli.commands._common import add_id, add_json, add_remote, client, emit, event
from bridge.client.client import Client
from bridge.client.follow import Follower
from bridge.core.errors import Interrupted
from bridge.core.result import RunResult


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("logs", help="a run's stdout/stderr: live while it runs, then the final logs")
    add_id(parser)
    parser.add_argument(
        "-f", "--follow", action="store_true", help="follow until the run is done, then the final logs"
    )
    add_remote(parser)
    add_json(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    c = client(args)
    rid = c.resolve_id(args.id)
    show = (lambda e: emit(event(e.pop("event"), rid, **e))) if args.json else words
    try:
        follow_logs(c, rid, show, follow=args.follow)
    except KeyboardInterrupt:
        raise Interrupted(
            f"stopped following; {rid} goes on (`kakeya logs {rid} -f` follows it again)"
        ) from None
    return 0


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


def words(e: dict[str, Any]) -> None:
    """An event for a person: the run's text on its own stream, kakeya's notes on stderr."""
    kind = e["event"]
    if kind == "log":
        if e["skipped"]:
            say(f"kakeya: [{e['skipped']} bytes of {e['stream']} not carried live; the final logs have them]")
        if e["source"] == "final" and e["start"]:
            if not e["text"]:
                return  # all of it was shown live
            say(f"kakeya: [the rest of {e['stream']}, from the final logs]")
        out = sys.stdout if e["stream"] == "stdout" else sys.stderr
        out.write(e["text"])
        out.flush()
    elif kind == "log-cut":
        say(f"kakeya: [the live {e['stream']} stops at {e['bytes']} bytes; the final logs follow when done]")
    elif kind == "log-missing":
        say(f"kakeya: [{e['why']}]")
    elif kind == "restarted":
        say(f"kakeya: [another runner took the request over; its run started at {e['started_at']}]")
    elif kind == "waiting":
        say(f"kakeya: [{e['state']}: no runner has started it yet]")
    elif kind == "end":
        if e["done"]:
            how = f" ({e['status']})" if e.get("status") else ""
            say(f"kakeya: [done: {e['done'][:12]}{how}]")
        elif e["state"] in ("claimed", "running"):
            say("kakeya: [still running; `-f` follows it to the end]")
        else:
            say(f"kakeya: [{e['state']}]")


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
