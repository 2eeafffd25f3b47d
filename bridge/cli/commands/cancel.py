"""`kakeya cancel ID [--reason TEXT] [--json]`: push a cancel marker; the runner ends the request as cancelled
(killing the run if it has started). ID may be a unique prefix or the six-hex suffix. --json: one `cancel`
event with the state the request was in (`already`: it had a cancel marker)."""

from __future__ import annotations

import argparse

from bridge.cli.commands._common import add_id, add_json, add_remote, client, emit, event


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("cancel", help="cancel a request (before or during its run)")
    add_id(parser)
    parser.add_argument("--reason", default="", help="why (recorded in the cancel marker)")
    add_json(parser)
    add_remote(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    c = client(args)
    rid = c.resolve_id(args.id)
    state = c.cancel(rid, args.reason)
    if args.json:
        emit(event("cancel", rid, was=state, already=state == "cancelled"))
    else:
        print(
            f"{rid}: already cancelled" if state == "cancelled" else f"{rid}: cancel requested (was {state})"
        )
    return 0
