"""The tinygpt training loop — the reference workload, wired with every Titan capability.

The Titan-specific lines are marked ``# titan:``. Everything else is an ordinary DDP loop:
AdamW, linear warm-up + cosine (LambdaLR), optional gradient accumulation (``no_sync`` on
the micro-steps), a ``for`` loop over each step's micro-batches. Beyond the README's wiring
(examples/ddp.py is the minimal one) it shows the advanced calls: the replay closure, a
prefetching loader (``commit="advance"``), rollback to in-memory snapshots, SDC checks,
tracing. One ``step`` event per optimizer step.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
import time
from typing import Any, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

import titan.beacon as beacon  # titan: progress beacons the hang watchdog reads
from titan.checkpoint import Checkpointer  # titan: checkpoints
from titan.guard import StepGuard
from titan.errors import UserError
from titan.exitcodes import ExitCode
from titan.settings import SECTIONS, Settings, load_settings
from titan.sdc.monitor import SDCMonitor
from titan.tracing.tracer import StepTracer
from titan.worker import RankLogFilter, WorkerContext, add_comm_hook_wrapper, init_distributed
from titan.worker.errors import fault_boundary
from titan.workloads.tinygpt.args import parse_args
from titan.workloads.tinygpt.config import PRESETS, GPTConfig
from titan.data import step_batches
from titan.workloads.tinygpt.data import MarkovCorpus, ResumableSampler
from titan.workloads.tinygpt.model import GPT
from titan.workloads.tinygpt.rng import seed_everything, warmup_cosine

__all__ = ["main", "model_config", "train"]

log = logging.getLogger(__name__)


def model_config(args: argparse.Namespace) -> GPTConfig:
    """The preset with any per-flag overrides applied."""
    over = {k: v for k, v in {"seq_len": args.seq_len, "n_layer": args.layers, "d_model": args.width,
                              "n_head": args.heads, "vocab_size": args.vocab, "dropout": args.dropout}.items()
            if v is not None}
    return dataclasses.replace(PRESETS[args.preset], **over)


def _settings(args: argparse.Namespace) -> Settings:
    cli: dict[str, Any] = {}
    for item in args.overrides:
        key, _, value = item.partition("=")
        cli[key.strip()] = value
    if args.ckpt_every is not None and "checkpoint" in SECTIONS:
        cli["checkpoint.every_steps"] = args.ckpt_every
    return load_settings(cli=cli)


def _to(batch: tuple[torch.Tensor, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = batch
    return x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def forward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One micro-batch forward pass; returns the mean token loss."""
    return model(x, y)


def backward(loss: torch.Tensor, grad_accum: int) -> None:
    """Accumulate gradients of ``loss / grad_accum`` (DDP all-reduces on the last micro-step)."""
    (loss / grad_accum).backward()


def _mean_over_ranks(value: torch.Tensor, world: int) -> float:
    if world > 1:  # one tiny all-reduce so every rank reports the same loss
        value = value.clone()
        dist.all_reduce(value)
        value /= world
    return float(value)


def step_samples(sampler: ResumableSampler, grad_accum: int) -> list[int]:
    """This rank's dataset indices of the step about to be committed (for the guard's log)."""
    return [i for k in range(grad_accum)
            for i in sampler.stream(k * sampler.global_batch + sampler.rank * sampler.batch_size,
                                    sampler.batch_size)]


