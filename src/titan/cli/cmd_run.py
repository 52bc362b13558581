"""``titan run [launcher options] -- script.py [args]``: torchrun with a run directory."""

from __future__ import annotations

import argparse

from titan.cli._common import add_settings_flags, print_json, settings_from_args, whole
from titan.cli.environment import Environment, styled
from titan.exitcodes import ExitCode

EXIT_CODES = (ExitCode.SUCCEEDED, ExitCode.JOB_FAILED, ExitCode.USER_ERROR, ExitCode.GAVE_UP, ExitCode.PREEMPTED,
              ExitCode.INTERRUPTED)


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
    p.add_argument("--max-restarts", type=whole(0, 1_000_000_000), metavar="N", help="restarts of the worker group (run.max_restarts)")
    p.add_argument("--node-id", help="this node's id in event file names (run.node_id; default hostname)")
    p.add_argument("--runs-dir", metavar="DIR", help="where run directories go (run.runs_dir; default ./runs)")
    p.add_argument("--run-id", help="name of the run directory (default: time + random)")
    p.add_argument("--local-addr", metavar="ADDR",
                   help="this node's address: every store listens there, gloo/NCCL use its interface "
                        "(default: the endpoint's address if it is this host, else loopback)")
    p.add_argument("--rdzv-secret-file", metavar="FILE",
                   help="file with the job secret that signs the rendezvous state; the same on every node "
                        "(else TITAN_RDZV_SECRET_FILE / TITAN_RDZV_SECRET; single node: random)")
    p.add_argument("--insecure-rdzv", action="store_true",
                   help="run torch's stock, unsigned rendezvous: anyone who can reach the rendezvous port "
                        "can run code as this user on every node")
    p.add_argument("--no-agent", action="store_true",
                   help="do not start the node agent (titan agent) beside the workers (run.start_agent)")
    p.add_argument("--explain-timeouts", action="store_true",
                   help="print the timeout ladder these settings give (watchdog, process group, NCCL heartbeat, "
                        "rendezvous, checkpoint, scheduler grace), where each value came from and the ordering rule "
                        "it satisfies; start nothing (no command needed)")
    add_settings_flags(p)
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- script.py [args] or -- -m module [args]")
    return p


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.launch import LaunchOptions, launch, parse_entrypoint, prepare

    settings = settings_from_args(args, env, extra={
        "run.max_restarts": args.max_restarts, "run.node_id": args.node_id, "run.runs_dir": args.runs_dir,
        "run.start_agent": False if args.no_agent else None})
    if args.explain_timeouts:
        return _explain_timeouts(args, env, settings)
    entry = parse_entrypoint(args.command, env.cwd)
    opts = LaunchOptions(nproc_per_node=str(args.nproc_per_node), nnodes=str(args.nnodes),
                         rdzv_backend=args.rdzv_backend, rdzv_endpoint=args.rdzv_endpoint,
                         rdzv_id=args.rdzv_id, rdzv_conf=args.rdzv_conf, local_addr=args.local_addr,
                         run_id=args.run_id, rdzv_secret_file=args.rdzv_secret_file,
                         insecure_rdzv=bool(args.insecure_rdzv))
    prepared = prepare(opts, settings, entry, environ=env.env)
    runs_root = env.path(settings.run.runs_dir)
    from titan.ledger import ledger_path

    ledger = f"; node ledger {ledger_path(settings)}" if settings.watchdog.enabled else ""

    def announce(rd):  # type: ignore[no-untyped-def]
        env.err_console.print(f"titan run: {rd.path} (node {prepared.node}){ledger}", markup=False)
        for line in prepared.security.describe():
            env.err_console.print(f"titan run: {line}", markup=False)

    if args.json:
        announce = None  # type: ignore[assignment]
    def say(line: str) -> None:  # a start line known once the rendezvous formed (the storage)
        env.err_console.print(f"titan run: {line}", markup=False)

    res = launch(prepared, runs_root=runs_root, command=["titan", "run", *env_argv(args)],
                 base_env=env.env, cwd=env.cwd, on_run_dir=announce, say=None if args.json else say,
                 on_capabilities=None if args.json else (lambda caps: _print_capabilities(env, caps)))
    if args.json:
        print_json(env, {"exit_code": int(res.exit_code), "exit_name": res.exit_code.name,
                         "run_dir": str(res.run_dir.path), "node": res.node, "restarts": res.restarts,
                         "failures": res.failures, "torchrun": res.torchrun, "abort": res.abort,
                         "restart_policy": res.restart_policy, **(res.conclusion.data() if res.conclusion else {})})
    else:
        style = "green" if res.exit_code in (ExitCode.SUCCEEDED, ExitCode.PREEMPTED) else "red"
        head = f"titan run: {res.exit_code.name}"
        line = res.conclusion.final_line(res.restarts) if res.conclusion else head
        env.err_console.print(styled((head, style), f"{line[len(head):]}; run dir {res.run_dir.path}"))
        _print_policy(env, res)
    return res.exit_code


