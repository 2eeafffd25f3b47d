"""`kakeya wait ID [--timeout S] [--no-runner-timeout S] [--json] [--out DIR]`: follow a request until it is
done, showing each change (queued and its place in the label's queue, no live runner for the label, claimed
by X on host Y, running with a progress bar and elapsed time, gating), then fetch its results like
`kakeya results` (into DIR/<id>) and show the verdict table. A request cancelled or expired before any runner
claimed it ends the wait at once, with its state. `--json`: one JSON event per line (bridge/client/follow.py), the
last one the verdict (or `cancelled`, `expired`, `timeout`, an error). ID may be a unique prefix or the six-hex
suffix. Ctrl-C stops waiting, never the request.
Exit 0 pass, 1 fail or any other outcome (cancelled, expired), 2 rejected, 3 no live runner for
--no-runner-timeout S, 4 --timeout S ran out (the request goes on), 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
from typing import Any

from bridge.bus.progress import View, clock, progress_line
from bridge.cli.commands._common import (
    add_id,
    add_json,
    add_output,
    add_remote,
    client,
    emit,
    out_dir,
    report,
)
from bridge.client.client import Client
from bridge.client.follow import Ended, Finished, Follower
from bridge.core.errors import Interrupted


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("wait", help="follow a request until it is done, then fetch its results")
    add_id(parser)
    add_output(parser)
    add_remote(parser)
    add_wait_args(parser)
    parser.set_defaults(func=run)


def add_wait_args(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(
        "--timeout", type=float, metavar="S", help=f"{prefix}give up (exit 4) after S seconds"
    )
    parser.add_argument(
        "--no-runner-timeout",
        type=float,
        metavar="S",
        help=f"{prefix}give up (exit 3) when no live runner has served the label for S seconds",
    )
    add_json(parser)


def run(args: argparse.Namespace) -> int:
    c = client(args)
    return follow(c, c.resolve_id(args.id), args)


def follow(c: Client, request_id: str, args: argparse.Namespace) -> int:
    """Show the request's changes until it is done, then its results; the exit code of the outcome."""
    view = View(line)  # one bar on a terminal, plain lines elsewhere (bridge/bus/progress.py)
    say = emit if args.json else view.show
    follower = Follower(c, request_id, timeout=args.timeout, no_runner_timeout=args.no_runner_timeout)
    try:
        done = None
        for event in follower.events():
            if isinstance(event, Ended):  # cancelled or expired before any runner claimed it: no results
                say(event.model_copy(update={"exit_code": 1}).dump())
                return 1
            say(event.dump())
            done = event.done if isinstance(event, Finished) else None
    except KeyboardInterrupt:  # (with --json, main prints it as an `interrupted` error object too)
        raise Interrupted(
            f"stopped waiting; {request_id} goes on (`kakeya wait {request_id}` to follow it again, "
            f"`kakeya cancel {request_id}` to cancel it)"
        ) from None
    finally:
        view.close()
    out = out_dir(c.root, args.out, request_id)
    result = c.results(request_id, out, done)
    return report(request_id, result, out, as_json=args.json, summary=getattr(args, "summary", False))


def line(e: dict[str, Any]) -> str:
    """One event in words, for a person."""
    at = e["at"][11:19]
    kind = e["event"]
    if kind == "queued" and "position" in e:  # not claimed yet (claimed, a scheduler's queue: below)
        where = f"position {e['position']} in the {e['label']} queue" + (
            f", {e['ahead']} running" if e["ahead"] else ""
        )
        who = f"live runners: {', '.join(e['runners'])}" if e["runners"] else "no live runner"
        line = f"queued: {where}; {who}"
    elif kind == "no-runner":
        seen = f" (seen: {', '.join(e['seen'])})" if e["seen"] else ""
        line = (
            f"no live runner serves label {e['label']!r}{seen}; still waiting "
            f"({clock(e['waited_s'])}); `kakeya runners` lists runners"
        )
    elif kind == "claimed":
        took = f", taking over from {e['takeover_of']}" if e["takeover_of"] else ""
        line = f"claimed by {e['runner']} on {e['host']} at {e['claimed_at'][11:19]}{took}"
    elif kind in ("running", "gating", "queued"):
        line = progress_line(e)
    elif kind == "stale":
        line = (
            f"the lease of {e['runner']} ran out at {e['lease_until'][11:19]}: it may have died; "
            "another runner may take the request over"
        )
    elif kind == "cancelling":
        line = "cancel requested: the runner is stopping the run"
    elif kind == "finished":
        line = f"done: {e['done'][:12]}"
    elif kind == "cancelled":
        line = "cancelled before any runner claimed it: nothing ran"
    elif kind == "expired":
        line = f"expired at {e['expires_at'][11:19]} before any runner claimed it: nothing ran"
    else:
        line = kind
    return f"{at} {line}"
