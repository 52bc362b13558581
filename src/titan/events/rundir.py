"""The run directory: layout, creation, ``run.json`` and file naming.

Layout (``docs/run-directory.md``)::

    runs/<run_id>/
      run.json                      # command, settings, versions, hosts, exit status
      events/<node>.rank<k>.attempt<n>.pid<p>.jsonl
      launcher.<node>.jsonl
      checkpoints/  metrics/  report/  stacks/

Every file that others read whole is written atomically (temp name, fsync, replace).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import re
import secrets
import socket
from pathlib import Path
from typing import Any, Mapping

from titan.errors import UserError
from titan.inputs import check_id
from titan.events import strict
from titan.security.paths import PathEscape, check_regular, confined, open_regular

__all__ = [
    "RunDir", "new_run_id", "default_node_id", "atomic_write_text", "atomic_write_json",
    "EVENT_FILE_RE",
]

EVENT_FILE_RE = re.compile(
    r"^(?P<node>.+)\.rank(?P<rank>\d+)\.attempt(?P<attempt>\d+)\.pid(?P<pid>\d+)\.jsonl$"
)
log = logging.getLogger(__name__)


def new_run_id() -> str:
    """A sortable, unique run id: UTC time plus random suffix."""
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{now}-{secrets.token_hex(3)}"


def default_node_id() -> str:
    """The hostname, made safe for a file name."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "node"


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file, fsync, and ``os.replace``.

    Raises ``OSError`` (ENOSPC on a full disk) with ``path`` untouched and no temporary
    file left behind; a short write is never mistaken for a complete one.
    """
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(text.encode())
            while view:  # a short write (full disk) is followed by the real error
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    os.replace(tmp, path)
    try:
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, strict.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


class RunDir:
    """Paths inside one run directory. Creating one is explicit (``create``)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def run_json(self) -> Path:
        return self.path / "run.json"

    @property
    def events_dir(self) -> Path:
        return self.path / "events"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def metrics(self) -> Path:
        return self.path / "metrics"

    @property
    def report(self) -> Path:
        return self.path / "report"

    @property
    def stacks(self) -> Path:
        return self.path / "stacks"

    def event_file(self, node: str, rank: int, attempt: int, pid: int) -> Path:
        return self.events_dir / f"{node}.rank{rank}.attempt{attempt}.pid{pid}.jsonl"

    def launcher_file(self, node: str) -> Path:
        return self.path / f"launcher.{node}.jsonl"

    def event_files(self) -> list[Path]:
        """Every JSONL event file of the run: workers' and launchers' (and agents')."""
        files = sorted(self.events_dir.glob("*.jsonl")) if self.events_dir.is_dir() else []
        files += sorted(self.path.glob("launcher.*.jsonl"))
        files += sorted(self.path.glob("agent.*.jsonl"))
        # Only regular files inside the run directory: a symlink to /dev/zero or out of the
        # folder is damage (logged), never read.
        return [f for f in files if _regular_inside(f, self.path)]

    @classmethod
    def create(cls, root: str | os.PathLike[str], run_id: str | None = None) -> "RunDir":
        """Create ``root/run_id`` and its sub-folders; raises ``UserError`` when impossible."""
        run_id = check_id(run_id or new_run_id(), "run id")
        rd = cls(Path(root) / run_id)
        try:
            for p in (rd.path, rd.events_dir, rd.checkpoints, rd.metrics, rd.report, rd.stacks):
                p.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(
                f"cannot create run directory {rd.path}: {e.strerror or e}",
                "choose a writable folder with --runs-dir or TITAN_RUN_RUNS_DIR",
            ) from None
        return rd

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> "RunDir":
        """Open an existing run directory; ``UserError`` if it is not one."""
        rd = cls(path)
        if not rd.path.is_dir():
            raise UserError(f"run directory {rd.path} does not exist", "pass the folder that `titan run` printed (runs/<run_id>)")
        if not rd.run_json.is_file() and not rd.events_dir.is_dir():
            raise UserError(
                f"{rd.path} is not a Titan run directory (no run.json, no events/)",
                "pass the folder that `titan run` printed (runs/<run_id>)",
            )
        return rd

    def read_run_json(self) -> dict[str, Any]:
        """``run.json`` as a dict ({} when absent); ``UserError`` when garbled."""
        try:
            with open(open_regular(self.run_json, what="run.json"), "rb") as f:
                text = f.read(64 << 20).decode("utf-8", "replace")
        except FileNotFoundError:
            return {}
        except PathEscape as e:
            raise UserError(str(e), "the run directory is damaged; the event files are still readable") from None
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            raise UserError(f"{self.run_json} is not valid JSON ({e.msg} at line {e.lineno})",
                            "the file is damaged; the event files are still readable with `titan events`") from None
        if not isinstance(obj, dict):
            raise UserError(f"{self.run_json} is not a JSON object", "the file is damaged")
        return obj

    def update_run_json(self, updates: Mapping[str, Any]) -> dict[str, Any]:
        """Merge ``updates`` into ``run.json`` atomically; returns the new content."""
        obj = self.read_run_json()
        obj.update(updates)
        atomic_write_json(self.run_json, obj)
        return obj


def _regular_inside(path: Path, root: Path) -> bool:
    try:
        check_regular(confined(root, str(path.relative_to(root)), what="run directory file"))
        return True
    except (PathEscape, OSError, ValueError) as e:
        log.warning("skipping %s: %s", path, e)
        return False
