"""`kakeya runner once [--request ID] [--json]` and `kakeya runner watch [--poll S]`: serve requests from the bus.

once claims one pending request for the runner's labels (or the one named) and executes it; watch
does so in a loop, backing off while the bus fails. On a Slurm label (config `executors`) each request is a
Slurm job (bridge/run/slurm_runner.py): once submits one and follows it to its done commit; watch holds up to
max_in_flight, and after a first stop signal follows those to their done commits, a second one scancels them
(each still ends in a done commit saying so). SIGTERM/SIGINT: take no new request, finish the
current one (a claim whose run has not started is released); a second signal, or the end of
`stop_grace_s` (KAKEYA_STOP_GRACE) after the first, kills the run, which still ends in a done commit.
git helpers run in process groups of their own, so a Ctrl-C reaches only kakeya. Exit 130 after SIGINT
(one line on stderr), 0 after SIGTERM (a service stop).

once --json prints what it did as one JSON object on a line (`served_json`, or `{"event": "idle", ...}`),
what the Actions job script (.github/scripts/runner-job.sh) reads.

A label means hardware: a runner refuses to start with a label whose accelerator this host lacks (the check
`kakeya doctor` makes per label, bridge/host.py) unless `--force-labels`, and then every result names the
forced labels.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from bridge.bus.progress import say
from bridge.cli.commands._common import add_remote, config_and_root, say_bus
from bridge.client.remote import default_remote, resolve_remote, state_dir
from bridge.config import Config, SlurmLabel
from bridge.core.errors import Interrupted, InvalidRequest, KakeyaError
from bridge.results.render import outcome_words
from bridge.run.isolation import (
    choose,
    describe_protection,
    reach_problem,
    runner_paths,
    trial,
    weak_problem,
)
from bridge.run.runner import Runner, Served
from bridge.run.slurm import SlurmExecutor
from bridge.run.slurm_runner import SlurmRunner


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("runner", help="serve requests from the bus on this host")
    modes = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
    for mode, help_ in (
        ("once", "claim and run one pending request, then exit"),
        ("watch", "claim and run requests until stopped"),
    ):
        p = modes.add_parser(mode, help=help_)
        p.add_argument(
            "--labels", metavar="L1,L2", help="labels this runner serves (default: config / KAKEYA_LABELS)"
        )
        p.add_argument("--name", help="runner name (default: config / KAKEYA_RUNNER_NAME / hostname)")
        p.add_argument(
            "--force-labels",
            action="store_true",
            help="serve labels whose accelerator this host lacks (refused otherwise; every result then "
            "names the forced labels, and presets gate the device their reports ran on)",
        )
        add_remote(p)
        p.add_argument(
            "--workdir", type=Path, help="mirror and run directories (default .kakeya/runners/<name>)"
        )
        p.add_argument(
            "--lease", type=float, metavar="S", help="claim lease in seconds (default: config lease_s)"
        )
        p.add_argument(
            "--poll", type=float, metavar="S", help="poll interval (default: config poll_interval_s)"
        )
        if mode == "once":
            p.add_argument(
                "--request", metavar="ID", help="serve this request (it must be for one of our labels)"
            )
            p.add_argument(
                "--json",
                action="store_true",
                help="print what it did as one JSON object: {event: served, id, state, verdict, done, "
                "pushed} or {event: idle, request, labels}",
            )
        p.set_defaults(func=run)


def make_runner(args: argparse.Namespace, config: Config, root: Path, url: str, labels: list[str]) -> Runner:
    name = args.name or config.runner_name
    workdir = args.workdir or state_dir(config, root) / "runners" / name
    protection = isolation_at_start(config, labels, trial_run=args.mode == "watch")
    runner = Runner(
        url, config=config, name=name, labels=labels, workdir=workdir, force_labels=args.force_labels
    )
    if protection:
        runner.log(protection)
    if runner.forced_labels:
        runner.log(
            f"warning: serving {', '.join(runner.forced_labels)} without the hardware (--force-labels); "
            "every result says so"
        )
    return runner


def isolation_at_start(config: Config, labels: list[str], trial_run: bool) -> str | None:
    """What a runner says at its start of the isolation its local runs get (None: it runs none here); refuses
    (KakeyaError) where `auto` found only a weak one, where runs under none/userns (this runner's own user)
    could write what the runner executes, and, with `trial_run`, where a trial run cannot start the runner's
    Python or could write to what the runner executes."""
    if all(isinstance(config.executor_for(lb), SlurmLabel) for lb in labels):
        return None  # the nodes choose (bridge/run/slurm_job.py)
    iso = choose(config.isolation, config.run_user, network_none=True)
    if problem := weak_problem(config.isolation, iso):
        raise KakeyaError(f"refusing to serve: {problem}")
    if iso.kind in ("none", "userns"):  # runs are this runner's own user: what it may write, they may
        mine = [p for p in runner_paths() if os.access(p, os.W_OK)]
        if problem := reach_problem(iso, mine):
            raise KakeyaError(f"refusing to serve: {problem}")
    line = describe_protection(iso)
    if trial_run:
        writable = trial(iso, os.environ)
        if problem := reach_problem(iso, writable):
            raise KakeyaError(f"refusing to serve: {problem}")
        if writable:  # the test suite's root runs alone (`reach_problem`)
            line += f"; a run can write to what the runner executes ({', '.join(writable)})"
    return line


def slurm_runner(args: argparse.Namespace, config: Config, root: Path, runner: Runner) -> SlurmRunner | None:
    """A SlurmRunner when the runner's label is a Slurm label in the config (`executors`); None otherwise."""
    slurm = [(lb, ex) for lb in runner.labels if isinstance(ex := config.executor_for(lb), SlurmLabel)]
    if not slurm:
        return None
    if len(runner.labels) != 1:
        raise InvalidRequest(
            f"label {slurm[0][0]} runs as Slurm jobs: serve it with `kakeya runner watch --labels {slurm[0][0]}` "
            "(one Slurm label per runner)"
        )
    label, executor = slurm[0]
    # the jobs' files (control, out, checkout) on the filesystem the nodes share, found by any runner
    jobs_dir = state_dir(config, root) / "slurm-jobs"
    return SlurmRunner(runner, label, SlurmExecutor(executor, config), jobs_dir)


def handle_signals(runner: Runner, grace_s: float | None = None) -> dict[int, Any]:
    """First SIGTERM/SIGINT: stop after the current request (after `grace_s`, end it: it still ends in a done
    commit). Second: end the current run now. Returns the handlers it replaced."""

    def handler(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        runner.signalled = runner.signalled or name
        if runner.stopping.is_set():
            runner.abort(f"runner {runner.name} stopped by {name} during the run")
            return
        runner.stop(name)
        if grace_s is not None:
            timer = threading.Timer(
                grace_s,
                runner.abort,
                (f"runner {runner.name} stopped by {name}; the run ended after {grace_s:g} s",),
            )
            timer.daemon = True
            timer.start()

    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}


def served_json(served: Served) -> str:
    """What `runner once --json` prints for a request it served (or released): one line, for job scripts."""
    return json.dumps(
        {
            "event": "served",
            "id": served.id,
            "state": served.status,
            "verdict": served.verdict,
            "done": served.done,
            "pushed": served.pushed,
            "reason": served.reason,
        }
    )


def run(args: argparse.Namespace) -> int:
    config, root = config_and_root(args)
    updates = {k: v for k, v in (("lease_s", args.lease), ("poll_interval_s", args.poll)) if v is not None}
    config = Config.model_validate({**config.model_dump(), **updates})
    labels = [s.strip() for s in args.labels.split(",") if s.strip()] if args.labels else config.labels
    remote = default_remote(config, root) if args.remote is None else args.remote
    url = resolve_remote(remote, root, config)
    say_bus(remote, url)
    runner = make_runner(args, config, root, url, labels)
    scheduled = slurm_runner(args, config, root, runner)
    previous = handle_signals(runner, config.stop_grace_s)
    if scheduled is None and args.mode == "once":  # presence only once it serves: an idle `once` pushes none
        runner.presence_when_serving = True
    else:  # kakeya/runners/<name>: `kakeya runners`, and `kakeya wait` knows we are here
        runner.start_presence()
    try:
        if scheduled is not None:
            served = scheduled.watch() if args.mode == "watch" else scheduled.once(request_id=args.request)
        elif args.mode == "watch":
            runner.watch()
            served = None
        else:
            served = runner.once(request_id=args.request)
    finally:
        runner.stop_presence()
        for sig, old in previous.items():
            signal.signal(sig, old)
    as_json = getattr(args, "json", False)
    if served is not None:  # `say`: a reader that left (EPIPE) changes nothing of what was served
        say(
            served_json(served)
            if as_json
            else f"{served.id}: {outcome_words(served.status, served.verdict)}"
            + ("" if served.pushed else " (result not pushed)"),
            sys.stdout,
        )
    if runner.signalled == "SIGINT":  # Ctrl-C: one line, exit 130 (a service stop by SIGTERM exits 0)
        what = f"request {served.id} ended {served.status}" if served else "no request was left half-done"
        raise Interrupted(f"interrupted by SIGINT: runner {runner.name} stopped; {what}")
    if args.mode == "watch":
        return 0
    if served is None:
        what = args.request or f"labels {', '.join(runner.labels)}"
        message = f"nothing to do for {what} (no pending request, or it is done or held by a live lease)"
        say(
            json.dumps(
                {"event": "idle", "request": args.request, "labels": runner.labels, "message": message}
            )
            if as_json
            else message,
            sys.stdout,
        )
        return 0
    return 0 if served.pushed or served.status == "released" else 1
