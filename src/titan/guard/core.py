"""``StepGuard``: check, decide, replay, step or skip — once per optimizer step, on every rank alike.

After the backward, the loop hands the guard the step's loss — the loop keeps its shape,
gradient accumulation with ``no_sync`` / ``require_backward_grad_sync`` included::

    guard = StepGuard(ddp_model, optimizer, scheduler=sched, scaler=scaler, max_norm=1.0, ctx=titan_ctx)
    for x, y in loader:
        optimizer.zero_grad()
        loss = loss_fn(ddp_model(x), y)
        loss.backward()                  # or scaler.scale(loss).backward()
        res = guard.step(loss)           # replaces clip_grad_norm_ / optimizer.step / scheduler.step

Or, before each backward, it hands the guard the micro-batch's loss (``guard.add_loss(loss)``)
and calls ``guard.step()`` after the last one: under DDP the verdict's exchange then rides
the gradients' own all-reduce (no second synchronisation per step; ``titan.guard.ddp``) —
what the framework integrations do (``titan.integrations``).

Or it hands a closure that zeroes the gradients and runs forward/backward of every
micro-batch of one step — the guard can then *replay* a faulty step to tell a transient
from a persistent fault (``res = guard.step(fwd_bwd, samples=batch_indices)``).

``guard.step`` replaces ``clip_grad_norm_`` / ``optimizer.step`` / ``scaler.step`` /
``scaler.update`` / ``scheduler.step``; it also drives the progress beacon's phases, a
drill's injection points, DDP's warm-up after a restore and the ``step`` event
(:mod:`titan.guard.progress`). Design and measured costs: ``docs/guard.md``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from titan.beacon import get_beacon
from titan.guard import actions
from titan.guard.checks import make_check
from titan.guard.decision import Observation, Verdict, exchange, gather_objects, judge, observe, step_vector
from titan.guard.escalation import Escalator
from titan.guard.progress import StepProgress
from titan.guard.rng import capture_rng, restore_rng
from titan.guard.stats import RobustWindow

__all__ = ["StepGuard", "StepResult"]

log = logging.getLogger(__name__)


@dataclasses.dataclass
class StepResult:
    """What happened to one optimizer step (identical on every rank except ``loss``)."""

    step: int
    loss: float  # this rank's loss as returned by the closure
    loss_mean: float  # mean over ranks (NaN if any rank's loss was)
    grad_norm: float  # global norm of the reduced gradients before clipping (unscaled)
    skipped: bool
    reason: str | None = None  # nonfinite | overflow | loss_spike | grad_spike
    classification: str | None = None  # transient | persistent
    culprit: dict[str, Any] | None = None  # ranks, nodes, params
    rolled_back_to: int | None = None  # the loop must continue after this step
    escalation: str | None = None
    replay_match: bool | None = None  # set when a replay was requested for verification
    lr: float | None = None  # the learning rate this step used (after the guard's lr_scale)
    step_time_s: float | None = None  # from the step's first forward to the end of the update
    rode: bool = False  # the step's vector rode DDP's gradient all-reduce (no exchange after the backward)

    def event_data(self) -> dict[str, Any]:
        """Fields for the loop's ``step`` event."""
        d: dict[str, Any] = {"grad_norm": self.grad_norm, "skipped": self.skipped}
        if self.culprit:
            d["culprit"] = self.culprit
        if self.reason:
            d["guard"] = self.reason
        if self.rode:
            d["rode"] = True
        return d


