"""`kakeya doctor [--json]`: check what the bus and a runner need, and say what to fix. --json: one `check` event
per check ({"name", "ok", "detail"}), then a `doctor` event with the count that failed. Exit 0 all passed, 1 not."""

from __future__ import annotations

import argparse
import email.utils
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from bridge.bus import trust
from bridge.bus.bus import Bus
from bridge.bus.presence import read_presences
from bridge.bus.records import PREFIX, RUNNERS_PREFIX, utcnow
from bridge.cli.commands._common import add_json, add_remote, describe_bus, emit
from bridge.client.remote import default_remote, resolve_remote, state_dir
from bridge.config import Config, SlurmLabel, load_config, project_root
from bridge.core.errors import KakeyaError
from bridge.host import check_accelerator, label_needs
from bridge.presets.params import models_dirs
from bridge.presets.registry import load_registry
from bridge.run.isolation import bwrap_available, choose, key_problem, reach_problem, trial, weak_problem
from bridge.run.slurm import Slurm
from bridge.wire import git

MIN_GIT = (2, 29)  # fetch --no-write-fetch-head / --stdin


NEGATIVE_REFSPEC = f"^refs/heads/{PREFIX.removeprefix('refs/heads/')}*"  # ^refs/heads/kakeya/*


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("doctor", help="check git, the bus, presets and the engine; say what to fix")
    add_remote(parser)
    parser.add_argument(
        "--no-bus-fetch",
        action="store_true",
        help=f"make `git fetch` of the bus remote skip the bus branches ({NEGATIVE_REFSPEC}), "
        "for a clone whose owner does not serve or inspect the bus",
    )
    add_json(parser)
    parser.set_defaults(func=run)


def check_models() -> str:
    """The models directory exists (a preset's NAME model is looked up there)."""
    dirs = models_dirs(os.environ)
    found = next((d for d in dirs if d.is_dir()), None)
    if found is None:
        raise KakeyaError(
            f"no models directory ({' or '.join(map(str, dirs))}); create it and copy model directories "
            "into it (docs/runners.md, Models)"
        )
    names = sorted(p.name for p in found.iterdir() if (p / "config.json").is_file())
    return f"{found}: {len(names)} model(s){': ' + ', '.join(names[:8]) if names else ''}"


def check_git() -> str:
    out = git.version()
    m = re.search(r"(\d+)\.(\d+)", out)
    version = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if version < MIN_GIT:
        raise KakeyaError(f"{out.strip()} is too old; install git >= {MIN_GIT[0]}.{MIN_GIT[1]}")
    return out.strip()


# The engine's path, then (where torch is installed) what its torch backend quantizes K/V with on a cpu.
ENGINE_PY = (  # run in a subprocess: bridge never imports engine
    "import importlib\n"
    "print(importlib.import_module('engine').__file__)\n"
    "try:\n"
    "    kernels = importlib.import_module('engine.backends.torch.kv_kernels')\n"
    "except ImportError:\n"
    "    print('')\n"
    "else:\n"
    "    print(kernels.status())\n"
)


# What the engine extras bring (pyproject.toml): their absence is a client-only install, not a broken one.
ENGINE_EXTRAS = ("numpy", "torch", "transformers", "safetensors", "mlx", "mlx_lm", "matplotlib", "tqdm")


class Skip(Exception):  # noqa: N818 - a check's outcome, not an error
    """A check that did not run here (what it needs failed or is absent): its line says `skip` and why."""