def train(args: argparse.Namespace, ctx: WorkerContext) -> dict[str, Any]:
    """Train ``args.steps`` optimizer steps (resuming from a checkpoint when there is one)."""
    distributed = ctx.world_size > 1
    backend = init_distributed(ctx, "gloo" if args.device == "cpu" else None) if distributed else None  # titan
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()
                                         and backend in (None, "nccl"))
    device = torch.device("cuda", ctx.local_rank) if use_cuda else torch.device("cpu")

    cfg = model_config(args)
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    # bf16: the parameters themselves (so gradients and AdamW moments too), not autocast —
    # autocast keeps every persistent tensor fp32 (docs/workload.md).
    model = GPT(cfg).to(device=device, dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    seed_everything(args.seed, ctx.rank)  # per-rank dropout streams, reproducible
    ddp: torch.nn.Module = DDP(model, device_ids=[device.index] if use_cuda else None) if distributed else model

    lr = args.lr if args.lr is not None else (3e-3 if args.preset == "tiny" else 3e-4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(args.warmup, args.steps, args.min_lr_ratio))
    corpus = MarkovCorpus(cfg.vocab_size, cfg.seq_len, num_samples=args.num_samples, seed=args.seed)
    # Workers may prefetch: the position moves only when a step is committed (advance below).
    sampler = ResumableSampler(len(corpus), args.batch_size, seed=args.seed, rank=ctx.rank, commit="advance",
                               world_size=ctx.world_size)
    # titan: the step guard checks, clips and steps, and drives the beacon's phases, a drill's
    # injection points and DDP's warm-up after a restore; --no-guard keeps all but the checks.
    policy = dataclasses.replace(ctx.settings.guard, enabled=False) if args.no_guard else None
    guard = StepGuard(ddp, optimizer, scheduler=scheduler, max_norm=args.clip, ctx=ctx, policy=policy,
                      step_events=False)
    app_state: dict[str, Any] = {"model": model, "optimizer": optimizer, "scheduler": scheduler,
                                 "sampler": sampler, "guard": guard}  # titan: the guard's statistics too

    ckpt = None if args.no_ckpt else Checkpointer(ctx, seed=args.seed)  # titan: checkpoints
    if ckpt is not None and not args.no_guard:
        guard.use_checkpointer(ckpt, app_state)  # titan: escalation rolls back to the /dev/shm snapshot
    start = ckpt.restore(app_state) if ckpt is not None else 0  # titan: resume after step `start`
    faults = guard.progress.faults  # a drill's faults (TITAN_CHAOS_PLAN), applied by the guard
    sdc = None
    if ctx.settings.sdc.enabled and not args.no_sdc:  # titan: silent-corruption checks + in-job repair
        if ckpt is not None:
            ckpt.enable_snapshots()  # verified snapshots: taken only when the replicas agree
        sdc = SDCMonitor(ctx, model, optimizer, ctx.settings.sdc,
                         rollback=(lambda: guard.rollback("silent data corruption")) if ckpt and not args.no_guard
                         else (lambda: ckpt.rollback(app_state)) if ckpt is not None else None,
                         snapshot=(lambda s: ckpt.snapshot(s, app_state)) if ckpt is not None else None,
                         perturbed=faults.gemm_perturbed if faults is not None else (lambda: False))

    ctx.events.emit("workload.config", f"tinygpt {args.preset}: {model.num_params():,} params", data={
        "preset": args.preset, "params": model.num_params(), "model": dataclasses.asdict(cfg),
        "batch_size": args.batch_size, "grad_accum": args.grad_accum, "lr": lr, "steps": args.steps, "dtype": args.dtype,
        "start_step": start, "device": str(device), "backend": backend, "num_workers": args.num_workers,
        "checkpoints": ckpt is not None, "samples": sampler.consumed,
    })
    # The loader is built after restore: its iterator starts at the committed position.
    # Its own generator keeps the global RNG (dropout) untouched by iterator creation.
    loader = DataLoader(corpus, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.num_workers, pin_memory=use_cuda,
                        generator=torch.Generator().manual_seed(args.seed))
    if sdc is not None:
        sdc.start(start)  # titan: verify the starting state and snapshot it
    losses: list[float] = []
    t_start = time.perf_counter()
    try:
        last = min(args.steps, args.stop_at or args.steps)
        step = start
        # titan: each step's micro-batches (what a replay reuses); after a rollback the stream
        # goes on from the restored position — the loop needs no rewiring.
        for micro_batches in step_batches(loader, args.grad_accum, to=lambda b: _to(b, device)):
            if guard.step_count >= last:
                break
            step = guard.step_count + 1

            def fwd_bwd() -> torch.Tensor:
                optimizer.zero_grad(set_to_none=True)
                loss_sum = torch.zeros((), device=device)
                for micro, (x, y) in enumerate(micro_batches):
                    sync = micro == args.grad_accum - 1
                    with contextlib.nullcontext() if sync or not distributed else ddp.no_sync():
                        loss = forward(ddp, x, y)
                        backward(loss, args.grad_accum)
                    loss_sum += loss.detach()
                return loss_sum / args.grad_accum

            # titan: check, decide (same on every rank), replay, clip, step
            res = guard.step(fwd_bwd, samples=lambda: step_samples(sampler, args.grad_accum))
            if res.rolled_back_to is not None:  # titan: in-memory snapshot restored, stream rewound
                continue
            mean_loss = res.loss_mean if not args.no_guard else _mean_over_ranks(
                torch.tensor(res.loss, device=device), ctx.world_size)
            # Commit the consumed samples only now: a prefetching loader never moves the state.
            sampler.advance(args.grad_accum * sampler.global_batch)
            losses.append(mean_loss)
            guard.emit_step(res, loss=mean_loss, samples=sampler.consumed,  # titan: one event per step
                            **(sdc.event_data() if sdc is not None else {}))
            if sdc is not None:
                with beacon.phase("sdc"):
                    back = sdc.after_step(step)  # titan: fingerprints every sdc.every_steps, canary
                if back is not None:  # titan: a replica diverged: rolled back to a verified snapshot
                    continue
            if ckpt is not None:
                ckpt.maybe_save(step, app_state)  # titan: every checkpoint.every_steps (phase `checkpoint`)
            if ctx.rank == 0 and args.log_every and step % args.log_every == 0:
                log.info("step %d/%d loss %.4f lr %.2e grad_norm %.3f", step, args.steps, mean_loss,
                         res.lr, res.grad_norm)
    finally:
        beacon.done()  # titan: training is over; teardown below is not a hang
        if ckpt is not None:
            ckpt.close()  # titan: waits for an async save in flight
    step = guard.step_count
    if ckpt is not None and step >= args.steps:
        ckpt.discard_snapshots()  # titan: finished for good; /dev/shm snapshots are RAM
    if args.out and ctx.rank == 0:
        torch.save({k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, args.out)
    return {"steps": last, "start_step": start, "losses": losses,
            "seconds": time.perf_counter() - t_start}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m titan.workloads.tinygpt``; returns the exit status."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if args.threads is not None:
        torch.set_num_threads(args.threads)  # before announce(): recorded in worker.started
    try:
        settings = _settings(args)
        if args.device == "cuda" and not torch.cuda.is_available():
            raise UserError("--device cuda but torch sees no CUDA device", "use --device auto or cpu")
        try:
            model_config(args)
        except ValueError as e:
            raise UserError(f"invalid model shape: {e}", "see --help and docs/workload.md for the presets") from None
    except UserError as e:  # a user mistake: one line and a hint, no traceback
        print(f"tinygpt: error: {e.message}\nhint: {e.hint}", file=sys.stderr)
        return int(ExitCode.USER_ERROR)
    # titan: rank, attempt, run dir, events; wired: worker.started, the beacon and stack dumps
    # the watchdog reads (before init_distributed), the fault boundary (exit codes 10/11).
    ctx = WorkerContext.from_env(settings, wire=True)
    for handler in logging.getLogger().handlers:  # stamp rank/attempt/step on every line
        handler.addFilter(RankLogFilter(ctx))
    bcn = ctx.beacon
    tracer = StepTracer(ctx, ctx.settings.tracing)  # titan: OpenTelemetry spans (off by default)
    if tracer.enabled:
        if bcn is not None:
            bcn.listener = tracer  # the beacon's phase marks become spans
        add_comm_hook_wrapper(tracer.wrap_comm_hook)  # one span per DDP bucket, under backward
    try:
        with fault_boundary(ctx):  # titan: a comm/CUDA fault or a give-up exits with its documented code
            result = train(args, ctx)
        ctx.events.emit("workload.finished", f"trained to step {result['steps']}", step=result["steps"],
                        data={"start_step": result["start_step"], "seconds": result["seconds"],
                              "final_loss": result["losses"][-1] if result["losses"] else None})
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        tracer.close()
        ctx.events.close()
    return 0


if __name__ == "__main__":  # `titan run -- src/titan/workloads/tinygpt/train.py` (README) as well as `-m`
    raise SystemExit(main())
