"""The injectable environment the CLI reads and writes through (httpie's pattern).

Tests build an ``Environment`` with string buffers and a temporary cwd and call
``titan.cli.main.run(argv, env)`` in-process.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
from pathlib import Path
from typing import IO, Mapping

from rich.console import Console

__all__ = ["Environment"]


@dataclasses.dataclass
class Environment:
    stdin: IO[str] = dataclasses.field(default_factory=lambda: sys.stdin)
    stdout: IO[str] = dataclasses.field(default_factory=lambda: sys.stdout)
    stderr: IO[str] = dataclasses.field(default_factory=lambda: sys.stderr)
    cwd: Path = dataclasses.field(default_factory=Path.cwd)
    env: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(os.environ))
    debug: bool = False

    @classmethod
    def captured(cls, cwd: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> "Environment":
        """An environment with in-memory stdout/stderr, for tests."""
        return cls(stdin=io.StringIO(), stdout=io.StringIO(), stderr=io.StringIO(), cwd=Path(cwd),
                   env=dict(env if env is not None else os.environ))

    def path(self, p: str | os.PathLike[str]) -> Path:
        """Resolve ``p`` against this environment's cwd."""
        q = Path(p).expanduser()
        return q if q.is_absolute() else self.cwd / q

    @property
    def console(self) -> Console:
        """A rich console on stdout (colour only on a real terminal)."""
        return Console(file=self.stdout, soft_wrap=True, highlight=False,
                       force_terminal=None if self.stdout is sys.stdout else False, width=self._width(self.stdout))

    @property
    def err_console(self) -> Console:
        return Console(file=self.stderr, soft_wrap=True, highlight=False,
                       force_terminal=None if self.stderr is sys.stderr else False, width=self._width(self.stderr))

    @staticmethod
    def _width(stream: IO[str]) -> int | None:
        # A terminal sets its own width; a pipe or log file gets room for the tables
        # (rich's default of 80 columns folds them into unreadable towers).
        try:
            return None if stream.isatty() else 150
        except (AttributeError, ValueError):
            return 150
