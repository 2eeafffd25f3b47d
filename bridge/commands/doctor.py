"""`kakeya doctor`: check what the bus and a runner need, and say what to fix."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable

from bridge import bus as B
from bridge import git
from bridge.client import default_remote, describe_bus, resolve_remote, state_dir
from bridge.commands._bus import add_remote
from bridge.config import load_config, project_root
from bridge.errors import KakeyaError
from bridge.presets import load_registry

MIN_GIT = (2, 29)  # fetch --no-write-fetch-head / --stdin


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("doctor", help="check git, the bus, presets and the engine; say what to fix")
    add_remote(parser)
    parser.set_defaults(func=run)


def check_git() -> str:
    out = git.version()
    m = re.search(r"(\d+)\.(\d+)", out)
    version = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
    if version < MIN_GIT:
        raise KakeyaError(f"{out.strip()} is too old; install git >= {MIN_GIT[0]}.{MIN_GIT[1]}")
    return out.strip()


def check_engine() -> str:
    proc = subprocess.run(
        [sys.executable, "-c", "import engine, sys; print(engine.__file__)"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise KakeyaError(
            f"`import engine` fails ({last}); a runner needs `pip install 'kakeya[torch]'` "
            "and/or 'kakeya[mlx]' (clients do not)"
        )
    return f"importable from {proc.stdout.strip()}"


def run(args: argparse.Namespace) -> int:
    root = project_root()
    state: dict[str, object] = {}

    def config() -> str:
        state["config"] = cfg = load_config(root)
        return f"runner {cfg.runner_name}, labels {', '.join(cfg.labels)}, lease {cfg.lease_s:g} s"

    def project() -> str:
        if not git.is_repo(root):
            raise KakeyaError(f"{root} is not a git repository; `kakeya request` needs one (git init)")
        return str(root)

    def bus() -> str:
        cfg = state.get("config") or load_config(root)
        remote = default_remote(cfg, root) if args.remote is None else args.remote
        url = resolve_remote(remote, root, cfg)
        store = root if git.is_repo(root) else state_dir(cfg, root)
        try:
            snap = B.Bus(url, store, timeout_s=30).ls_remote()
        except KakeyaError as exc:
            raise KakeyaError(
                f"{exc}; check --remote / KAKEYA_REMOTE / `remote` in kakeya.toml, the network "
                "and your git credentials"
            ) from None
        where = describe_bus(remote, url)
        bad = f"; {len(snap.ignored)} malformed refs under {B.PREFIX}" if snap.ignored else ""
        return f"{where}: {len(snap.entries)} requests readable{bad}"

    def presets() -> str:
        registry = load_registry()
        if not registry:
            raise KakeyaError("no presets found; set KAKEYA_PRESETS to the presets/ directory")
        return f"{len(registry)} valid: {', '.join(sorted(registry))}"

    checks: list[tuple[str, Callable[[], str]]] = [
        ("git", check_git),
        ("config", config),
        ("project", project),
        ("bus", bus),
        ("presets", presets),
        ("engine", check_engine),
    ]
    failed = 0
    for name, check in checks:
        try:
            print(f"ok    {name:<8} {check()}")
        except (KakeyaError, OSError, subprocess.SubprocessError) as exc:
            failed += 1
            print(f"FAIL  {name:<8} {exc}")
    print("all checks passed" if not failed else f"{failed} check(s) failed")
    return 1 if failed else 0
