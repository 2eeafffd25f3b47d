"""`kakeya serve [FLAGS...]`: the engine behind an OpenAI-compatible HTTP API, i.e. `python -m engine.serve FLAGS`
in this interpreter (docs/serving.md). The bridge never imports the engine: it replaces this process with the
engine's own entry point, after saying in one line what a client-only install lacks."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from bridge.core.errors import InvalidRequest

NEEDS = {"engine": "a checkout of kakeya", "fastapi": "kakeya[serve]", "uvicorn": "kakeya[serve]"}


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "serve",
        help="serve the engine over an OpenAI-compatible HTTP API (python -m engine.serve)",
        description="Every flag goes to `python -m engine.serve` (its --help lists them): --model, --drafter, "
        "--policy, --kv-budget, --host, --port, ...",
        add_help=False,
    )
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="flags of python -m engine.serve")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # find_spec of a top-level name imports nothing
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    engine = [m for m in ("torch", "mlx") if importlib.util.find_spec(m) is not None]
    if missing or not engine:
        what = missing[0] if missing else "torch or mlx"
        raise InvalidRequest(
            f"kakeya serve runs the engine, and this install lacks {what}: from a checkout of kakeya, "
            "pip install -e '.[torch,serve]' (or '.[mlx,serve]')",
            code="missing-extra",
        )
    argv = [sys.executable, "-m", "engine.serve", *args.flags]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, argv)
    return 0  # not reached
