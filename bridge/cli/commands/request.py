"""`kakeya request PRESET [-p k=v ...] --runner LABEL[,LABEL...] [--subject REV] [--expires 2h | --queue-timeout S]
[--idempotency-key KEY] [--allow-dirty] [--wait]`.

Validates against the local preset registry, pushes kakeya/req/<label>/<id> and prints the id.
--runner h200,h100: the first label with a live runner, none live: the first. --queue-timeout S: a request no
runner has started within S ends as `expired` (the same clock as --expires). --idempotency-key KEY: a retry
with the same key and content prints the first request's id (queued, running or done); other content under
the same key is refused.
With --wait: follows it like `kakeya wait` (--json: one JSON event per line, starting with "requested"), writes
the result to --out (default out/<id>) and exits like `kakeya wait`.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from bridge.bus.progress import say
from bridge.cli.commands._common import (
    add_preset_args,
    add_remote,
    add_wait_args,
    client,
    follow,
    label_note,
    parse_duration,
    unsent_warning,
)
from bridge.config import project_root
from bridge.core.result import iso_time
from bridge.presets.params import parse_assignments


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("request", help="ask a runner for a run through the bus")
    add_preset_args(parser)
    parser.add_argument(
        "--runner",
        required=True,
        metavar="LABEL[,LABEL...]",
        help="the runner label to run on (e.g. cpu, h200); several in order of preference: the first "
        "with a live runner (none live: the first)",
    )
    add_remote(parser)
    parser.add_argument("--subject", metavar="REV", help="the commit to run (default: HEAD)")
    timeout = parser.add_mutually_exclusive_group()
    timeout.add_argument(
        "--expires", metavar="DURATION", help="expire unless started within this (e.g. 30m, 2h, 7d)"
    )
    timeout.add_argument(
        "--queue-timeout",
        metavar="S",
        help="end as `expired` unless a runner starts it within S seconds (or 90s, 15m, 2h)",
    )
    parser.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="retry safely: the same KEY and content gives the first request's id; other content is refused",
    )
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="send a snapshot of the working tree (tracked and untracked files) instead of refusing",
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="follow it until it is done (like `kakeya wait`) and fetch the result",
    )
    add_wait_args(parser, "with --wait: ")
    parser.add_argument("--out", type=Path, help="with --wait: where to write the results (default out/<id>)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    expires_s = (
        parse_duration(args.expires, unit_required=True)
        if args.expires
        else parse_duration(args.queue_timeout)
        if args.queue_timeout
        else None
    )
    params = parse_assignments(args.param)
    state = project_root(args.project.expanduser() if args.project else None) / ".kakeya"
    fresh = not state.exists()
    try:
        c = client(args)
        manifest = c.request(
            args.preset,
            params,
            args.runner,
            subject=args.subject,
            expires_s=expires_s,
            allow_dirty=args.allow_dirty,
            idempotency_key=args.idempotency_key,
        )
    except BaseException:
        if fresh:  # a request that failed leaves no state directory behind
            shutil.rmtree(state, ignore_errors=True)
        raise
    note = label_note(c.label_choice)
    if c.unsent:
        say(unsent_warning(c.unsent))
    if c.reused:  # said on stderr; stdout stays the id (or the event) alone
        say(f"kakeya: reused request {manifest.id} (made earlier with this idempotency key and content)")
    elif note:
        say(f"kakeya: runner {manifest.runner}: {note}")
    if args.json:
        event = {"event": "requested", "id": manifest.id, "at": iso_time(manifest.created_at)}
        event.update(runner=manifest.runner, expires_at=iso_time(manifest.expires_at), reused=c.reused)
        event.update({"label_note": note} if note and not c.reused else {})
        print(json.dumps(event), flush=True)
    else:
        print(manifest.id, flush=True)
    return follow(c, manifest.id, args) if args.wait else 0
