"""What the guard does once it has decided: events, skip, apply, strike, escalate.

Every function here runs on every rank with the same inputs, so the same branch is taken
everywhere; events that describe the job (``guard.nonfinite``, ``guard.spike``,
``guard.replay``, ``guard.skip``, ``guard.escalate``, ``guard.rollback``) are written by
rank 0, ``guard.strike`` by the culprit rank itself (its event carries its own node).

What happens to the optimizer, the LR scheduler and a GradScaler on a skipped step:

* the optimizer does not step (no parameter, moment or step-count change) and the
  gradients are zeroed (``set_to_none``);
* the scheduler does not step unless ``guard.step_scheduler_on_skip`` — the schedule
  counts applied updates;
* a GradScaler backs off exactly as without Titan when the step was non-finite (its
  ``found_inf`` is forced on every rank, so FSDP2 shards agree); on a spike skip the
  scaler is left untouched (no unscale, no growth-tracker change).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any, Callable

import torch

from titan.errors import TitanAbort, TitanError
from titan.exitcodes import ExitCode

if TYPE_CHECKING:  # pragma: no cover
    from titan.guard.core import StepGuard, StepResult
    from titan.guard.decision import Observation, Verdict

__all__ = ["apply", "skip", "describe_culprit", "report_fault", "report_replay", "report_verify",
           "report_norm_mismatch", "maybe_escalate",
           "rollback", "lower_lr", "effective_lr", "unguarded_step"]

log = logging.getLogger(__name__)


def _emit(g: "StepGuard", kind: str, msg: str, *, level: str = "warning", step: int | None = None,
          data: dict[str, Any] | None = None, everywhere: bool = False) -> None:
    if level in ("warning", "error", "critical"):
        log.warning("%s: %s", kind, msg)
    if g.events is not None and (everywhere or g.rank == 0):
        g.events.emit(kind, msg, level=level, step=step, data=data or {})


def describe_culprit(v: "Verdict", info: list[dict[str, Any]]) -> dict[str, Any]:
    """The culprit record for events and the ``step`` event: ranks, nodes, params."""
    culprits = []
    for r in v.ranks:
        bad = info[r]["bad_units"]
        culprits.append({"rank": r, "node": info[r]["node"], "params": [u for u, _, _ in bad],
                         "buckets": sorted({b for _, b, _ in bad}), "values": sorted({k for _, _, k in bad}),
                         "samples": info[r]["samples"]})
    return {"reason": v.kind, "ranks": list(v.ranks), "nodes": sorted({c["node"] for c in culprits}),
            "params": sorted({p for c in culprits for p in c["params"]}), "culprits": culprits,
            "origin": v.detail.get("origin", "local")}


def report_fault(g: "StepGuard", s: int, v: "Verdict", obs: "Observation", culprit: dict[str, Any]) -> None:
    kind = "guard.nonfinite" if v.kind == "nonfinite" else "guard.spike"
    who = ", ".join(f"rank {c['rank']} ({c['node']}" + (f": {', '.join(c['params'][:4])}" if c["params"] else "")
                    + ")" for c in culprit["culprits"]) or "no single rank (values appeared in the collective)"
    _emit(g, kind, f"step {s}: {v.kind} from {who}", step=s, data={
        "step": s, "reason": v.kind, **culprit, "grad_norm": _j(obs.grad_norm),
        "losses": [_j(x) for x in obs.losses], "detail": v.detail})


def report_replay(g: "StepGuard", s: int, first: "Verdict", again: "Verdict", res: "StepResult",
                  info: list[dict[str, Any]]) -> None:
    """Emit ``guard.replay``; on a transient fault strike each culprit's node."""
    cls = res.classification
    samples = {r: info[r]["samples"] for r in first.ranks}
    _emit(g, "guard.replay", f"step {s}: {first.kind} replayed -> {cls}"
          + (" (finite at loss scale 1: the scaler's overflow)" if cls == "overflow" else "")
          + (f"; samples {samples}" if cls == "persistent" else ""), step=s,
          data={"step": s, "first": first.kind, "replay": again.kind, "classification": cls,
                "ranks": list(first.ranks), "samples": {str(r): v for r, v in samples.items()}})
    if cls != "transient":
        return
    for r in first.ranks:
        node = info[r]["node"]
        g.strikes[node] = g.strikes.get(node, 0) + 1
        n = g.strikes[node]
        if g.rank == r:
            reported = n >= g.policy.strikes_to_report
            _emit(g, "guard.strike", f"strike {n} against node {node} (rank {r}): transient {first.kind} at step {s}",
                  level="error" if reported else "warning", step=s, everywhere=True,
                  data={"node": node, "rank": r, "reason": first.kind, "step": s, "strikes": n,
                        "reported": reported})


