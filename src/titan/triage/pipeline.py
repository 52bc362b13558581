"""Input discovery and the top-level ``triage()`` call.

Inputs: a Titan run directory (``run.json`` or ``events/``), any directory of logs (walked
recursively, hidden files skipped), or single files. Files are sniffed by content, not by
name; a file's name and parent folders give rank and host hints (``rank3.log``,
``node07/dmesg.log``, torchrun's ``attempt_0/3/stderr.log``).
"""

from __future__ import annotations

import datetime as _dt
import itertools
import logging
import os
import re
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Iterable, Sequence

from titan.errors import UserError
from titan.triage.incidents import run_succeeded, succeeded_verdict
from titan.triage.lexical import lexical_finding
from titan.triage.lineparse import name_hints
from titan.triage.method import DEFAULT_SKEW_S, decide
from titan.triage.model import DEFAULT_ACTION, DEFAULT_SCOPE, Finding, Verdict
from titan.triage.rules import RuleSet, load_rules
from titan.triage import scan as _scan
from titan.triage.grepfilter import GREP as _GREP
from titan.triage.grepfilter import GrepFailed, grep_many
from titan.triage.scan import FileScan, scan_text_file, summary_dict
from titan.triage.stacks import HEADER_RULE, parse_stacks
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
        for root, dirs, names in os.walk(p):
            rootp = Path(root)
            in_run = _is_run_dir(rootp)  # a run directory given, or one inside the folder given
            if in_run and rootp not in runs:
                runs.append(rootp)
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in _SKIP_DIRS
                             and not (in_run and d == "events"))
            for n in sorted(names):
                if n.startswith("."):
                    continue
                fp = rootp / n
                if in_run and (n == "run.json" or n.endswith(".jsonl")):
                    continue  # read through titan.events
                if n.endswith(_SKIP_SUFFIXES):
                    continue
                if fp.is_file() and not fp.is_symlink():
                    files.append((fp, str(fp.relative_to(p))))
    return files, runs


def _inside(p: Path, root: Path) -> bool:
    try:
        p.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def _year(p: Path) -> int:
    try:
        return _dt.datetime.fromtimestamp(p.stat().st_mtime, tz=_dt.timezone.utc).year
    except OSError:
        return _dt.datetime.now(tz=_dt.timezone.utc).year


#: timestamps that carry their year: ISO-8601 and ctime / ``dmesg -T`` (raw bytes: a stamp right behind a colour
#: sequence's final letter still counts)
_YEARED = re.compile(rb"(?<!\d)(20\d\d)-[01]\d-[0-3]\d[T _][0-2]\d:[0-5]\d|[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)? (20\d\d)\b")
YEAR_PROBE_BYTES = 16 << 10
#: stamps of a file's head counted for its year (the most common one wins; a few dozen settle it)
YEAR_PROBE_STAMPS = 64


def _years(paths: list[Path]) -> tuple[dict[Path, int], int | None]:
    """The year each file's own stamps carry (most common in its head), and the inputs' most common one.

    Formats without a year (glog ``W1130 …``, syslog ``Nov 30 …``) take the file's own year, else the
    year the other inputs' stamps carry, and only then the file's mtime — so a log copied or checked
    out in another year still lines up with its siblings. Cost: one read of ≤ 16 KiB per file.
    """
    own: dict[Path, int] = {}
    total: Counter[int] = Counter()
    for p in paths:
        try:
            with open(p, "rb") as f:
                head = f.read(YEAR_PROBE_BYTES)
        except OSError:
            continue
        c = Counter(int(m.group(1) or m.group(2)) for m in itertools.islice(_YEARED.finditer(head), YEAR_PROBE_STAMPS))
        if c:
            own[p] = max(c, key=lambda y: (c[y], y))
            total.update(c)
    return own, (max(total, key=lambda y: (total[y], y)) if total else None)


_WORKER_RULES: RuleSet | None = None


def _init_worker(rule_files: tuple[str, ...]) -> None:
    global _WORKER_RULES
    _WORKER_RULES = load_rules(rule_files)


def _scan_one(args: tuple[Path, str, int, int | None], rules: RuleSet | None = None,
              hits: Iterable[tuple[int, int, bytes]] | None = None) -> FileScan:
    path, display, order, year_hint = args
    rules = rules or _WORKER_RULES
    assert rules is not None
    rank, host = name_hints(display)
    year = year_hint if year_hint is not None else _year(path)
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
        kind = sniff(path, head)
        if hits is not None and kind != "text":
            hits = None  # sniffed otherwise than when the batch was formed (the file changed): its own reader
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
        res = scan_text_file(path, display, order, rules, year, file_rank=rank, file_host=host, hits=hits)
        if any(f.rule == HEADER_RULE for f in res.findings):  # the file holds stack dumps: who waits for whom
            res.stacks = parse_stacks(path, display)
            res.findings = [f for f in res.findings if f.rule != HEADER_RULE]
        return res
    except OSError as e:
        res = FileScan(file=display)
        res.problem = f"cannot read: {e.strerror or e}"
        return res
    except Exception as e:  # noqa: BLE001 - one odd file must not stop the triage of the others
        log.debug("scanning %s failed", path, exc_info=True)
        res = FileScan(file=display)
        res.problem = f"could not be parsed ({type(e).__name__}: {e})"
        return res


