"""Everything the report shows, gathered from one run directory (events + accounting)."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
from collections import defaultdict
from typing import Any

from titan.events import Event, RunDir, read_run
from titan.sla.accounting import Accounting, account, corrected_events
from titan.sla.steps import event_attempt

__all__ = ["RunData", "collect", "triage_verdict", "NOTABLE_LEVELS"]

log = logging.getLogger(__name__)
NOTABLE_LEVELS = ("warning", "error", "critical")
#: Seconds of node telemetry shown either side of an incident.
TELEMETRY_WINDOW_S = 60.0


@dataclasses.dataclass
class RunData:
    """The report's inputs for one run."""

    rd: RunDir
    run_json: dict[str, Any]
    events: list[Event]
    problems: list[str]
    acc: Accounting
    triage: dict[str, Any] | None
    ranks: list[int]
    clock_offsets: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return not self.acc.outcome.get("succeeded") or any(i.kind in ("restart", "fatal") for i in self.acc.incidents)


def _finite(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def triage_verdict(run_dir: RunDir) -> dict[str, Any]:
    """Ask ``titan.triage`` for a verdict when it is installed; never raises.

    Tries the public entry points the triage package may offer, in order; the result is
    a plain dict with at least ``available`` (bool) and either the verdict or ``reason``.
    """
    try:
        mod = importlib.import_module("titan.triage")
    except Exception as e:  # noqa: BLE001 - an optional part may fail to import in many ways
        return {"available": False, "reason": f"titan.triage not importable: {type(e).__name__}: {e}"}
    for name in ("triage_run", "triage", "diagnose", "analyze", "run_triage"):
        fn = getattr(mod, name, None)
        if not callable(fn):
            continue
        try:
            try:
                res = fn([run_dir.path])  # titan.triage.triage(paths) takes a list of inputs
            except TypeError:
                res = fn(run_dir.path)
        except Exception as e:  # noqa: BLE001 - the report must render whatever triage does
            log.warning("triage failed on %s: %s", run_dir.path, e)
            return {"available": True, "reason": f"triage raised {type(e).__name__}: {e}"}
        if hasattr(res, "to_dict"):
            res = res.to_dict()
        elif dataclasses.is_dataclass(res) and not isinstance(res, type):
            res = dataclasses.asdict(res)
        if not isinstance(res, dict):
            res = {"verdict": str(res)}
        return {"available": True, "entry_point": f"titan.triage.{name}", **res}
    return {"available": False, "reason": "titan.triage has no triage entry point (triage_run/diagnose)"}


def collect(path: str | RunDir, *, run_triage: bool = True) -> RunData:
    """Read a run directory and account it. Raises ``UserError`` for a non-run directory."""
    from titan.errors import UserError

    rd = path if isinstance(path, RunDir) else RunDir.open(path)
    res = read_run(rd)
    if not res.events:
        raise UserError(f"{rd.path} has no events", "run something with `titan run` first")
    run_json = rd.read_run_json()
    events = corrected_events(res)
    acc = account(events, run_json, run_dir=str(rd.path))
    ranks = sorted({ev.rank for ev in events if ev.rank is not None})
    data = RunData(rd=rd, run_json=run_json, events=events,
                   problems=[f"{p.source}:{p.line}: {p.reason}" for p in res.problems], acc=acc, triage=None,
                   ranks=ranks, clock_offsets=dict(res.clock_offsets))
    if data.failed:
        data.triage = triage_verdict(rd) if run_triage else {"available": False, "reason": "skipped (--no-triage)"}
    return data


def step_times_by_rank(events: list[Event]) -> dict[int, list[tuple[int, float, int]]]:
    """rank → [(step, step_time_s, attempt)] from ``step`` events."""
    out: dict[int, list[tuple[int, float, int]]] = defaultdict(list)
    for ev in events:
        if ev.kind == "step" and ev.step is not None:
            st = _finite(ev.data.get("step_time_s"))
            if st is not None:
                out[ev.rank if ev.rank is not None else 0].append((ev.step, st, event_attempt(ev)))
    return dict(out)


def phase_spans(events: list[Event], t0: float) -> list[dict[str, Any]]:
    """Per rank and attempt, spans of consecutive events in the same ``phase`` (relative s)."""
    per: dict[tuple[int, int], list[Event]] = defaultdict(list)
    for ev in events:
        if ev.rank is not None and not ev.kind.startswith("agent."):
            per[(ev.rank, event_attempt(ev))].append(ev)
    spans: list[dict[str, Any]] = []
    for (rank, att), evs in sorted(per.items()):
        evs.sort(key=lambda e: e.t)
        cur: dict[str, Any] | None = None
        for ev in evs:
            ph = ev.phase or ("train" if ev.kind == "step" else None) or (cur["phase"] if cur else "start")
            if cur and cur["phase"] == ph:
                cur["t1"] = ev.t - t0
                continue
            if cur:
                cur["t1"] = ev.t - t0
                spans.append(cur)
            cur = {"rank": rank, "attempt": att, "phase": ph, "t0": ev.t - t0, "t1": ev.t - t0}
        if cur:
            spans.append(cur)
    return spans


def _metric_files(d: "RunData") -> list[tuple[float, str, dict[str, float]]]:
    """``metrics/agent.<node>.jsonl`` (the agent's 1 Hz compact samples) as (t, node, snapshot)."""
    files = sorted(d.rd.metrics.glob("agent.*.jsonl")) if d.rd.metrics.is_dir() else []
    if not files:
        return []
    try:  # the agent's own reader (delta-encoded lines); the report renders without it
        from titan.monitor.samples import read_samples
    except Exception as e:  # noqa: BLE001 - an optional capability may fail to import in many ways
        log.warning("cannot read agent metric files: %s", e)
        return []
    out = []
    for f in files:
        node = f.name[len("agent."):-len(".jsonl")]
        off = d.clock_offsets.get(node, 0.0)
        try:
            out.extend((t - off, node, m) for t, m in read_samples(f))
        except OSError as e:
            log.warning("cannot read %s: %s", f, e)
    return out


def telemetry(events: list[Event], acc: Accounting, d: "RunData | None" = None) -> dict[str, Any]:
    """Numeric agent series (metric files, else ``agent.sample`` events) and alerts, cut to
    ±``TELEMETRY_WINDOW_S`` around each interruption (the whole run when there was none)."""
    samples = [ev for ev in events if ev.kind == "agent.sample"]
    rows = _metric_files(d) if d is not None else []
    source = "metrics/agent.*.jsonl" if rows else "agent.sample events"
    if not rows:
        rows = [(ev.t, ev.node, ev.data.get("m") or {}) for ev in samples]
    alerts = [ev for ev in events if ev.kind in ("agent.alert", "agent.xid", "agent.kernel")]
    incidents = [i for i in acc.incidents if i.kind in ("restart", "fatal")] or acc.incidents
    windows = [(i.onset_t - TELEMETRY_WINDOW_S, i.detect_t + TELEMETRY_WINDOW_S) for i in incidents]

    def inside(t: float) -> bool:
        return not windows or any(a <= t <= b for a, b in windows)

    series: dict[str, dict[str, list]] = defaultdict(lambda: {"x": [], "y": []})
    for t, node, snap in rows:
        if not inside(t):
            continue
        for k, v in snap.items():
            fv = _finite(v)
            if fv is not None:
                s = series[f"{node}: {k}"]
                s["x"].append(t - acc.t0)
                s["y"].append(fv)
    # Keep the series that moved most (relative range), at most 12, so the plot stays readable.
    def spread(s: dict[str, list]) -> float:
        ys = s["y"]
        return (max(ys) - min(ys)) / (abs(sum(ys) / len(ys)) + 1e-9) if ys else 0.0

    keep = sorted(series, key=lambda k: -spread(series[k]))[:12]
    return {
        "series": {k: series[k] for k in sorted(keep)},
        "alerts": [{"t": ev.t - acc.t0, "node": ev.node, "kind": ev.kind, "msg": ev.msg, "level": ev.level}
                   for ev in alerts if inside(ev.t)],
        "windows": [(a - acc.t0, b - acc.t0) for a, b in windows],
        "n_samples": len(rows), "source": source,
    }
