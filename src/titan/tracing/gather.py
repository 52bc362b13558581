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
import re
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


_USER = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_HINT = "with --fetch-command every source is HOST:PATH (or USER@HOST:PATH), e.g. node1:/scratch/runs/exp42"


def _remote(source: str) -> tuple[str, str]:
    """``[USER@]HOST:PATH`` → (host as given, path); ``UserError`` for anything else."""
    from titan.inputs import check_host

    host, sep, path = source.partition(":")
    if not sep:
        raise UserError(f"{source!r} is not HOST:PATH", _HINT)
    user, at, name = host.rpartition("@")
    if (at and not _USER.match(user)) or not path.strip():
        raise UserError(f"{source!r} is not [USER@]HOST:PATH", _HINT)
    try:
        check_host(name, "host")
    except UserError as e:
        raise UserError(f"source {source!r}: {e.message}", e.hint) from None
    return host, path


def _check_template(command: str) -> None:
    try:
        command.format(host="h", path="p", dest="d")
    except (KeyError, IndexError, ValueError) as e:
        raise UserError(f"--fetch-command {command!r} is not a template of {{host}}, {{path}} and {{dest}} ({e!r})",
                        'e.g. --fetch-command "rsync -a {host}:{path}/ {dest}/" (write {{ and }} for literal braces)') from None


def _check(out: Path, sources: Sequence[str], fetch_command: str | None) -> None:
    """Every refusal before anything is fetched or written."""
    from titan.inputs import check_id

    if not sources:
        raise UserError("no sources to gather", "give one run directory per node")
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a folder", "gather into a new folder")
    if out.is_dir() and any(out.iterdir()):
        raise UserError(f"{out} exists and is not empty", "gather into a new folder")
    check_id(out.name, "run id (the name of OUT)")
    if len(set(sources)) != len(sources):
        dup = next(x for x in sources if list(sources).count(x) > 1)
        raise UserError(f"source {dup} is given twice", "give each node's run directory once")
    if fetch_command is not None:
        for s in sources:
            _remote(s)
        _check_template(fetch_command)
        return
    target = out.resolve()
    seen: dict[Path, str] = {}
    for s in sources:
        p = Path(s)
        if not p.is_dir():
            raise UserError(f"{s} is not a folder", "give local run directories, or HOST:PATH with --fetch-command")
        src = p.resolve()
        if src in seen:
            raise UserError(f"{s} and {seen[src]} are the same folder", "give each node's run directory once")
        seen[src] = s
        if target == src or src in target.parents:
            raise UserError(f"OUT {out} is inside the source {s}", "gather into a folder outside every source; "
                            "a source is never written to")


def _fetch(source: str, command: str | None, staging: Path, timeout_s: float) -> Path:
    if command is None:
        return Path(source)
    host, path = _remote(source)
    dest = staging / str(len(list(staging.iterdir())))
    dest.mkdir()
    cmd = command.format(host=shlex.quote(host), path=shlex.quote(path), dest=shlex.quote(str(dest)))
    try:
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise UserError(f"fetching {source} took more than {timeout_s:g} s", "check --fetch-command and the host") from None
    if p.returncode != 0:
        raise UserError(f"fetching {source} failed (exit {p.returncode}): {p.stderr.strip()[:200]}",
                        "check --fetch-command; it is run with {host}, {path} and {dest} filled in")
    return dest


def gather(out: Path, sources: Sequence[str], *, fetch_command: str | None = None, force: bool = False,
           timeout_s: float = 600.0) -> GatherResult:
    """Merge ``sources`` into ``out`` (created). Raises ``UserError`` on bad input, before
    anything is fetched or written: OUT must be new (or empty) and outside every source.

    Cost: copies every event, metric, stack and trace file once; checkpoints are not copied.
    """
    _check(out, sources, fetch_command)
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


