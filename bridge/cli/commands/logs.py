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
from typing import Any

from bridge.bus.progress import say
from bridge.cli.commands._common import add_id, add_json, add_remote, client, emit, event
from bridge.client.logs import follow_logs
from bridge.core.errors import Interrupted


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
