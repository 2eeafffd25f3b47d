"""`kakeya history PRESET@LABEL [--metric POINTER] [--branch REF] [--since DATE] [--json] [--plot FILE.svg]
[--html FILE]` and `kakeya history --publish [--branch-to gh-pages]`.

The trusted runs of a preset (those `kakeya gate pr` counts) along a branch's first-parent history, one row
per run: commit, run, date, runner, device, the metric's value, the re-gated verdict; per commit its noise
band and whether the metric changed against the previous commit with runs (two-sided Mann-Whitney U over
their runs, bridge/history.py). --publish commits a dashboard of every required preset
(.github/kakeya-required.yml as --branch has it) to a branch GitHub Pages can serve, through the object store only.
Exit 0; 2 for a bad requirement, metric or branch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bridge import evidence, git
from bridge import history as H
from bridge.commands._common import add_remote, add_signer_args, client
from bridge.errors import InvalidRequest
from bridge.evidence import REQUIRED_FILE
from bridge.presets import load_registry
from bridge.trust import evidence_signers


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "history",
        help="a preset's trusted runs along a branch: table, JSON, plot, page; --publish a dashboard",
        description="The trusted runs of PRESET@LABEL along a branch's first-parent history, with noise bands "
        "from repeated runs; 'changed' is a two-sided Mann-Whitney U test (p < 0.05), not a fixed percent.",
        epilog="examples:\n  kakeya history probe@cpu --branch main\n"
        "  kakeya history niah-ladder@h200 --metric /summary/recall --since 2026-11-01 --plot h.svg\n"
        "  kakeya history --publish --branch-to gh-pages",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "requirement",
        nargs="?",
        metavar="PRESET@LABEL",
        help="the preset and runner label, e.g. probe@cpu",
    )
    parser.add_argument(
        "--metric",
        metavar="POINTER",
        help="JSON pointer to one number (default: the preset's first gated one)",
    )
    parser.add_argument("--branch", default="HEAD", metavar="REF", help="whose first parents (default: HEAD)")
    parser.add_argument(
        "--since", metavar="DATE", help="only commits after DATE (e.g. 2026-11-01, '2 weeks ago')"
    )
    parser.add_argument(
        "--limit", type=int, default=H.LIMIT, metavar="N", help=f"at most N commits (default {H.LIMIT})"
    )
    parser.add_argument("--json", action="store_true", help="print the history as JSON")
    parser.add_argument("--plot", type=Path, metavar="FILE.svg", help="write the plot (SVG)")
    parser.add_argument("--html", type=Path, metavar="FILE", help="write a static page (plot and table)")
    parser.add_argument(
        "--publish", action="store_true", help=f"commit a dashboard of every entry of {REQUIRED_FILE}"
    )
    parser.add_argument(
        "--branch-to", default="gh-pages", metavar="BRANCH", help="--publish's branch (default gh-pages)"
    )
    add_signer_args(parser)
    add_remote(parser)
    parser.set_defaults(func=run)


def required(root: Path, ref: str) -> list[str]:
    """The entries of REQUIRED_FILE as committed on `ref` (not as the working tree has it)."""
    sha = git.rev_parse(root, ref)
    if sha is None:
        raise InvalidRequest(f"{ref!r} is not a branch or commit of {root} (--branch)")
    raw = git.read_path(root, sha, REQUIRED_FILE)
    if raw is None:
        raise InvalidRequest(f"{ref} has no {REQUIRED_FILE}: nothing to publish")
    return evidence.parse_required(raw, f"{REQUIRED_FILE} on {ref}")


def run(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise InvalidRequest("--limit must be at least 1")
    if args.publish == bool(args.requirement):
        raise InvalidRequest("give PRESET@LABEL, or --publish (a dashboard of every required preset)")
    registry = load_registry()
    c = client(args)
    if not c.in_repo:
        raise InvalidRequest(f"{c.root} is not a git repository: history follows its branch")
    texts = required(c.root, args.branch) if args.publish else [args.requirement]
    requirements = evidence.check_requirements(texts, registry)
    signers = evidence_signers(
        c.root, args.allowed_signers, bus=c.url, embedded=not c.remote, allow_unsigned=args.allow_unsigned
    )
    histories = [
        H.collect(
            evidence.DoneResults(c.bus, signers),
            c.root,
            req,
            registry[req.preset],
            None if args.publish else args.metric,
            args.branch,
            args.since,
            args.limit,
        )
        for req in requirements
    ]
    if args.publish:
        sha = H.publish(c.root, H.dashboard(histories), args.branch_to, c.who())
        where = f"{args.branch_to} at {sha[:12]}" if sha else f"{args.branch_to} (unchanged)"
        print(
            f"dashboard of {len(histories)} preset(s) committed to {where}; `git push origin {args.branch_to}` "
            "publishes it (GitHub Pages: serve that branch)"
        )
        return 0
    [h] = histories
    if args.plot:
        args.plot.write_text(H.svg(h))
        print(f"plot: {args.plot}", file=sys.stderr)
    if args.html:
        args.html.write_text(H.html_page(h))
        print(f"page: {args.html}", file=sys.stderr)
    print(h.model_dump_json(indent=2) if args.json else H.text_table(h))
    return 0
