"""Flags and helpers shared by the commands (request, status, results, wait, cancel, bus, runner, run, exec,
evidence, gate): what a command would otherwise import from another command lives here."""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gates
from bridge.bus.progress import View, clock, progress_line, say
from bridge.bus.records import utcnow
from bridge.bus.trust import ALLOWED_SIGNERS
from bridge.client.client import Client
from bridge.client.follow import Ended, Finished, Follower
from bridge.client.request import LabelChoice
from bridge.client.rows import shown
from bridge.config import Config, load_config, project_root
from bridge.core.errors import Interrupted, InvalidRequest
from bridge.core.result import RunResult, iso_time
from bridge.core.text import clean_json
from bridge.evidence import REQUIRED_FILE
from bridge.results.render import verdict_line

if TYPE_CHECKING:
    from bridge.presets.preset import Preset


def add_preset_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("preset", help="the preset to run (`kakeya presets` lists them)")
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
    add_project(parser)


def add_project(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--project",
        type=Path,
        metavar="DIR",
        help="the project checkout whose bus, presets and commits to use (default: the working directory's)",
    )


def add_require(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--require",
        action="append",
        metavar="'PRESET[@LABEL] [PARAM OP VALUE ...]'",
        help=f"evidence that must pass (repeatable; default: the entries of {REQUIRED_FILE}); without @LABEL "
        "a run on any label counts; pins (operators == >= <= > <; a list parameter's every item must meet "
        ">= <= > <) make a run whose parameters do not meet them no evidence, e.g. "
        "'niah-ladder@h200 contexts>=65536 samples>=5'",
    )


def add_json(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(
        "--json",
        action="store_true",
        help=f"{prefix}JSON on stdout, one object per line (an error too: its `code`), for agents",
    )


def add_output(
    parser: argparse.ArgumentParser, where: str = "write the results into DIR/<id> (default out/<id>)"
) -> None:
    """Where a run's results are written (`--out`: `out_dir`) and what of them is printed (`--summary`)."""
    parser.add_argument("--out", type=Path, metavar="DIR", help=where)
    parser.add_argument(
        "--summary", action="store_true", help="print the whole summary.md, not only the verdict table"
    )


def add_id(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "id", help="the request id, a unique prefix of it (20261125T1615...) or its six-hex suffix (663f0b)"
    )


def engine_ready(preset: Preset) -> None:
    """Refuse, before anything starts, a preset that runs the engine (`{python} -m engine...`) in an install
    without it (a client-only `pip install kakeya`): one line saying which extra to install."""
    module = next((b for a, b in itertools.pairwise(preset.argv) if a == "-m"), "")
    if preset.argv[0] != "{python}" or not module.startswith("engine."):
        return
    lacks = [m for m in ("numpy",) if importlib.util.find_spec(m) is None]
    if not lacks and not any(importlib.util.find_spec(m) for m in ("torch", "mlx")):
        lacks = ["torch or mlx"]
    if lacks:
        raise InvalidRequest(
            f"preset {preset.name} runs the engine ({module}), which this install lacks (no {lacks[0]}): "
            "pip install 'kakeya[torch]' (or 'kakeya[mlx]')",
            code="missing-extra",
        )


def emit(obj: dict[str, Any]) -> None:
    """One JSON object on one line of stdout, its text cleaned (bridge/core/text.py: an agent decodes it)."""
    print(json.dumps(clean_json(obj)), flush=True)


def event(kind: str, request_id: str | None, **fields: Any) -> dict[str, Any]:
    return {"event": kind, "id": request_id, "at": iso_time(utcnow()), **fields}


def config_and_root(args: argparse.Namespace | None = None) -> tuple[Config, Path]:
    """The project (`--project DIR` where the verb has it, else the working directory's) and its config."""
    given = getattr(args, "project", None)
    if given is not None and not given.expanduser().is_dir():
        raise InvalidRequest(f"--project {given}: no such directory", code="not-in-project")
    root = project_root(given.expanduser() if given is not None else None)
    return load_config(root), root


def describe_bus(remote: str, url: str) -> str:
    """Which bus, for the stderr line every bus command prints (credentials in a URL are not shown)."""
    shown = re.sub(r"://[^/@]*@", "://", url)
    if not remote:
        return f"{shown} (embedded)"
    return (
        f"remote {remote} ({shown})" if re.fullmatch(r"[A-Za-z0-9._-]+", remote) and remote != url else shown
    )


def exit_code(result: RunResult) -> int:
    """0 succeeded with a passing (or no) verdict, 2 rejected (invalid request, nothing ran), 1 otherwise."""
    if result.status == "rejected":
        return 2
    return 0 if result.status == "succeeded" and result.verdict in (None, "pass") else 1


_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, unit_required: bool = False) -> float:
    """'90', '90s', '15m', '2h', '7d', or compound, largest unit first: '1h30m', '2d12h', '1m30s' -> seconds
    (`unit_required`: a bare number is refused)."""
    bad = InvalidRequest(
        f"duration {text!r} must look like 90s, 15m, 2h, 7d or 1h30m (a number and a unit, or several, largest first)"
    )
    compact = text.strip().replace(" ", "")
    parts = re.findall(r"(\d+(?:\.\d+)?)([smhd]?)", compact)
    if not parts or "".join(n + u for n, u in parts) != compact:
        raise bad
    units = [u for _, u in parts]
    if len(parts) > 1 and ("" in units or units != sorted(set(units), key=lambda u: -_UNITS[u])):
        raise bad  # every part with its own unit, each unit once, largest first
    total = sum(float(n) * _UNITS[u] for n, u in parts)
    if total <= 0 or (unit_required and not units[-1]):
        raise bad
    return total


