"""`kakeya bisect --good SHA --bad SHA --require PRESET@LABEL (--verdict | --metric POINTER --threshold X
[--lower-is-better]) [-p NAME=VALUE ...] [--max-in-flight N] [--json] [--reset]`.

Finds the first commit of GOOD..BAD (first parents) whose trusted run of PRESET@LABEL is bad, requesting
runs on midpoints over the bus (bridge/evidence/bisect.py): evidence already on the bus is reused, up to N requests
are in flight at once, commits whose run cannot tell (did not succeed, rejected, expired) are skipped like
`git bisect skip`. State: .kakeya/bisect.json; after Ctrl-C the same command resumes, reusing the requests
already made. Exit 0 with the first bad commit, 1 when skipped commits leave it ambiguous, 2 bad arguments,
130 Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from bridge.bus.trust import evidence_signers
from bridge.cli.commands._common import add_remote, add_signer_args, client
from bridge.client.remote import state_dir
from bridge.core.errors import InvalidRequest
from bridge.evidence import Requirement
from bridge.evidence import bisect as BI
from bridge.presets.params import parse_assignments
from bridge.presets.registry import load_registry


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "bisect",
        help="find the first commit whose run of a preset is bad, running midpoints on the bus",
        description="Bisect GOOD..BAD (first parents) on real hardware: runs are requested over the bus, "
        "existing evidence is reused, untestable commits are skipped; resumable after Ctrl-C.",
        epilog="examples:\n  kakeya bisect --good v1.2 --bad main --require probe@cpu --verdict\n"
        "  kakeya bisect --good a1b2c3 --bad HEAD --require throughput-code@h200 "
        "--metric /summary/tok_s --threshold 90 --max-in-flight 3",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--good", metavar="REV", help="a commit whose run is good")
    parser.add_argument("--bad", metavar="REV", help="a later commit whose run is bad")
    parser.add_argument("--require", metavar="PRESET@LABEL", help="the preset and runner label to run")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--verdict", action="store_true", help="bad: the re-gated verdict fails (default)")
    how.add_argument(
        "--metric", metavar="POINTER", help="bad: the number at POINTER is worse than --threshold"
    )
    parser.add_argument("--threshold", type=float, metavar="X", help="with --metric: bad below X")
    parser.add_argument("--lower-is-better", action="store_true", help="with --metric: bad above X instead")
    parser.add_argument(
        "-p",
        "--param",
        action="append",
        metavar="NAME=VALUE",
        help="a preset parameter of the runs (repeatable)",
    )
    parser.add_argument(
        "--max-in-flight", type=int, default=1, metavar="N", help="requests at once (default 1)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON event per line")
    parser.add_argument(
        "--reset", action="store_true", help="forget the bisect in .kakeya/bisect.json and stop"
    )
    add_signer_args(parser)
    add_remote(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    c = client(args)
    path = BI.state_path(state_dir(c.config, c.root))
    if args.reset:
        path.unlink(missing_ok=True)
        print(f"kakeya: bisect state {path} removed", file=sys.stderr)
        return 0
    if not (args.good and args.bad and args.require):
        raise InvalidRequest("give --good REV, --bad REV and --require PRESET@LABEL")
    if args.metric and args.threshold is None:
        raise InvalidRequest("--metric needs --threshold X (bad: worse than X)")
    if args.threshold is not None and not args.metric:
        raise InvalidRequest("--threshold goes with --metric POINTER")
    if args.max_in_flight < 1:
        raise InvalidRequest("--max-in-flight must be at least 1")
    registry = load_registry()
    req = Requirement.parse(args.require, registry)
    good, bad = c.rev_parse(args.good), c.rev_parse(args.bad)
    fresh = BI.State(
        requirement=str(req),
        good=good,
        bad=bad,
        bus=c.url,
        metric=args.metric,
        threshold=args.threshold,
        lower_is_better=args.lower_is_better,
        params=parse_assignments(args.param),
        commits=BI.commit_range(c.root, good, bad),
    )
    state = BI.load_state(path)
    if state is not None and not state.same_as(fresh):
        raise InvalidRequest(
            f"another bisect is in {path} ({state.requirement}, {state.good[:12]}..{state.bad[:12]}); finish it "
            "with its own arguments, or `kakeya bisect --reset` to forget it"
        )
    signers = evidence_signers(
        c.root,
        args.allowed_signers,
        bus=c.url,
        embedded=not c.remote,
        allow_unsigned=args.allow_unsigned,
    )
    b = BI.Bisect(c, state or fresh, path, registry, signers, args.max_in_flight)
    b.save()
    emit = (lambda e: print(json.dumps(e), flush=True)) if args.json else show
    last: dict[str, Any] = {}
    try:
        for event in b.events():
            emit(event)
            last = event
    except KeyboardInterrupt:
        print(
            f"kakeya: bisect interrupted; its requests go on. Run the same command again to resume ({path})",
            file=sys.stderr,
        )
        return 130
    return 0 if last.get("event") == "first-bad" else 1


def show(e: dict[str, Any]) -> None:
    kind, commit = e["event"], (e.get("commit") or "")[:12]
    if kind == "start":
        line = f"bisecting {e['commits']} commit(s) {e['good'][:12]}..{e['bad'][:12]} with {e['requirement']}"
    elif kind in ("good", "bad", "skip"):
        value = f" value {e['value']:g}" if e.get("value") is not None else ""
        why = f" ({e['reason']})" if e.get("reason") else ""
        line = f"{commit} {kind}{value}: {e['id'] or 'no run'}{' (reused)' if e.get('reused') else ''}{why}"
    elif kind == "request":
        line = f"{commit} requested {e['id']}"
    elif kind == "follow":
        line = f"{commit} following {e['id']}, already on the bus"
    elif kind == "waiting":
        line = "waiting: " + ", ".join(f"{rid} {state}" for rid, state in e["requests"].items())
    elif kind == "lost":
        line = f"{commit} lost {e['id']}: its request is gone from the bus; it is requested again"
    elif kind == "cancel":
        line = f"{commit} cancelled {e['id']}: outside the range left"
    elif kind == "first-bad":
        line = (
            f"first bad commit: {e['commit']} {e['title']}\n  bad run: {e['bad_run'] or 'none (given as --bad)'}\n"
            f"  last good: {e['good'][:12]}, run {e['good_run'] or 'none (given as --good)'}\n"
            f"  runs requested: {e['requested']}"
        )
    else:  # ambiguous
        line = "skipped commits leave it ambiguous; the first bad commit is one of:\n" + "\n".join(
            f"  {c}" for c in e["candidates"]
        )
    print(line, flush=True)
