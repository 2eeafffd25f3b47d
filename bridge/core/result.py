"""A run's result: result.json's model (`RunResult`), who asked for it (`RunContext`), where a scheduler ran
it (`SchedulerJob`), and the clock its times are written with (`now`, `iso_time`).

The layers of a run's outcome, bottom up: these models; bridge/results/render.py (the words, summary.md and
report.html made from them); bridge/results/outcome.py (`RunOutcome`, which writes a run's files once).
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from bridge.core.caps import DROPPED_LINES

Status = Literal["succeeded", "failed", "timed-out", "error", "cancelled", "expired", "rejected"]


class RunContext(BaseModel):
    """Who asked for the run and where it runs (filled by the bus runner; empty for `kakeya exec`)."""

    model_config = ConfigDict(extra="forbid")
    request_id: str | None = None
    subject: str | None = None
    runner_name: str | None = None
    runner_labels: list[str] = []
    forced_labels: list[str] = []  # labels served without their accelerator (runner --force-labels)
    signed_by: str | None = None  # the principal the runner signs its done commit as (None: unsigned)


class SchedulerJob(BaseModel):
    """Where a scheduler ran the program (bridge/run/slurm.py): result.json's `scheduler`."""

    model_config = ConfigDict(extra="forbid")
    scheduler: Literal["slurm"] = "slurm"
    job_id: str
    state: str | None = None  # Slurm's final state
    partition: str | None = None
    node: str | None = None
    gpus: list[str] = []  # the allocated GPUs' indices on the node
    gpu_names: list[str] = []  # their names, where nvidia-smi answered inside the job
    queue_wait_s: float | None = None
    run_time_s: float | None = None


class RunResult(BaseModel):
    """result.json: the provenance and outcome of one run."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    schema_version: Literal[1] = 1
    status: Status
    reason: str | None = None
    exit_code: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    duration_s: float | None = None
    argv: list[str] = []
    preset: str
    preset_hash: str | None = None
    params: dict[str, Any] = {}
    request_id: str | None = None
    subject: str | None = None
    runner_name: str | None = None
    runner_labels: list[str] = []
    forced_labels: list[str] = []  # labels served without their accelerator (bridge/host.py hardware_for)
    signed_by: str | None = None  # the principal the runner signs as; `kakeya gate pr` verifies it
    host: dict[str, Any] = {}
    tools: dict[str, str] = {}
    report: str | None = None
    verdict: Literal["pass", "fail", "error"] | None = None
    isolation: str | None = None  # none | user (uid N) | userns: bridge/run/isolation.py
    network: str | None = None  # host | none
    strays_killed: int | None = None  # processes left behind by the program, killed at its end
    dropped: list[str] = []  # what the run left and the runner did not commit, with why (bridge/core/caps.py)

    @field_validator("dropped")
    @classmethod
    def _few(cls, lines: list[str]) -> list[str]:
        """At most DROPPED_LINES lines (a run can leave a million FIFOs; result.json stays small)."""
        if len(lines) <= DROPPED_LINES:
            return lines
        return lines[: DROPPED_LINES - 1] + [f"... and {len(lines) - DROPPED_LINES + 1} more, not listed"]

    scheduler: SchedulerJob | None = None  # a scheduler's job ran it (bridge/run/slurm.py)


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso_time(t: dt.datetime) -> str:
    """A timestamp as result.json and the follower's events write it: ISO 8601 in UTC, to the millisecond."""
    return t.astimezone(dt.UTC).isoformat(timespec="milliseconds")
