"""Errors a user can act on, and their exit codes. The CLI prints the message on one line and exits with
the error's `exit_code`; with `--json` it also prints `as_json()` on stdout: {"event": "error", "code": ...,
"message": ..., "hint": ...}. `code` is stable (kebab-case, for agents); a raise site may pass a more
specific one (`unknown-preset`, `bad-param`, `not-found`, `dirty-tree`, ...) and a `hint`.

    class            exit  code
    KakeyaError         1  error            base class: the message says what is wrong and what to do
    InvalidRequest      2  invalid-request  a preset, parameter, manifest or config value is invalid; nothing ran
    UsageError          2  usage            the command line itself (argparse's words)
    Rejected            1  rejected         a request this runner may not run (it ends in a `rejected` done commit)
    BusError            1  bus-error        a git operation against the bus or a local repository failed
    BusUnreachable      1  bus-unreachable  the bus remote could not be reached; nothing was written
    NoRunner            3  no-runner        `wait --no-runner-timeout S`: no live runner served the label for S
                                            seconds (the request stays queued)
    WaitTimeout         4  timeout          `wait --timeout S`: not done after S seconds (the request goes on)
    Interrupted       130  interrupted      stopped by SIGINT/SIGTERM (a request that was served still ended in a
                                            done commit); Ctrl-C in `wait` stops waiting, the request goes on
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

# What `kakeya --help` and the README say about exit codes (every verb keeps to these).
EXIT_CODES = (
    "0 success / pass, 1 failure (a failing verdict, a failed run, an error), 2 invalid (usage, unknown "
    "preset, bad parameter: nothing ran; or rejected), 3 no live runner (--no-runner-timeout), 4 timeout "
    "(--timeout), 130 interrupted, 141 the reader of stdout left"
)


class KakeyaError(Exception):
    """Base class: the message says what is wrong and what to do."""

    exit_code = 1
    code = "error"
    event = "error"  # the `event` of the JSON object (`timeout` for a WaitTimeout)
    hint: str | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "code" not in cls.__dict__:  # SlurmError -> slurm-error: a stable code for every subclass
            cls.code = re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower()

    def __init__(self, message: str = "", *, code: str | None = None, hint: str | None = None, **fields: Any):
        super().__init__(message)
        if code is not None:
            self.code = code
        if hint is not None:
            self.hint = hint
        self.fields = fields  # more for the JSON object (e.g. a timeout's id and state)

    def as_json(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "code": self.code,
            "message": str(self),
            "hint": self.hint,
            "exit_code": self.exit_code,
            **self.fields,
        }


class InvalidRequest(KakeyaError):
    """A preset, parameter, manifest or config value is invalid; nothing was run."""

    exit_code = 2
    code = "invalid-request"


class UsageError(InvalidRequest):
    """The command line is wrong (argparse's message)."""

    code = "usage"


class Rejected(KakeyaError):
    """The request is not one this runner may run; it ends in a `rejected` done commit."""

    code = "rejected"


class BusError(KakeyaError):
    """A git operation against the bus failed (the message carries git's own words)."""

    code = "bus-error"


class BusUnreachable(BusError):
    """The bus remote could not be reached; nothing was written."""

    code = "bus-unreachable"
    hint = "check --remote / KAKEYA_REMOTE / `remote` in kakeya.toml, the network and your git credentials"


class Interrupted(KakeyaError):
    """Stopped by a signal; the message says what became of the request."""

    exit_code = 130
    code = "interrupted"


class NoRunner(KakeyaError):
    """No live runner serves the label a request waits on (the request stays queued)."""

    exit_code = 3
    code = "no-runner"
    hint = "`kakeya runners` lists the live runners; the request stays queued"


class WaitTimeout(KakeyaError):
    """`wait --timeout S` ran out; the request goes on (`kakeya wait ID` again)."""

    exit_code = 4
    code = "timeout"
    event = "timeout"


def problems(exc: ValidationError, what: str, limit: int | None = None) -> str:
    """A pydantic ValidationError as one line: `field.path: message; ...` (`what` names the whole object),
    at most `limit` problems."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or what}: {e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors()[:limit]
    )
