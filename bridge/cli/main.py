"""`kakeya ...`: one small module per subcommand under bridge/cli/commands/, dispatched from here.

Each command module has `register(subparsers)` which adds its parser and sets `func(args) -> int`.
A KakeyaError becomes one line on stderr and its exit code; with `--json` also its JSON object on stdout
(`{"event": "error", "code": ..., "message": ..., "hint": ...}`, bridge/core/errors.py), usage errors included.
Every verb's --help ends with an example (EXAMPLES) and `kakeya --help` lists the exit codes.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from collections.abc import Iterator, Sequence
from typing import NoReturn

from bridge.core.errors import EXIT_CODES, Interrupted, KakeyaError, UsageError
from bridge.core.text import CleanStream

# Command modules, in the order `kakeya --help` lists them.
COMMANDS = [
    "presets",
    "exec",
    "gate",
    "evidence",
    "history",
    "bisect",
    "request",
    "status",
    "results",
    "wait",
    "logs",
    "cancel",
    "run",
    "runner",
    "runners",
    "bus",
    "doctor",
    "mcp",
    "serve",
    "verify",
]

# The example each verb's --help ends with (a verb whose module sets its own epilog keeps it).
EXAMPLES = {
    "presets": "kakeya presets show niah-smoke --json",
    "exec": "kakeya exec probe -p repeat=2 --json",
    "gate": "kakeya gate check out/ID/report.json --json",
    "runner": "kakeya runner watch --labels cpu",
    "bus": "kakeya bus gc --older-than 30 --dry-run",
    "gate check": "kakeya gate check out/ID/report.json            # the preset from the report's kind",
    "gate compare": "kakeya gate compare new.json base.json --metric /summary/tok_s --max-regression 5",
    "gate pr": "kakeya gate pr --subject HEAD --require 'niah-smoke@cpu' --json",
    "request": "kakeya request niah-smoke --runner cpu -p samples=2 --wait --json",
    "status": "kakeya status 20261125T1615        # a unique prefix of an id (or its six-hex suffix)",
    "results": "kakeya results 663f0b --out results/   # writes results/<id>/",
    "wait": "kakeya wait 663f0b --timeout 600 --json   # exit 4 on timeout",
    "logs": "kakeya logs 663f0b -f        # live while it runs, then the final logs",
    "serve": "kakeya serve --model zoo:tiny-hybrid --drafter block:zoo:tiny-block-drafter --port 8000",
    "cancel": "kakeya cancel 663f0b --reason 'wrong commit'",
    "run": "kakeya run probe --json",
    "runner once": "kakeya runner once --labels cpu",
    "runner watch": "kakeya runner watch --labels cpu,h200 --poll 5",
    "runners": "kakeya runners --all --json",
    "bus gc": "kakeya bus gc --older-than 30 --dry-run --json",
    "bus compact": "kakeya bus compact --older-than 3 --json",
    "bus migrate": "kakeya bus migrate --dry-run",
    "doctor": "kakeya doctor --json",
    "verify": "kakeya verify results/ID/attestation.json --json",
    "mcp": "kakeya mcp",
    "evidence": "kakeya evidence HEAD --request-missing --wait --json",
}


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error raised as UsageError (so that `--json` gets it as JSON too)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        raise UsageError(f"{self.prog}: {message}", hint=f"`{self.prog} --help` shows the usage")


def package_version() -> str:
    import importlib.metadata  # only for --version: its import is a tenth of a second

    try:
        return importlib.metadata.version("kakeya")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


class Version(argparse.Action):
    """--version: the package's version, looked up only when asked for."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        print(f"kakeya {package_version()}")
        parser.exit()


def verbs(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """Every verb's parser, with its path (`gate check`), depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"{path} {name}".strip(), sub
                yield from verbs(sub, f"{path} {name}".strip())


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of command `only` (what one `kakeya VERB ...` needs: a command module
    imports what it uses, so `kakeya gate pr` never imports the runner)."""
    parser = Parser(
        prog="kakeya",
        description="Request hardware runs through git; gate the evidence.",
        epilog=f"exit codes: {EXIT_CODES}.\n\nexample:\n  kakeya run probe --json",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action=Version, nargs=0, default=argparse.SUPPRESS, help="show the version"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS if only is None else [only]:
        importlib.import_module(f"bridge.cli.commands.{name.replace('-', '_')}").register(sub)
    for path, verb in verbs(parser):
        if verb.epilog is None and path in EXAMPLES:
            verb.epilog = f"example:\n  {EXAMPLES[path]}"
            verb.formatter_class = argparse.RawDescriptionHelpFormatter
    return parser


def fail(exc: KakeyaError, as_json: bool) -> int:
    """The error as one line on stderr, and with `as_json` as its JSON object on stdout; its exit code."""
    if as_json:
        print(json.dumps(exc.as_json()), flush=True)
    print(f"kakeya: {'' if isinstance(exc, Interrupted) else 'error: '}{exc}", file=sys.stderr)
    return exc.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Everything it prints passes bridge/core/text.py's `clean`: a run's text and the bus's are
    hostile, and no escape sequence of theirs reaches a terminal (nor one of an error message quoting them)."""
    if isinstance(sys.stdout, CleanStream):
        return command(argv)
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = CleanStream(sys.stdout), CleanStream(sys.stderr)
    try:
        return command(argv)
    finally:
        sys.stdout, sys.stderr = streams


def command(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    verb = next((a for a in argv if not a.startswith("-")), None)  # the top level takes no option value
    parser = build_parser(verb if verb in COMMANDS else None)
    try:
        if verb == "serve":  # every flag after it is python -m engine.serve's, --help included
            run = importlib.import_module("bridge.cli.commands.serve").run
            args = argparse.Namespace(func=run, flags=argv[argv.index("serve") + 1 :])
        else:
            args = parser.parse_args(argv)
    except UsageError as exc:
        return fail(exc, "--json" in argv)
    as_json = bool(getattr(args, "json", False))
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a reader that left (EPIPE) is caught below
        return code
    except KakeyaError as exc:
        return fail(exc, as_json)
    except KeyboardInterrupt:
        if as_json:
            print(json.dumps(Interrupted("interrupted").as_json()), flush=True)
        print("kakeya: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kakeya status | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
