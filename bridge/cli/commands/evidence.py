"""`kakeya evidence SHA [--require 'PRESET[@LABEL] [PIN ...]' ...] [--request-missing] [--wait] [--json]`: the
evidence a commit needs, in one call.

Lists what is required (the --require entries, else .github/kakeya-required.yml of this checkout: the file the
PR gate reads), what the bus holds for SHA (the evidence used, and the results that name it but are no
evidence: untrusted, not run, mismatched, not meeting the pins) and what is pending (a live request of that
preset for SHA that meets the pins). --request-missing requests every missing one at once (its pins met by
the smallest values they allow; without @LABEL on the preset's labels in order, the first with a live
runner); --wait follows all of them concurrently, streaming each one's progress (--json: one JSON event per
line, each with its request "id"), then judges again. Exit 0 when every requirement passes, 1 otherwise (2 a
bad requirement, 3 no live runner for --no-runner-timeout).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from bridge.bus.records import Manifest
from bridge.cli.commands._common import add_remote, add_require, add_signer_args, add_wait_args, client, line
from bridge.evidence import service
from bridge.presets.registry import load_registry


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "evidence",
        help="what evidence a commit needs, what the bus holds, and (--request-missing) request the rest",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "subject",
        nargs="?",
        default="HEAD",
        metavar="SHA",
        help="the commit (a full sha, or a rev of this repo; default HEAD)",
    )
    add_require(parser)
    parser.add_argument("--request-missing", action="store_true", help="request every missing run at once")
    parser.add_argument(
        "--wait", action="store_true", help="follow the requested and pending runs until all are done"
    )
    add_wait_args(parser, "with --wait: ")
    add_signer_args(parser)
    add_remote(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bridge.client.follow import follow_all

    registry = load_registry()
    c = client(args)
    reqs = service.requirements(c, args.require, registry)
    subject = service.subject_sha(c, args.subject)
    signers = service.signers_for(c, args.allowed_signers, args.allow_unsigned)
    emit = (lambda e: print(json.dumps(e), flush=True)) if args.json else None
    outcomes = service.judge(c, subject, reqs, registry, signers)
    waiting = service.pending(c, subject, outcomes, registry)
    made = service.request_missing(c, subject, outcomes, registry, waiting) if args.request_missing else {}
    for req, rid in waiting.items():
        say(emit, {"event": "pending", "id": rid, "requirement": req}, f"pending: {req}: {rid}")
    for req, m in made.items():
        say(emit, requested_event(req, m), f"requested: {req}: {m.id} on {m.runner}")
    ids = [*waiting.values(), *(m.id for m in made.values())]
    if args.wait and ids:
        for event in follow_all(c, ids, args.timeout, args.no_runner_timeout):
            if emit is not None:
                emit(event)
            else:
                print(f"{event['id']}: {line(event)}", flush=True)
        outcomes = service.judge(c, subject, reqs, registry, signers)
    if emit is not None:
        emit({"event": "evidence", "subject": subject, "outcomes": [o.as_dict() for o in outcomes]})
    else:
        print(f"evidence for {subject}:" if outcomes else f"no evidence is required for {subject}")
        for o in outcomes:
            print(o.line())
    return 0 if all(o.passed for o in outcomes) else 1


def requested_event(req: str, m: Manifest) -> dict[str, Any]:
    return {"event": "requested", "id": m.id, "requirement": req, "runner": m.runner, "params": m.params}


def say(emit: Any, event: dict[str, Any], line: str) -> None:
    if emit is not None:
        emit(event)
    else:
        print(line, flush=True)
