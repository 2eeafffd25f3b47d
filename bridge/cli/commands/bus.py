"""`kakeya bus gc --older-than DAYS [--archive-done] [--dry-run]`: delete what finished requests left behind
(a done push deletes the request and claim refs itself; a cancel marker pushed after it, result side refs a
runner left, refs/kakeya-stage/<id>/..., and the refs of layout 1 stay until gc); with --archive-done, also
move their done refs to refs/kakeya-archive/done/<id> (kept on the bus, read by no status or gate) and
delete their by-subject index refs.

`kakeya bus compact [--older-than DAYS] [--dry-run]`: move done results older than DAYS (2) into the ledger
(bridge/bus/ledger.py): their done and index refs go, the ledger keeps them reachable and indexed. The runners do
this on their own (config compact_after_days); this is the same by hand.

`kakeya bus migrate [--dry-run]`: upgrade a bus of layout 1 (everything under refs/heads/kakeya/) to layout 2
(bridge/bus/); idempotent, and safe while runners of this version work.

--json (each verb): one object, {"event": "gc" | "compact" | "migrate", "dry_run", "refs", "count"}."""

from __future__ import annotations

import argparse

from bridge.cli.commands._common import add_json, add_remote, client, emit
from bridge.client.admin import Admin


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
    add_json(gc)
    add_remote(gc)
    gc.set_defaults(func=run_gc)
    compact = verbs.add_parser("compact", help="move old done results into the ledger (out of refs)")
    compact.add_argument(
        "--older-than", type=float, default=2.0, metavar="DAYS", help="done results made before this (2)"
    )
    compact.add_argument("--dry-run", action="store_true", help="list the refs that would go")
    add_json(compact)
    add_remote(compact)
    compact.set_defaults(func=run_compact)
    migrate = verbs.add_parser("migrate", help="upgrade a bus of layout 1 to this kakeya's layout")
    migrate.add_argument("--dry-run", action="store_true", help="list what would be written or deleted")
    add_json(migrate)
    add_remote(migrate)
    migrate.set_defaults(func=run_migrate)


def run_gc(args: argparse.Namespace) -> int:
    refs = Admin(client(args)).gc(args.older_than, dry_run=args.dry_run, archive_done=args.archive_done)
    return said(args, "gc", refs, f"{'would delete' if args.dry_run else 'deleted'} {len(refs)} refs")


def run_migrate(args: argparse.Namespace) -> int:
    refs = Admin(client(args)).migrate(dry_run=args.dry_run)
    return said(args, "migrate", refs, f"{'would update' if args.dry_run else 'updated'} {len(refs)} refs")


def run_compact(args: argparse.Namespace) -> int:
    refs = Admin(client(args)).compact(args.older_than, dry_run=args.dry_run)
    words = f"{'would move' if args.dry_run else 'moved'} {len(refs)} refs into the ledger"
    return said(args, "compact", refs, words)


def said(args: argparse.Namespace, verb: str, refs: list[str], words: str) -> int:
    """The refs a verb touched, one a line and then `words`; or (--json) its one JSON object."""
    if args.json:
        emit({"event": verb, "dry_run": args.dry_run, "refs": refs, "count": len(refs)})
        return 0
    for ref in refs:
        print(ref)
    print(words)
    return 0
