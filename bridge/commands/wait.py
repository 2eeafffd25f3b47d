"""`kakeya wait ID [--timeout S] [--out DIR]`: wait for a request to finish, then fetch its results like
`kakeya results`. Exit 0 pass, 1 fail or any other outcome, 2 rejected."""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge.commands._bus import add_remote, client, out_dir, report


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("wait", help="wait for a request to finish, then fetch its results")
    parser.add_argument("id")
    parser.add_argument("--out", type=Path, help="where to write the results (default out/<id>)")
    add_remote(parser)
    parser.add_argument("--timeout", type=float, metavar="S", help="give up after S seconds")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    c = client(args)
    done = c.wait(args.id, timeout=args.timeout)
    out = out_dir(c.root, args.out, args.id)
    return report(args.id, c.results(args.id, out, done), out)
