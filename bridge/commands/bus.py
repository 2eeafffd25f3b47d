"""`kakeya bus gc --older-than DAYS [--archive-done] [--dry-run]`: delete the req/claim/cancel refs of finished
requests (their done refs keep the whole history); with --archive-done, also move their done refs to
refs/kakeya-archive/done/<id>: kept on the bus, but fetched by no clone and read by no status or gate. Result
side refs a runner left behind (refs/kakeya-stage/<id>/...) go too once their request is done or gone."""

from __future__ import annotations

import argparse

from bridge.commands._bus import add_remote, client


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bus", help="bus maintenance")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    gc = verbs.add_parser("gc", help="delete the req/claim/cancel refs of finished requests")
    gc.add_argument(
        "--older-than", type=float, required=True, metavar="DAYS", help="only requests made before this"
    )
    gc.add_argument(
        "--archive-done",
        action="store_true",
        help="also move their done refs to refs/kakeya-archive/done/<id> (out of every clone's fetch)",
    )
    gc.add_argument("--dry-run", action="store_true", help="list what would be deleted")
    add_remote(gc)
    gc.set_defaults(func=run_gc)


def run_gc(args: argparse.Namespace) -> int:
    refs = client(args).gc(args.older_than, dry_run=args.dry_run, archive_done=args.archive_done)
    for ref in refs:
        print(ref)
    print(f"{'would delete' if args.dry_run else 'deleted'} {len(refs)} refs")
    return 0
