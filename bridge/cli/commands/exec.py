"""`kakeya exec PRESET [-p name=value ...] [--out DIR] [--summary] [--json]`: run a preset on this working tree,
no git involved. Prints the verdict line and the gate table (--summary: the whole summary.md; --json: one
`verdict` event). Exit 0 succeeded with a passing (or no) verdict, 1 anything else (a failing verdict, failed,
timed-out, error), 2 invalid request (nothing ran). It refuses to run where a runner would refuse to serve
(isolation auto found no bubblewrap and no run user; root under none or userns): name the isolation.
"""

from __future__ import annotations

import argparse
import datetime as dt

from bridge.cli.commands._common import (
    add_json,
    add_output,
    add_preset_args,
    config_and_root,
    engine_ready,
    report,
)
from bridge.core.errors import KakeyaError
from bridge.presets.params import parse_assignments
from bridge.presets.registry import get_preset, load_registry
from bridge.run.execute import execute
from bridge.run.isolation import choose, weak_problem


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("exec", help="run a preset against the current working tree (no bus)")
    add_preset_args(parser)
    add_output(parser, "output directory (default: out/exec/<time>-<preset>)")
    add_json(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    preset = get_preset(load_registry(), args.preset)
    values = preset.validate_params(parse_assignments(args.param))
    engine_ready(preset)
    config, root = config_and_root()
    iso = choose(config.isolation, config.run_user)
    if problem := weak_problem(config.isolation, iso):  # as a runner refuses to serve
        raise KakeyaError(f"refusing to run: {problem}")
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = (args.out or root / "out" / "exec" / f"{stamp}-{preset.name}").resolve()
    result = execute(preset, values, root, out, config=config)
    return report(None, result, out, as_json=args.json, summary=args.summary)
