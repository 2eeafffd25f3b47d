"""`kakeya run PRESET [-p k=v ...] [--runner LABEL] [--out DIR]`: request + in-process runner + wait.

The request goes to the embedded local bus (.kakeya/bus.git) unless --remote names another; a dirty
working tree is sent as a snapshot. Prints the verdict line, the gate table and where the results are
(--summary: the whole summary.md; --json: a `requested` event, then the `verdict` event); exit 0 pass,
1 fail (or any other outcome), 2 invalid (nothing ran). Where a runner would refuse to serve (isolation auto found
no bubblewrap and no run user; a root runner under none or userns) it refuses too, before any request. Ctrl-C (or SIGTERM) kills the run, which
still ends in a done commit (git helpers are in process groups of their own and never see the signal),
then exits 130 with one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from bridge.cli.commands._common import (
    add_json,
    add_output,
    add_preset_args,
    add_remote,
    config_and_root,
    emit,
    engine_ready,
    event,
    out_dir,
    report,
    say_bus,
)
from bridge.client.client import Client
from bridge.client.remote import state_dir
from bridge.core.errors import Interrupted, InvalidRequest, KakeyaError
from bridge.presets.params import parse_assignments
from bridge.presets.registry import get_preset, load_registry
from bridge.run.isolation import choose, key_problem, weak_problem
from bridge.run.runner import Runner


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "run", help="run a preset through the bus on this machine (request + runner + wait)"
    )
    add_preset_args(parser)
    parser.add_argument(
        "--runner",
        metavar="LABEL",
        help="runner label (default: the first of this host's labels the preset allows)",
    )
    add_output(parser)
    add_json(parser)
    add_remote(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    config, root = config_and_root(args)
    registry = load_registry()
    preset = get_preset(registry, args.preset)
    engine_ready(preset)  # the run happens here: refuse before a request is made
    label = args.runner or next((lb for lb in config.labels if preset.allows(lb)), None)
    if label is None:
        raise InvalidRequest(
            f"preset {preset.name} runs on {', '.join(preset.runners)}; this host serves "
            f"{', '.join(config.labels)} (set --runner or KAKEYA_LABELS)"
        )
    iso = choose(config.isolation, config.run_user)
    if problem := weak_problem(config.isolation, iso):  # as a runner refuses to serve: before any request
        raise KakeyaError(f"refusing to run: {problem}")
    client = Client(config, root, remote=args.remote or "")
    say_bus(client.remote, client.url)
    manifest = client.request(
        preset.name, parse_assignments(args.param), label, allow_dirty=True, registry=registry
    )
    if args.json:
        emit(event("requested", manifest.id, preset=preset.name, label=label))
    if problem := key_problem(config.signing_key or None, iso, os.environ):
        # The request is this user's own, from this working tree: run it, unsigned, rather than refuse.
        print(f"kakeya: the result is not signed: {problem}", file=sys.stderr)
        config = config.model_copy(update={"signing_key": ""})
    runner = Runner(
        client.url,
        config=config,
        name=config.runner_name,
        labels=[label],
        registry=registry,
        workdir=state_dir(config, root) / "runners" / config.runner_name,
    )
    previous = {
        sig: signal.signal(sig, lambda s, _f: runner.abort(f"interrupted by {signal.Signals(s).name}"))
        for sig in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        served = runner.once(request_id=manifest.id)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if runner.stopping.is_set() and (served is None or served.status == "released"):
        raise Interrupted(
            f"{runner.abort_reason}: request {manifest.id} was not run and stays on the bus "
            f"(`kakeya cancel {manifest.id}`)"
        )
    done = served.done if served and served.pushed else client.wait(manifest.id)
    out = out_dir(root, args.out, manifest.id)
    result = client.results(manifest.id, out, done)
    code = report(manifest.id, result, out, as_json=args.json, summary=args.summary)
    if runner.abort_reason:  # Ctrl-C / SIGTERM: the run was ended and recorded in its done commit
        raise Interrupted(
            f"{runner.abort_reason}: request {manifest.id} ended in its done commit {done[:12]}"
        )
    return code
