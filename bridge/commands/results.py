"""`kakeya results ID [--out DIR]` and `kakeya wait ID [--timeout S] [--out DIR]`.

results: fetch the done commit and write its files (result.json, report.json, verdict.json, summary.md,
logs/) into DIR (default out/<id>). wait: the same once the request is done; exit 0 pass, 1 fail or
any other outcome, 2 rejected.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge.commands._bus import add_remote, client, out_dir, report


def register(sub: argparse._SubParsersAction) -> None:
    for name, help_ in (
        ("results", "fetch and write the results of a finished request"),
        ("wait", "wait for a request to finish, then fetch its results"),
    ):
        parser = sub.add_parser(name, help=help_)
        parser.add_argument("id")
        parser.add_argument("--out", type=Path, help="where to write the results (default out/<id>)")
        add_remote(parser)
        if name == "wait":
            parser.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds")
        parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    c = client(args)
    done = c.wait(args.id, timeout=args.timeout) if args.command == "wait" else None
    out = out_dir(c.root, args.out, args.id)
    code = report(args.id, c.results(args.id, out, done), out)
    return code if args.command == "wait" else 0
