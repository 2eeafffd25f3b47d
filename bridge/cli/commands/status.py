"""`kakeya status [ID] [--json] [--fetch] [--all]`: one request, or a table of the live requests and those of
the last two days (by id date; --all: every done request still in refs), from one prefix-scoped listing.

Verdicts show for done commits this machine already has (or that a local bus holds); --fetch first
fetches the missing ones (one more round trip). `status ID` fetches what that one request needs; ID may be a
unique prefix of an id or its six-hex suffix. --json: one line, an object (ID) or a list of them.
"""

from __future__ import annotations

import argparse
import json

from bridge.bus.progress import describe
from bridge.bus.records import Progress
from bridge.cli.commands._common import add_json, add_remote, client
from bridge.client.rows import Row, age, row_dict
from bridge.core.text import clean_json

COLUMNS = ("ID", "STATE", "PRESET", "RUNNER", "AGE", "VERDICT")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("status", help="the state of one request or of all of them")
    parser.add_argument(
        "id",
        nargs="?",
        help="one request: its id, a unique prefix (20261125T1615...) or its six-hex suffix (663f0b); "
        "default: a table of the live and recent ones",
    )
    add_json(parser)
    parser.add_argument(
        "--fetch", action="store_true", help="fetch done commits not yet here to show every verdict"
    )
    parser.add_argument("--all", action="store_true", help="every finished request, not just recent ones")
    add_remote(parser)
    parser.set_defaults(func=run)


def table(rows: list[Row]) -> str:
    cells = [COLUMNS] + [
        (r.id, r.state, r.preset, r.runner or "-", age(r.age_s), r.verdict or "-") for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def running(rows: list[Row]) -> list[str]:
    """A line under the table for each request a runner holds: progress, elapsed time, the holder's liveness."""
    lines = []
    for r in rows:
        if r.holder is None or r.holder_live is None:
            continue
        lease = "lease live" if r.holder_live else f"lease expired at {r.lease_until} (holder may be dead)"
        detail = "claimed, no progress yet"
        if r.progress is not None:
            detail = describe(Progress.model_validate(r.progress))
        lines.append(f"{r.id}: {detail}; held by {r.holder} ({lease})")
    return lines


def run(args: argparse.Namespace) -> int:
    c = client(args)
    if args.id:
        row = c.status_one(c.resolve_id(args.id))
        if args.json:
            print(json.dumps(clean_json(row_dict(row))))
        else:
            for key, value in row_dict(row).items():
                if value not in (None, {}):
                    print(f"{key:<11}{json.dumps(value) if isinstance(value, dict) else value}")
        return 0
    rows = c.status(fetch=args.fetch, everything=args.all)
    if args.json:
        print(json.dumps(clean_json([row_dict(r) for r in rows])))
    elif rows:
        print(table(rows))
        for line in running(rows):
            print(line)
    else:
        print(f"no requests on the bus at {c.url}")
    return 0
