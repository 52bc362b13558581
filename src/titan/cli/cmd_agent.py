"""``titan agent``: the node agent — telemetry, alerts, baselines, Prometheus endpoint."""

from __future__ import annotations

import argparse
import signal
import threading
import time
from typing import Any

from rich.table import Table

from titan.cli._common import MAX_SECONDS_FLAG, add_settings_flags, hostname, ident, number, print_json, settings_from_args, whole
from titan.cli.environment import Environment, styled
from titan.errors import UserError
from titan.events import RunDir, default_node_id
from titan.events.rundir import check_id
from titan.exitcodes import ExitCode
from titan.settings.env import TITAN_NODE_ID, TITAN_RUN_DIR


#: What this verb can exit with (its --help lists them).
EXIT_CODES = (ExitCode.SUCCEEDED, ExitCode.USER_ERROR)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "agent", help="run the node agent (GPU/host/disk/net/kernel-log telemetry and alerts)",
        description="Sample every collector each interval, apply the alert rules, baselines and peer "
                    "comparison, and write samples and alerts to the run directory; optionally serve "
                    "Prometheus metrics. --once takes one sample of every collector and prints it.")
    p.add_argument("--once", action="store_true", help="take one sample of every collector, print it, exit")
    p.add_argument("--prometheus-port", type=whole(0, 65535, "a port"), metavar="PORT",
                   help="serve Prometheus metrics on PORT (agent.prometheus_port; 0 = off)")
    p.add_argument("--prometheus-addr", type=hostname, metavar="ADDR", help="bind address (default 127.0.0.1)")
    p.add_argument("--run-dir", metavar="DIR", help=f"run directory to write to (default ${TITAN_RUN_DIR})")
    p.add_argument("--node", type=ident("node id"), metavar="ID", help=f"node id (default ${TITAN_NODE_ID} or the hostname)")
    p.add_argument("--interval-s", type=number(0.01, 3600, unit="s"), metavar="S",
                   help="seconds between samples (agent.interval_s)")
    p.add_argument("--duration-s", type=number(0, MAX_SECONDS_FLAG, above=True, unit="s"), metavar="S",
                   help="stop after S seconds (default: until SIGTERM)")
    add_settings_flags(p)
    return p


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.monitor.agent import Agent  # the monitor package is only needed by this verb

    settings = settings_from_args(args, env, extra={
        "agent.interval_s": args.interval_s, "agent.prometheus_port": args.prometheus_port,
        "agent.prometheus_addr": args.prometheus_addr})
    cfg = settings.agent
    if args.once and (args.duration_s is not None or args.prometheus_port):
        flag = "--duration-s" if args.duration_s is not None else "--prometheus-port"
        raise UserError(f"--once takes one sample and exits; {flag} does not apply", f"drop --once or {flag}")
    node = check_id(args.node or env.env.get(TITAN_NODE_ID) or default_node_id(), "node id")
    rd_path = args.run_dir or env.env.get(TITAN_RUN_DIR)
    run_dir = RunDir.open(env.path(rd_path)) if rd_path else None
    if run_dir is not None:
        run_dir.metrics.mkdir(exist_ok=True)
    from titan.beacon.install import beacon_dir

    agent = Agent(cfg, node=node, run_dir=run_dir,
                  beacon_dir=beacon_dir(run_dir.path, settings.watchdog.beacon_dir) if run_dir else None)
    exporter = None
    try:
        if args.once:
            return _once(agent, args, env)
        if cfg.prometheus_port:
            from titan.monitor.prom import PrometheusExporter

            try:
                exporter = PrometheusExporter(agent, port=cfg.prometheus_port, addr=cfg.prometheus_addr)
            except OSError as e:
                raise UserError(f"cannot serve metrics on {cfg.prometheus_addr}:{cfg.prometheus_port}: "
                                f"{e.strerror or e}", "choose a free port and an address of this host") from None
        stop = threading.Event()
        _install_signals(stop)
        from titan.monitor.parent import watch_parent

        watch_parent(lambda _why: stop.set(), env.env)  # started by `titan run`: stop when it is gone
        if args.duration_s is not None:
            timer = threading.Timer(args.duration_s, stop.set)
            timer.daemon = True  # a SIGTERM before the end must not wait for the timer
            timer.start()
        env.stderr.write(f"titan agent: node {node}, every {cfg.interval_s:g}s"
                         + (f", metrics on {exporter.url}" if exporter else "")
                         + (f", run dir {run_dir.path}" if run_dir else ", no run dir (events only logged)") + "\n")
        env.stderr.flush()
        agent.run(stop)
        if args.json:
            print_json(env, {"node": node, "ticks": agent.ticks, "alerts": dict(agent.alert_counts),
                             "status": agent.status})
        return ExitCode.SUCCEEDED
    finally:
        if exporter is not None:
            exporter.close()
        agent.close()


def _once(agent: Any, args: argparse.Namespace, env: Environment) -> ExitCode:
    # Rates need two readings: prime the counters, wait a moment, then take the sample.
    agent.tick()
    time.sleep(min(1.0, agent.cfg.interval_s))
    res = agent.tick()
    if args.json:
        print_json(env, {"node": agent.node, "t": res.t,
                         "collectors": {r.collector: r.to_dict() for r in res.readings}, "alerts": res.alerts})
        return ExitCode.SUCCEEDED
    table = Table(show_header=True, header_style="bold", box=None)
    for col in ("collector", "status", "metrics", "details"):
        table.add_column(col, overflow="fold")
    for r in res.readings:
        detail = ", ".join(f"{k}={v}" for k, v in list(r.info.items())[:4] if not isinstance(v, (list, dict)))
        table.add_row(r.collector, r.status, str(len(r.metrics)), detail, style=None if r.ok else "yellow")
    env.console.print(table)
    for a in res.alerts:
        env.console.print(styled(("alert", "red"), f" {a['rule']}: {a['metric']}"))
    return ExitCode.SUCCEEDED


def _install_signals(stop: threading.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
