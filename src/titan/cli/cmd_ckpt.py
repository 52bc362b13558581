"""``titan ckpt ls|verify|inspect RUN_DIR``: list, verify and look inside checkpoints.

``RUN_DIR`` is a run directory (its ``checkpoints/`` is used) or a checkpoint root. Reads
never unpickle anything but DCP's metadata classes (``titan.checkpoint.storage``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from titan.cli._common import print_json
from titan.cli.environment import Environment
from titan.errors import UserError
from titan.exitcodes import ExitCode


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("ckpt", help="list, verify and inspect checkpoints",
                       description="List, verify (manifest + checksums) and inspect a run's checkpoints.")
    p.add_argument("action", choices=["ls", "verify", "inspect"])
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory or checkpoint root")
    p.add_argument("--step", type=int, help="only this step (verify, inspect; default: all / latest)")
    p.add_argument("--quick", action="store_true", help="verify sizes only, no checksums")
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    return p


def _root(env: Environment, arg: str) -> Path:
    p = env.path(arg)
    if not p.is_dir():
        raise UserError(f"{arg} is not a directory", "give a run directory (runs/<id>) or its checkpoints/ folder")
    return p / "checkpoints" if (p / "checkpoints").is_dir() else p


def _entries(root: Path) -> list[dict[str, Any]]:
    from titan.checkpoint.manifest import parse_step, read_latest, read_manifest

    latest = read_latest(root)
    out = []
    for d in sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")):
        base = d.name.split(".")[0]
        state = "partial" if d.name.endswith(".partial") else "corrupt" if ".corrupt-" in d.name else "committed"
        row: dict[str, Any] = {"name": d.name, "step": parse_step(base), "state": state, "latest": d.name == latest}
        try:
            m = read_manifest(d)
            row.update(world_size=m["world_size"], bytes=m.get("bytes"), created=m.get("created"),
                       torch=m.get("torch"), files=len(m["files"]))
        except ValueError as e:
            row["problem"] = str(e)
        out.append(row)
    return out


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    root = _root(env, args.run_dir)
    if args.action == "ls":
        return _ls(root, args, env)
    if args.action == "verify":
        return _verify(root, args, env)
    return _inspect(root, args, env)


def _ls(root: Path, args: argparse.Namespace, env: Environment) -> ExitCode:
    rows = _entries(root)
    if args.json:
        print_json(env, rows)
        return ExitCode.SUCCEEDED
    t = Table(box=None, header_style="bold")
    for c in ("checkpoint", "step", "state", "world", "MB", "created", ""):
        t.add_column(c)
    for r in rows:
        style = {"partial": "yellow", "corrupt": "red"}.get(r["state"])
        mb = f"{r['bytes'] / 1e6:.1f}" if r.get("bytes") else ""
        t.add_row(r["name"], str(r["step"]), r["state"], str(r.get("world_size", "")), mb,
                  (r.get("created") or "")[:19], "← latest" if r["latest"] else r.get("problem", ""), style=style)
    env.console.print(t)
    env.console.print(f"{len(rows)} checkpoint directories in {root}")
    return ExitCode.SUCCEEDED


def _verify(root: Path, args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.checkpoint.manifest import list_committed, step_dir_name, verify

    targets = [root / step_dir_name(args.step)] if args.step is not None else [p for _, p in list_committed(root)]
    if not targets:
        raise UserError(f"no committed checkpoints in {root}", "check the path; `titan ckpt ls` lists what is there")
    results = [verify(p, checksums=not args.quick) for p in targets]
    if args.json:
        print_json(env, [{"name": r.path.name, "ok": r.ok, "problems": r.problems, "seconds": r.seconds,
                          "bytes_read": r.bytes_read} for r in results])
    else:
        for r in results:
            mark = "[green]ok[/]" if r.ok else "[red]BAD[/]"
            rate = f" ({r.bytes_read / max(r.seconds, 1e-9) / 1e6:.0f} MB/s)" if r.bytes_read else ""
            env.console.print(f"{mark}  {r.path.name}  {r.seconds:.3f}s{rate}  {'' if r.ok else r.reason}")
    return ExitCode.SUCCEEDED if all(r.ok for r in results) else ExitCode.JOB_FAILED


def _inspect(root: Path, args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.checkpoint.manifest import read_latest, read_manifest, step_dir_name
    from titan.checkpoint.storage import UnsafeCheckpointError, safe_unpickle_metadata

    name = step_dir_name(args.step) if args.step is not None else read_latest(root)
    if not name or not (root / name).is_dir():
        raise UserError(f"no checkpoint {name or '(latest)'} in {root}", "see `titan ckpt ls RUN_DIR`")
    d = root / name
    try:
        manifest = read_manifest(d)
    except ValueError as e:
        raise UserError(f"{name}: {e}", "run `titan ckpt verify` to see what is wrong") from None
    try:
        md = safe_unpickle_metadata((d / ".metadata").read_bytes())
    except (OSError, UnsafeCheckpointError) as e:
        raise UserError(f"{name}: cannot read .metadata: {e}", "the checkpoint is damaged or was tampered with") from None
    items = []
    for fqn, m in sorted(md.state_dict_metadata.items()):
        size = getattr(m, "size", None)
        props = getattr(m, "properties", None)
        items.append({"key": fqn, "kind": "tensor" if size is not None else "bytes",
                      "shape": list(size) if size is not None else None,
                      "dtype": str(props.dtype).replace("torch.", "") if props is not None else None})
    if args.json:
        print_json(env, {"name": name, "manifest": manifest, "items": items})
        return ExitCode.SUCCEEDED
    env.console.print(f"[bold]{name}[/]  step {manifest['step']}  world {manifest['world_size']}  "
                      f"{manifest['bytes'] / 1e6:.1f} MB  torch {manifest['torch']}  titan {manifest['titan']}")
    t = Table(box=None, header_style="bold")
    for c in ("key", "kind", "shape", "dtype"):
        t.add_column(c, overflow="fold")
    for it in items:
        t.add_row(it["key"], it["kind"], "" if it["shape"] is None else "×".join(map(str, it["shape"])) or "()",
                  it["dtype"] or "")
    env.console.print(t)
    return ExitCode.SUCCEEDED
