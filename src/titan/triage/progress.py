"""What the progress lines say: slowdowns, loss spikes, divergence and NaN that persist.

Progress samples (``scan.Progress``: step, loss, grad norm, step time, throughput) are the
last ones of each file. Per rank (or per file when no rank is known), in step order:

- **straggler**: the step time grows ≥ 3× the rank's own median before the end;
- **slowdown**: a *level shift* — the last ≥ 2 samples run ≥ 3 % slower (step time up, or
  throughput/TFLOPs down) than every earlier one, by more than 3× the earlier samples'
  own spread. In a synchronous job the slowest device sets the pace, so with nothing else
  wrong this is the precursor of one degraded GPU/node;
- **loss spike**: a loss ≥ 1.5× the median of the samples before it; **divergence**: the loss
  rising over ≥ 3 consecutive samples to ≥ 1.3× where it started. Either is *recovered* when
  a later sample is back within 5 % of the level before it — a one-off (skip the step) —
  else it persists (the numbers went bad for good: a code/config-level cause);
- **grad-norm spike**: a grad norm ≥ 3× the median before it (a precursor);
- **non-finite run**: NaN/Inf loss or grad norm on ≥ 2 consecutive samples (persistent), or on
  one sample followed by finite ones (one-off).

Cost: linear in the number of samples (≤ 48 per file).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from typing import Iterable

from titan.triage.model import Finding
from titan.triage.scan import Progress

__all__ = ["series", "throughput_drops", "slowdown", "numerics", "SPIKE", "DIVERGE", "RECOVER", "SHIFT"]

SPIKE = 1.5  # a loss this many times the median before it
DIVERGE = 1.3  # a loss climbing over >= 3 samples to this many times where it started
RECOVER = 1.05  # back within 5 % of the level before the spike
SHIFT = 0.03  # a sustained slowdown of at least 3 %
GNORM_SPIKE = 3.0


def series(progress: Iterable[Progress]) -> dict[object, list[Progress]]:
    """Samples per rank (per file when the rank is unknown), in step order, one per step."""
    by: dict[object, dict[int, Progress]] = defaultdict(dict)
    for p in progress:
        key: object = p.rank if p.rank is not None else ("file", p.file)
        by[key].setdefault(p.step, p)
    return {k: [v[s] for s in sorted(v)] for k, v in by.items()}


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _mk(p: Progress, rule: str, role: str, cls: str | None, prio: int, text: str, order: int,
        **fields: object) -> Finding:
    return Finding(rule=rule, role=role, cls=cls, file=p.file, line=p.line, text=text, t=p.t,
                   rank=p.rank, priority=prio, order=(order, p.line), fields=dict(fields))


def throughput_drops(progress: list[Progress], order: int) -> list[Finding]:
    """A rank whose step time grew ≥ 3× its own median before the end: a straggler (precursor)."""
    out: list[Finding] = []
    for _, ps in series(p for p in progress if p.step_time is not None and p.step_time > 0).items():
        if len(ps) < 6:
            continue
        base = statistics.median(p.step_time for p in ps[: len(ps) // 2])  # type: ignore[misc]
        for i, p in enumerate(ps[len(ps) // 2:], start=len(ps) // 2):
            if base > 0 and all((q.step_time or 0) >= 3 * base for q in ps[i:i + 3]):
                out.append(_mk(p, "throughput_drop", "precursor", None, 35,
                               f"throughput drop on rank {p.rank}: step {p.step} took {p.step_time:.3g}s vs median "
                               f"{base:.3g}s", order, ratio=(p.step_time or 0) / base))
                break
    return out


def slowdown(progress: list[Progress], order: int) -> list[Finding]:
    """Sustained level shifts of step time (or throughput) at the end of a rank's samples."""
    out: list[Finding] = []
    for _, ps in series(progress).items():
        for attr, worse in (("step_time", 1.0), ("tput", -1.0)):
            vals = [(p, getattr(p, attr)) for p in ps if _finite(getattr(p, attr)) and getattr(p, attr) > 0]
            if len(vals) < 4:
                continue
            x = [v * worse for _, v in vals]  # larger = worse
            for k in range(2, min(len(vals) - 1, 12) + 1):  # the last k samples shifted, the rest before
                before, after = x[:-k], x[-k:]
                if len(before) < 2:
                    break
                med = statistics.median(before)
                spread = (max(before) - min(before)) / abs(med) if med else math.inf
                shift = (min(after) - max(before)) / abs(med) if med else 0.0
                if shift >= max(SHIFT, 3 * spread):
                    p = vals[-k][0]
                    rel = (statistics.median(after) - med) / abs(med)
                    what = "step time" if attr == "step_time" else "throughput"
                    out.append(_mk(p, "slowdown", "precursor", None, 30,
                                   f"sustained slowdown: {what} {'+' if worse > 0 else '-'}{rel:.1%} from step "
                                   f"{p.step} on (earlier samples within {spread:.1%} of each other)", order,
                                   shift=rel, samples=len(vals), metric=attr))
                    break
            else:
                continue
            break
    return out