def label_note(choice: LabelChoice | None) -> str | None:
    """Which of several runner labels a request took, and why (None: it was given one)."""
    if choice is None:
        return None
    if not choice.live:
        return f"no live runner serves {', '.join(choice.labels)}: queued on {choice.chosen}, the first"
    if choice.chosen != choice.labels[0]:
        skipped = choice.labels[: choice.labels.index(choice.chosen)]
        return f"no live runner serves {', '.join(skipped)}: fell back to {choice.chosen}"
    return f"a live runner serves {choice.chosen}, the first choice"


def unsent_warning(unsent: list[str]) -> str:
    """What a request said when untracked files stayed behind (`Client.unsent`): a runner sees HEAD."""
    return (
        f"kakeya: warning: {len(unsent)} untracked file(s) ({shown(unsent)}) are not sent: a runner "
        "sees HEAD (--allow-dirty sends a snapshot with them)"
    )


def say_bus(remote: str, url: str) -> None:
    """The one stderr line that says which bus a command uses."""
    say(f"kakeya: bus: {describe_bus(remote, url)}")  # a reader that left (EPIPE) fails nothing


def client(args: argparse.Namespace, remote: str | None = None) -> Client:
    config, root = config_and_root(args)
    c = Client(config, root, remote=args.remote if remote is None else remote)
    say_bus(c.remote, c.url)
    return c


def out_dir(root: Path, given: Path | None, request_id: str) -> Path:
    """Where a request's results go: DIR/<id> (default out/<id>), so that two runs never mix."""
    return ((given or root / "out") / request_id).resolve()


def outcome(result: RunResult, out: Path) -> dict[str, Any]:
    """A result as the fields of a `verdict` JSON event: outcome, gate checks, where its files are."""
    try:
        checks = json.loads((out / "verdict.json").read_text())
    except (OSError, ValueError, RecursionError):
        checks = None
    html = out / "report.html"
    return {
        "preset": result.preset,
        "status": result.status,
        "verdict": result.verdict,
        "reason": result.reason,
        "runner": result.runner_name,
        "subject": result.subject,
        "started_at": result.started_at,
        "ended_at": result.ended_at,
        "duration_s": result.duration_s,
        "checks": checks,
        "out": str(out),
        "summary": str(out / "summary.md"),
        "report_html": str(html) if html.is_file() else None,
        "plots": [str(p) for p in sorted(out.rglob("*.png"))],
        "exit_code": exit_code(result),
    }


