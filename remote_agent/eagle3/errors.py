"""Exit-code contract of every `eagle3` command: 0 done, 1 failed, 2 bad input."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


class Eagle3Error(Exception):
    """Base class; `exit_code` decides how the CLI exits."""

    exit_code = EXIT_FAILED


class BadInput(Eagle3Error):
    """The user's input is wrong (file, field, flag). The message names where and what to fix."""

    exit_code = EXIT_BAD_INPUT


class Failed(Eagle3Error):
    """The command ran and found a problem (a verification failed, a server misbehaved)."""

    exit_code = EXIT_FAILED


def located(path: object, line: int | None, message: str) -> str:
    """`file:line: message`, the shape every bad-input message takes."""
    return f"{path}:{line}: {message}" if line is not None else f"{path}: {message}"
