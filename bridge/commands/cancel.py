"""`kakeya cancel ID [--reason TEXT]`: push a cancel marker; the runner ends the request as cancelled
(killing the run if it has started)."""

from __future__ import annotations

import argparse

from bridge.commands._bus import add_remote, client


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("cancel", help="cancel a request (before or during its run)")
    parser.add_argument("id")
    parser.add_argument("--reason", default="", help="why (recorded in the cancel marker)")
    add_remote(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    state = client(args).cancel(args.id, args.reason)
    print(
        f"{args.id}: already cancelled"
        if state == "cancelled"
        else f"{args.id}: cancel requested (was {state})"
    )
    return 0