def check_engine() -> str:
    proc = subprocess.run([sys.executable, "-c", ENGINE_PY], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        missing = re.fullmatch(r"ModuleNotFoundError: No module named '([\w.]+)'", last)
        if missing and missing[1].split(".")[0] in ENGINE_EXTRAS:  # a client-only install: fine for clients
            raise Skip(
                f"not installed here (no {missing[1]}): presets that run the engine need "
                "`pip install 'kakeya[torch]'` and/or 'kakeya[mlx]'; clients and other presets do not"
            )
        raise KakeyaError(
            f"`import engine` fails ({last}); a runner needs `pip install 'kakeya[torch]'` "
            "and/or 'kakeya[mlx]' (clients do not)"
        )
    path, kernels = [*proc.stdout.strip().splitlines(), ""][:2]
    return f"importable from {path}" + (f"; quantized K/V on a cpu: {kernels}" if kernels else "")


def isolation_in_force(cfg: Config) -> str:
    """Which isolation a run gets here (bridge/run/isolation.py); fails when untrusted labels would lack one."""
    iso = choose(cfg.isolation, cfg.run_user)
    untrusted = [lb for lb in cfg.labels if lb in cfg.untrusted_labels]
    if untrusted and iso.kind == "none":
        raise KakeyaError(
            f"labels {', '.join(untrusted)} are untrusted-subjects but runs have no isolation; "
            "set isolation = auto (KAKEYA_ISOLATION)"
        )
    problem = key_problem(cfg.signing_key or None, iso, os.environ) or weak_problem(cfg.isolation, iso)
    if problem:
        raise KakeyaError(f"a runner would refuse to start: {problem}")
    # a trial run, as the run user in the sandbox runs get (bridge/run/isolation.py's `trial`)
    run_iso = choose(cfg.isolation, cfg.run_user, network_none=True)
    writable = trial(run_iso, os.environ)
    if problem := reach_problem(run_iso, writable):
        raise KakeyaError(f"a runner would refuse to start: {problem}")
    extra = f"; runs of untrusted-subjects labels {', '.join(untrusted)} allowed" if untrusted else ""
    extra += f"; a run can write to what the runner executes: {', '.join(writable)}" if writable else ""
    if sys.platform.startswith("linux") and not bwrap_available():
        extra += "; install bubblewrap (scripts/setup-runner.sh) for the sandbox"
    return f"{iso.describe} (config isolation = {cfg.isolation}){extra}"


def runners_seen(remote: str, url: str, root: Path, store: Path) -> str:
    """Which live runners serve the bus. The embedded one (no remote: .kakeya/bus.git in this clone) is seen
    only by runners started in this project on this host: with none live, a request waits for ever there, so
    say what that means and how to point requesters and runners at a shared bus."""
    bus = Bus(url, store, timeout_s=30)
    signers = trust.trusted_signers(root) if git.is_repo(root) else None
    now = utcnow()
    seen = read_presences(bus, bus.ls_remote(RUNNERS_PREFIX).runners, signers)
    live = [f"{s.name} ({', '.join(s.presence.labels)})" for s in seen if s.presence and s.live(now)]
    names = f"{len(live)} live runner(s): {', '.join(live)}" if live else "no live runner"
    if remote:
        return f"{names} (`kakeya runners` lists them)"
    if live:
        return f"the embedded bus, served by runners of this project on this host: {names}"
    return (
        f"the bus is the embedded one ({url}) and no runner can see it: a `kakeya request` here waits until "
        "a runner started in this project on this host serves it (`kakeya run` runs one in-process). For "
        "runners on other hosts use a shared bus: a git repository every requester and runner can push to "
        '(`remote = "URL"` in kakeya.toml, KAKEYA_REMOTE or the clone\'s origin), with each runner started '
        "as `kakeya runner watch --remote URL` (docs/runners.md)"
    )


def clock_skew(url: str, timeout: float = 10.0) -> str:
    """The remote's clock against this host's, where it can be measured: the HTTP Date header of an http(s)
    bus (1 s resolution, half a round trip of uncertainty). A path, file://, git:// or ssh bus has no clock
    to read. Leases never compare clocks (bridge/run/claims.py), so skew is reported, not failed."""
    if not re.match(r"^https?://", url):
        return "not measurable for this bus (a path, file://, git:// or ssh remote carries no clock)"
    probe = url.rstrip("/") + "/info/refs?service=git-upload-pack"
    sent = time.time()
    try:
        with urllib.request.urlopen(urllib.request.Request(probe, method="HEAD"), timeout=timeout) as resp:
            date = resp.headers.get("Date")
    except urllib.error.HTTPError as exc:  # 401/404 still carry the server's Date
        date = exc.headers.get("Date")
    except (urllib.error.URLError, OSError) as exc:
        return f"not measurable: {probe} did not answer ({getattr(exc, 'reason', exc)})"
    got = time.time()
    if not date:
        return f"not measurable: {probe} sent no Date header"
    remote = email.utils.parsedate_to_datetime(date).timestamp()
    skew = remote + 0.5 - (sent + got) / 2  # Date is truncated to the second: its middle
    uncertainty = 0.5 + (got - sent) / 2
    return (
        f"the bus's clock is {skew:+.0f} s from this host's (HTTP Date, ± {uncertainty:.1f} s); "
        "leases do not depend on it"
    )


class Doctor:
    """The checks of one `kakeya doctor`, in order; what one finds (the config, the bus) the later ones use."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.root = project_root(args.project.expanduser() if args.project else None)
        self.cfg: Config | None = None
        self.url: str | None = None  # set once the bus could be read
        self.remote = ""
        self.store = self.root

    def checks(self) -> list[tuple[str, Callable[[], str]]]:
        return [
            ("git", check_git),
            ("config", self.config),
            ("project", self.project),
            ("bus", self.bus),
            ("runners", self.runners),
            ("push", self.push),
            ("clock", self.clock),
            ("fetch", self.fetch),
            ("presets", self.presets),
            ("signing", self.signing),
            ("isolation", self.isolation),
            ("engine", check_engine),
        ]

    def label_checks(self) -> list[tuple[str, Callable[[], str]]]:
        """What each label promises, checked from here as a runner checks it at its start: a local label's
        accelerator; a Slurm label's hardware is the cluster's, so Slurm itself (squeue, sinfo, sbatch); and
        with any accelerated label, the models directory."""
        if self.cfg is None:
            return []
        out: list[tuple[str, Callable[[], str]]] = []
        accelerated = [lb for lb in self.cfg.labels if label_needs(lb) is not None]
        for label in self.cfg.labels:
            ex = self.cfg.executor_for(label)
            if isinstance(ex, SlurmLabel):
                out.append((label, lambda ex=ex: Slurm().check(ex)))
            elif label in accelerated:
                out.append((label, lambda lb=label: check_accelerator(lb)))
        return out + ([("models", check_models)] if accelerated else [])

    def loaded(self) -> Config:
        return self.cfg or load_config(self.root)

    def config(self) -> str:
        self.cfg = cfg = load_config(self.root)
        return f"runner {cfg.runner_name}, labels {', '.join(cfg.labels)}, lease {cfg.lease_s:g} s"

    def project(self) -> str:
        if not git.is_repo(self.root):
            raise KakeyaError(f"{self.root} is not a git repository; `kakeya request` needs one (git init)")
        return str(self.root)

    def bus(self) -> str:
        cfg, root = self.loaded(), self.root
        remote = default_remote(cfg, root) if self.args.remote is None else self.args.remote
        url = resolve_remote(remote, root, cfg)
        store = root if git.is_repo(root) else state_dir(cfg, root)
        try:
            snap = Bus(url, store, timeout_s=30).ls_remote()
        except KakeyaError as exc:
            raise KakeyaError(
                f"{exc}; check --remote / KAKEYA_REMOTE / `remote` in kakeya.toml, the network "
                "and your git credentials"
            ) from None
        self.url, self.remote, self.store = url, remote, store
        bad = f"; {len(snap.ignored)} malformed refs under {PREFIX}" if snap.ignored else ""
        return f"{describe_bus(remote, url)}: {len(snap.entries)} requests readable{bad}"

    def isolation(self) -> str:
        return isolation_in_force(self.loaded())

    def read_bus(self, skipped: str) -> str:
        """The bus's URL; Skip (saying `skipped`) when the bus check could not read it."""
        if self.url is None:
            raise Skip(f"{skipped}: the bus could not be read")
        return self.url

    def runners(self) -> str:
        return runners_seen(self.remote, self.read_bus("not looked at"), self.root, self.store)

    def clock(self) -> str:
        return clock_skew(self.read_bus("not measured"))

    def push(self) -> str:
        cfg = self.loaded()
        url = self.read_bus("not tried")
        if not git.is_repo(self.root):
            raise KakeyaError(f"{self.root} is not a git repository: nothing to push from")
        ref = f"{PREFIX}doctor/{cfg.runner_name}"
        git.push_dry_run(self.root, url, "HEAD", ref)
        return f"a dry-run push of {ref} was accepted"

    def fetch(self) -> str:
        remote, root = self.remote, self.root
        if not remote or not git.remote_url(root, remote):
            raise Skip("the bus is not a named remote of this clone: `git fetch` does not pull it")
        if self.args.no_bus_fetch:
            git.add_negative_refspec(root, remote, NEGATIVE_REFSPEC)
        if NEGATIVE_REFSPEC in git.fetch_refspecs(root, remote):
            return f"`git fetch {remote}` skips the bus branches ({NEGATIVE_REFSPEC})"
        return (
            f"`git fetch {remote}` also pulls every bus branch; if you do not serve or inspect the bus, "
            "`kakeya doctor --no-bus-fetch` stops that"
        )

    def presets(self) -> str:
        registry = load_registry()
        if not registry:
            raise KakeyaError("no presets found; set KAKEYA_PRESETS to the presets/ directory")
        return f"{len(registry)} valid: {', '.join(sorted(registry))}"

    def signing(self) -> str:
        cfg = self.loaded()
        allowed = trust.trusted_signers(self.root)
        trusted = (
            f"; {trust.ALLOWED_SIGNERS}: {len(allowed.labels)} runner(s)"
            if allowed
            else f"; no {trust.ALLOWED_SIGNERS}: `kakeya gate pr` refuses a shared bus's evidence until it "
            "lists the runners (or --allow-unsigned)"
        )
        key = trust.key_file(cfg.signing_key)
        if key is None:
            return (
                f"no signing_key: results and requests are unsigned (fine for the embedded default){trusted}"
            )
        proc = subprocess.run(["ssh-keygen", "-y", "-f", key], capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise KakeyaError(f"signing key {key} cannot be read by ssh-keygen: {proc.stderr.strip()}")
        line = trust.signers_line(trust.principal(cfg.runner_name, cfg.labels), proc.stdout)
        return f"signs with {key}; its allowed-signers line: {line}{trusted}"


def run(args: argparse.Namespace) -> int:
    doctor = Doctor(args)
    failed = sum(not run_check(name, check, args.json) for name, check in doctor.checks())
    failed += sum(not run_check(name, check, args.json) for name, check in doctor.label_checks())
    if args.json:
        emit({"event": "doctor", "failed": failed, "ok": not failed, "exit_code": 1 if failed else 0})
    else:
        print("all checks passed" if not failed else f"{failed} check(s) failed")
    return 1 if failed else 0


def run_check(name: str, check: Callable[[], str], as_json: bool = False) -> bool:
    """Run one check and print its line, `ok`, `skip` (it did not run here: not a failure) or `FAIL`
    (`as_json`: its `check` event, `skipped` true for a skip); whether it did not fail."""
    skipped = False
    try:
        detail, ok = check(), True
    except Skip as exc:
        detail, ok, skipped = str(exc), True, True
    except (KakeyaError, OSError, subprocess.SubprocessError) as exc:
        detail, ok = str(exc), False
    if as_json:
        emit({"event": "check", "name": name, "ok": ok, "skipped": skipped, "detail": detail})
    else:
        print(f"{'skip' if skipped else 'ok  ' if ok else 'FAIL'}  {name:<8} {detail}")
    return ok
