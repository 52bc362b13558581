"""Did the fault bite? The measured effect of every injection, against a reference measured in
the same run.

A drill whose fault did nothing proves nothing: a "tolerated" slow disk that was not slow, a
stress that took no CPU, a loss rule that dropped no packet. :func:`measure_effect` returns,
for one injected fault, what it did to the job — extra step time, checkpoint save time,
packets dropped, bytes delayed, memory taken, a value changed, a process ended — next to the
same quantity measured just before the fault in the same run (``reference``) and that
reference's noise. A time-like effect *bites* when it exceeds twice the noise:

* extra step time: ``Σ (t_i − m)`` over the steps that ran during the fault, where ``m`` is
  the median and ``σ = 1.4826·MAD`` the robust spread of the same rank's last
  :data:`REF_STEPS` steps before it; noise of the sum over ``n`` steps ``σ·√n``; and the
  median of those steps must exceed ``m`` by twice its standard error ``1.25·σ/√n`` (step
  times have heavy tails: one pause among calm steps lifts the sum, not the median); and
  when at least :data:`MIN_AFTER_STEPS` steps ran after the fault, their median must be
  below the fault's by the same margin (a drifting machine load slows them all alike);
* checkpoint save time: the first save after the fault vs the median and ``σ`` of the saves
  before it (at least :data:`MIN_REF_SAVES`);
* counters (packets dropped, packets held by the shaper, bytes delayed) are 0 without the
  fault: they bite at :data:`MIN_COUNT` or more.

The evidence comes from the run directory only: ``step`` and ``ckpt.saved`` events and the
measurements the injectors write into their ``inject.*`` events (``titan.chaos.oslevel``).
Cost: linear scans of the events.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from typing import Any, Sequence

from titan.chaos.plan import FaultSpec
from titan.events import Event

__all__ = ["Effect", "measure_effect", "REF_STEPS", "NOISE_FACTOR", "MIN_REF_SAVES", "MIN_COUNT"]

REF_STEPS = 20
NOISE_FACTOR = 2.0
MIN_REF_SAVES = 2
MIN_COUNT = 2
#: Floor of a reference's spread, relative to its median: a run of identical step times
#: (MAD 0) would otherwise call a 1 % wiggle "twice the noise".
REL_NOISE_FLOOR = 0.02
#: Steps after a fault (starting this long after its end, at least this many) that must be
#: faster than those during it, when the run has them.
AFTER_GAP_S = 0.5
MIN_AFTER_STEPS = 3
#: Smallest slowdown of the typical (median) step that counts as a fault's effect, relative
#: to the reference median: a calm reference's standard error is tiny, and a 9 % drift of the
#: box under a switched-off stress once passed it (CI); real faults slow steps ≥ 1.35×.
REL_MIN_SHIFT = 0.20
#: Standard error of a median over ``n`` normal samples: ``√(π/2)·σ/√n``.
_MEDIAN_SE = math.sqrt(math.pi / 2)


@dataclasses.dataclass
class Effect:
    """What one fault measurably did (``bit``: beyond ``NOISE_FACTOR`` × the noise)."""

    what: str
    value: float | None
    reference: float | None
    noise: float | None
    unit: str
    bit: bool
    text: str

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _sigma(xs: Sequence[float]) -> float:
    m = statistics.median(xs)
    mad = statistics.median(abs(x - m) for x in xs)
    return max(1.4826 * mad, REL_NOISE_FLOOR * abs(m), 1e-4)


def _steps(evs: Sequence[Event]) -> list[Event]:
    return [e for e in evs if e.kind == "step" and e.step is not None and "step_time_s" in e.data]


def _clean(e: Event) -> bool:
    return not (e.data.get("skipped") or e.data.get("replay") or e.data.get("replayed"))


def _process(steps: Sequence[Event], t0: float, rank: int) -> int | None:
    """The pid of ``rank``'s worker at time ``t0`` (its last step before): effects are measured
    within one process, so a restart or a resubmission never mixes in."""
    return next((e.pid for e in reversed(steps) if e.t < t0 and (e.rank or 0) == rank), None)


def _reference(steps: Sequence[Event], t0: float, rank: int, pid: int | None) -> list[float]:
    """Step times of ``rank``'s process ``pid`` just before ``t0`` (clean steps only)."""
    ref = [float(e.data["step_time_s"]) for e in steps if e.t < t0 and _clean(e) and (e.rank or 0) == rank
           and (pid is None or e.pid == pid)]
    return ref[-REF_STEPS:]


