"""`kakeya mcp [--remote R]`: serve the Model Context Protocol on stdin/stdout (bridge/mcp.py) for an agent's
MCP client (Claude Desktop or Code, Cursor, VS Code: docs/agents.md has the configuration). Run it in the
project (or give --project DIR): the bus, the presets and the subject commit are those `kakeya request` would
use there."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from bridge.commands._common import add_remote
from bridge.errors import InvalidRequest


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "mcp",
        help="serve the Model Context Protocol on stdio, for agents (docs/agents.md)",
        description=__doc__,
    )
    parser.add_argument(
        "--project",
        type=Path,
        metavar="DIR",
        help="the project checkout to serve (default: the working directory; MCP clients such as Claude "
        "Desktop start servers elsewhere)",
    )
    add_remote(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bridge.mcp import serve  # the MCP SDK only when serving

    if args.project is not None:
        if not args.project.expanduser().is_dir():
            raise InvalidRequest(f"--project {args.project}: no such directory")
        os.chdir(args.project.expanduser())
    serve(args.remote)
    return 0
