"""One rank of a preflight job: ``python -m titan.preflight.worker`` under torchrun/``titan run``.

Every rank fingerprints itself and runs the self-tests; rank 0 gathers, analyses and
writes ``preflight.json`` into the run directory (and ``--out`` when given).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

__all__ = ["main", "run_preflight_rank"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m titan.preflight.worker")
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--duration-s", type=float, default=0.0)
    p.add_argument("--pair-bytes", type=int, default=4 << 20)
    p.add_argument("--io-bytes", type=int, default=64 << 20)
    p.add_argument("--io-dir", default=None, help="checkpoint folder to test (default: RUN_DIR/checkpoints)")
    p.add_argument("--packages", default=None, help="comma-separated Python packages to compare")
    p.add_argument("--baseline", default=None, help="known-good fingerprint JSON")
    p.add_argument("--out", default=None)
    p.add_argument("--skip", default="", help="comma-separated tests to skip: sweep,pairs,gemm,io")
    return p


def run_preflight_rank(argv: Sequence[str] | None = None) -> dict[str, Any] | None:
    """Run this rank's part; returns the verdict on rank 0, ``None`` elsewhere."""
    import torch
    import torch.distributed as dist

    from titan.preflight import selftest
    from titan.preflight.analyze import analyze
    from titan.preflight.fingerprint import DEFAULT_PACKAGES, collect_fingerprint
    from titan.worker import WorkerContext, init_distributed

    args = _parser().parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    ctx = WorkerContext.from_env()
    ctx.announce()
    backend = init_distributed(ctx)
    device = torch.device("cuda", ctx.local_rank) if backend == "nccl" else torch.device("cpu")
    packages = tuple(filter(None, args.packages.split(","))) if args.packages else DEFAULT_PACKAGES
    mine: dict[str, Any] = {"rank": ctx.rank, "node": ctx.node, "fingerprint": collect_fingerprint(packages)}

    def guarded(name: str, fn: Any) -> Any:
        if name in skip or "error" in mine:
            return None
        try:
            return fn()
        except RuntimeError as e:  # a collective failing is a finding, not a crash
            mine["error"] = {"test": name, "message": str(e).splitlines()[0]}
            return None

    mine["sweep"] = guarded("sweep", lambda: selftest.collective_sweep(args.max_bytes, device, duration_s=args.duration_s))
    if ctx.world_size >= 3:
        mine["pairs"] = guarded("pairs", lambda: selftest.pairwise_bandwidth(args.pair_bytes, device))
    mine["gemm"] = guarded("gemm", lambda: selftest.gemm_canary(device))
    io_dir = Path(args.io_dir) if args.io_dir else ctx.run_dir.checkpoints
    dist.barrier()  # all ranks hit the folder at once, as a checkpoint does
    mine["io"] = guarded("io", lambda: selftest.io_test(io_dir, args.io_bytes, ctx.rank))
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, mine)
    verdict = None
    if ctx.rank == 0:
        baseline = json.loads(Path(args.baseline).read_text()) if args.baseline else None
        verdict = analyze(gathered, baseline)
        verdict["fingerprints"] = {f"{r['node']}/rank{r['rank']}": r["fingerprint"] for r in gathered}
        text = json.dumps(verdict, indent=2, sort_keys=True, default=str)
        (ctx.run_dir.path / "preflight.json").write_text(text)
        if args.out:
            Path(args.out).write_text(text)
        ctx.events.emit("preflight.result", f"preflight: {verdict['verdict']}",
                        level="info" if verdict["exit_code"] == 0 else "error",
                        data={"verdict": verdict["verdict"], "differences": verdict["differences"], "flags": verdict["flags"]})
    dist.barrier()
    dist.destroy_process_group()
    ctx.events.close()
    return verdict


def main(argv: Sequence[str] | None = None) -> int:
    run_preflight_rank(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