def _extra_step_time(steps: Sequence[Event], inj: Event, t_end: float, *, rank: int | None,
                     skip_step: int | None, label: str) -> Effect:
    """Σ extra step time of ``rank``'s steps running during [inj.t, t_end] vs the reference."""
    r = 0 if rank is None else rank
    pid = _process(steps, inj.t, r)
    ref = _reference(steps, inj.t, r, pid)
    during = [float(e.data["step_time_s"]) for e in steps if (e.rank or 0) == r and e.t >= inj.t
              and e.t - float(e.data["step_time_s"]) <= t_end and e.step != skip_step and e.pid == pid]
    if len(ref) < 5 or not during:
        return Effect(label, None, None, None, "s", False,
                      f"{label}: not measurable ({len(ref)} reference steps, {len(during)} during the fault)")
    m, sig = statistics.median(ref), _sigma(ref)
    extra = sum(d - m for d in during)
    noise = sig * math.sqrt(len(during))
    # Step times have heavy tails (a GC pause, a descheduled rank): one outlier among calm
    # steps can lift the sum past σ·√n. A fault that slows the job slows its typical step,
    # so the median must move too, by more than NOISE_FACTOR × its standard error.
    med = statistics.median(during)
    shift_noise = _MEDIAN_SE * sig / math.sqrt(len(during))
    typical = med - m >= max(NOISE_FACTOR * shift_noise, REL_MIN_SHIFT * m) and med > m
    # A box whose load drifts (other jobs) slows every step alike: the steps after the
    # fault are then as slow as those during it. A fault's slowdown ends with it.
    after = [float(e.data["step_time_s"]) for e in steps if (e.rank or 0) == r and e.pid == pid and _clean(e)
             and e.t - float(e.data["step_time_s"]) > t_end + AFTER_GAP_S][:REF_STEPS]
    ma = statistics.median(after) if len(after) >= MIN_AFTER_STEPS else None
    ended = ma is None or med - ma >= NOISE_FACTOR * shift_noise
    sums = extra >= NOISE_FACTOR * noise and extra > 0
    bit = sums and typical and ended
    why = ("" if bit or not sums else "; the median step did not slow: outliers, not an effect" if not typical
           else f"; as slow after it ({ma:.3f} s median): the box's load, not the fault")
    return Effect(label, round(extra, 4), round(m, 4), round(noise, 4), "s", bit,
                  f"{label} {extra:+.2f} s over {len(during)} steps (step {m:.3f} -> "
                  f"{med:.3f} s median; noise {noise:.3f} s){why}")


def _save_time(evs: Sequence[Event], f: FaultSpec, inj: Event) -> Effect:
    saves = [e for e in evs if e.kind == "ckpt.saved" and (e.rank or 0) == 0 and "total_s" in e.data]
    # By the step saved, not the event time: an async save finishes after later steps.
    pre = [float(e.data["total_s"]) for e in saves if int(e.data.get("step", e.step or 0)) < f.step]
    post = next((float(e.data["total_s"]) for e in saves if int(e.data.get("step", e.step or 0)) >= f.step
                 and e.t > inj.t), None)
    if len(pre) < MIN_REF_SAVES or post is None:
        return Effect("checkpoint save time", post, None, None, "s", False,
                      f"checkpoint save time: not measurable ({len(pre)} saves before, "
                      f"{'one' if post is not None else 'none'} after)")
    m, sig = statistics.median(pre), _sigma(pre)
    bit = post - m >= NOISE_FACTOR * sig and post > m
    return Effect("checkpoint save time", round(post, 3), round(m, 3), round(sig, 3), "s", bit,
                  f"checkpoint save {m:.2f} -> {post:.2f} s (noise {sig:.2f} s)")


def _count(label: str, n: Any, unit: str, extra: str = "") -> Effect:
    v = float(n) if isinstance(n, (int, float)) else None
    bit = v is not None and v >= MIN_COUNT
    txt = f"{label}: {int(v) if v is not None else 'not measured'} {unit}" + (f" ({extra})" if extra else "")
    return Effect(label, v, 0.0, 0.0, unit, bit, txt)


