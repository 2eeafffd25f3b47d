"""`kakeya ...`: one small module per subcommand under bridge/commands/, dispatched from here.

Each command module has `register(subparsers)` which adds its parser and sets `func(args) -> int`.
A KakeyaError becomes one line on stderr and its exit code.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import os
import sys

from bridge.errors import Interrupted, KakeyaError

# Command modules, in the order `kakeya --help` lists them.
COMMANDS = [
    "presets",
    "exec",
    "gate",
    "request",
    "status",
    "results",
    "wait",
    "cancel",
    "run",
    "runner",
    "runners",
    "bus",
    "doctor",
    "verify",
]


def package_version() -> str:
    try:
        return importlib.metadata.version("kakeya")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kakeya", description="Request hardware runs through git; gate the evidence."
    )
    parser.add_argument("--version", action="version", version=f"kakeya {package_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"bridge.commands.{name.replace('-', '_')}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # here, where a reader that left (EPIPE) is caught below
        return code
    except KakeyaError as exc:
        print(f"kakeya: {'' if isinstance(exc, Interrupted) else 'error: '}{exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("kakeya: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kakeya status | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
