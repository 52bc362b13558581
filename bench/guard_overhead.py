"""Step-time overhead of the step guard, side by side in one run.

Three loops on the same model, data and optimizer, interleaved in blocks so that machine
noise hits them alike:

* ``bare``   — forward/backward, ``clip_grad_norm_``, ``optimizer.step``, ``scheduler.step``;
* ``guard``  — the same through ``StepGuard.step`` (check, decide, clip, step);
* ``recipe`` — the common recipe: a Python loop of ``isnan().any()`` / ``isinf().any()``
  per parameter (one host sync per parameter on a GPU), then clip and step.

``--world 2`` runs the loops under DDP on 2 gloo ranks (the guard then adds its comm hook's
pre-reduce read and its one small all-reduce). Prints a table and, with ``--append``, adds
it to ``docs/benchmarks.md``. On a CUDA machine ``--sync-debug`` runs the guard under
``torch.cuda.set_sync_debug_mode("warn")`` and reports the host syncs it counts per step.

    .venv/bin/python bench/guard_overhead.py --preset tiny --preset 100m --append
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

MODES = ("bare", "guard", "recipe")


def _setup(preset: str, batch: int, seq: int | None, device: torch.device, world: int):
    from titan.guard import GuardConfig, StepGuard
    from titan.workloads.tinygpt.config import PRESETS
    from titan.workloads.tinygpt.model import GPT
    import dataclasses

    cfg = PRESETS[preset]
    if seq:
        cfg = dataclasses.replace(cfg, seq_len=seq)
    torch.manual_seed(0)
    model = GPT(cfg).to(device)
    wrapped: nn.Module = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    guard = StepGuard(wrapped, opt, scheduler=sched, max_norm=1.0,
                      policy=GuardConfig(replay=True), node=platform.node())
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), device=device)
    y = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), device=device)

    mark = {"t": 0.0}

    def fwd_bwd() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = wrapped(x, y)
        loss.backward()
        _sync(device)
        mark["t"] = time.perf_counter()  # end of backward: what follows is the loop's overhead
        return loss.detach()

    def bare() -> None:
        fwd_bwd()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()

    def recipe() -> None:
        fwd_bwd()
        bad = False
        for p in model.parameters():
            if p.grad is not None and (bool(p.grad.isnan().any()) or bool(p.grad.isinf().any())):
                bad = True
        if not bad:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()

    def guarded() -> None:
        guard.step(fwd_bwd)

    return model, {"bare": bare, "guard": guarded, "recipe": recipe}, mark, guard


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(preset: str, *, batch: int, seq: int | None, blocks: int, per_block: int, warmup: int,
            device: torch.device, world: int) -> dict:
    model, fns, mark, _ = _setup(preset, batch, seq, device, world)
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {m: [] for m in MODES}
    post: dict[str, list[float]] = {m: [] for m in MODES}
    for b in range(blocks):
        order = MODES[b % 3:] + MODES[:b % 3]  # rotate so no mode always runs first
        for m in order:
            for _ in range(per_block):
                if world > 1:
                    dist.barrier()
                _sync(device)
                t0 = time.perf_counter()
                fns[m]()
                _sync(device)
                t1 = time.perf_counter()
                times[m].append(t1 - t0)
                post[m].append(t1 - mark["t"])
    med = {m: statistics.median(v) for m, v in times.items()}
    med_post = {m: statistics.median(v) for m, v in post.items()}
    return {"preset": preset, "params": sum(p.numel() for p in model.parameters()), "batch": batch,
            "seq": seq, "steps_per_mode": len(times["bare"]), "median_s": med, "median_post_s": med_post,
            "guard_overhead_pct": 100 * (med["guard"] / med["bare"] - 1),
            "recipe_overhead_pct": 100 * (med["recipe"] / med["bare"] - 1)}


def check_cost(preset: str, *, batch: int, seq: int | None, reps: int, device: torch.device) -> dict:
    """World 1: the decision alone after one backward (no optimizer), interleaved, medians.

    bare: ``get_total_norm`` + ``clip_grads_with_norm_``; guard: the guard's check,
    exchange and verdict + the same clip; recipe: the per-parameter ``isnan``/``isinf``
    loop + the bare clip. Low-noise: no forward/backward or optimizer inside the timing.
    """
    from titan.guard.decision import exchange

    model, _, _, guard = _setup(preset, batch, seq, device, 1)
    params = [p for p in model.parameters()]
    loss = model(*_batch(model, batch, seq, device))
    loss.backward()
    grads = [p.grad for p in params if p.grad is not None]

    def bare() -> None:
        total = torch.nn.utils.get_total_norm(grads)
        torch.nn.utils.clip_grads_with_norm_(params, 1e9, total)

    def guarded() -> None:
        chk = guard.check
        chk.begin_step()
        units = chk.local_unit_norms()
        obs = exchange(loss.detach(), torch.linalg.vector_norm(units), chk.norm_slot(), partial_sq=False,
                       scale=None)
        guard._judge(obs)
        torch.nn.utils.clip_grads_with_norm_(params, 1e9, obs.norm_t)

    def recipe() -> None:
        bad = any(bool(g.isnan().any()) or bool(g.isinf().any()) for g in grads)
        if not bad:
            bare()

    fs = {"bare": bare, "guard": guarded, "recipe": recipe}
    t: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(reps):
        for m in MODES[i % 3:] + MODES[:i % 3]:
            _sync(device)
            t0 = time.perf_counter()
            fs[m]()
            _sync(device)
            t[m].append(time.perf_counter() - t0)
    return {"preset": preset, **{m: statistics.median(v) for m, v in t.items()}}


def _batch(model: nn.Module, batch: int, seq: int | None, device: torch.device):
    cfg = model.cfg if hasattr(model, "cfg") else None
    vocab = cfg.vocab_size if cfg else 256
    n = seq or (cfg.seq_len if cfg else 64)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, vocab, (batch, n), generator=g).to(device)
    return x, torch.roll(x, -1, 1)


def sync_count(preset: str, batch: int, device: torch.device) -> dict:
    """GPU only: count host syncs of one guarded step under sync debug mode ``warn``."""
    import warnings

    _, fns, _, _ = _setup(preset, batch, None, device, 1)
    fns["guard"]()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            fns["guard"]()
            n = sum("synchroniz" in str(x.message) for x in w)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return {"preset": preset, "host_syncs_per_guarded_step": n}


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rows = [measure(p, batch=args.batch, seq=args.seq, blocks=args.blocks, per_block=args.per_block,
                        warmup=args.warmup, device=torch.device("cpu"), world=world) for p in args.preset]
        if rank == 0:
            Path(out).write_text(json.dumps(rows))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", choices=("tiny", "100m"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=None, help="override the preset's sequence length")
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--per-block", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--sync-debug", action="store_true")
    ap.add_argument("--check-reps", type=int, default=30, help="repetitions of the decision-only timing (world 1)")
    ap.add_argument("--append", action="store_true", help="append the table to docs/benchmarks.md")
    args = ap.parse_args(argv)
    args.preset = args.preset or ["tiny"]
    torch.set_num_threads(args.threads)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.world > 1:
        import socket
        import tempfile

        import torch.multiprocessing as mp

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = tempfile.mktemp(suffix=".json")
        mp.spawn(_worker, args=(args.world, port, args, out), nprocs=args.world)
        rows = json.loads(Path(out).read_text())
        os.unlink(out)
    else:
        rows = [measure(p, batch=args.batch, seq=args.seq, blocks=args.blocks, per_block=args.per_block,
                        warmup=args.warmup, device=device, world=1) for p in args.preset]
    lines = ["| preset | params | world | bare ms | guard ms | recipe ms | guard overhead | recipe overhead "
             "| after-backward ms bare / guard / recipe |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, q = r["median_s"], r["median_post_s"]
        lines.append(f"| {r['preset']} | {r['params'] / 1e6:.2f}M | {args.world} | {m['bare'] * 1e3:.1f} | "
                     f"{m['guard'] * 1e3:.1f} | {m['recipe'] * 1e3:.1f} | {r['guard_overhead_pct']:+.1f} % | "
                     f"{r['recipe_overhead_pct']:+.1f} % | {q['bare'] * 1e3:.2f} / {q['guard'] * 1e3:.2f} / "
                     f"{q['recipe'] * 1e3:.2f} |")
    if args.world == 1 and args.check_reps:
        lines += ["", "| preset | decision after backward, ms: bare (norm + clip) | guard (check + exchange + verdict + clip) "
                  "| recipe (isnan/isinf loop + clip) | guard extra, % of the bare step |", "|---|---|---|---|---|"]
        for r in rows:
            c = check_cost(r["preset"], batch=args.batch, seq=args.seq, reps=args.check_reps, device=device)
            extra = 100 * (c["guard"] - c["bare"]) / r["median_s"]["bare"]
            lines.append(f"| {r['preset']} | {c['bare'] * 1e3:.2f} | {c['guard'] * 1e3:.2f} | {c['recipe'] * 1e3:.2f} "
                         f"| {extra:+.2f} % |")
    if args.sync_debug and device.type == "cuda":
        for p in args.preset:
            lines.append(f"\nhost syncs per guarded step ({p}): {sync_count(p, args.batch, device)}")
    table = "\n".join(lines)
    print(table)
    if args.append:
        cmd = "python bench/guard_overhead.py " + " ".join(sys.argv[1:] if argv is None else argv)
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        machine = f"{platform.node()}, {os.cpu_count()} CPUs, {device.type}, torch {torch.__version__}"
        docs = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"
        with docs.open("a") as f:
            f.write(f"\n### guard overhead ({when})\n\n`{cmd}` — {machine}; medians of "
                    f"{rows[0]['steps_per_mode']} steps per mode, interleaved blocks, "
                    f"batch {args.batch}, {args.threads} intra-op thread(s), load average "
                    f"{os.getloadavg()[0]:.1f} at the end.\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
