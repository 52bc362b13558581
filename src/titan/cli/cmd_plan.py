"""``titan plan``: interruptions per day, optimal checkpoint interval and expected goodput."""

from __future__ import annotations

import argparse

from rich.table import Table

from titan.cli._common import SEED, number, print_json, whole
from titan.cli.environment import Environment
from titan.errors import UserError
from titan.exitcodes import ExitCode

EXIT_CODES = (ExitCode.SUCCEEDED, ExitCode.USER_ERROR)

DEFAULT_CKPT_STALL_S = 10.0  # assumption: async (snapshot-then-write) checkpoint stall
DEFAULT_RESTART_S = 300.0  # assumption: detection + teardown + re-rendezvous + reload at scale


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from titan.sla.fleetdata import DEFAULT_FLEET, FLEETS

    p = sub.add_parser(
        "plan", help="expected interruptions, checkpoint interval and goodput at N GPUs",
        description="Model goodput at scale: interruptions/day from the GPU count and a published failure "
                    "rate, the Young/Daly checkpoint interval, and the expected goodput (closed form, "
                    "cross-checked by Monte-Carlo). Defaults come from published fleet data (--fleet).")
    from titan.sla.plan import LIMITS as L

    def w(name: str) -> object:
        return whole(int(L[name][0]), int(L[name][1]))

    def f(name: str, unit: str) -> object:
        return number(L[name][0], L[name][1], unit=unit)

    p.add_argument("--gpus", type=w("gpus"), required=True, help="GPUs in the job")
    p.add_argument("--fleet", choices=sorted(FLEETS), default=None,
                   help=f"published failure rate to scale from (default {DEFAULT_FLEET})")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument("--mtbi-h", type=f("mtbi_h", "h"),
                      help="job mean time between interruptions at --gpus (hours); instead of --fleet")
    rate.add_argument("--rate-per-gpu-hour", type=f("rate_per_gpu_hour", "per GPU-hour"),
                      help="interruptions per GPU-hour; instead of --fleet")
    p.add_argument("--ckpt-stall-s", type=f("ckpt_stall_s", "s"),
                   help=f"checkpoint stall per save (default {DEFAULT_CKPT_STALL_S:g}, an assumption)")
    p.add_argument("--restart-s", type=f("restart_s", "s"),
                   help=f"cost per interruption: detection + restart (default {DEFAULT_RESTART_S:g}, an assumption)")
    p.add_argument("--interval-s", type=f("interval_s", "s"), help="evaluate this checkpoint interval instead of the optimum")
    p.add_argument("--from", dest="from_run", metavar="RUN_DIR", help="take checkpoint stall and restart cost measured in this run")
    p.add_argument("--no-sim", action="store_true", help="skip the Monte-Carlo cross-check")
    p.add_argument("--replicas", type=w("replicas"), default=None, help="Monte-Carlo replicas (default 16)")
    p.add_argument("--horizon-days", type=f("horizon_days", "days"), default=None,
                   help="simulated days per replica (default 30)")
    p.add_argument("--seed", type=whole(*SEED), default=None,
                   help="random seed of the Monte-Carlo cross-check (default 0; same seed, same numbers)")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    return p


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.sla.fleetdata import HOUR_S, fleet
    from titan.sla.plan import PlanInput, plan

    from titan.sla.fleetdata import DEFAULT_FLEET

    given = [flag for flag, v in (("--mtbi-h", args.mtbi_h), ("--rate-per-gpu-hour", args.rate_per_gpu_hour)) if v is not None]
    if args.fleet is not None and given:
        raise UserError(f"--fleet and {given[0]} both give the failure rate", f"pass one of them (drop --fleet to use {given[0]})")
    sim_flags = [flag for flag, v in (("--replicas", args.replicas), ("--horizon-days", args.horizon_days),
                                      ("--seed", args.seed)) if v is not None]
    if args.no_sim and sim_flags:
        raise UserError(f"--no-sim skips the simulation that {sim_flags[0]} configures", f"drop --no-sim or {sim_flags[0]}")
    if args.from_run and args.ckpt_stall_s is not None and args.restart_s is not None:
        raise UserError("--from measures what --ckpt-stall-s and --restart-s already give", "pass --from or the two costs, not all three")
    replicas = 16 if args.replicas is None else args.replicas
    horizon_days = 30.0 if args.horizon_days is None else args.horizon_days
    f = fleet(args.fleet or DEFAULT_FLEET)
    rate, fleet_used = f.rate_per_gpu_hour, f
    if args.mtbi_h is not None:
        rate, fleet_used = 1.0 / (args.mtbi_h * args.gpus), None
    elif args.rate_per_gpu_hour is not None:
        rate, fleet_used = args.rate_per_gpu_hour, None
    stall, restart, src = DEFAULT_CKPT_STALL_S, DEFAULT_RESTART_S, "assumption (defaults)"
    if args.from_run:
        from titan.sla.accounting import account_run
        from titan.sla.measured import measured_costs

        m = measured_costs(account_run(env.path(args.from_run)))
        if m["ckpt_stall_s"] is None and m["restart_s"] is None:
            raise UserError(f"{args.from_run} has no checkpoint saves and no restarts to measure",
                            "run a drill (`titan drill`) or pass --ckpt-stall-s/--restart-s")
        stall = m["ckpt_stall_s"] if m["ckpt_stall_s"] is not None else stall
        restart = m["restart_s"] if m["restart_s"] is not None else restart
        src = f"measured in {args.from_run} ({m['ckpt_stall_samples']} saves, {m['restart_samples']} restarts)"
    if args.ckpt_stall_s is not None or args.restart_s is not None:
        stall = args.ckpt_stall_s if args.ckpt_stall_s is not None else stall
        restart = args.restart_s if args.restart_s is not None else restart
        src = "given on the command line" + ("" if args.ckpt_stall_s is not None and args.restart_s is not None
                                               else f"; the other from {src}")
    inp = PlanInput(gpus=args.gpus, rate_per_gpu_hour=rate, ckpt_stall_s=stall, restart_s=restart,
                    interval_s=args.interval_s, fleet=fleet_used, cost_source=src)
    res = plan(inp, simulate=not args.no_sim, replicas=replicas, horizon_days=horizon_days, seed=args.seed or 0)
    if args.json:
        print_json(env, res.to_dict())
        return ExitCode.SUCCEEDED
    t = Table(show_header=False, box=None)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("GPUs", f"{args.gpus:,}")
    t.add_row("failure rate", f"{rate:.3g} interruptions per GPU-hour"
              + (f" ({f.name}: {f.interruptions:g} in {f.period_s / 86400:g} d on {f.gpus:,} GPUs)" if fleet_used else ""))
    t.add_row("mean time between interruptions", f"{res.mtbi_s / HOUR_S:.3g} h")
    t.add_row("interruptions per day", f"{res.interruptions_per_day:.3g}")
    t.add_row("checkpoint stall / restart cost", f"{stall:g} s / {restart:g} s  ({src})")
    t.add_row("checkpoint interval", f"Daly {res.daly_interval_s:,.0f} s, Young {res.young_interval_s:,.0f} s"
              + (f"; evaluating {res.interval_s:,.0f} s" if args.interval_s else ""))
    t.add_row("expected goodput", f"{res.goodput:.2%} (first-order {res.goodput_first_order:.2%})")
    if res.mc is not None:
        t.add_row("Monte-Carlo", f"{res.mc.goodput:.2%} ± {res.mc.goodput_stderr:.2%} over {res.mc.replicas} × "
                  f"{horizon_days:g} d; {res.mc.interruptions_per_day:.3g} interruptions/day")
    env.console.print(t)
    if fleet_used is not None:
        env.console.print(f"source: {fleet_used.source}")
    return ExitCode.SUCCEEDED
