"""``titan preflight``: stack consistency and hardware self-tests across the job's ranks."""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.table import Table
from rich.text import Text

from titan.cli._common import MAX_SECONDS_FLAG, add_settings_flags, number, print_json, settings_from_args, whole
from titan.cli.environment import Environment, styled
from titan.errors import UserError
from titan.events import RunDir, default_node_id
from titan.exitcodes import ExitCode


#: What this verb can exit with (its --help lists them).
EXIT_CODES = (ExitCode.SUCCEEDED, ExitCode.JOB_FAILED, ExitCode.USER_ERROR, ExitCode.MISMATCH, ExitCode.SELFTEST_FAILED,
              ExitCode.INTERRUPTED)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "preflight", help="check stack consistency and hardware before a long run",
        description="Fingerprint every rank, compare them (majority with >= 3, --baseline with 2), and run "
                    "self-tests: collective sweep, pairwise send/recv, GEMM canary, concurrent checkpoint I/O. "
                    "Alone it runs N local ranks; across nodes run `titan run ... -- -m titan.preflight.worker`.")
    p.add_argument("--nproc", type=whole(1, 64, "a rank count"), default=2, help="local ranks (default 2)")
    p.add_argument("--max-bytes", type=whole(4096, 16 << 30, "a size in bytes"), default=256 << 20,
                   help="largest collective size in bytes, 4096 … 16 GiB (default 256 MiB)")
    p.add_argument("--duration", type=number(0, MAX_SECONDS_FLAG, unit="s"), default=0.0,
                   help="repeat the collective sweep for this many seconds (soak)")
    p.add_argument("--io-bytes", type=whole(1, 16 << 30, "a size in bytes"), default=64 << 20,
                   help="bytes each rank writes in the I/O test, at most 16 GiB (default 64 MiB)")
    p.add_argument("--io-dir", help="existing checkpoint folder to test (default: the run's checkpoints/)")
    p.add_argument("--packages", help="comma-separated Python packages to compare")
    p.add_argument("--baseline", metavar="FILE", help="known-good fingerprint (from --save) to compare against")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--save", metavar="FILE", help="save this node's fingerprint as JSON and exit")
    mode.add_argument("--compare", metavar="FILE", nargs="+", help="compare saved per-node fingerprints offline")
    p.add_argument("--timeout", type=number(0, MAX_SECONDS_FLAG, above=True, unit="s"), default=600.0,
                   help="give up after this many seconds (default 600)")
    add_settings_flags(p)
    return p


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.preflight import analyze, collect_fingerprint, compare_fingerprints
    from titan.preflight.analyze import section_verdicts

    packages = _packages(args.packages)
    baseline = _load_fingerprint(env, args.baseline, "--baseline") if args.baseline else None
    if args.save:
        _check_save_path(env, args.save)
    if args.io_dir and not env.path(args.io_dir).is_dir():
        raise UserError(f"--io-dir {args.io_dir} is not an existing folder",
                        "give the folder your checkpoints go to (it must exist); the test writes and removes files there")
    if args.save:
        fp = collect_fingerprint(packages) if packages else collect_fingerprint()
        try:
            env.path(args.save).write_text(json.dumps(fp, indent=2, sort_keys=True))
        except OSError as e:
            raise UserError(f"cannot write --save {args.save}: {e.strerror or e}", "choose a writable file path") from None
        env.console.print(f"saved fingerprint to {args.save}")
        return ExitCode.SUCCEEDED
    if args.compare:
        fps = {str(f): _load_fingerprint(env, f, "--compare") for f in args.compare}
        if len(fps) < 2 and baseline is None:
            raise UserError("--compare needs two or more fingerprints, or one with --baseline",
                            "e.g. --compare node0.json node1.json (written by `titan preflight --save`)")
        diffs = compare_fingerprints(fps, baseline)
        verdict: dict[str, Any] = {"exit_code": int(ExitCode.MISMATCH if diffs else ExitCode.SUCCEEDED),
                                   "verdict": "mismatch" if diffs else "succeeded", "members": sorted(fps),
                                   "differences": [d.to_dict() for d in diffs], "flags": [],
                                   "baseline": baseline is not None}
        verdict["sections"] = section_verdicts(verdict)
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
    with env.err_console.status(styled(f"preflight: {args.nproc} local ranks…")):
        try:
            verdict = run_local(run_dir, args.nproc, worker_args, node_id=settings.run.node_id or default_node_id(),
                                env=worker_env, timeout_s=args.timeout)
        except PreflightError as e:
            env.stderr.write(f"titan: error: {e}\nhint: the log names the failing rank; `titan preflight --nproc 1` "
                             "isolates a rank-local problem\n")
            return ExitCode.JOB_FAILED
    verdict["run_dir"] = str(run_dir.path)
    return _report(env, args, verdict)


def _packages(text: str | None) -> tuple[str, ...] | None:
    import re

    if not text:
        return None
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", n)]
    if bad or not names:
        raise UserError(f"--packages {text!r}: {bad[0] if bad else 'no name'} is not a package name",
                        "give comma-separated distribution names, e.g. --packages torch,numpy")
    return names


def _check_save_path(env: Environment, path: str) -> None:
    target = env.path(path)
    if target.is_dir():
        raise UserError(f"--save {path} is a folder", "give a file path, e.g. --save node0.json")
    if not target.parent.is_dir():
        raise UserError(f"--save {path}: folder {target.parent} does not exist", "create it first, or save elsewhere")


def _load_fingerprint(env: Environment, path: str, flag: str) -> dict[str, Any]:
    """A fingerprint written by ``--save``: a JSON object of sections (``torch``, ``python``, …)."""
    from titan.inputs import read_text_file

    hint = "pass a file written by `titan preflight --save`"
    text = read_text_file(env.path(path), f"{flag} file", hint)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{flag} {path} is not valid JSON ({e.msg})", hint) from None
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, dict) for v in obj.values()):
        raise UserError(f"{flag} {path} is not a fingerprint (a JSON object of sections such as torch, python)", hint)
    return obj


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
    from titan.preflight.analyze import section_verdicts

    t = Table(title="verdict by section", box=None, show_header=False)
    t.add_column("section", style="bold", no_wrap=True)
    t.add_column("status", no_wrap=True)
    t.add_column("detail", overflow="fold")
    colour = {"ok": "green", "mismatch": "red", "failed": "red", "not run": "dim"}
    for s in verdict.get("sections") or section_verdicts(verdict):
        t.add_row(s["title"], Text(s["status"], style=colour.get(s["status"], "")), s["detail"])
    con.print(t)
    con.print(styled("preflight: ", (str(verdict["verdict"]), "bold"), f" — {len(verdict['members'])} members"
              + (f" — {verdict['run_dir']}" if verdict.get("run_dir") else "")))
    return code
