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

from bridge.cli.commands._common import add_id, add_output, add_remote, add_wait_args, client, follow


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("wait", help="follow a request until it is done, then fetch its results")
    add_id(parser)
    add_output(parser)
    add_remote(parser)
    add_wait_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    c = client(args)
    return follow(c, c.resolve_id(args.id), args)