def _ended(evs: Sequence[Event], inj: Event, label: str) -> Effect:
    """The victim process made no step after the injection (it ended). The victim is the pid
    the driver signalled, or the worker that wrote the event (an in-process fault)."""
    victim = inj.data.get("pid") if inj.kind.startswith("inject.kill") else inj.pid
    steps = _steps(evs)
    later = [e for e in steps if e.t > inj.t + 0.2 and e.pid == victim]
    # No step after the grace is not enough: a victim left alive that was just finishing
    # (the last steps can all land within 0.2 s) ends too. It failed, or it stopped short.
    rank = inj.data.get("rank", inj.rank)
    failed = any(e.kind == "worker.failed" and e.t >= inj.t and (
        e.data.get("pid") == victim if e.data.get("pid") is not None else e.data.get("global_rank") == rank)
        for e in evs)
    mine = [e.step for e in steps if e.pid == victim and e.step is not None]
    short = bool(mine) and max(mine) < max(e.step for e in steps if e.step is not None)
    bit = victim is not None and not later and (failed or short)
    return Effect(label, float(len(later)), 0.0, 0.0, "steps", bit,
                  f"{label}: {'no' if bit else len(later)} step(s) of pid {victim} after it")


def _value_change(inj: Event, label: str) -> Effect:
    d = inj.data
    before, after = d.get("before"), d.get("after")
    if before is None or after is None:
        return Effect(label, None, None, None, "", False, f"{label}: the injector recorded no before/after value")
    try:
        b, a = float(before), float(after)
    except (TypeError, ValueError):
        return Effect(label, None, None, None, "", False, f"{label}: unreadable before/after {before!r}/{after!r}")
    changed = (d.get("before_bits") != d.get("after_bits")) if "before_bits" in d else (
        not (a == b or (math.isnan(a) and math.isnan(b))))
    return Effect(label, a, b, 0.0, "", changed, f"{label}: {b:.6g} -> {a:.6g}")


def _loss_spike(steps: Sequence[Event], inj: Event) -> Effect:
    d = inj.data
    try:
        before, after = float(d["before"]), float(d["after"])
    except (KeyError, TypeError, ValueError):
        return _value_change(inj, "loss")
    if not math.isfinite(after):
        return Effect("loss", after, before, 0.0, "", True, f"loss {before:.4g} -> {after}")
    losses = [float(e.data["loss"]) for e in steps if e.t < inj.t and _clean(e) and isinstance(e.data.get("loss"), float)
              and math.isfinite(e.data["loss"])][-REF_STEPS:]
    sig = _sigma(losses) if len(losses) >= 5 else abs(before) * 0.1
    bit = abs(after - before) >= NOISE_FACTOR * sig
    return Effect("loss", round(after, 4), round(before, 4), round(sig, 4), "", bit,
                  f"loss {before:.3g} -> {after:.3g} (step-to-step noise {sig:.3g})")


def _stall(steps: Sequence[Event], evs: Sequence[Event], inj: Event, rank: int, seconds: float) -> Effect:
    """No step of ``rank`` from the injection until the next one (or the restart / hang
    verdict that ended the attempt), against the same rank's step time before it."""
    nxt = next((e.t for e in steps if e.t > inj.t and (e.rank or 0) == rank), None)
    restart = next((e.t for e in evs if e.kind in ("launcher.restart", "hang.detected") and e.t > inj.t), None)
    stop = min(x for x in (nxt, restart, inj.t + seconds if seconds > 0 else None, math.inf) if x is not None)
    ref = _reference(steps, inj.t, rank, _process(steps, inj.t, rank))
    if len(ref) < 5 or not math.isfinite(stop):
        return Effect("step stalled", None, None, None, "s", False, "step stalled: not measurable "
                      f"({len(ref)} reference steps)")
    m, sig = statistics.median(ref), _sigma(ref)
    stall = stop - inj.t
    return Effect("step stalled", round(stall, 3), round(m, 4), round(sig, 4), "s",
                  stall - m >= NOISE_FACTOR * sig and stall > 3 * m,
                  f"no step for {stall:.1f} s (step {m:.3f} s, noise {sig:.3f} s)")


