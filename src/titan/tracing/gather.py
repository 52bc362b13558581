"""``titan gather``: bring per-node run directories together into one.

Event files are node-local by default; without a shared file system each node holds its
own part of ``runs/<run_id>``. ``gather`` copies (or fetches with a command the user
supplies, e.g. rsync over ssh) every node's part into one folder that ``titan events``,
triage and the report read as one job. File names are unique per node, rank, attempt and
pid, so parts merge without renaming; ``run.json`` files are kept per node under
``nodes`` in the merged one.
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

from titan.errors import UserError
from titan.events.rundir import RunDir, atomic_write_json

__all__ = ["GatherResult", "gather"]

_COPY_GLOBS = ("events/*.jsonl", "launcher.*.jsonl", "agent.*.jsonl", "metrics/**/*", "stacks/**/*",
               "traces/**/*", "*.log", "preflight.json")


@dataclasses.dataclass
class GatherResult:
    out: Path
    sources: list[str]
    files: int
    conflicts: list[str]


def _fetch(source: str, command: str | None, staging: Path, timeout_s: float) -> Path:
    if command is None:
        p = Path(source)
        if not p.is_dir():
            raise UserError(f"{source} is not a folder", "give local run directories, or host:path with --fetch-command")
        return p
    host, sep, path = source.partition(":")
    if not sep:
        raise UserError(f"{source!r} is not HOST:PATH", "with --fetch-command every source is HOST:PATH")
    dest = staging / f"{len(list(staging.iterdir()))}-{host}"
    dest.mkdir()
    cmd = command.format(host=shlex.quote(host), path=shlex.quote(path), dest=shlex.quote(str(dest)))
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout_s)
    if p.returncode != 0:
        raise UserError(f"fetching {source} failed (exit {p.returncode}): {p.stderr.strip()[:200]}",
                        "check --fetch-command; it is run with {host}, {path} and {dest} filled in")
    return dest


def gather(out: Path, sources: Sequence[str], *, fetch_command: str | None = None, force: bool = False,
           timeout_s: float = 600.0) -> GatherResult:
    """Merge ``sources`` into ``out`` (created). Raises ``UserError`` on bad input.

    Cost: copies every event, metric, stack and trace file once; checkpoints are not copied.
    """
    if not sources:
        raise UserError("no sources to gather", "give one run directory per node")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not empty", "gather into a new folder")
    with tempfile.TemporaryDirectory(prefix="titan-gather-") as tmp:
        staging = Path(tmp)
        parts = [_fetch(s, fetch_command, staging, timeout_s) for s in sources]
        run_jsons = []
        for src, part in zip(sources, parts):
            rd = RunDir(part)
            if not rd.run_json.is_file() and not rd.events_dir.is_dir():
                raise UserError(f"{src} is not a Titan run directory (no run.json, no events/)",
                                "give the runs/<run_id> folder of each node")
            run_jsons.append(rd.read_run_json())
        ids = {j.get("run_id") for j in run_jsons if j.get("run_id")}
        if len(ids) > 1 and not force:
            raise UserError(f"the sources belong to different runs: {', '.join(sorted(map(str, ids)))}",
                            "gather the parts of one run only, or pass --force")
        dest = RunDir.create(out.parent, out.name)
        files, conflicts = 0, []
        for part in parts:
            for pattern in _COPY_GLOBS:
                for f in part.glob(pattern):
                    if not f.is_file():
                        continue
                    rel = f.relative_to(part)
                    target = dest.path / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    if target.exists():
                        if target.read_bytes() == f.read_bytes():
                            continue
                        conflicts.append(str(rel))
                        target = target.with_name(f"{target.stem}.{len(conflicts)}{target.suffix}")
                    shutil.copy2(f, target)
                    files += 1
        merged = dict(run_jsons[0]) if run_jsons else {}
        merged["nodes"] = {str(j.get("node_id") or f"part{i}"): j for i, j in enumerate(run_jsons)}
        merged["gathered_from"] = list(sources)
        atomic_write_json(dest.run_json, merged)
    return GatherResult(dest.path, list(sources), files, conflicts)


