"""``titan run [launcher options] -- script.py [args]``: torchrun with a run directory."""

from __future__ import annotations

import argparse

from titan.cli._common import add_settings_flags, print_json, settings_from_args
from titan.cli.environment import Environment
from titan.exitcodes import ExitCode


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "run", help="launch a training script on torchrun with a run directory",
        description="Launch `script.py` (or `-m module`) on torchrun's elastic agent: creates "
                    "runs/<run_id>/, hands workers TITAN_RUN_DIR/TITAN_RUN_ID/TITAN_NODE_ID/"
                    "TITAN_SETTINGS_JSON, records launcher events and restarts reliably. "
                    "Multi-node: the same command on every node with --nnodes MIN:MAX "
                    "--rdzv-endpoint HOST:PORT --run-id ID.",
        usage="titan run [options] -- script.py [args] | -- -m module [args]")
    p.add_argument("--nproc-per-node", default="1", metavar="N", help="workers on this node (default 1)")
    p.add_argument("--nnodes", default="1", metavar="MIN:MAX", help="number of nodes, N or MIN:MAX (default 1)")
    p.add_argument("--rdzv-backend", default="c10d", help="rendezvous backend (default c10d)")
    p.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="rendezvous store (multi-node)")
    p.add_argument("--rdzv-id", help="rendezvous id (default: the run id)")
    p.add_argument("--rdzv-conf", metavar="K=V,…", help="extra rendezvous config, e.g. is_host=1")
    p.add_argument("--max-restarts", type=int, metavar="N", help="restarts of the worker group (run.max_restarts)")
    p.add_argument("--node-id", help="this node's id in event file names (run.node_id; default hostname)")
    p.add_argument("--runs-dir", metavar="DIR", help="where run directories go (run.runs_dir; default ./runs)")
    p.add_argument("--run-id", help="name of the run directory (default: time + random)")
    p.add_argument("--local-addr", metavar="ADDR", help="address of this node for the rendezvous")
    p.add_argument("--no-agent", action="store_true",
                   help="do not start the node agent (titan agent) beside the workers (run.start_agent)")
    add_settings_flags(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- script.py [args] or -- -m module [args]")
    return p


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.launch import LaunchOptions, launch, parse_entrypoint, prepare

    settings = settings_from_args(args, env, extra={
        "run.max_restarts": args.max_restarts, "run.node_id": args.node_id, "run.runs_dir": args.runs_dir,
        "run.start_agent": False if args.no_agent else None})
    entry = parse_entrypoint(args.command, env.cwd)
    opts = LaunchOptions(nproc_per_node=str(args.nproc_per_node), nnodes=str(args.nnodes),
                         rdzv_backend=args.rdzv_backend, rdzv_endpoint=args.rdzv_endpoint,
                         rdzv_id=args.rdzv_id, rdzv_conf=args.rdzv_conf, local_addr=args.local_addr,
                         run_id=args.run_id)
    prepared = prepare(opts, settings, entry)
    runs_root = env.path(settings.run.runs_dir)
    announce = None if args.json else (
        lambda rd: env.err_console.print(f"titan run: {rd.path} (node {prepared.node})"))
    res = launch(prepared, runs_root=runs_root, command=["titan", "run", *env_argv(args)],
                 base_env=env.env, cwd=env.cwd, on_run_dir=announce)
    if args.json:
        print_json(env, {"exit_code": int(res.exit_code), "exit_name": res.exit_code.name,
                         "run_dir": str(res.run_dir.path), "node": res.node, "restarts": res.restarts,
                         "failures": res.failures, "torchrun": res.torchrun, "abort": res.abort})
    else:
        style = "green" if res.exit_code in (ExitCode.SUCCEEDED, ExitCode.PREEMPTED) else "red"
        env.err_console.print(f"[{style}]titan run: {res.exit_code.name}[/] — {len(res.failures)} worker "
                              f"failure(s), {res.restarts} restart(s); run dir {res.run_dir.path}")
    return res.exit_code


def env_argv(args: argparse.Namespace) -> list[str]:
    """The launcher options as given (for run.json's ``command``)."""
    out: list[str] = []
    for flag in ("nproc_per_node", "nnodes", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf",
                 "max_restarts", "node_id", "runs_dir", "run_id", "local_addr", "config"):
        v = getattr(args, flag, None)
        if v is not None:
            out += [f"--{flag.replace('_', '-')}", str(v)]
    for s in args.settings or []:
        out += ["--set", s]
    return out + list(args.command)
