"""`kakeya request PRESET [-p k=v ...] --runner LABEL [--subject REV] [--expires 2h] [--allow-dirty] [--wait]`.

Validates against the local preset registry, pushes kakeya/req/<label>/<id> and prints the id.
With --wait: follows it like `kakeya wait` (--json: one JSON event per line, starting with "requested"), writes
the result to --out (default out/<id>) and exits like `kakeya wait`.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from bridge.client import parse_duration
from bridge.commands._bus import add_preset_args, add_remote, client
from bridge.commands.wait import add_wait_args, follow
from bridge.config import project_root
from bridge.follow import iso
from bridge.presets import parse_assignments


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("request", help="ask a runner for a run through the bus")
    add_preset_args(parser)
    parser.add_argument(
        "--runner", required=True, metavar="LABEL", help="the runner label to run on (e.g. cpu, h200)"
    )
    add_remote(parser)
    parser.add_argument("--subject", metavar="REV", help="the commit to run (default: HEAD)")
    parser.add_argument(
        "--expires", metavar="DURATION", help="expire unless started within this (e.g. 30m, 2h, 7d)"
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
    expires_s = parse_duration(args.expires, unit_required=True) if args.expires else None
    params = parse_assignments(args.param)
    state = project_root() / ".kakeya"
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
        )
    except BaseException:
        if fresh:  # a request that failed leaves no state directory behind
            shutil.rmtree(state, ignore_errors=True)
        raise
    if args.json:
        print(
            json.dumps({"event": "requested", "id": manifest.id, "at": iso(manifest.created_at)}), flush=True
        )
    else:
        print(manifest.id, flush=True)
    return follow(c, manifest.id, args) if args.wait else 0