def numerics(progress: list[Progress], order: int) -> list[Finding]:
    """Loss spikes/divergence (with whether they recovered), grad-norm spikes, non-finite runs."""
    out: list[Finding] = []
    for _, ps in series(progress).items():
        losses = [(p, p.loss) for p in ps if p.loss is not None]
        bad = [i for i, (_, v) in enumerate(losses) if not _finite(v)]
        if not bad:
            bad_g = [i for i, p in enumerate(ps) if p.gnorm is not None and not _finite(p.gnorm)]
        if bad:
            i0 = bad[0]
            persistent = any(b + 1 in bad for b in bad) or (i0 == len(losses) - 1 and i0 > 0 and len(bad) > 1)
            p = losses[i0][0]
            at_start = i0 == 0 and (p.step <= 1 or (p.epoch is not None and p.epoch <= 0.01))
            out.append(_mk(p, "loss_nonfinite_run", "precursor", "numerical", 30,
                           f"loss non-finite at step {p.step}" + (" and on every sample after it" if persistent and
                                                                 bad == list(range(i0, len(losses))) else
                                                                 (" on consecutive samples" if persistent else
                                                                  ", finite again afterwards")),
                           order, persistent=persistent, recovered=not persistent and bad[-1] < len(losses) - 1,
                           at_start=at_start))
        elif bad_g:
            persistent = any(b + 1 in bad_g for b in bad_g)
            p = ps[bad_g[0]]
            out.append(_mk(p, "gnorm_nonfinite_run", "precursor", "numerical", 25,
                           f"grad norm non-finite at step {p.step}" + (" on consecutive samples" if persistent else ""),
                           order, persistent=persistent,
                           at_start=bad_g[0] == 0 and (p.step <= 1 or (p.epoch is not None and p.epoch <= 0.01))))
        fin = [(p, v) for p, v in losses if _finite(v)]
        zeros = 0
        for j, (p, v) in enumerate(fin):  # the loss collapsing to exactly 0 and staying there
            zeros = zeros + 1 if v == 0.0 and j > 0 and (fin[j - zeros - 1][1] or 0) > 0 else (zeros + 1 if v == 0.0 and zeros else 0)
            if zeros == 3:
                q = fin[j - 2][0]
                out.append(_mk(q, "loss_collapse", "precursor", "numerical", 30,
                               f"loss collapsed to 0 from step {q.step} on (3+ samples): a masked NaN/underflow or "
                               "a broken loss", order, persistent=True))
                break
        spike = _loss_spike(fin, order)
        if spike is not None:
            out.append(spike)
        g = [(p, p.gnorm) for p in ps if _finite(p.gnorm) and p.gnorm and p.gnorm > 0]
        for i in range(1, len(g)):
            med = statistics.median(v for _, v in g[:i])  # type: ignore[misc]
            if med > 0 and g[i][1] >= GNORM_SPIKE * med:  # type: ignore[operator]
                p = g[i][0]
                out.append(_mk(p, "gnorm_spike", "precursor", "numerical", 32,
                               f"grad-norm spike at step {p.step}: {g[i][1]:.4g} vs median {med:.4g} before it",
                               order, ratio=g[i][1] / med))  # type: ignore[operator]
                break
    return out


def _loss_spike(fin: list[tuple[Progress, float | None]], order: int) -> Finding | None:
    vals = [float(v) for _, v in fin]  # type: ignore[arg-type]
    for i in range(1, len(vals)):
        med = statistics.median(vals[:i])
        start = i
        while start > 0 and vals[start - 1] < vals[start]:
            start -= 1
        rising = i - start >= 3 and vals[start] > 0 and vals[i] >= DIVERGE * vals[start]
        if med > 0 and (vals[i] >= SPIKE * med or rising):
            level = vals[start] if rising else med
            rest = vals[i + 1:]
            recovered = bool(rest) and min(rest) <= RECOVER * level
            p = fin[i][0]
            kind = "divergence" if rising and vals[i] < SPIKE * med else "loss spike"
            return _mk(p, "loss_spike", "cause", "numerical", 40,
                       f"{kind} at step {p.step}: loss {vals[i]:.4g} vs {level:.4g} before it"
                       + ("; back to that level later (one-off)" if recovered else
                          ("; still above it at the last sample" if rest else "; no later sample")),
                       order, ratio=vals[i] / level, recovered=recovered, later=len(rest), kind=kind)
    return None
