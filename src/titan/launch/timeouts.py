"""The whole timeout ladder in force for a launch, with where each value came from and the
ordering rule it has to satisfy (``titan run --explain-timeouts``).

A hang must be seen by Titan's watchdog before a collective times out on the innocent ranks;
that must happen before the rendezvous stops waiting for the restarted group; a dead node must
be dropped from the rendezvous before joining gives up; and the scheduler's termination grace
must outlast the checkpoint saved on SIGTERM. :func:`timeout_ladder` lists every rung of that
chain, smallest first, from the resolved settings, the ``--rdzv-conf`` string the launch
passes to torchrun, and the environment (NCCL's heartbeat, Slurm's ``KillWait``, Kubernetes'
grace period). Cost: no I/O but ``scontrol show config`` (5 s bound) inside a Slurm job.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from typing import Any, Mapping

__all__ = ["Rung", "timeout_ladder", "NCCL_HEARTBEAT_DEFAULT_S", "GRACE_DEFAULT_S"]

#: torch's default for ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`` (ProcessGroupNCCL's monitor thread).
NCCL_HEARTBEAT_DEFAULT_S = 480.0
#: Slurm's ``KillWait`` and Kubernetes' ``terminationGracePeriodSeconds`` both default to 30 s.
GRACE_DEFAULT_S = 30.0


@dataclasses.dataclass(frozen=True)
class Rung:
    """One timeout: its value in seconds (``None``: not known here), where it came from, the
    rule it must satisfy and whether it does (``None``: the rule cannot be checked here)."""

    name: str
    value_s: float | None
    source: str
    rule: str
    ok: bool | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _src(settings: Any, key: str) -> str:
    return settings.sources.get(key, "default")


def _conf(conf: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in conf.split(",") if "=" in item)


def _grace(environ: Mapping[str, str]) -> tuple[float | None, str]:
    """The scheduler's SIGTERM → SIGKILL grace, when this process can know it."""
    if environ.get("SLURM_JOB_ID") and shutil.which("scontrol"):
        try:
            out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        for line in out.splitlines():
            key, _, val = line.partition("=")
            if key.strip() == "KillWait":
                num = val.strip().split()[0] if val.strip() else ""
                if num.isdigit():
                    return float(num), "Slurm KillWait (scontrol show config)"
        return None, "Slurm job, KillWait not readable (default 30 s)"
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return None, "Kubernetes pod: terminationGracePeriodSeconds is not visible from inside (default 30 s)"
    return None, "no scheduler seen (Slurm KillWait / Kubernetes terminationGracePeriodSeconds: default 30 s)"


