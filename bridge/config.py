"""One small configuration: `kakeya.toml` or `[tool.kakeya]` in pyproject.toml at the project root,
then `KAKEYA_*` environment variables, then command-line flags (applied by the commands).

    remote          bus remote: a git remote name or URL; empty = the embedded local bus
    runner_name     this runner's name (default: the hostname)
    labels          runner labels this host serves
    poll_interval_s runner watch poll interval
    lease_s         claim lease length; heartbeats renew it
    git_timeout_s   how long one git operation against the bus may take (a listing, a fetch, a push)
    compact_after_days  runners move done results older than this into the bus's ledger, one runner at a time
                    (a lease), at most every compact_every_s (300); 0 = never (docs/bus.md)
    log_cap_bytes   cap for each of stdout.log / stderr.log (head and tail kept)
    secrets         names of environment variables whose values are redacted from everything written
    state_dir       where the embedded bus, runner mirrors and run directories live (default: <project>/.kakeya)
    request_ttl_s   a request expires this long after it is made unless --expires says otherwise
    signing_key     an SSH private key file: the runner signs its claim and done commits, a client its
                    requests (git's gpg.format=ssh); empty = unsigned (the embedded default)
    require_signed_requests  a runner rejects requests not signed by a key of `allowed_requesters`
    allowed_requesters       allowed-signers file of the requesters (relative to the project root)
    isolation       how a run is kept from the runner (bridge/run/isolation.py): auto (the default: the strongest
                    the host offers, bwrap where bubblewrap works, user for a root runner with a run user; a
                    runner refuses to serve where that leaves only userns or none, until one is named) | bwrap |
                    user | userns | none (asked by name)
    run_user        the dedicated unprivileged user (name or uid) a root runner starts programs as (bwrap, user)
    untrusted_labels  labels whose subjects are untrusted: the runner refuses them without isolation
    report_cap_bytes / files_cap_bytes / result_cap_bytes  caps on report.json, the program's other
                    files, and the whole result: what exceeds is dropped and listed in result.json
    files_count_cap the files and directories a run may leave (5,000): the rest is not looked at, dropped and
                    counted in one line of result.json
    secrets_dir     a directory only the runner's user can read (mode 700), holding the runner's own secrets as
                    files, never in its environment nor passed to a run: `git-credentials` (git's
                    credential-store format, e.g. https://x-access-token:TOKEN@github.com) is what the
                    runner's git pushes to the bus with
    min_free_bytes  a runner claims no request while the file system of its state directory has less free space
                    than this (it says so in its presence, and claims again once there is room); 0 = no floor.
                    Default 1 GiB: ten times the default result cap (a run's out dir, its logs and checkout,
                    and the mirror's objects for its done commit all land there before the result is pushed)
    clock_offset_s  added to this runner's wall clock (tests fake clock skew with it)
    stop_grace_s    after a stop signal, `runner watch` lets the current run go on this long, then ends it
                    (it still ends in a done commit); unset: the run is finished whatever it takes
    executors       per runner label, how its runs are executed (a TOML table per label):
                    `[executors.h200] executor = "slurm", partition = "gpu", account = "ml", qos = "",
                    gpu_type = "h200", gpus = 1, sbatch_options = ["--constraint=ib"], max_in_flight = 16`;
                    a label not listed runs locally (`executor = "local"`)
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bridge.core.errors import InvalidRequest, problems
from bridge.wire import git

MAX_TTL = dt.timedelta(days=7)  # the longest a request may wait for a runner (expires_at - created_at)

ENV_PREFIX = "KAKEYA_"


# A Slurm name (partition, account, QoS, GPU type): nothing a shell or sbatch's own syntax could read more in.
_SLURM_NAME = r"^[A-Za-z0-9_.+-]*$"
# What the Slurm executor sets itself (bridge/run/slurm.py): a label's sbatch_options may not override it.
SBATCH_OWN = (
    "--job-name", "-J", "--output", "-o", "--error", "-e", "--export", "--requeue", "--no-requeue",
    "--parsable", "--wrap", "--chdir", "-D", "--gres", "--gpus", "-G", "--cpus-per-task", "-c", "--mem",
    "--time", "-t", "--partition", "-p", "--account", "-A", "--qos", "-q", "--uid", "--gid", "--get-user-env",
    "--export-file", "--input", "-i", "--open-mode",
)  # fmt: skip


class LocalLabel(BaseModel):
    """A label whose runs run on the runner's own host (bridge/run/execute.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    executor: Literal["local"] = "local"


