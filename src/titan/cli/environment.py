"""The injectable environment the CLI reads and writes through (httpie's pattern).

Tests build an ``Environment`` with string buffers and a temporary cwd and call
``titan.cli.main.run(argv, env)`` in-process.

Nothing printed through these consoles is parsed as rich markup or emoji codes: log lines,
event messages, node ids and paths carry brackets (gloo's ``[/__w/…/pair.cc:537]``) that
rich would otherwise read as tags. The CLI's own colours are styles on ``rich.text.Text``
(:func:`styled`), never ``[red]…[/]`` inside a string.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
from pathlib import Path
from typing import IO, Mapping

from rich.console import Console
from rich.text import Text

__all__ = ["Environment", "styled"]


def styled(*parts: str | tuple[str, str]) -> Text:
    """A line of plain text with styled pieces: ``styled(("problem:", "red"), " ", msg)``.

    Every piece is literal text (no markup), so data may contain any characters."""
    return Text.assemble(*parts)


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
        return self._console(self.stdout, sys.stdout)

    @property
    def err_console(self) -> Console:
        """A rich console on stderr (progress bars, notes)."""
        return self._console(self.stderr, sys.stderr)

    def _console(self, stream: IO[str], real: IO[str]) -> Console:
        # markup/emoji off: printed data is never interpreted (see the module doc).
        return Console(file=stream, soft_wrap=True, highlight=False, markup=False, emoji=False,
                       force_terminal=None if stream is real else False, width=self._width(stream))

    def _width(self, stream: IO[str]) -> int | None:
        # COLUMNS wins (as for rich and argparse); else a terminal sets its own width and a
        # pipe or log file gets room for the tables (rich's default of 80 columns folds
        # them into unreadable towers).
        cols = self.env.get("COLUMNS", "")
        if cols.isdigit() and 20 <= int(cols) <= 1000:
            return int(cols)
        try:
            return None if stream.isatty() else 150
        except (AttributeError, ValueError):
            return 150
