"""`kakeya mcp [--project DIR] [--remote R]`: serve the Model Context Protocol on stdin/stdout (bridge/cli/mcp.py)
for an agent's MCP client (Claude Desktop or Code, Cursor, VS Code: docs/agents.md has the configuration).
Give --project DIR (MCP clients start servers in a directory of their own) or run it in the project: the bus,
the presets and the subject commit are those `kakeya request` would use there. Outside a git project it
refuses to start. The MCP SDK is the extra `kakeya[mcp]`."""

from __future__ import annotations

import argparse
import importlib.util

from bridge.cli.commands._common import add_remote, config_and_root
from bridge.client.remote import not_in_project
from bridge.core.errors import KakeyaError
from bridge.wire import git

INSTALL = "the MCP server needs the MCP SDK: pip install 'kakeya[mcp]'"


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "mcp",
        help="serve the Model Context Protocol on stdio, for agents (docs/agents.md)",
        description=__doc__,
    )
    add_remote(parser)  # and --project DIR
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    _, root = config_and_root(args)
    if not git.is_repo(root):
        raise not_in_project(root)
    if importlib.util.find_spec("mcp") is None:
        raise KakeyaError(INSTALL, code="missing-extra", hint="pip install 'kakeya[mcp]'")
    from bridge.cli.mcp import serve

    serve(args.remote, root)
    return 0
