"""`kakeya exec PRESET [-p name=value ...] [--out DIR]`: run a preset on this working tree, no git involved.

Exit 0 succeeded, 1 anything else (failed, timed-out, error), 2 invalid request (nothing ran).
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

from bridge.commands._bus import add_preset_args, config_and_root
from bridge.execute import execute
from bridge.presets import get_preset, load_registry, parse_assignments


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("exec", help="run a preset against the current working tree (no bus)")
    add_preset_args(parser)
    parser.add_argument("--out", type=Path, help="output directory (default: out/exec/<time>-<preset>)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    preset = get_preset(load_registry(), args.preset)
    values = preset.validate_params(parse_assignments(args.param))
    config, root = config_and_root()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = (args.out or root / "out" / "exec" / f"{stamp}-{preset.name}").resolve()
    result = execute(preset, values, root, out, config=config)
    print((out / "summary.md").read_text())
    verdict = f", verdict {result.verdict}" if result.verdict else ""
    print(f"{preset.name}: {result.status}{verdict} — results in {out}")
    return 0 if result.status == "succeeded" else 1
