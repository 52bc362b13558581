"""The CLI run in-process, for the launcher tests (imported by name: ``from _cli import titan`` —
not from ``conftest``, which another test folder's conftest shadows in a mixed pytest run)."""

from __future__ import annotations

from pathlib import Path

from titan.cli.environment import Environment
from titan.cli.main import run as cli_run
from titan.exitcodes import ExitCode


def titan(argv: list[str], cwd: Path) -> tuple[ExitCode, str, str]:
    """Run the CLI in-process; returns (exit code, stdout, stderr)."""
    env = Environment.captured(cwd)
    code = cli_run(argv, env)
    return code, env.stdout.getvalue(), env.stderr.getvalue()
