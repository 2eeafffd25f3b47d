"""`kakeya results ID [--out DIR]`: fetch the done commit and write its files (result.json, report.json,
verdict.json, summary.md, logs/) into DIR (default out/<id>). Exit 0 once written, whatever the outcome."""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge.commands._bus import add_remote, client, out_dir, report


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("results", help="fetch and write the results of a finished request")
    parser.add_argument("id")
    parser.add_argument("--out", type=Path, help="where to write the results (default out/<id>)")
    add_remote(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    c = client(args)
    out = out_dir(c.root, args.out, args.id)
    report(args.id, c.results(args.id, out), out)
    return 0
