"""Errors a user can act on, and their exit codes. The CLI prints the message on one line and exits with
the error's `exit_code`.

    KakeyaError      1  base class: the message says what is wrong and what to do
    InvalidRequest   2  a preset, parameter, manifest or config value is invalid; nothing was run
    Rejected         1  a request this runner may not run (it ends in a `rejected` done commit)
    BusError         1  a git operation against the bus or a local repository failed (git's own words)
    BusUnreachable   1  the bus remote could not be reached; nothing was written
    Interrupted    130  stopped by SIGINT/SIGTERM (the request, if one was served, still ended in a done commit)
    NoRunner         3  `wait --no-runner-timeout S`: no live runner served the label for S seconds
                        (the request stays queued)
    (Ctrl-C)       130  `wait` stopped waiting; the request goes on
"""

from __future__ import annotations

from pydantic import ValidationError


class KakeyaError(Exception):
    """Base class: the message says what is wrong and what to do."""

    exit_code = 1


class InvalidRequest(KakeyaError):
    """A preset, parameter, manifest or config value is invalid; nothing was run."""

    exit_code = 2


class Rejected(KakeyaError):
    """The request is not one this runner may run; it ends in a `rejected` done commit."""


class BusError(KakeyaError):
    """A git operation against the bus failed (the message carries git's own words)."""


class BusUnreachable(BusError):
    """The bus remote could not be reached; nothing was written."""


class Interrupted(KakeyaError):
    """Stopped by a signal; the message says what became of the request."""

    exit_code = 130


class NoRunner(KakeyaError):
    """No live runner serves the label a request waits on (the request stays queued)."""

    exit_code = 3


def problems(exc: ValidationError, what: str, limit: int | None = None) -> str:
    """A pydantic ValidationError as one line: `field.path: message; ...` (`what` names the whole object),
    at most `limit` problems."""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or what}: {e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors()[:limit]
    )
