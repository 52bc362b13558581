"""``titan preflight``: stack consistency and hardware self-tests across the job's ranks."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table

from titan.cli._common import add_settings_flags, print_json, settings_from_args
from titan.cli.environment import Environment
from titan.errors import UserError
from titan.events import RunDir, default_node_id
from titan.exitcodes import ExitCode


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "preflight", help="check stack consistency and hardware before a long run",
        description="Fingerprint every rank, compare them (majority with >= 3, --baseline with 2), and run "
                    "self-tests: collective sweep, pairwise send/recv, GEMM canary, concurrent checkpoint I/O. "
                    "Alone it runs N local ranks; across nodes run `titan run ... -- -m titan.preflight.worker`.")
    p.add_argument("--nproc", type=int, default=2, help="local ranks (default 2)")
    p.add_argument("--max-bytes", type=int, default=256 << 20, help="largest collective size (default 256 MiB)")
    p.add_argument("--duration", type=float, default=0.0, help="repeat the collective sweep for this many seconds (soak)")
    p.add_argument("--io-bytes", type=int, default=64 << 20, help="bytes each rank writes in the I/O test")
    p.add_argument("--io-dir", help="checkpoint folder to test (default: the run's checkpoints/)")
    p.add_argument("--packages", help="comma-separated Python packages to compare")
    p.add_argument("--baseline", metavar="FILE", help="known-good fingerprint (from --save) to compare against")
    p.add_argument("--save", metavar="FILE", help="save this node's fingerprint as JSON and exit")
    p.add_argument("--compare", metavar="FILE", nargs="+", help="compare saved per-node fingerprints offline")
    p.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    add_settings_flags(p)
    return p


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.preflight import analyze, collect_fingerprint, compare_fingerprints

    if args.nproc < 1:
        raise UserError(f"--nproc must be >= 1, got {args.nproc}", "e.g. --nproc 2")
    if args.max_bytes < 4096 or args.io_bytes < 1:
        raise UserError("--max-bytes must be >= 4096 and --io-bytes >= 1", "sizes are in bytes")
    baseline = _load_json(env, args.baseline) if args.baseline else None
    packages = tuple(filter(None, args.packages.split(","))) if args.packages else None
    if args.save:
        fp = collect_fingerprint(packages) if packages else collect_fingerprint()
        env.path(args.save).write_text(json.dumps(fp, indent=2, sort_keys=True))
        env.console.print(f"saved fingerprint to {args.save}")
        return ExitCode.SUCCEEDED
    if args.compare:
        fps = {str(f): _load_json(env, f) for f in args.compare}
        diffs = compare_fingerprints(fps, baseline)
        verdict: dict[str, Any] = {"exit_code": int(ExitCode.MISMATCH if diffs else ExitCode.SUCCEEDED),
                                   "verdict": "mismatch" if diffs else "succeeded", "members": sorted(fps),
                                   "differences": [d.to_dict() for d in diffs], "flags": []}
        return _report(env, args, verdict)
    settings = settings_from_args(args, env)
    from titan.preflight.runner import PreflightError, run_local

    run_dir = RunDir.create(env.path(settings.run.runs_dir))
    worker_args = [f"--max-bytes={args.max_bytes}", f"--duration-s={args.duration}", f"--io-bytes={args.io_bytes}"]
    if args.io_dir:
        worker_args.append(f"--io-dir={env.path(args.io_dir)}")
    if args.packages:
        worker_args.append(f"--packages={args.packages}")
    if args.baseline:
        worker_args.append(f"--baseline={env.path(args.baseline)}")
    worker_env = dict(env.env)
    worker_env["TITAN_SETTINGS_JSON"] = settings.to_json()
    with env.err_console.status(f"preflight: {args.nproc} local ranks…"):
        try:
            verdict = run_local(run_dir, args.nproc, worker_args, node_id=settings.run.node_id or default_node_id(),
                                env=worker_env, timeout_s=args.timeout)
        except PreflightError as e:
            env.stderr.write(f"titan: error: {e}\n")
            return ExitCode.JOB_FAILED
    verdict["run_dir"] = str(run_dir.path)
    return _report(env, args, verdict)


def _load_json(env: Environment, path: str) -> Any:
    try:
        return json.loads(env.path(path).read_text())
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}", "pass a file written by `titan preflight --save`") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{path} is not valid JSON ({e.msg})", "pass a file written by `titan preflight --save`") from None


def _report(env: Environment, args: argparse.Namespace, verdict: dict[str, Any]) -> ExitCode:
    code = ExitCode(verdict["exit_code"])
    if args.json:
        print_json(env, verdict)
        return code
    con = env.console
    if verdict.get("sweep"):
        t = Table(title="collective sweep (median)", box=None)
        for c in ("op", "bytes", "time", "algbw GB/s", "busbw GB/s"):
            t.add_column(c, justify="right")
        for r in verdict["sweep"]:
            t.add_row(r["op"], f"{r['bytes']:,}", f"{r['time_s'] * 1e3:.2f} ms", f"{r['algbw_GBps']:.3f}", f"{r['busbw_GBps']:.3f}")
        con.print(t)
    if verdict["differences"]:
        t = Table(title="stack differences", box=None)
        for c in ("member", "setting", "value", "expected", "reference"):
            t.add_column(c, overflow="fold")
        for d in verdict["differences"]:
            t.add_row(d["member"], d["key"], d["value"], d["expected"] or "?", d["reference"], style="red")
        con.print(t)
    for f in verdict["flags"]:
        con.print(f"[red]self-test {f['test']} failed on {f['member']}:[/] {f['why']}")
    con.print(f"preflight: [bold]{verdict['verdict']}[/] — {len(verdict['members'])} members"
              + (f" — {verdict['run_dir']}" if verdict.get("run_dir") else ""))
    return code
