"""`kakeya results ID [--out DIR] [--verify]`: fetch the done commit and write its files (result.json, report.json,
verdict.json, summary.md, logs/) into DIR (default out/<id>). Exit 0 once written, whatever the outcome."""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge.commands._bus import add_remote, client, out_dir, report
from bridge.errors import InvalidRequest
from bridge.trust import ALLOWED_SIGNERS, trusted_signers


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("results", help="fetch and write the results of a finished request")
    parser.add_argument("id")
    parser.add_argument("--out", type=Path, help="where to write the results (default out/<id>)")
    parser.add_argument(
        "--verify",
        action="store_true",
        help=f"write them only if the done commit is a runner's signed commit (allowed signers: "
        f"--allowed-signers, else {ALLOWED_SIGNERS} of this checkout)",
    )
    parser.add_argument("--allowed-signers", type=Path, metavar="FILE", help="the allowed-signers file")
    add_remote(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    c = client(args)
    out = out_dir(c.root, args.out, args.id)
    signers = None
    if args.verify:
        signers = trusted_signers(c.root, args.allowed_signers)
        if signers is None:
            raise InvalidRequest(f"--verify needs --allowed-signers FILE or {ALLOWED_SIGNERS} in {c.root}")
    report(args.id, c.results(args.id, out, signers=signers), out)
    return 0