def report_verify(g: "StepGuard", s: int, obs: "Observation", obs2: "Observation", match: bool) -> None:
    """Emit the outcome of a requested verification replay (``guard.replay``, ``verify``)."""
    diff = [r for r in range(len(obs.losses))
            if obs.losses[r] != obs2.losses[r] or obs.local_norms[r] != obs2.local_norms[r]]
    _emit(g, "guard.replay", f"step {s}: verification replay {'matches' if match else 'DIFFERS on ranks ' + str(diff)}",
          level="info" if match else "warning", step=s,
          data={"step": s, "verify": True, "match": match, "ranks": diff,
                "losses": [[_j(a), _j(b)] for a, b in zip(obs.losses, obs2.losses)],
                "local_norms": [[_j(a), _j(b)] for a, b in zip(obs.local_norms, obs2.local_norms)]})


def report_norm_mismatch(g: "StepGuard", s: int, norms: tuple[float, ...]) -> None:
    """Ranks computed different global norms from the same reduced gradients (a premise of
    riding DDP's all-reduce, :mod:`titan.guard.ddp`): from now on the guard exchanges rank 0's."""
    _emit(g, "guard.norm_mismatch", f"step {s}: ranks computed different gradient norms from the same reduced "
          "gradients; the guard exchanges the norm separately from now on", level="error", step=s,
          data={"step": s, "norms": [_j(x) for x in norms]})


def skip(g: "StepGuard", s: int, v: "Verdict", res: "StepResult") -> None:
    """Skip the update identically on every rank (see the module docstring)."""
    res.skipped = True
    g.skipped_total += 1
    if g.scaler is not None and v.kind in ("nonfinite", "overflow"):
        _scaler_backoff(g)
    g.optimizer.zero_grad(set_to_none=True)
    if g.scheduler is not None and g.policy.step_scheduler_on_skip:
        g.scheduler.step()
    level = "info" if v.kind == "overflow" else "warning"
    _emit(g, "guard.skip", f"step {s} skipped ({v.kind}{', ' + res.classification if res.classification else ''})",
          level=level, step=s, data={"step": s, "reason": v.kind, "classification": res.classification,
                                     "consecutive": g.escalator.consecutive_skips + 1})


def _scaler_backoff(g: "StepGuard") -> None:
    sc, opt = g.scaler, g.optimizer
    sc.unscale_(opt)
    # Force found_inf everywhere: after a clean replay, or on an FSDP2 shard that held no
    # NaN, the local check would disagree and the scales would diverge across ranks.
    for t in sc._per_optimizer_states[id(opt)]["found_inf_per_device"].values():
        t.fill_(1.0)
    sc.update()


def apply(g: "StepGuard", obs: "Observation") -> None:
    """Clip with the exchanged norm and step optimizer, scaler and scheduler."""
    assert g.check is not None
    if g.scaler is not None:
        g.scaler.unscale_(g.optimizer)
    if g.max_norm is not None:
        total = obs.norm_t
        if g.scaler is not None:
            total = total / g.scaler._scale.to(total.device)
        if g.check.mode == "fsdp2":
            coef = torch.clamp(g.max_norm / (total + 1e-6), max=1.0)
            grads = g.check.grads()
            if grads:
                torch._foreach_mul_(grads, coef.to(grads[0].device))
        else:
            torch.nn.utils.clip_grads_with_norm_(g.check.params, g.max_norm, total)
    _optimizer_and_schedule(g)
    g.loss_stats.add(obs.losses)
    if obs.norm_exchanged:
        g.grad_stats.add([obs.grad_norm])
    else:  # each rank's own norm: it enters the statistics once exchanged, with the next step
        g._pending_norm = (obs.raw_norm, obs.scale)


def maybe_escalate(g: "StepGuard", s: int, res: "StepResult") -> None:
    """Climb the ladder when due. Raises ``TitanAbort(GAVE_UP)`` on the abort rung."""
    reason = g.escalator.due(s)
    while reason:
        rung = g.escalator.next_rung()
        res.escalation = rung
        if rung == "abort":
            msg = f"the step guard gave up at step {s}: {reason} (escalation level {g.escalator.level})"
            _emit(g, "guard.escalate", msg, level="critical", step=s, everywhere=True,
                  data={"step": s, "action": rung, "reason": reason, "level": g.escalator.level,
                        "exit_code": int(ExitCode.GAVE_UP)})
            raise TitanAbort(msg, int(ExitCode.GAVE_UP))
        if rung == "lower_lr":
            lower_lr(g)
            _emit(g, "guard.escalate", f"step {s}: {reason} -> learning rate x{g.policy.lr_factor:g} "
                  f"(now x{g.lr_scale:g})", level="error", step=s,
                  data={"step": s, "action": rung, "reason": reason, "level": g.escalator.level,
                        "lr_scale": g.lr_scale,
                        "lr": [_j(float(x["lr"]) * g.lr_scale) for x in g.optimizer.param_groups]})
            return
        _emit(g, "guard.escalate", f"step {s}: {reason} -> {rung}", level="error", step=s,
              data={"step": s, "action": rung, "reason": reason, "level": g.escalator.level})
        restored = rollback(g, reason)
        if restored is not None:
            res.rolled_back_to = restored
            return
        reason = f"{reason}; rollback unavailable"


