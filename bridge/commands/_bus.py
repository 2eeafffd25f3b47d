"""Flags and helpers shared by the commands (request, status, results, wait, cancel, bus, runner, run, exec)."""

from __future__ import annotations

import argparse
from pathlib import Path

import gates
from bridge.client import Client, describe_bus, exit_code
from bridge.config import Config, load_config, project_root
from bridge.progress import say
from bridge.render import verdict_line
from bridge.result import RunResult


def add_preset_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset")
    parser.add_argument(
        "-p", "--param", action="append", metavar="NAME=VALUE", help="a preset parameter (repeatable)"
    )


def add_remote(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--remote",
        metavar="NAME|URL",
        help="the bus: a git remote name, URL or path (default: config / KAKEYA_REMOTE, else the "
        "clone's origin, else the embedded .kakeya/bus.git)",
    )


def config_and_root() -> tuple[Config, Path]:
    root = project_root()
    return load_config(root), root


def say_bus(remote: str, url: str) -> None:
    """The one stderr line that says which bus a command uses."""
    say(f"kakeya: bus: {describe_bus(remote, url)}")  # a reader that left (EPIPE) fails nothing


def client(args: argparse.Namespace, remote: str | None = None) -> Client:
    config, root = config_and_root()
    c = Client(config, root, remote=args.remote if remote is None else remote)
    say_bus(c.remote, c.url)
    return c


def out_dir(root: Path, given: Path | None, request_id: str) -> Path:
    return (given or root / "out" / request_id).resolve()


def report(request_id: str, result: RunResult, out: Path) -> int:
    """Print the verdict line, the gate table, where the plots and the summary are; the exit code of the outcome."""
    print(verdict_line(request_id, result))
    try:
        print(gates.Verdict.model_validate_json((out / "verdict.json").read_text()).to_markdown().rstrip())
    except (OSError, ValueError):
        pass  # no verdict (the run did not get that far) or an unreadable one: the line above says why
    for png in sorted(out.rglob("*.png")):
        print(f"plot: {png}")
    if (out / "report.html").is_file():
        print(f"report: {out / 'report.html'}")
    print(f"summary: {out / 'summary.md'}")
    return exit_code(result)