def _print_capabilities(env: Environment, caps) -> None:  # noqa: ANN001 - list[Capability]
    """One line per capability: which are live, and why not (titan.launch.capabilities)."""
    off = sum(1 for c in caps if not c.live and c.judged)
    unjudged = sum(1 for c in caps if not c.judged)
    note = ", ".join(x for x in (f"{off} off" if off else "", f"{unjudged} not judged" if unjudged else "") if x)
    env.err_console.print(styled(("titan run: capabilities", "bold"), f" ({note})" if note else " (all on)"))
    width = max(len(c.name) for c in caps)
    for c in caps:
        mark = ("on ", "green") if c.live else ("OFF", "red") if c.judged else (" - ", "dim")
        env.err_console.print(styled(f"  {c.name:<{width}}  ", mark, f"  {c.why.split(' — ', 1)[-1]}"))


def _explain_timeouts(args: argparse.Namespace, env: Environment, settings) -> ExitCode:  # noqa: ANN001
    """``--explain-timeouts``: the ladder as a table (or JSON); nothing is started or written."""
    from rich.table import Table
    from rich.text import Text

    from titan.launch.timeouts import timeout_ladder

    rungs = timeout_ladder(settings, user_rdzv_conf=args.rdzv_conf, environ=env.env)
    if args.json:
        print_json(env, {"timeouts": [r.to_dict() for r in rungs]})
        return ExitCode.SUCCEEDED
    t = Table(title="titan run — the timeout ladder in force (smallest first)", title_justify="left")
    for col in ("", "timeout", "seconds", "from", "rule"):
        t.add_column(col, justify="right" if col == "seconds" else "left")
    for r in rungs:
        mark = {True: Text("✔", style="green"), False: Text("✘", style="red"), None: Text("?", style="dim")}[r.ok]
        t.add_row(mark, r.name, "—" if r.value_s is None else f"{r.value_s:g}", r.source, r.rule)
    env.console.print(t)
    return ExitCode.SUCCEEDED


def _print_policy(env: Environment, res) -> None:  # noqa: ANN001 - LaunchResult
    """One line per restart storm, and the give-up reason (exit 3) as one line."""
    for st in (res.restart_policy or {}).get("storms", []):
        total = st.get("restarts_total", st["restarts"])
        env.err_console.print(styled(("restart storm:", "red"), f" {st['restarts']} restarts within {st['window_s']:g} s"
                                     + (f" ({total} in all)" if total > st["restarts"] else "")
                                     + f" — {'; '.join(st['causes']) or 'causes unknown'}"))
    said = res.conclusion is not None and res.conclusion.reason  # the final line carries it already
    if res.exit_code == ExitCode.GAVE_UP and res.abort and not said:
        env.err_console.print(styled(("titan run:", "red"), f" {res.abort.get('reason')}"))


def env_argv(args: argparse.Namespace) -> list[str]:
    """The launcher options as given (for run.json's ``command``)."""
    out: list[str] = []
    for flag in ("nproc_per_node", "nnodes", "rdzv_backend", "rdzv_endpoint", "rdzv_id", "rdzv_conf",
                 "max_restarts", "node_id", "runs_dir", "run_id", "local_addr", "rdzv_secret_file", "config"):
        v = getattr(args, flag, None)
        if v is not None:
            out += [f"--{flag.replace('_', '-')}", str(v)]
    if getattr(args, "insecure_rdzv", False):
        out.append("--insecure-rdzv")
    for s in args.settings or []:
        out += ["--set", s]
    return out + list(args.command)
