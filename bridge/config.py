"""One small configuration: `kakeya.toml` or `[tool.kakeya]` in pyproject.toml at the project root,
then `KAKEYA_*` environment variables, then command-line flags (applied by the commands).

    remote          bus remote: a git remote name or URL; empty = the embedded local bus
    runner_name     this runner's name (default: the hostname)
    labels          runner labels this host serves
    poll_interval_s runner watch poll interval
    lease_s         claim lease length; heartbeats renew it
    log_cap_bytes   cap for each of stdout.log / stderr.log (head and tail kept)
    secrets         names of environment variables whose values are redacted from everything written
    state_dir       where the embedded bus, runner mirrors and worktrees live (default: <project>/.kakeya)
    request_ttl_s   a request expires this long after it is made unless --expires says otherwise
    stop_grace_s    after a stop signal, `runner watch` lets the current run go on this long, then ends it
                    (it still ends in a done commit); unset: the run is finished whatever it takes
"""

from __future__ import annotations

import os
import platform
import tomllib
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from bridge import git
from bridge.errors import InvalidRequest, problems

ENV_PREFIX = "KAKEYA_"


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")

    remote: str = ""
    runner_name: str = Field(default_factory=lambda: platform.node() or "runner")
    labels: list[str] = ["cpu"]
    poll_interval_s: float = Field(default=2.0, gt=0, le=3600)
    lease_s: float = Field(default=60.0, ge=2, le=24 * 3600)
    log_cap_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    secrets: list[str] = ["HF_TOKEN", "GITHUB_TOKEN", "GH_TOKEN"]
    state_dir: str = ""
    request_ttl_s: float = Field(default=24 * 3600, gt=0)
    stop_grace_s: float | None = Field(default=None, ge=0)


# Environment variable -> field; lists are comma-separated.
_ENV_FIELDS = {
    "KAKEYA_REMOTE": "remote",
    "KAKEYA_RUNNER_NAME": "runner_name",
    "KAKEYA_LABELS": "labels",
    "KAKEYA_POLL_INTERVAL": "poll_interval_s",
    "KAKEYA_LEASE": "lease_s",
    "KAKEYA_LOG_CAP": "log_cap_bytes",
    "KAKEYA_SECRETS": "secrets",
    "KAKEYA_STATE_DIR": "state_dir",
    "KAKEYA_REQUEST_TTL": "request_ttl_s",
    "KAKEYA_STOP_GRACE": "stop_grace_s",
}


def project_root(start: Path | None = None) -> Path:
    """The git top level of `start` (default: cwd), or `start` itself outside a repository."""
    start = (start or Path.cwd()).resolve()
    return git.toplevel(start) or start


def _file_values(root: Path) -> tuple[dict, Path | None]:
    for name, section in (("kakeya.toml", None), ("pyproject.toml", ("tool", "kakeya"))):
        path = root / name
        if not path.is_file():
            continue
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidRequest(f"config {path}: {exc}") from None
        for key in section or ():
            data = data.get(key, {})
        if data or section is None:
            return data, path
    return {}, None


def load_config(root: Path | None = None, environ: Mapping[str, str] | None = None) -> Config:
    environ = os.environ if environ is None else environ
    values, source = _file_values(root or project_root())
    values = dict(values)
    for var, field in _ENV_FIELDS.items():
        if var in environ:
            raw = environ[var]
            values[field] = (
                [s.strip() for s in raw.split(",") if s.strip()] if field in ("labels", "secrets") else raw
            )
    try:
        return Config.model_validate(values)
    except ValidationError as exc:
        where = source or "environment"
        raise InvalidRequest(f"config ({where}): {problems(exc, 'config')}") from None