def rollback(g: "StepGuard", reason: str) -> int | None:
    """Restore the in-memory snapshot through the wired hook (collective); None if unavailable."""
    if g._rollback is None:
        _emit(g, "guard.rollback", f"rollback requested ({reason}) but no snapshot hook is wired",
              level="warning", step=g.step_count, data={"reason": reason, "restored_step": None})
        return None
    keep = {"escalator": g.escalator.state_dict(), "strikes": dict(g.strikes), "lr_scale": g.lr_scale}
    g._keep_on_load = keep
    try:
        restored = int(g._rollback())
    except TitanError as e:
        _emit(g, "guard.rollback", f"rollback failed: {e}", level="error", step=g.step_count,
              data={"reason": reason, "restored_step": None, "error": str(e)})
        return None
    finally:
        g._keep_on_load = None
    g.escalator.load_state_dict(keep["escalator"])
    g.strikes, g.lr_scale = keep["strikes"], keep["lr_scale"]
    g.step_count = restored
    _emit(g, "guard.rollback", f"rolled back to step {restored} ({reason})", level="error", step=restored,
          data={"reason": reason, "restored_step": restored})
    return restored


def lower_lr(g: "StepGuard") -> None:
    """Lower the learning rate by ``lr_factor`` from now on: ``g.lr_scale`` multiplies every
    param group's rate at each update (:func:`_optimizer_and_schedule`), whatever set it — a
    scheduler or the loop by hand — and is saved with the guard's state."""
    g.lr_scale *= g.policy.lr_factor


def effective_lr(g: "StepGuard") -> float | None:
    """The first param group's learning rate as the next update uses it (× ``lr_scale``)."""
    try:
        return float(g.optimizer.param_groups[0]["lr"]) * g.lr_scale
    except (IndexError, KeyError, TypeError, ValueError):
        return None


def _scaled_lr(g: "StepGuard") -> list[Any]:
    """Multiply each group's rate by ``lr_scale`` for one update; returns what to put back."""
    saved: list[Any] = []
    for group in g.optimizer.param_groups:
        lr = group["lr"]
        if isinstance(lr, torch.Tensor):
            saved.append(lr.clone())
            lr.mul_(g.lr_scale)
        else:
            saved.append(lr)
            group["lr"] = lr * g.lr_scale
    return saved


def _restore_lr(g: "StepGuard", saved: list[Any]) -> None:
    for group, lr in zip(g.optimizer.param_groups, saved):
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].copy_(lr)
        else:
            group["lr"] = lr


def unguarded_step(g: "StepGuard", fwd_bwd: Callable[[], Any], s: int) -> "StepResult":
    """``guard.enabled = false``: the plain recipe (clip, step, schedule), no checks."""
    from titan.guard.core import StepResult

    loss = fwd_bwd()
    lr = effective_lr(g)
    params = [p for p in g.model.parameters() if p.grad is not None]
    if g.scaler is not None:
        g.scaler.unscale_(g.optimizer)
    if g.max_norm is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, g.max_norm)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    _optimizer_and_schedule(g)
    g.step_count = s
    lf = float(loss) if not isinstance(loss, torch.Tensor) else float(loss.detach().float())
    return StepResult(step=s, loss=lf, loss_mean=lf, grad_norm=float(norm), skipped=False, lr=lr)


def _j(x: float) -> float | str:
    """JSON-safe float (events are strict JSON)."""
    return x if math.isfinite(x) else str(x)


def _optimizer_and_schedule(g: "StepGuard") -> None:
    """The update itself: scaler (when any) or optimizer step — at ``lr_scale`` × the rate the
    loop or its scheduler set, which is put back afterwards — then the scheduler."""
    saved = _scaled_lr(g) if g.lr_scale != 1.0 else None
    try:
        if g.scaler is not None:
            g.scaler.step(g.optimizer)
            g.scaler.update()
        else:
            g.optimizer.step()
    finally:
        if saved is not None:
            _restore_lr(g, saved)
    if g.scheduler is not None:
        g.scheduler.step()
