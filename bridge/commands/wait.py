"""`kakeya wait ID [--timeout S] [--no-runner-timeout S] [--json] [--out DIR]`: follow a request until it is
done, showing each change (queued and its place in the label's queue, no live runner for the label, claimed
by X on host Y, running with a progress bar and elapsed time, gating), then fetch its results like
`kakeya results` and show the verdict table. `--json`: one JSON event per line (bridge/follow.py), the last
one the verdict. Ctrl-C stops waiting, never the request.
Exit 0 pass, 1 fail or any other outcome, 2 rejected, 3 no live runner for --no-runner-timeout S, 130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bridge.client import Client, exit_code
from bridge.commands._bus import add_remote, client, out_dir, report
from bridge.follow import Finished, Follower
from bridge.progress import View, clock, progress_line


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("wait", help="follow a request until it is done, then fetch its results")
    parser.add_argument("id")
    parser.add_argument("--out", type=Path, help="where to write the results (default out/<id>)")
    add_remote(parser)
    add_wait_args(parser)
    parser.set_defaults(func=run)


def add_wait_args(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument("--timeout", type=float, metavar="S", help=f"{prefix}give up after S seconds")
    parser.add_argument(
        "--no-runner-timeout",
        type=float,
        metavar="S",
        help=f"{prefix}give up (exit 3) when no live runner has served the label for S seconds",
    )
    parser.add_argument("--json", action="store_true", help=f"{prefix}one JSON event per line, for agents")


def run(args: argparse.Namespace) -> int:
    return follow(client(args), args.id, args)


def follow(c: Client, request_id: str, args: argparse.Namespace) -> int:
    """Show the request's changes until it is done, then its results; the exit code of the outcome."""
    view = View(line)  # one bar on a terminal, plain lines elsewhere (bridge/progress.py)
    emit = (lambda e: print(json.dumps(e), flush=True)) if args.json else view.show
    follower = Follower(c, request_id, timeout=args.timeout, no_runner_timeout=args.no_runner_timeout)
    try:
        done = None
        for event in follower.events():
            emit(event.dump())
            done = event.done if isinstance(event, Finished) else None
    except KeyboardInterrupt:
        print(
            f"kakeya: stopped waiting; {request_id} goes on (`kakeya wait {request_id}` to follow it again, "
            f"`kakeya cancel {request_id}` to cancel it)",
            file=sys.stderr,
        )
        return 130
    finally:
        view.close()
    out = out_dir(c.root, args.out, request_id)
    result = c.results(request_id, out, done)
    if not args.json:
        return report(request_id, result, out)
    try:
        checks = json.loads((out / "verdict.json").read_text())
    except (OSError, ValueError):
        checks = None
    code = exit_code(result)
    emit(  # the last event: the run's outcome
        follower.event(
            "verdict",
            status=result.status,
            verdict=result.verdict,
            reason=result.reason,
            runner=result.runner_name,
            started_at=result.started_at,
            ended_at=result.ended_at,
            duration_s=result.duration_s,
            checks=checks,
            out=str(out),
            exit_code=code,
        ).dump()
    )
    return code


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
    else:
        line = kind
    return f"{at} {line}"
