"""Input discovery and the top-level ``triage()`` call.

Inputs: a Titan run directory (``run.json`` or ``events/``), any directory of logs (walked
recursively, hidden files skipped), or single files. Files are sniffed by content, not by
name; a file's name and parent folders give rank and host hints (``rank3.log``,
``node07/dmesg.log``, torchrun's ``attempt_0/3/stderr.log``).
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Iterable, Sequence

from titan.errors import UserError
from titan.triage.lineparse import name_hints
from titan.triage.method import DEFAULT_SKEW_S, decide
from titan.triage.model import Verdict
from titan.triage.rules import RuleSet, load_rules
from titan.triage.scan import _GREP, FileScan, scan_text_file, summary_dict
from titan.triage.structured import scan_error_file, scan_fr_dump, scan_nvsmi, sniff

__all__ = ["triage", "discover"]

log = logging.getLogger(__name__)
#: Above this many bytes of input, files are scanned by a pool of processes.
PARALLEL_BYTES = 64 << 20
_SKIP_DIRS = {"checkpoints", "metrics", "beacons", "report", "traces", "__pycache__", ".git"}  # report: our own output (a bundled plotly.min.js once matched a rule)
#: never logs: checkpoints, databases, beacons (skipped silently)
_SKIP_SUFFIXES = (".pt", ".pth", ".safetensors", ".distcp", ".bin", ".sqlite", ".db", ".bcn", ".npy")


def _is_run_dir(p: Path) -> bool:
    return p.is_dir() and ((p / "run.json").is_file() or (p / "events").is_dir())


def discover(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[tuple[Path, str]], list[Path]]:
    """Return (log files with display names, run directories). Raises ``UserError`` for a bad path."""
    if not paths:
        raise UserError("no input given", "pass a run directory, a folder of logs, or log files")
    files: list[tuple[Path, str]] = []
    runs: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise UserError(f"{p}: no such file or directory", "pass a run directory, a folder of logs, or log files")
        if p.is_file():
            files.append((p, p.name))
            continue
        if not p.is_dir():
            raise UserError(f"{p}: not a regular file or directory", "pass log files or folders")
        if _is_run_dir(p):
            runs.append(p)
        for root, dirs, names in os.walk(p):
            rootp = Path(root)
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS
                             and not (_is_run_dir(p) and rootp == p and d == "events"))
            for n in sorted(names):
                if n.startswith("."):
                    continue
                fp = rootp / n
                if _is_run_dir(p) and (n == "run.json" or (rootp == p and n.endswith(".jsonl"))):
                    continue  # read through titan.events
                if n.endswith(_SKIP_SUFFIXES):
                    continue
                if fp.is_file() and not fp.is_symlink():
                    files.append((fp, str(fp.relative_to(p))))
    return files, runs


def _year(p: Path) -> int:
    try:
        return _dt.datetime.fromtimestamp(p.stat().st_mtime, tz=_dt.timezone.utc).year
    except OSError:
        return _dt.datetime.now(tz=_dt.timezone.utc).year


_WORKER_RULES: RuleSet | None = None


def _init_worker(rule_files: tuple[str, ...]) -> None:
    global _WORKER_RULES
    _WORKER_RULES = load_rules(rule_files)


def _scan_one(args: tuple[Path, str, int], rules: RuleSet | None = None) -> FileScan:
    path, display, order = args
    rules = rules or _WORKER_RULES
    assert rules is not None
    rank, host = name_hints(display)
    year = _year(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
        kind = sniff(path, head)
        if not head:
            res = FileScan(file=display)
            res.problem = "empty file"
            return res
        if kind == "error_file":
            return scan_error_file(path, display, order, rules, year, rank, host)
        if kind == "fr_dump":
            return scan_fr_dump(path, display, order, rank, host)
        if kind == "nvsmi":
            return scan_nvsmi(path, display, order, rules, year, host)
        if kind == "events":
            res, _probs = scan_run_events_file(path, display, order, rules)
            return res
        return scan_text_file(path, display, order, rules, year, file_rank=rank, file_host=host)
    except OSError as e:
        res = FileScan(file=display)
        res.problem = f"cannot read: {e.strerror or e}"
        return res
    except Exception as e:  # noqa: BLE001 - one odd file must not stop the triage of the others
        log.debug("scanning %s failed", path, exc_info=True)
        res = FileScan(file=display)
        res.problem = f"could not be parsed ({type(e).__name__}: {e})"
        return res


def scan_run_events_file(path: Path, display: str, order: int, rules: RuleSet) -> tuple[FileScan, list[str]]:
    from titan.triage.runevents import scan_run_events

    res, probs = scan_run_events([path], order, rules, path.parent)  # type: ignore[arg-type]
    res.file = display
    return res, probs


def triage(paths: Sequence[str | os.PathLike[str]], *, window_s: float = 30.0, skew_s: float = DEFAULT_SKEW_S,
           rule_files: Iterable[str | os.PathLike[str]] = (), jobs: int | None = None) -> Verdict:
    """Triage a failed job from its run directory and/or raw logs; returns the verdict.

    Cost: one streaming pass over every input file (parallel processes above
    ``PARALLEL_BYTES``); memory is bounded per file. Raises ``UserError`` for a missing
    input or a malformed rules file; never raises for bad log content.
    """
    if window_s <= 0 or skew_s < 0:
        raise UserError("--window must be > 0 and --skew >= 0", "e.g. --window 30")
    rule_files = tuple(str(r) for r in rule_files)
    rules = load_rules(rule_files)
    files, runs = discover(paths)
    scans: list[FileScan] = []
    problems: list[str] = []
    for i, rd in enumerate(runs):
        from titan.triage.runevents import scan_run_events

        res, probs = scan_run_events(rd, 10_000 + i, rules, rd)
        scans.append(res)
        problems += probs
    tasks = [(p, d, i) for i, (p, d) in enumerate(files)]
    total = 0
    for p, _, _ in tasks:
        try:
            total += p.stat().st_size
        except OSError:
            pass
    # with grep doing the prefilter a serial scan already keeps two cores busy (measured:
    # --jobs 1 8.7 s vs --jobs 2 13.5 s for 1 GB on 2 shared cores); without grep, fan out
    workers = jobs if jobs is not None else (1 if _GREP else min(os.cpu_count() or 1, 4))
    if total > PARALLEL_BYTES and len(tasks) > 1 and workers > 1:
        with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker, initargs=(rule_files,)) as ex:
            file_scans = list(ex.map(_scan_one, tasks, chunksize=max(1, len(tasks) // (workers * 8))))
    else:
        file_scans = [_scan_one(t, rules) for t in tasks]
    for s in file_scans:
        if s.problem:
            problems.append(f"{s.file}: {s.problem}")
        if s.dropped:
            problems.append(f"{s.file}: {s.dropped} matching lines beyond the first/last kept were not examined")
    scans += file_scans
    verdict = decide(scans, window_s=window_s, skew_s=skew_s)
    verdict.problems = problems
    verdict.inputs = {"files": len(files), "run_dirs": [str(r) for r in runs], "bytes": total,
                      "lines": sum(s.lines for s in file_scans),
                      "findings": sum(len(s.findings) for s in scans),
                      "unreadable": [summary_dict(s) for s in file_scans if s.problem][:20]}
    if not verdict.diagnosed and not any(s.findings or s.progress for s in scans):
        readable = [s for s in file_scans if not s.problem]
        verdict.reason = ("no readable log lines" if not readable and not runs else
                          f"no recognised failure lines in {len(readable)} readable file(s)"
                          + (f" ({len(file_scans) - len(readable)} skipped: binary/empty/unreadable)"
                             if len(readable) < len(file_scans) else ""))
    return verdict