class StepGuard:
    """Guards one model/optimizer pair; see the module docstring for the wiring.

    ``model``: a ``DistributedDataParallel`` (a comm hook is installed), a model sharded
    with FSDP2 ``fully_shard`` (custom reduce-scatters are installed) or a plain module.
    ``ctx`` (a ``titan.worker.WorkerContext``) supplies the policy (``settings.guard``),
    the event writer and the node name; ``policy``/``events``/``node`` override it.
    ``rollback``: a callable that restores the in-memory snapshot (collective) and returns
    the restored step — see :meth:`use_checkpointer`. ``step_events``: write one ``step``
    event per step (default; a loop with its own richer event calls :meth:`emit_step`).

    A loop that sets its learning rate by hand every step keeps doing so: the guard's
    LR-lowering escalation multiplies the rate *at the update* by :attr:`lr_scale` (saved
    with the guard's state) and puts the loop's value back afterwards.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, *, scheduler: Any = None,
                 scaler: Any = None, max_norm: float | None = None, policy: Any = None, ctx: Any = None,
                 events: Any = None, node: str | None = None, process_group: Any = None,
                 rollback: Callable[[], int] | None = None, step_events: bool = True) -> None:
        from titan.settings.guard import GuardConfig

        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.scaler = scaler if scaler is not None and getattr(scaler, "is_enabled", lambda: True)() else None
        self.max_norm = max_norm
        self.policy: GuardConfig = policy or (ctx.settings.guard if ctx is not None else GuardConfig())
        self.events = events if events is not None else (ctx.events if ctx is not None else None)
        self.node = node or (ctx.node if ctx is not None else "local")
        self.group = process_group
        self._rollback = rollback
        self.ctx = ctx
        p = self.policy
        self.step_count = 0
        # Before the check registers DDP's one comm hook: a drill's collective hang wraps it.
        self.progress = StepProgress(self, ctx, step_events=step_events)
        self.check = make_check(model, process_group) if p.enabled else None
        self._loss_sum: torch.Tensor | None = None  # add_loss: this step's losses so far
        self._loss_n = 0
        self._ride_loss: Any = None
        self._ride_units: torch.Tensor | None = None
        #: (norm, loss scale) of the last applied step whose norm each rank computed itself;
        #: exchanged with the next step's vector before it enters the statistics.
        self._pending_norm: tuple[float, float] | None = None
        self._ride_ok = True  # off for good once ranks' own norms were seen to differ
        #: rides in the step vector (``use_checkpointer``): ``step_flags(step)`` gives this
        #: rank's small integers, ``flags_agreed(step, sums)`` gets their sums over ranks
        self._passenger: Any = None
        if self.check is not None and hasattr(self.check, "ride"):
            self.check.ride = self._ride_vector
        self.progress.attach_faults()
        if self.events is not None:  # what `titan run`'s capability report reads
            self.events.emit("guard.armed", f"step guard {'on (' + self.check.mode + ')' if self.check else 'off'}",
                             data={"mode": self.check.mode if self.check else "off", "enabled": p.enabled,
                                   "replay": p.replay, "max_norm": max_norm})
        self.loss_stats = RobustWindow(p.spike_window, p.spike_warmup, rel_floor=p.spike_rel_floor)
        self.grad_stats = RobustWindow(p.spike_window, p.spike_warmup, rel_floor=p.spike_rel_floor, log=True)
        self.escalator = Escalator(k=p.persistent_k, window=p.persistent_window,
                                   max_consecutive_skips=p.max_consecutive_skips, ladder=p.escalation)
        self.skipped_total = 0
        self.strikes: dict[str, int] = {}
        self.lr_scale = 1.0
        self._verify_next = False
        self._keep_on_load: dict[str, Any] | None = None

    # --- wiring ---------------------------------------------------------------------
    @property
    def rank(self) -> int:
        from titan.guard.decision import _dist_world

        return _dist_world(self.group)[0]

    def use_checkpointer(self, checkpointer: Any, app_state: Mapping[str, Any] | None, *,
                         rollback: bool = True) -> None:
        """Wire a ``titan.checkpoint.Checkpointer`` (on every rank alike): escalation rolls back
        through ``checkpointer.rollback(app_state)`` (unless ``rollback=False``), and the flags
        its ``maybe_save`` agrees on every step (SIGTERM seen on a rank, save due) travel in
        this guard's step vector — riding DDP's all-reduce or in the guard's own exchange —
        so ``maybe_save`` after this step needs no all-reduce of its own. Cost: 3 more floats
        in the vector."""
        if rollback:
            if app_state is None:
                raise ValueError("use_checkpointer: rollback needs the app_state to restore")
            self._rollback = lambda: int(checkpointer.rollback(app_state))
        if hasattr(checkpointer, "step_flags") and hasattr(checkpointer, "flags_agreed"):
            self._passenger = checkpointer

    def request_replay(self) -> None:
        """Make the next :meth:`step` replay its batch and compare bitwise (for SDC checks).

        Calling it on one rank is enough: the request travels in the step's exchange, so
        every rank replays together. The result's ``replay_match`` says whether losses and
        per-rank gradient norms of the two passes were bitwise equal on every rank.
        """
        self._verify_next = True

    def rollback(self, reason: str) -> int | None:
        """Roll every rank back to the in-memory snapshot now (collective).

        Returns the restored step, or None when no rollback hook is wired. The guard's
        escalation counters and strikes survive the rollback; the loop must continue after
        the returned step (its data position is restored with the app state).
        """
        return actions.rollback(self, reason)

    # --- the loss --------------------------------------------------------------------
    def add_loss(self, loss: Any) -> None:
        """Count one micro-batch's loss toward the next :meth:`step` called without a loss
        (their mean is the step's loss). Given before the backward that reduces the
        gradients, it lets the verdict's exchange ride DDP's gradient all-reduce; given
        after, the guard exchanges it separately. Cost: one detach (no host sync)."""
        t = loss.detach().float().reshape(-1).mean() if isinstance(loss, torch.Tensor) else \
            torch.tensor(float(loss), dtype=torch.float32)
        self._loss_sum = t if self._loss_sum is None else self._loss_sum + t
        self._loss_n += 1

    def note_grad_norm(self, norm: Any) -> None:
        """The global norm of this step's reduced gradients as the loop computed it (the
        norm it clipped with, e.g. what ``clip_grad_norm_`` returned): the guard uses it
        instead of reading the gradients again (DDP and no wrapper). Call it after the
        backward, before :meth:`step`. Cost: none."""
        if self.check is not None and isinstance(norm, torch.Tensor):
            self.check.note_norm(norm)

    @property
    def loss_pending(self) -> bool:
        """True when :meth:`add_loss` counted a loss the next step has not used yet."""
        return self._loss_n > 0

    def _take_loss(self) -> torch.Tensor | float:
        if self._loss_sum is None:
            return 0.0  # no loss seen: the gradients are still checked
        loss = self._loss_sum / self._loss_n
        self._loss_sum, self._loss_n = None, 0
        return loss

    def _ride_vector(self) -> torch.Tensor | None:
        """This rank's step vector for DDP's last bucket (``titan.guard.ddp``), or None when
        the step's loss is not known yet (or the guard must not ride: a DDP warm-up pass)."""
        if self._loss_sum is None or not self._ride_ok or self.progress.warming_up:
            return None
        assert self.check is not None
        loss = self.progress.loss(self._loss_sum / self._loss_n)  # a drill's loss fault, once
        units = self.check.local_unit_norms()
        self._ride_loss, self._ride_units = loss, units
        return step_vector(loss.to(units.device), torch.linalg.vector_norm(units), None, partial_sq=False,
                           scale=self._scale(), verify=False, prev_norm=self._prev_norm(), group=self.group,
                           extra=self._extra())

    def _extra(self) -> Sequence[int]:
        """The passenger's slots for the step under way (the same count on every rank)."""
        return self._passenger.step_flags(self.step_count + 1) if self._passenger is not None else ()

    def _scale(self) -> torch.Tensor | None:
        return self.scaler._scale if self.scaler is not None and self.scaler._scale is not None else None

    def _prev_norm(self) -> float | None:
        return self._pending_norm[0] if self._pending_norm is not None else None

    def _settle(self, obs: Observation) -> None:
        """The previous step's norm, as every rank now holds it, enters the statistics (the
        same value everywhere: rank 0's); ranks that computed different norms end riding."""
        pend, self._pending_norm = self._pending_norm, None
        if pend is None:
            return
        prev = obs.prev_norms
        if len({repr(x) for x in prev}) > 1 and self._ride_ok:
            self._ride_ok = False
            actions.report_norm_mismatch(self, self.step_count, prev)
        self.grad_stats.add([prev[0] / pend[1] if pend[1] else prev[0]])

    def _grad_stats_state(self) -> dict[str, Any]:
        if self._pending_norm is None:
            return self.grad_stats.state_dict()
        import copy

        w = copy.deepcopy(self.grad_stats)
        norm, scale = self._pending_norm
        w.add([norm / scale if scale else norm])
        return w.state_dict()

    # --- the step -------------------------------------------------------------------
    def step(self, loss_or_fwd_bwd: Any = None, *,
             samples: Sequence[int] | Callable[[], Sequence[int]] | None = None) -> StepResult:
        """Run one optimizer step under guard.

        ``loss_or_fwd_bwd``: the step's loss (a tensor or float, after the loop's backward),
        None for the mean of the losses given to :meth:`add_loss` (0 if none), or a closure
        that zeroes the gradients, runs forward/backward of the step and returns the loss —
        only a closure lets the guard replay a faulty step (policy ``replay``) to classify it
        as transient or persistent; with a loss a faulty step is skipped unclassified. Cost
        on a clean step: the closure (if any), one pre-reduce read of the gradients (DDP at
        world > 1 and FSDP2; none without a wrapper), one all-reduce of ``3 + 3·world``
        floats (3 more with a checkpointer wired: :meth:`use_checkpointer`; none at world 1;
        under DDP with the loss given to :meth:`add_loss` before the backward, launched with
        the last gradient bucket's instead of after the backward), one read of the reduced
        gradients for their norm (DDP, unless noted: :meth:`note_grad_norm`) and one host
        read. On a faulty step: an all-gather of per-rank details and (a closure, policy
        ``replay``) one more forward/backward.
        ``samples``: this rank's dataset indices of the step (or a callable returning
        them, evaluated only on a faulty step), logged when a fault is persistent.
        Raises ``TitanAbort(exit_code=GAVE_UP)`` when the escalation ladder ends in abort.
        """
        res = self._step(loss_or_fwd_bwd, samples)
        self.progress.end(res)
        return res

    def _step(self, loss_or_fwd_bwd: Any, samples: Any) -> StepResult:
        s = self.step_count + 1
        fwd_bwd = loss_or_fwd_bwd if callable(loss_or_fwd_bwd) else None
        if self.check is None:
            self.progress.phase("optimizer")
            loss0 = self._take_loss() if loss_or_fwd_bwd is None else loss_or_fwd_bwd
            res = actions.unguarded_step(self, fwd_bwd or (lambda: loss0), s)
            return res
        rng0 = capture_rng() if fwd_bwd is not None else None  # ~20 µs; only a closure can be replayed
        loss, obs = self._run(fwd_bwd, verify=self._verify_next and fwd_bwd is not None, loss=loss_or_fwd_bwd)
        self._verify_next = False
        if self._passenger is not None:  # what every rank's maybe_save of this step agrees on
            self._passenger.flags_agreed(s, obs.extra)
        self._settle(obs)
        verify = obs.verify  # agreed through the exchange: all ranks replay or none
        verdict = self._judge(obs)
        res = StepResult(step=s, loss=obs.losses[self.rank], loss_mean=_mean(obs.losses), grad_norm=obs.grad_norm,
                         skipped=False, reason=verdict.kind, rode=not obs.norm_exchanged)
        apply_obs: Observation | None = obs
        if verdict.bad or verify:
            info = gather_objects({"rank": self.rank, "node": self.node,
                                   "samples": _samples(samples),
                                   "bad_units": self._bad_units(verdict)}, self.group)
            if verdict.bad:
                res.culprit = actions.describe_culprit(verdict, info)
                actions.report_fault(self, s, verdict, obs, res.culprit)
            if (self.policy.replay or verify) and fwd_bwd is not None:
                rng1 = capture_rng()
                restore_rng(rng0)
                _, obs2 = self._run(fwd_bwd)
                restore_rng(rng1)  # the RNG stream continues as if no replay had run
                v2 = self._judge(obs2)
                if verify:
                    res.replay_match = (obs2.losses == obs.losses and obs2.local_norms == obs.local_norms)
                    actions.report_verify(self, s, obs, obs2, res.replay_match)
                if verdict.bad:
                    res.classification = "persistent" if v2.bad else "transient"
                    if (v2.kind == "nonfinite" and verdict.kind == "nonfinite" and self.scaler is not None
                            and self._finite_unscaled(fwd_bwd, rng0)):
                        # fp16 overflow turns into NaN inside the backward (inf·0, inf−inf) and
                        # reproduces at the same scale; finite at scale 1 means: the scale.
                        res.classification, res.reason = "overflow", "overflow"
                    actions.report_replay(self, s, verdict, v2, res, info)
                    if res.classification == "transient" and self.policy.transient_action == "apply_replay" \
                            and v2.kind is None:
                        apply_obs, verdict = obs2, v2
                        res.grad_norm = obs2.grad_norm
                else:
                    apply_obs = obs2
            if verdict.bad:
                apply_obs = None
                if res.classification == "overflow":
                    verdict = Verdict("overflow", verdict.ranks, verdict.detail)
                elif res.classification != "transient":
                    self.escalator.record_persistent(s)
        if verdict.kind == "overflow":
            apply_obs = None
        if s in self.progress.skips and apply_obs is not None:  # a drill's clean reference run
            verdict, apply_obs = Verdict(self.progress.skips[s], (), {"planned": True}), None
        res.lr = actions.effective_lr(self)
        self.progress.phase("optimizer")
        if apply_obs is None:
            actions.skip(self, s, verdict, res)
        else:
            actions.apply(self, apply_obs)
        if fwd_bwd is None:
            self.check.begin_step()  # the next step's backward runs before its guard.step
        self.step_count = s
        if res.reason != "overflow":  # the scaler's normal business: neither a skip nor progress
            self.escalator.record_step(skipped=res.skipped)
        actions.maybe_escalate(self, s, res)
        return res

    def _run(self, fwd_bwd: Callable[[], Any] | None, verify: bool = False, loss: Any = None) -> tuple[Any, Observation]:
        assert self.check is not None
        if fwd_bwd is not None:
            self.check.begin_step()
            loss = fwd_bwd()
        self.progress.phase("comm")  # the one exchange is a collective
        if fwd_bwd is None and loss is None:
            # Rode DDP's last gradient bucket? Then it is summed (DDP waited for that bucket).
            ridden = self.check.take_ride() if hasattr(self.check, "take_ride") else None
            if ridden is not None:
                self._take_loss()
                units = self._ride_units
                self._last_units = lambda: units
                return self._ride_loss, observe(ridden, partial_sq=False, norm_t=self.check.norm_slot(),
                                                group=self.group)
            loss = self._take_loss()
        loss = self.progress.loss(loss)
        dev = self.check.device()
        loss_t = loss.detach() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss), device=dev)
        # Counted on the beacon like DDP's buckets: a rank stopped after its last bucket but
        # before this exchange is then behind in the sequence, and the watchdog names it
        # (uncounted, the peer waiting here looked like the one that stopped first).
        b = get_beacon()
        if b is not None:
            b.collective_issued(0)
        obs = exchange(loss_t.to(dev), self.check.local_norm(), self.check.norm_slot(),
                       partial_sq=self.check.norm_is_partial_sq, scale=self._scale(), verify=verify,
                       prev_norm=self._prev_norm(), group=self.group, extra=self._extra())
        if b is not None:
            b.collective_done(0)
        self._last_units = self.check.local_unit_norms  # read on a fault only
        return loss, obs

    def _finite_unscaled(self, fwd_bwd: Callable[[], Any], rng0: dict[str, Any]) -> bool:
        """Replay once more with the loss scale at 1 (RNG restored); True if finite everywhere."""
        sc = self.scaler
        saved = sc._scale.clone()
        rng1 = capture_rng()
        restore_rng(rng0)
        sc._scale.fill_(1.0)
        try:
            _, obs = self._run(fwd_bwd)
        finally:
            sc._scale.copy_(saved)
            restore_rng(rng1)
        return not obs.nonfinite

    def _judge(self, obs: Observation) -> Verdict:
        p = self.policy
        return judge(obs, loss_stats=self.loss_stats, grad_stats=self.grad_stats, spike_z=p.spike_z,
                     loss_spike=p.loss_spike, grad_spike=p.grad_spike, scaler=self.scaler is not None)

    def _bad_units(self, verdict: Verdict) -> list[list[str]]:
        """This rank's non-finite units as [unit, group, kind] (fault path; one host read)."""
        if verdict.kind != "nonfinite" or self.check is None:
            return []
        norms = self._last_units().tolist()
        groups = self.check.unit_groups()
        return [[self.check.unit_names[i], groups[i], "nan" if math.isnan(v) else "inf"]
                for i, v in enumerate(norms) if not math.isfinite(v)]

    # --- state ----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The guard's saved state (``titan.checkpoint`` saves it with the app state).

        Flat on purpose — scalars plus one JSON string — so that DCP, which flattens nested
        containers and loads into the *current* structure, restores it whole:
        ``version``, ``step_count``, ``skipped_total``, ``lr_scale``, ``escalation_level``
        and ``detail_json`` (loss/grad statistics, escalation counters, strikes per node,
        the policy it ran with).
        """
        detail = {"loss_stats": self.loss_stats.state_dict(), "grad_stats": self._grad_stats_state(),
                  "escalator": self.escalator.state_dict(), "strikes": dict(self.strikes),
                  "policy": {k: list(v) if isinstance(v, tuple) else v
                             for k, v in dataclasses.asdict(self.policy).items()}}
        return {"version": 1, "step_count": self.step_count, "skipped_total": self.skipped_total,
                "lr_scale": self.lr_scale, "escalation_level": self.escalator.level,
                "detail_json": json.dumps(detail)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output. During a guard rollback the escalation
        counters, strikes and LR scale are kept (the ladder must not restart)."""
        detail = json.loads(state["detail_json"])
        self._pending_norm = None  # the saved statistics hold it
        self.step_count = int(state["step_count"])
        self.skipped_total = int(state["skipped_total"])
        self.loss_stats.load_state_dict(detail["loss_stats"])
        self.grad_stats.load_state_dict(detail["grad_stats"])
        keep = self._keep_on_load
        self.escalator.load_state_dict(keep["escalator"] if keep else detail["escalator"])
        self.strikes = dict(keep["strikes"] if keep else detail["strikes"])
        self.lr_scale = float(keep["lr_scale"] if keep else state["lr_scale"])

    def emit_step(self, res: StepResult, **extra: Any) -> None:
        """Write the ``step`` event of ``res`` (loss mean over ranks, learning rate, grad norm,
        skipped, step time, culprit) plus ``extra`` fields. Every rank writes its own."""
        if self.events is None:
            return
        data: dict[str, Any] = {"loss": res.loss_mean, "lr": res.lr, "step_time_s": res.step_time_s,
                                **res.event_data(), **extra}
        self.events.emit("step", step=res.step, data=data, force=res.skipped)

    def close(self) -> None:
        """Detach the check and the step hooks from the model (DDP's hook becomes a plain all-reduce)."""
        self.progress.close()
        if self.check is not None:
            self.check.close()


def _samples(samples: Any) -> list[int] | None:
    if samples is None:
        return None
    return [int(i) for i in (samples() if callable(samples) else samples)]


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else math.nan
