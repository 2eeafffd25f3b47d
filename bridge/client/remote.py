"""Which bus a client (or a runner, or `kakeya doctor`) talks to: the configured remote, else the clone's
origin, else the embedded .kakeya/bus.git under the state directory.

    remote = default_remote(config, root)            # 'origin', a URL from kakeya.toml, or '' (embedded)
    url = resolve_remote(remote, root, config)       # a URL or an absolute path; the embedded bus is made
"""

from __future__ import annotations

import re
from pathlib import Path

from bridge.bus.bus import is_local_path
from bridge.config import Config
from bridge.core.errors import InvalidRequest
from bridge.wire import git


def state_dir(config: Config, root: Path) -> Path:
    """The state directory (default <project>/.kakeya), created with a .gitignore that ignores all of it."""
    path = Path(config.state_dir).expanduser() if config.state_dir else root / ".kakeya"
    path = path if path.is_absolute() else (root / path)
    path.mkdir(parents=True, exist_ok=True)
    ignore = path / ".gitignore"
    if not ignore.exists():
        ignore.write_text(
            "# kakeya state: the embedded bus, runner mirrors and run directories; never committed\n*\n"
        )
    return path


DEFAULT_REMOTE = "origin"  # inside a clone with no configured remote, the bus is the clone's own remote


def default_remote(config: Config, root: Path) -> str:
    """The bus when no --remote is given: the configured remote (kakeya.toml / KAKEYA_REMOTE), else the
    clone's `origin`, else '' (the embedded .kakeya/bus.git: for `kakeya run` and clones with no remote)."""
    if config.remote:
        return config.remote
    if git.is_repo(root) and git.remote_url(root, DEFAULT_REMOTE) is not None:
        return DEFAULT_REMOTE
    return ""


def resolve_remote(remote: str, root: Path, config: Config) -> str:
    """A git remote name of the project, a URL, a path, or '' for the embedded bus (.kakeya/bus.git).
    A bare name that is neither a remote of the project nor an existing path is refused (InvalidRequest)."""
    if not remote:
        return str(git.init_bare(state_dir(config, root) / "bus.git"))
    if re.fullmatch(r"[A-Za-z0-9._-]+", remote):
        named = git.remote_url(root, remote) if git.is_repo(root) else None
        if named is not None:
            return named
        if not remote.endswith(".git") and not Path(remote).expanduser().exists():
            known = git.remote_names(root) if git.is_repo(root) else []
            raise InvalidRequest(
                f"{remote!r} is not a git remote of {root} (remotes: {', '.join(known) or 'none'}); "
                f"give a remote name, a URL, or a path such as ./{remote}",
                code="unknown-remote",
            )
    if is_local_path(remote):
        return str(Path(remote).expanduser().resolve())
    return remote


def not_in_project(where: Path) -> InvalidRequest:
    """A bus verb outside a git checkout: it would read an empty bus and write a bus or an object store into
    whatever directory it was started in (an MCP client starts servers in its own)."""
    return InvalidRequest(
        f"not in a git project: pass --project DIR ({where} is not in a git checkout)", code="not-in-project"
    )
