"""`kakeya gate check REPORT [--preset NAME | --checks FILE]` (neither: the one preset whose report kind is the
report's `kind`), `kakeya gate compare NEW BASE --metric PATH ...`
and `kakeya gate pr [--subject SHA (default HEAD)] [--require 'PRESET[@LABEL] [PARAM OP VALUE ...]' ...] [--remote R]
[--summary FILE] [--comment FILE [--base SHA] [--link-base URL]] [--allow-unsigned]`.

check and compare print a table (or `--json`) and exit 0 pass, 1 fail, 2 error (the report could not be
evaluated). pr finds the evidence the bus holds for a commit and re-gates it (bridge/evidence/) against
each --require, else the entries of .github/kakeya-required.yml of this checkout: exit 0 when every
requirement passes, 1 when evidence is missing, belongs to another commit or fails, 2 when a
requirement names an unknown preset, a label the preset does not run on or a pin its parameters do not
take, or when a shared bus has no allowed-signers file and --allow-unsigned is not given (the message says
how to add one). Each line says who signed the evidence (`signed by RUNNER@LABELS`, or `unsigned
(allowed)`), its accelerator, and the newer results that were ignored and why. --comment writes the pull
request's comment (bridge/evidence/comment.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

import gates
from bridge import evidence
from bridge.cli.commands._common import add_remote, add_require, add_signer_args, client
from bridge.core.errors import InvalidRequest
from bridge.evidence import comment
from bridge.evidence.service import requirements as required
from bridge.evidence.service import signers_for, subject_sha
from bridge.presets.registry import get_preset, load_registry


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("gate", help="gate a report against a preset's checks, or against a baseline")
    gsub = parser.add_subparsers(dest="gate_command", metavar="SUBCOMMAND", required=True)
    add_check(gsub)
    add_compare(gsub)
    add_pr(gsub)


def add_check(gsub: argparse._SubParsersAction) -> None:
    check = gsub.add_parser(
        "check",
        help="validate a report's schema and run gate checks on it",
        description="Exit 0 pass, 1 fail, 2 error (the report could not be evaluated).",
    )
    check.add_argument("report", type=Path, metavar="REPORT.json", help="the report to gate (a report.json)")
    source = check.add_mutually_exclusive_group()
    source.add_argument(
        "--preset",
        metavar="NAME",
        help="use this preset's gate checks and report kind (default: the one preset of the report's kind)",
    )
    source.add_argument(
        "--checks",
        type=Path,
        metavar="FILE",
        help="YAML/JSON: a list of checks, or a mapping with `gate:` (and optionally `report:`)",
    )
    check.add_argument("--json", action="store_true", help="print the verdict as JSON")
    check.set_defaults(func=run_check)


def add_compare(gsub: argparse._SubParsersAction) -> None:
    comp = gsub.add_parser(
        "compare",
        help="fail when a numeric metric regressed against a baseline report",
        description="Exit 0 within tolerance, 1 regressed or missing, 2 baseline unusable.",
    )
    comp.add_argument("new", type=Path, metavar="NEW.json", help="the new report")
    comp.add_argument("base", type=Path, metavar="BASE.json", help="the baseline report")
    comp.add_argument(
        "--metric", required=True, metavar="PATH", help="JSON pointer to one number, e.g. /summary/tok_s"
    )
    comp.add_argument(
        "--max-regression",
        required=True,
        type=float,
        metavar="PCT",
        help="largest allowed regression, in percent of the baseline value",
    )
    comp.add_argument(
        "--lower-is-better",
        action="store_true",
        help="the metric is a cost (latency, bytes): an increase is a regression",
    )
    comp.add_argument(
        "--samples",
        metavar="PATH",
        help="JSON pointer to per-repeat samples of the metric in both reports: a regression must also be "
        "beyond the noise (one-sided Mann-Whitney U, p < 0.05)",
    )
    comp.add_argument("--json", action="store_true", help="print the comparison as JSON")
    comp.set_defaults(func=run_compare)


def add_pr(gsub: argparse._SubParsersAction) -> None:
    pr = gsub.add_parser(
        "pr",
        help="re-gate the evidence the bus holds for a commit (the pull-request check)",
        description="For each PRESET[@LABEL]: the newest done run on the bus for the subject, "
        "verified to belong to it and re-gated with this registry's checks. Exit 0 all "
        "pass, 1 evidence missing, for another commit or failing, 2 bad requirement.",
    )
    pr.add_argument(
        "--subject",
        default="HEAD",
        metavar="SHA",
        help="the commit (a full sha, or a rev of this repo; default HEAD)",
    )
    add_require(pr)
    pr.add_argument(
        "--summary",
        type=Path,
        metavar="FILE",
        help="append a markdown table to FILE (e.g. $GITHUB_STEP_SUMMARY), keeping it under 1 MiB",
    )
    pr.add_argument(
        "--comment",
        type=Path,
        metavar="FILE",
        help="write the pull request's comment to FILE (markdown, starting with the marker "
        "<!-- kakeya-evidence --> that finds it again): the table, the change against --base, the results",
    )
    pr.add_argument(
        "--base",
        metavar="SHA",
        help="with --comment: compare with the latest trusted run of each requirement on this commit or its "
        "ancestors (the PR's base)",
    )
    pr.add_argument(
        "--link-base",
        metavar="URL",
        help="with --comment: the bus repository's web address, for links to summaries and plots (default: "
        "the bus's own, when it is a github.com repository; plain ids otherwise)",
    )
    pr.add_argument("--json", action="store_true", help="print the outcomes as JSON")
    add_signer_args(pr)
    add_remote(pr)
    pr.set_defaults(func=run_pr)


def _checks_file(path: Path) -> tuple[list[gates.Check], str | None, int | None]:
    try:
        data: Any = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InvalidRequest(f"checks file {path}: cannot read YAML/JSON: {exc}") from None
    kind = version = None
    if isinstance(data, dict):
        unknown = set(data) - {"gate", "report"}
        if unknown or "gate" not in data:
            raise InvalidRequest(
                f"checks file {path}: a mapping needs `gate:` and may have `report:` "
                f"(unexpected: {', '.join(sorted(map(str, unknown))) or 'no gate'})"
            )
        report = data.get("report") or {}
        if not isinstance(report, dict) or set(report) - {"kind", "schema_version"}:
            raise InvalidRequest(f"checks file {path}: `report:` must be {{kind: ..., schema_version: ...}}")
        kind, version, data = report.get("kind"), report.get("schema_version"), data["gate"]
    try:
        return gates.parse_checks(data), kind, version
    except ValueError as exc:
        raise InvalidRequest(f"checks file {path}: {exc}") from None


def _preset_of(report: Path) -> str:
    """The one preset whose report kind is `report`'s kind; InvalidRequest (naming the candidates) otherwise."""
    try:
        kind = gates.load_report(report).get("kind")
    except gates.ReportError as exc:
        raise InvalidRequest(f"{exc}; cannot tell its preset", code="bad-report") from None
    names = sorted(p.name for p in load_registry().values() if p.report.kind == kind)
    if len(names) == 1:
        return names[0]
    which = f"presets {', '.join(names)} all have" if names else "no preset has"
    raise InvalidRequest(
        f"{report}: {which} report kind {kind!r}; give --preset NAME or --checks FILE",
        code="preset-needed",
        candidates=names,
    )


