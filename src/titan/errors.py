"""The exception roots of Titan.

``TitanError`` is the root of every error Titan raises on purpose. ``UserError`` is a
mistake the user can fix (bad flag, missing file): the CLI prints it as one line plus a
hint, never a traceback. ``TitanAbort`` derives from ``BaseException`` so that a broad
``except Exception`` in a user's loop cannot swallow a decision to stop the job.
"""

from __future__ import annotations

__all__ = ["TitanError", "UserError", "TitanAbort"]


class TitanError(Exception):
    """Root of the errors Titan raises on purpose."""


class UserError(TitanError, ValueError):
    """A mistake in the user's input: one line of what is wrong and a hint of what to do."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class TitanAbort(BaseException):
    """Stop the job now and do not restart it; carries the exit code to end with."""

    def __init__(self, message: str, exit_code: int, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.hint = hint