def measure_effect(f: FaultSpec, inj: Event, evs: Sequence[Event], *, end: Event | None = None) -> Effect:
    """The measured effect of fault ``f`` whose ground truth is ``inj`` (see the module doc).

    ``end`` is the fault's end event (``inject.net_healed``, ``inject.stress_end``) when it
    has one: its data carries the injector's own measurements (packets dropped, …).
    """
    steps = _steps(evs)
    d, ed = inj.data, (end.data if end is not None else {})
    rank = f.rank if f.rank is not None else d.get("rank")
    kind = f.kind
    if kind in ("nan_grad",):
        return _value_change(inj, "gradient element")
    if kind in ("inf_loss", "spike"):
        return _loss_spike(steps, inj)
    # Deterministic in-process mutations: the injector says whether it applied it.
    if kind == "poison_sample":
        on = not d.get("noop")
        return Effect("loss", math.nan if on else None, None, 0.0, "", on,
                      "the batch's loss is NaN on every pass of the step" if on else "poison switched off")
    if kind == "bitflip":
        return _value_change(inj, f"bit {d.get('bit')} of {d.get('tensor')}[{d.get('index')}]")
    if kind == "gemm_perturb":
        on = not d.get("noop")
        return Effect("canary arithmetic", float(on), 0.0, 0.0, "", on,
                      "this rank's GEMM results are perturbed from now on" if on else "perturbation switched off")
    if kind == "node_loss":
        killed, files = len(d.get("pids") or []), int(d.get("deleted_files") or 0)
        bit = killed > 0 and files > 0 and not d.get("noop")
        return Effect("node lost", float(killed), 0.0, 0.0, "processes", bit,
                      f"{killed} process(es) of {d.get('lost_node')} SIGKILLed, {files} file(s) "
                      f"({int(d.get('deleted_bytes') or 0) >> 20} MiB) of its folder deleted")
    if kind in ("kill", "exception"):
        return _ended(evs, inj, "the rank ended")
    if kind == "preempt":
        fin = [e for e in evs if e.kind == "launcher.finished" and e.t > inj.t
               and e.data.get("exit_name") == "PREEMPTED"]
        return Effect("launchers preempted", float(len(fin)), 0.0, 0.0, "launchers", bool(fin),
                      f"{len(fin)} launcher(s) exited PREEMPTED after the SIGTERM")
    if kind == "hang":
        return _stall(steps, evs, inj, rank or 0, float(d.get("seconds") or 0))
    if kind == "slow":
        pid = inj.pid
        t_end = max((e.t for e in steps if e.pid == pid and e.step is not None
                     and f.step <= e.step < f.step + int(f.get("steps"))), default=inj.t)
        return _extra_step_time(steps, inj, t_end, rank=rank, skip_step=None, label="extra step time")
    if kind == "stress":
        t_end = inj.t + float(d.get("seconds") or f.get("seconds"))
        st = _extra_step_time(steps, inj, t_end, rank=None, skip_step=f.step, label="extra step time")
        if str(f.get("what")) != "cpu":
            taken = ed.get("memory_taken_bytes")
            want = float(d.get("bytes") or 0)
            if isinstance(taken, (int, float)):
                bit = taken >= 0.5 * want and taken > 0
                st = Effect("memory taken", float(taken), 0.0, 0.0, "bytes", bit or st.bit,
                            f"memory taken {taken / 2**20:.0f} MiB of {want / 2**20:.0f} MiB asked; {st.text}")
        return st
    if kind == "disk":
        what = str(f.get("what"))
        if what == "slow_fsync":
            return _save_time(evs, f, inj)
        if what == "enospc":
            free = d.get("free_after_bytes")
            filled = d.get("filled_bytes")
            bit = isinstance(free, (int, float)) and free < 1 << 20 and bool(filled)
            return Effect("disk filled", float(filled or 0), None, 0.0, "bytes", bit,
                          f"filled {int(filled or 0) >> 20} MiB, {free if free is not None else '?'} bytes left")
        return _count("bytes damaged", d.get("damaged_bytes"), "bytes", str(d.get("file", "")).rsplit("/", 1)[-1])
    if kind == "net":
        what = str(f.get("what"))
        t_end = end.t if end is not None else inj.t + float(d.get("seconds") or 0)
        st = _extra_step_time(steps, inj, t_end, rank=0, skip_step=f.step, label="extra step time")
        if what == "loss":
            c = _count("packets dropped", ed.get("dropped_packets"), "packets")
        elif what == "delay":
            c = _count("packets delayed", ed.get("delayed_packets"), "packets",
                       f"{int(ed.get('delayed_bytes') or 0)} bytes by {d.get('delay_ms')} ms")
        elif what == "bandwidth":
            c = _count("packets held by the shaper", ed.get("shaped_packets"), "packets", f"rate {d.get('rate')}")
        else:  # a partition: packets dropped; the collectives stall until the link heals (or the watchdog acts)
            c = _count("packets dropped", ed.get("dropped_packets"), "packets")
            st = _stall(steps, evs, inj, 0, float(d.get("seconds") or 0))
            c.bit = c.bit or st.bit
        c.text = f"{c.text}; {st.text}"
        return c
    return Effect("unknown", None, None, None, "", False, f"no effect measure for kind {kind}")