def run_check(args: argparse.Namespace) -> int:
    if args.checks:
        checks, kind, version = _checks_file(args.checks)
    else:
        preset = get_preset(load_registry(), args.preset or _preset_of(args.report))
        checks, kind, version = preset.gate, preset.report.kind, preset.report.schema_version
    verdict = gates.evaluate_file(args.report, checks, kind=kind, schema_version=version)
    print(verdict.model_dump_json() if args.json else verdict.to_markdown())
    return verdict.exit_code()


def run_compare(args: argparse.Namespace) -> int:
    try:
        new, base = gates.load_report(args.new), gates.load_report(args.base)
    except gates.ReportError as exc:
        raise InvalidRequest(str(exc)) from None
    try:
        result = gates.compare(
            new,
            base,
            args.metric,
            args.max_regression,
            higher_is_better=not args.lower_is_better,
            samples=args.samples,
        )
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    print(result.model_dump_json() if args.json else result.to_markdown())
    return result.exit_code()


def run_pr(args: argparse.Namespace) -> int:
    registry = load_registry()
    c = client(args)
    requirements = required(c, args.require, registry)
    subject = subject_sha(c, args.subject)
    try:
        signers = signers_for(c, args.allowed_signers, args.allow_unsigned)
    except InvalidRequest as exc:
        if args.summary:  # the job summary says what to do, not only the job log
            with args.summary.open("a") as fh:
                fh.write(f"**Evidence for `{subject}`: ✗ refused**\n\n{exc}\n")
        if args.comment:
            args.comment.write_text(f"{comment.MARKER}\n**Evidence for `{subject}`: ✗ refused**\n\n{exc}\n")
        raise
    shelf = evidence.DoneResults(c.bus, signers)
    outcomes = evidence.gate_subject(shelf, subject, requirements, registry)
    if args.json:
        print(evidence.evidence_json(outcomes))
    else:
        for o in outcomes:
            print(o.line())
    if args.summary and not evidence.append_summary(args.summary, subject, outcomes):
        print(
            f"kakeya: warning: {args.summary} is already at its 1 MiB limit; nothing appended",
            file=sys.stderr,
        )
    if args.comment:
        base = subject_sha(c, args.base) if args.base else None
        changes = comment.compare_with_base(c.bus, signers, registry, outcomes, base) if base else None
        link = (args.link_base or "").rstrip("/") or comment.github_web(c.url)
        args.comment.write_text(comment.render(subject, outcomes, shelf, changes, base, link))
    return 0 if all(o.passed for o in outcomes) else 1
