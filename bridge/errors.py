"""Errors a user can act on. The CLI prints the message on one line and exits non-zero."""


class KakeyaError(Exception):
    """Base class: the message says what is wrong and what to do."""

    exit_code = 1


class InvalidRequest(KakeyaError):
    """A preset, parameter, manifest or config value is invalid; nothing was run."""

    exit_code = 2
