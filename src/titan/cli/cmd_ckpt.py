"""``titan ckpt ls|verify|inspect RUN_DIR``: list, verify and look inside checkpoints.

``RUN_DIR`` is a run directory (its ``checkpoints/`` is used) or a checkpoint root. Reads
never unpickle anything but DCP's metadata classes (``titan.checkpoint.storage``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from titan.cli._common import print_json, whole
from titan.cli.environment import Environment, styled
from titan.errors import UserError
from titan.exitcodes import ExitCode


#: What this verb can exit with (its --help lists them).
EXIT_CODES = (ExitCode.SUCCEEDED, ExitCode.JOB_FAILED, ExitCode.USER_ERROR)


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("ckpt", help="list, verify and inspect checkpoints",
                       description="List, verify (manifest + checksums) and inspect a run's checkpoints.")
    p.add_argument("action", choices=["ls", "verify", "inspect"])
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory or checkpoint root")
    p.add_argument("--step", type=whole(0, 10**12, "a step"), help="only this step (verify, inspect; default: all / latest)")
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
            row.update(world_size=m.get("world_size"), bytes=_num(m.get("bytes")), created=_text(m.get("created")),
                       torch=_text(m.get("torch")), files=len(m["files"]))
        except ValueError as e:
            row["problem"] = str(e)
        out.append(row)
    return out


def _num(x: Any) -> float | None:
    return x if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def _text(x: Any) -> str | None:
    return x if isinstance(x, str) else None


def run(args: argparse.Namespace, env: Environment) -> ExitCode:
    if args.action == "ls" and args.step is not None:
        raise UserError("`titan ckpt ls` lists every checkpoint; --step does not apply", "drop --step, or use verify/inspect")
    if args.quick and args.action != "verify":
        raise UserError(f"--quick only applies to verify, not {args.action}", "drop --quick")
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
                  (r.get("created") or "")[:19],
                  "; ".join(x for x in ("← latest" if r["latest"] else "", r.get("problem", "")) if x), style=style)
    env.console.print(t)
    env.console.print(f"{len(rows)} checkpoint directories in {root}")
    return ExitCode.SUCCEEDED


def _verify(root: Path, args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.checkpoint.manifest import list_committed, step_dir_name, verify

    targets = [root / step_dir_name(args.step)] if args.step is not None else [p for _, p in list_committed(root)]
    if not targets:
        raise UserError(f"no committed checkpoints in {root}", "check the path; `titan ckpt ls` lists what is there")
    if not targets[0].is_dir():
        raise UserError(f"no checkpoint {targets[0].name} in {root}", "`titan ckpt ls RUN_DIR` lists the steps there")
    results = [verify(p, checksums=not args.quick) for p in targets]
    if args.json:
        print_json(env, [{"name": r.path.name, "ok": r.ok, "problems": r.problems, "seconds": r.seconds,
                          "bytes_read": r.bytes_read} for r in results])
    else:
        for r in results:
            mark = ("ok", "green") if r.ok else ("BAD", "red")
            rate = f" ({r.bytes_read / max(r.seconds, 1e-9) / 1e6:.0f} MB/s)" if r.bytes_read else ""
            env.console.print(styled(mark, f"  {r.path.name}  {r.seconds:.3f}s{rate}  {'' if r.ok else r.reason}"))
    bad = [r for r in results if not r.ok]
    if bad:
        env.stderr.write(f"titan: error: {len(bad)} of {len(results)} checkpoint(s) failed verification "
                         f"(first: {bad[0].path.name})\nhint: a restart skips a damaged checkpoint and loads the "
                         "newest good one; delete or move the damaged ones to reclaim space\n")
        env.stderr.flush()
    return ExitCode.JOB_FAILED if bad else ExitCode.SUCCEEDED


def _inspect(root: Path, args: argparse.Namespace, env: Environment) -> ExitCode:
    from titan.checkpoint.manifest import read_latest, read_manifest, step_dir_name
    from titan.checkpoint.storage import UnsafeCheckpointError, load_metadata_file

    name = step_dir_name(args.step) if args.step is not None else read_latest(root)
    if not name or not (root / name).is_dir():
        raise UserError(f"no checkpoint {name or '(latest)'} in {root}", "see `titan ckpt ls RUN_DIR`")
    d = root / name
    try:
        manifest = read_manifest(d)
    except ValueError as e:
        raise UserError(f"{name}: {e}", "run `titan ckpt verify` to see what is wrong") from None
    try:
        md = load_metadata_file(d)
    except (OSError, UnsafeCheckpointError) as e:
        raise UserError(f"{name}: cannot read .metadata: {e}", "the checkpoint is damaged or was tampered with") from None
    except Exception as e:  # noqa: BLE001 - a truncated or garbage pickle raises anything
        raise UserError(f"{name}: .metadata is damaged ({type(e).__name__}: {e})",
                        "run `titan ckpt verify` to see what is wrong") from None
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
    mb = _num(manifest.get("bytes"))
    env.console.print(styled((str(name), "bold"), f"  step {manifest['step']}  world {manifest.get('world_size', '?')}  "
                      f"{'?' if mb is None else f'{mb / 1e6:.1f}'} MB  torch {manifest.get('torch', '?')}  "
                      f"titan {manifest.get('titan', '?')}"))
    t = Table(box=None, header_style="bold")
    for c in ("key", "kind", "shape", "dtype"):
        t.add_column(c, overflow="fold")
    for it in items:
        t.add_row(it["key"], it["kind"], "" if it["shape"] is None else "×".join(map(str, it["shape"])) or "()",
                  it["dtype"] or "")
    env.console.print(t)
    return ExitCode.SUCCEEDED