def _grep_batchable(path: Path) -> bool:
    """A plain text log large enough for the grep prefilter (what ``scan_text_file`` would grep itself)."""
    try:
        if path.stat().st_size < _scan.GREP_MIN_BYTES:
            return False
        with open(path, "rb") as f:
            return sniff(path, f.read(4096)) == "text"
    except OSError:
        return False


def _scan_serial(tasks: list[tuple[Path, str, int, int | None]], rules: RuleSet) -> list[FileScan]:
    """Scan files in this process; the large text logs share one grep process per batch (``grep_many``).

    Cost: one ``grep -F`` process per ``GREP_BATCH`` large files instead of one per file — on a
    loaded machine the fork and wake-ups per file cost more than the reading. A batch grep reports
    an error for → its files are scanned again one by one (each with its own grep or Python).
    """
    out: list[FileScan | None] = [None] * len(tasks)
    big = [i for i, t in enumerate(tasks) if _grep_batchable(t[0])] if _GREP else []
    batched = set(big)
    for i, t in enumerate(tasks):
        if i not in batched:
            out[i] = _scan_one(t, rules)
    if big:
        try:
            for j, hits in grep_many([tasks[i][0] for i in big], rules):
                out[big[j]] = _scan_one(tasks[big[j]], rules, hits=hits)
        except GrepFailed as e:
            for j in range(e.start, len(big)):
                out[big[j]] = _scan_one(tasks[big[j]], rules)
    return [s if s is not None else _scan_one(t, rules) for s, t in zip(out, tasks)]


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
    own_year, ref_year = _years([p for p, _ in files])
    tasks = [(p, d, i, own_year.get(p, ref_year)) for i, (p, d) in enumerate(files)]
    total = 0
    for p, _, _, _ in tasks:
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
        file_scans = _scan_serial(tasks, rules)
    for s in file_scans:
        if s.problem:
            problems.append(f"{s.file}: {s.problem}")
        if s.dropped:
            problems.append(f"{s.file}: {s.dropped} matching lines beyond the first/last kept were not examined")
    scans += file_scans
    outside = [p for p, _ in files if not any(_inside(p, r) for r in runs)]
    if len(runs) == 1 and not outside and run_succeeded(runs[0]):
        # a run that succeeded is no failure to explain: its handled incidents, costliest first
        verdict = succeeded_verdict(runs[0], scans, decide, window_s=window_s, skew_s=skew_s)
    else:
        verdict = decide(scans, window_s=window_s, skew_s=skew_s)
    verdict.problems = problems
    verdict.inputs = {"files": len(files), "run_dirs": [str(r) for r in runs], "bytes": total,
                      "lines": sum(s.lines for s in file_scans),
                      "findings": sum(len(s.findings) for s in scans),
                      "unreadable": [summary_dict(s) for s in file_scans if s.problem][:20]}
    if verdict.outcome == "failed" and not verdict.diagnosed and not any(s.findings or s.progress for s in scans):
        readable = [s for s in file_scans if not s.problem]
        verdict.reason = ("no readable log lines" if not readable and not runs else
                          f"no recognised failure lines in {len(readable)} readable file(s)"
                          + (f" ({len(file_scans) - len(readable)} skipped: binary/empty/unreadable)"
                             if len(readable) < len(file_scans) else ""))
    if verdict.outcome == "failed" and not verdict.diagnosed and "finishing normally" not in verdict.reason:
        readable_files = [(p, d) for (p, d), s in zip(files, file_scans) if not s.problem]
        lf = lexical_finding(readable_files)
        if lf is not None:  # the last resort: the words of the error lines (a weak diagnosis, said so)
            verdict = _lexical_verdict(lf, verdict)
    return verdict


def _lexical_verdict(lf: Finding, v: Verdict) -> Verdict:
    cls = lf.cls or "user_code"
    words = ", ".join(lf.fields.get("words", []))
    votes = lf.fields.get("votes", {})
    how = lf.fields.get("how")
    why = {"plain_error": "an error line that names no infrastructure domain: by base rate the program's own",
           "no_error": "no error line at all: the output stops (progress stopped, or the job only slowed down)"}.get(
        str(how), f"the wording of the error lines points to {cls} ({words}) — a reading of words, not of a "
                  f"documented message")
    out = Verdict(cls=cls, culprit={"rank": lf.rank, "node": lf.node, "gpu": None}, scope=DEFAULT_SCOPE[cls],
                  action=DEFAULT_ACTION[cls], first_anomaly=lf, evidence=[lf], confidence=0.2 if how == "words" else 0.15,
                  reason=f"{v.reason}; {why}", failure_time=v.failure_time, window_s=v.window_s,
                  inputs=v.inputs, problems=v.problems)
    out.steps = [f"first anomaly: {lf.file}:{lf.line} (untimed) [lexical] {lf.text[:160]}",
                 f"domain: {cls} — no rule recognises any line; the error lines' words vote "
                 + ", ".join(f"{k} {n}" for k, n in sorted(votes.items(), key=lambda kv: -kv[1])),
                 f"scope: {out.scope} — culprit {'rank ' + str(lf.rank) if lf.rank is not None else 'not localised'}",
                 f"action: {out.action} — the class's default (nothing more specific is known)"]
    out.candidates = [{"class": k, "rule": "lexical", "votes": n} for k, n in
                      sorted(votes.items(), key=lambda kv: -kv[1]) if k != cls][:3]
    return out
