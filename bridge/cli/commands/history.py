"""`kakeya history PRESET@LABEL [--metric POINTER] [--branch REF] [--since DATE] [--json] [--plot FILE.svg]
[--html FILE] [--alert [--alert-file F]]` and `kakeya history --publish [--branch-to gh-pages]`.

The trusted runs of a preset (those `kakeya gate pr` counts) along a branch's first-parent history, one row
per run: commit, run, date, runner, device, the metric's value, the re-gated verdict; per commit its noise
band and whether the metric changed against the previous commit with runs (two-sided Mann-Whitney U over
their runs, bridge/evidence/history.py). --publish commits a dashboard of every required preset
(.github/kakeya-required.yml as --branch has it) to a branch GitHub Pages can serve, through the object store only.
--alert: exit 1 and an issue's markdown (stdout, or --alert-file F; --json: one `alert` object each) when the
newest commit with trusted runs changed for the worse against the one before it (without PRESET@LABEL: for
every required preset); the regressions workflow files them (.github/workflows/regressions.yml).
Exit 0; 1 a regression (--alert); 2 for a bad requirement, metric or branch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bridge import evidence
from bridge.bus.trust import evidence_signers
from bridge.cli.commands._common import add_remote, add_signer_args, client, emit
from bridge.core.errors import InvalidRequest
from bridge.evidence import REQUIRED_FILE
from bridge.evidence import history as H
from bridge.presets.registry import load_registry
from bridge.wire import git


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
    parser.add_argument(
        "--alert",
        action="store_true",
        help="exit 1 and write an issue's markdown when the newest commit with trusted runs changed for the "
        f"worse (without PRESET@LABEL: every entry of {REQUIRED_FILE}); --json: one `alert` object each",
    )
    parser.add_argument(
        "--alert-file", type=Path, metavar="F", help="--alert's markdown goes to F (written only on an alert)"
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
        raise InvalidRequest(f"{ref} has no {REQUIRED_FILE}: no required presets to publish or check")
    return evidence.parse_required(raw, f"{REQUIRED_FILE} on {ref}")


def run(args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise InvalidRequest("--limit must be at least 1")
    if args.publish and (args.requirement or args.alert):
        raise InvalidRequest("--publish takes no PRESET@LABEL and no --alert")
    if not (args.publish or args.alert or args.requirement):
        raise InvalidRequest("give PRESET@LABEL, or --publish (a dashboard of every required preset)")
    if args.alert_file and not args.alert:
        raise InvalidRequest("--alert-file goes with --alert")
    registry = load_registry()
    c = client(args)
    if not c.in_repo:
        raise InvalidRequest(f"{c.root} is not a git repository: history follows its branch")
    texts = [args.requirement] if args.requirement else required(c.root, args.branch)
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
            args.metric if args.requirement else None,
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
    if args.alert:
        return alert(histories, args.alert_file, args.json)
    [h] = histories
    if args.plot:
        args.plot.write_text(H.svg(h))
        print(f"plot: {args.plot}", file=sys.stderr)
    if args.html:
        args.html.write_text(H.html_page(h))
        print(f"page: {args.html}", file=sys.stderr)
    print(h.model_dump_json(indent=2) if args.json else H.text_table(h))
    return 0


def alert(histories: list[H.History], to: Path | None, as_json: bool) -> int:
    """--alert: each regression's issue (bridge/evidence/history.py `regression`), as markdown to `to` or stdout, or
    with `as_json` one `alert` object a line; exit 1 when there is one, else 0 (a line on stderr each)."""
    found = [(h, p) for h in histories if (p := H.regression(h)) is not None]
    for h in histories:
        if all(h is not f for f, _ in found):
            print(
                f"{h.requirement} {h.metric}: no regression at the newest commit with runs", file=sys.stderr
            )
    bodies = []
    for h, point in found:
        title, body = H.alert_title(h, point), H.alert_markdown(h, point)
        print(f"{title}: changed {point.change}, p = {point.p_value:.3g}", file=sys.stderr)
        if as_json:
            fields = {"requirement": h.requirement, "metric": h.metric, "subject": point.subject}
            fields |= {"against": point.against, "change": point.change, "p_value": point.p_value}
            emit({"event": "alert", "title": title, **fields, "body": body})
        bodies.append(body)
    if as_json:
        emit(
            {
                "event": "alerts",
                "count": len(found),
                "checked": [f"{h.requirement} {h.metric}" for h in histories],
            }
        )
    elif bodies:
        text = "\n---\n\n".join(bodies)
        if to is None:
            print(text, end="")
        else:
            to.write_text(text)
    return 1 if found else 0
