"""`kakeya runners [--all] [--json]`: the runners whose presence refs (refs/kakeya/runners/<name>) are on the bus.

Lists live runners (idle or serving) and presences that cannot be trusted (malformed, or not signed by a
runner key of the project's allowed-signers file for their labels: shown, never counted as serving a
label). Runners that stopped or have not refreshed their presence for three intervals age out; --all shows
them too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json

from bridge.bus.presence import Seen, read_presences
from bridge.bus.records import RUNNERS_PREFIX, utcnow
from bridge.bus.trust import trusted_signers
from bridge.cli.commands._common import add_json, add_remote, client
from bridge.client.rows import age

COLUMNS = ("NAME", "STATE", "LABELS", "HOST", "ACCELERATOR", "VERSION", "SEEN", "SERVING")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("runners", help="the runners present on the bus: labels, host, what they serve")
    parser.add_argument("--all", action="store_true", help="also runners that stopped or aged out")
    add_json(parser)
    add_remote(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    c = client(args)
    snap = c.bus.ls_remote(RUNNERS_PREFIX)
    now = utcnow()
    seen = read_presences(c.bus, snap.runners, trusted_signers(c.root) if c.in_repo else None)
    shown = [s for s in seen if args.all or s.state(now) not in ("stopped", "stale")]
    if args.json:
        print(json.dumps([s.as_dict(now) for s in shown]))
    elif shown:
        print(table(shown, now))
    else:
        print(
            f"no live runner on the bus at {c.url}"
            + ("" if args.all else " (--all shows those that aged out)")
        )
    return 0


def table(seen: list[Seen], now: dt.datetime) -> str:
    cells = [COLUMNS]
    for s in seen:
        p = s.presence
        state = s.state(now) + (f" ({s.problem})" if s.problem else "")
        if p is None:
            cells.append((s.name, state, "-", "-", "-", "-", "-", "-"))
            continue
        state += f" ({p.paused})" if p.paused else ""  # e.g. not claiming: too little free space
        seen_ago = age((now - p.seen_at).total_seconds()) + " ago"
        cells.append(
            (s.name, state, ",".join(p.labels), p.host, p.accelerator, p.version, seen_ago, p.serving or "-")
        )
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )
