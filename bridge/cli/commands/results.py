"""`kakeya results ID [--out DIR] [--verify] [--link-base URL] [--json]`: fetch the done commit and write its
files (result.json, report.json, verdict.json, summary.md, report.html, logs/) into DIR/<id> (default out/<id>:
two requests never mix), and say where. ID may be a unique prefix or the six-hex suffix. Exit 0 once written,
whatever the outcome (--json: the `verdict` event, with the outcome's own `exit_code`, and `trust` with --verify).

--verify writes them only if the done commit is a runner's signed commit for its request, and says who
signed it (`signed by RUNNER@LABELS`); with no allowed-signers file it is refused on a shared bus unless
--allow-unsigned (then, as on the embedded bus, it says `unsigned (allowed)`).
--link-base URL (a repository's web address, e.g. https://github.com/ORG/kakeya) makes summary.md's links
absolute: logs to URL/blob/<done>/.kakeya/results/<id>/..., plots to URL/raw/<done>/...; for a page where
relative links cannot resolve, such as a GitHub job summary.
--attestation [FILE] writes the runner's signed in-toto attestation of the run (bridge/results/attest.py), committed
in its done commit, to FILE as well; `kakeya verify FILE` checks it offline (docs/evidence.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from bridge.bus.records import results_path
from bridge.bus.trust import ALLOWED_SIGNERS, UNSIGNED, done_signer, evidence_signers, trust_words
from bridge.cli.commands._common import (
    add_id,
    add_json,
    add_output,
    add_remote,
    client,
    emit,
    event,
    out_dir,
    outcome,
    report,
)
from bridge.core.errors import KakeyaError
from bridge.results import attest
from bridge.results.render import absolute_links


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("results", help="fetch and write the results of a finished request")
    add_id(parser)
    add_output(parser)
    add_json(parser)
    parser.add_argument(
        "--verify",
        action="store_true",
        help=f"write them only if the done commit is a runner's signed commit (allowed signers: "
        f"--allowed-signers, else {ALLOWED_SIGNERS} of this checkout)",
    )
    parser.add_argument("--allowed-signers", type=Path, metavar="FILE", help="the allowed-signers file")
    parser.add_argument(
        "--allow-unsigned",
        action="store_true",
        help="--verify with no allowed-signers file on a shared bus: accept it unsigned",
    )
    parser.add_argument(
        "--link-base",
        metavar="URL",
        help="make summary.md's links absolute under this repository web address",
    )
    parser.add_argument(
        "--attestation",
        nargs="?",
        const="",
        metavar="FILE",
        help="also write the runner's signed in-toto attestation of the run (a DSSE envelope) to FILE "
        "(default: attestation.json in the results); `kakeya verify FILE` checks it offline",
    )
    add_remote(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    c = client(args)
    args.id = c.resolve_id(args.id)
    out = out_dir(c.root, args.out, args.id)
    signers = None
    if args.verify:
        signers = evidence_signers(
            c.root, args.allowed_signers, bus=c.url, embedded=not c.remote, allow_unsigned=args.allow_unsigned
        )
    entry = c.entry(args.id) if args.link_base or signers is not None else None
    done = entry.done if entry is not None and args.link_base else None
    # Verifying reads the entry again, with its request commit: a done sha alone would skip the replay check.
    result = c.results(args.id, out, None if signers is not None else done, signers=signers)
    if args.verify:
        words = UNSIGNED
        if signers is not None and entry is not None and entry.done is not None:
            who, problem = done_signer(
                c.repo_with(entry.done), args.id, entry.done, entry.req, entry.label, signers
            )
            if problem:  # the done ref moved while it was read
                raise KakeyaError(f"{args.id}: its results are not trusted: {problem}", code="untrusted")
            words = trust_words(who)
        if not args.json:
            print(f"{args.id}: {words}")
    if done is not None:
        base, where = args.link_base.rstrip("/"), f"{done}/{results_path(args.id)}/"
        summary = out / "summary.md"
        summary.write_text(absolute_links(summary.read_text(), f"{base}/blob/{where}", f"{base}/raw/{where}"))
    attestation = None
    if args.attestation is not None:
        attestation = attest.hand_out(out, Path(args.attestation) if args.attestation else None)
    if args.json:
        extra = {"trust": words} if args.verify else {}
        if attestation is not None:
            extra["attestation"] = str(attestation)
        emit(event("verdict", args.id, **outcome(result, out), **extra))
        return 0
    if attestation is not None:
        print(f"attestation: {attestation}")
    report(args.id, result, out, summary=args.summary)
    return 0