def timeout_ladder(settings: Any, *, user_rdzv_conf: str | None = None,
                   environ: Mapping[str, str] | None = None) -> list[Rung]:
    """Every rung of the ladder for ``settings`` and the user's ``--rdzv-conf`` (which wins over
    the settings, as in the launch), smallest first. Raises ``UserError`` for a bad
    ``--rdzv-conf``. Pure but for :func:`_grace`."""
    from titan.launch.options import rdzv_conf

    env = dict(os.environ if environ is None else environ)
    w, d, r, c = settings.watchdog, settings.dist, settings.run, settings.checkpoint
    conf = _conf(rdzv_conf(user_rdzv_conf, settings))
    user = set(_conf(rdzv_conf(user_rdzv_conf)))
    pg = d.pg_timeout_s
    join = float(conf.get("join_timeout", r.rdzv_join_timeout_s))
    interval = float(conf.get("keep_alive_interval", r.rdzv_keep_alive_interval_s))
    attempts = int(conf.get("keep_alive_max_attempt", r.rdzv_keep_alive_max_attempt))
    last_call = float(conf.get("last_call_timeout", r.rdzv_last_call_timeout_s))
    rsrc = lambda k, s: "--rdzv-conf" if k in user else _src(settings, s)  # noqa: E731
    auto = "derived: 0.4 × dist.pg_timeout_s"
    ceiling_src = _src(settings, "watchdog.ceiling_s") if "watchdog.ceiling_s" in settings.sources else auto
    budget_src = (_src(settings, "watchdog.checkpoint_budget_s") if "watchdog.checkpoint_budget_s" in settings.sources
                  else auto)
    nccl_raw = env.get("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC")
    try:
        nccl = float(nccl_raw) if nccl_raw else NCCL_HEARTBEAT_DEFAULT_S
    except ValueError:
        nccl = NCCL_HEARTBEAT_DEFAULT_S
    nccl_src = "environment TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC" if nccl_raw else "torch default"
    grace, grace_src = _grace(env)
    heartbeat = interval * attempts
    return [
        Rung("watchdog.floor_s (shortest hang verdict)", w.floor_s, _src(settings, "watchdog.floor_s"),
             "≤ watchdog.ceiling_s", w.floor_s <= w.ceiling_s),
        Rung("watchdog.warmup_timeout_s (before the first beacons)", min(w.warmup_timeout_s, w.ceiling_s),
             _src(settings, "watchdog.warmup_timeout_s"), "effective min(value, ceiling) < dist.pg_timeout_s",
             min(w.warmup_timeout_s, w.ceiling_s) < pg),
        Rung("watchdog.idle_timeout_s (between steps)", min(w.idle_timeout_s, w.ceiling_s),
             _src(settings, "watchdog.idle_timeout_s"), "effective min(value, ceiling) < dist.pg_timeout_s",
             min(w.idle_timeout_s, w.ceiling_s) < pg),
        Rung("watchdog.ceiling_s (longest learned hang timeout)", w.ceiling_s, ceiling_src,
             "< dist.pg_timeout_s: Titan names the hung rank before the collective times out", w.ceiling_s < pg),
        Rung("watchdog.checkpoint_budget_s (a save in progress)", w.checkpoint_budget_s, budget_src,
             "< dist.pg_timeout_s", w.checkpoint_budget_s < pg),
        Rung("dist.pg_timeout_s (process group: gloo/NCCL collective timeout)", pg, _src(settings, "dist.pg_timeout_s"),
             "< rendezvous join timeout: a hung group must fail before the re-rendezvous gives up", pg < join),
        Rung("NCCL heartbeat monitor (TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC; NCCL only)", nccl, nccl_src,
             "> dist.pg_timeout_s: the monitor kills a process whose NCCL watchdog is stuck, after the timeout "
             "had its chance", nccl > pg if d.backend != "gloo" else None),
        Rung("rendezvous last call (last_call_timeout)", last_call, rsrc("last_call_timeout", "run.rdzv_last_call_timeout_s"),
             "< rendezvous join timeout: late nodes and spares get a bounded last call", last_call < join),
        Rung("rendezvous heartbeat (keep_alive_interval × keep_alive_max_attempt)", heartbeat,
             f"{rsrc('keep_alive_interval', 'run.rdzv_keep_alive_interval_s')} × "
             f"{rsrc('keep_alive_max_attempt', 'run.rdzv_keep_alive_max_attempt')}",
             "< rendezvous join timeout: a dead node is dropped before joining gives up", heartbeat < join),
        Rung("rendezvous join timeout (join_timeout)", join, rsrc("join_timeout", "run.rdzv_join_timeout_s"),
             "the top of the ladder for a running job", True),
        Rung("checkpoint.replica_timeout_s (one buddy-copy request)", c.replica_timeout_s,
             _src(settings, "checkpoint.replica_timeout_s"), "≤ checkpoint.wait_timeout_s",
             c.replica_timeout_s <= c.wait_timeout_s),
        Rung("checkpoint.wait_timeout_s (waiting for a save in flight)", c.wait_timeout_s,
             _src(settings, "checkpoint.wait_timeout_s"), "bounds the SIGTERM save's wait", True),
        Rung("scheduler termination grace (SIGTERM → SIGKILL)", grace, grace_src,
             "> the time of the checkpoint saved on SIGTERM (ckpt.saved total_s in your runs), or exit 9 "
             "finds nothing on disk", None),
    ]