class SlurmLabel(BaseModel):
    """A label whose runs are Slurm jobs (bridge/run/slurm.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    executor: Literal["slurm"]
    partition: str = Field(default="", pattern=_SLURM_NAME)
    account: str = Field(default="", pattern=_SLURM_NAME)
    qos: str = Field(default="", pattern=_SLURM_NAME)
    gpu_type: str = Field(default="", pattern=_SLURM_NAME)
    gpus: int = Field(default=0, ge=0, le=64)  # GPUs a run asks for where its preset's `resources` names none
    sbatch_options: list[str] = []
    max_in_flight: int = Field(default=8, ge=1, le=1000)

    @field_validator("sbatch_options")
    @classmethod
    def _options(cls, options: list[str]) -> list[str]:
        for option in options:
            name = option.split("=", 1)[0]
            if not option.startswith("-") or any(c in option for c in "\n\r\0"):
                raise ValueError(f"sbatch option {option!r} must be one '--name=value' argument")
            if name in SBATCH_OWN or any(name.startswith(own) and len(own) == 2 for own in SBATCH_OWN):
                raise ValueError(
                    f"sbatch option {option!r} is set by Kakeya itself and may not be overridden"
                )
        return options


LabelExecutor = Annotated[LocalLabel | SlurmLabel, Field(discriminator="executor")]


class Config(BaseModel):
    model_config = ConfigDict(extra="forbid")

    remote: str = ""
    runner_name: str = Field(default_factory=lambda: platform.node() or "runner")
    labels: list[str] = ["cpu"]
    poll_interval_s: float = Field(default=2.0, gt=0, le=3600)
    lease_s: float = Field(default=60.0, ge=2, le=24 * 3600)
    git_timeout_s: float = Field(default=120.0, gt=0, le=24 * 3600)
    compact_after_days: float = Field(default=2.0, ge=0)
    compact_every_s: float = Field(default=300.0, ge=1)
    log_cap_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    secrets: list[str] = ["HF_TOKEN", "GITHUB_TOKEN", "GH_TOKEN"]
    state_dir: str = ""
    request_ttl_s: float = Field(default=24 * 3600, gt=0, le=MAX_TTL.total_seconds())
    signing_key: str = ""
    require_signed_requests: bool = False
    allowed_requesters: str = ""
    isolation: Literal["none", "auto", "bwrap", "user", "userns"] = "auto"
    run_user: str = "kakeya-run"
    untrusted_labels: list[str] = []
    report_cap_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    files_cap_bytes: int = Field(default=64 * 1024 * 1024, ge=0)
    result_cap_bytes: int = Field(default=100 * 1024 * 1024, ge=64 * 1024)
    files_count_cap: int = Field(default=5000, ge=10)  # files and directories a run may leave (caps.py)
    secrets_dir: str = ""
    min_free_bytes: int = Field(default=1 << 30, ge=0)
    clock_offset_s: float = 0.0
    stop_grace_s: float | None = Field(default=None, ge=0)
    executors: dict[str, LabelExecutor] = {}

    def executor_for(self, label: str) -> LocalLabel | SlurmLabel:
        """How runs of runner label `label` are executed (local unless the config says otherwise)."""
        return self.executors.get(label, LocalLabel())


# Environment variable -> field; lists are comma-separated.
_ENV_FIELDS = {
    "KAKEYA_REMOTE": "remote",
    "KAKEYA_RUNNER_NAME": "runner_name",
    "KAKEYA_LABELS": "labels",
    "KAKEYA_POLL_INTERVAL": "poll_interval_s",
    "KAKEYA_LEASE": "lease_s",
    "KAKEYA_GIT_TIMEOUT": "git_timeout_s",
    "KAKEYA_COMPACT_AFTER_DAYS": "compact_after_days",
    "KAKEYA_COMPACT_EVERY": "compact_every_s",
    "KAKEYA_LOG_CAP": "log_cap_bytes",
    "KAKEYA_SECRETS": "secrets",
    "KAKEYA_STATE_DIR": "state_dir",
    "KAKEYA_REQUEST_TTL": "request_ttl_s",
    "KAKEYA_SIGNING_KEY": "signing_key",
    "KAKEYA_ISOLATION": "isolation",
    "KAKEYA_RUN_USER": "run_user",
    "KAKEYA_UNTRUSTED_LABELS": "untrusted_labels",
    "KAKEYA_REPORT_CAP": "report_cap_bytes",
    "KAKEYA_FILES_CAP": "files_cap_bytes",
    "KAKEYA_RESULT_CAP": "result_cap_bytes",
    "KAKEYA_FILES_COUNT_CAP": "files_count_cap",
    "KAKEYA_SECRETS_DIR": "secrets_dir",
    "KAKEYA_MIN_FREE": "min_free_bytes",
    "KAKEYA_CLOCK_OFFSET": "clock_offset_s",
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
                [s.strip() for s in raw.split(",") if s.strip()]
                if field in ("labels", "secrets", "untrusted_labels")
                else raw
            )
    try:
        return Config.model_validate(values)
    except ValidationError as exc:
        where = source or "environment"
        raise InvalidRequest(f"config ({where}): {problems(exc, 'config')}") from None


GIT_CREDENTIALS = "git-credentials"


def secret_file(config: Config, name: str) -> Path | None:
    """<secrets_dir>/<name> when it exists; InvalidRequest when the directory or the file can be read by
    anyone but this user (a run, or another user, could read the secret)."""
    if not config.secrets_dir:
        return None
    folder = Path(config.secrets_dir).expanduser().resolve()
    if not folder.is_dir():
        raise InvalidRequest(f"secrets_dir {folder} is not a directory (secrets_dir / KAKEYA_SECRETS_DIR)")
    path = folder / name
    for item, fix in ((folder, "chmod 700"), (path, "chmod 600")):
        if not item.exists():
            continue
        st = item.stat()
        if st.st_mode & 0o077 or st.st_uid != os.geteuid():
            raise InvalidRequest(
                f"{item} is readable by others (mode {st.st_mode & 0o777:o}, owner uid {st.st_uid}): "
                f"the runner's secrets must be its own user's alone; `{fix} {item}`"
            )
    return path if path.is_file() else None