def report(
    request_id: str | None, result: RunResult, out: Path, *, as_json: bool = False, summary: bool = False
) -> int:
    """Print the verdict line, the gate table, where the plots and the summary are (`summary`: the whole
    summary.md too), or with `as_json` the `verdict` event; the exit code of the outcome."""
    if as_json:
        emit(event("verdict", request_id, **outcome(result, out)))
        return exit_code(result)
    print(verdict_line(request_id or "exec", result))
    try:
        if summary:
            print((out / "summary.md").read_text().rstrip())
        else:
            print(
                gates.Verdict.model_validate_json((out / "verdict.json").read_text()).to_markdown().rstrip()
            )
    except (OSError, ValueError):
        pass  # no verdict (the run did not get that far) or an unreadable one: the line above says why
    for png in sorted(out.rglob("*.png")):
        print(f"plot: {png}")
    if (out / "report.html").is_file():
        print(f"report: {out / 'report.html'}")
    print(f"summary: {out / 'summary.md'}")
    return exit_code(result)


def add_signer_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allowed-signers",
        type=Path,
        metavar="FILE",
        help=f"accept only done commits signed by these runners (default: {ALLOWED_SIGNERS} of this "
        "checkout, the trusted base, when it exists; without one, a shared bus is refused unless "
        "--allow-unsigned)",
    )
    parser.add_argument(
        "--allow-unsigned",
        action="store_true",
        help="with no allowed-signers file, accept unsigned evidence on a shared bus (anyone with push "
        "access could forge it); the embedded bus never needs keys",
    )


def add_wait_args(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument(
        "--timeout", type=float, metavar="S", help=f"{prefix}give up (exit 4) after S seconds"
    )
    parser.add_argument(
        "--no-runner-timeout",
        type=float,
        metavar="S",
        help=f"{prefix}give up (exit 3) when no live runner has served the label for S seconds",
    )
    add_json(parser)


def follow(c: Client, request_id: str, args: argparse.Namespace) -> int:
    """Show the request's changes until it is done, then its results; the exit code of the outcome."""
    view = View(line)  # one bar on a terminal, plain lines elsewhere (bridge/bus/progress.py)
    say = emit if args.json else view.show
    follower = Follower(c, request_id, timeout=args.timeout, no_runner_timeout=args.no_runner_timeout)
    try:
        done = None
        for event in follower.events():
            if isinstance(event, Ended):  # cancelled or expired before any runner claimed it: no results
                say(event.model_copy(update={"exit_code": 1}).dump())
                return 1
            say(event.dump())
            done = event.done if isinstance(event, Finished) else None
    except KeyboardInterrupt:  # (with --json, main prints it as an `interrupted` error object too)
        raise Interrupted(
            f"stopped waiting; {request_id} goes on (`kakeya wait {request_id}` to follow it again, "
            f"`kakeya cancel {request_id}` to cancel it)"
        ) from None
    finally:
        view.close()
    out = out_dir(c.root, args.out, request_id)
    result = c.results(request_id, out, done)
    return report(request_id, result, out, as_json=args.json, summary=getattr(args, "summary", False))


def line(e: dict[str, Any]) -> str:
    """One event in words, for a person."""
    at = e["at"][11:19]
    kind = e["event"]
    if kind == "queued" and "position" in e:  # not claimed yet (claimed, a scheduler's queue: below)
        where = f"position {e['position']} in the {e['label']} queue" + (
            f", {e['ahead']} running" if e["ahead"] else ""
        )
        who = f"live runners: {', '.join(e['runners'])}" if e["runners"] else "no live runner"
        line = f"queued: {where}; {who}"
    elif kind == "no-runner":
        seen = f" (seen: {', '.join(e['seen'])})" if e["seen"] else ""
        line = (
            f"no live runner serves label {e['label']!r}{seen}; still waiting "
            f"({clock(e['waited_s'])}); `kakeya runners` lists runners"
        )
    elif kind == "claimed":
        took = f", taking over from {e['takeover_of']}" if e["takeover_of"] else ""
        line = f"claimed by {e['runner']} on {e['host']} at {e['claimed_at'][11:19]}{took}"
    elif kind in ("running", "gating", "queued"):
        line = progress_line(e)
    elif kind == "stale":
        line = (
            f"the lease of {e['runner']} ran out at {e['lease_until'][11:19]}: it may have died; "
            "another runner may take the request over"
        )
    elif kind == "cancelling":
        line = "cancel requested: the runner is stopping the run"
    elif kind == "finished":
        line = f"done: {e['done'][:12]}"
    elif kind == "cancelled":
        line = "cancelled before any runner claimed it: nothing ran"
    elif kind == "expired":
        line = f"expired at {e['expires_at'][11:19]} before any runner claimed it: nothing ran"
    else:
        line = kind
    return f"{at} {line}"
