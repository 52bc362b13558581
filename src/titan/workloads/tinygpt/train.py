"""The tinygpt training loop — and the readable example of wiring Titan into a script.

The Titan-specific lines are marked ``# titan:``. Everything else is an ordinary DDP loop:
AdamW, linear warm-up + cosine (LambdaLR), optional gradient accumulation (``no_sync`` on
the micro-steps), ``clip_grad_norm_``. One ``step`` event per optimizer step.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
import time
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

import titan.beacon as beacon  # titan: progress beacons the hang watchdog reads
from titan.checkpoint import Checkpointer, ddp_warmup  # titan: checkpoints
from titan.guard import StepGuard
from titan.errors import UserError
from titan.exitcodes import ExitCode
from titan.settings import SECTIONS, Settings, load_settings
from titan.watchdog.policy import check_progress, restart_backoff  # titan: restart policy
from titan.chaos.worker import WorkerFaults
from titan.sdc.monitor import SDCMonitor
from titan.tracing.tracer import StepTracer
from titan.worker import RankLogFilter, WorkerContext, add_comm_hook_wrapper, init_distributed
from titan.workloads.tinygpt.args import parse_args
from titan.workloads.tinygpt.config import PRESETS, GPTConfig
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


def _batches(loader: DataLoader, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for x, y in loader:  # the sampler is infinite: this never ends by itself
        yield x.to(device, non_blocking=True), y.to(device, non_blocking=True)


def forward(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One micro-batch forward pass; returns the mean token loss."""
    return model(x, y)


def backward(loss: torch.Tensor, grad_accum: int) -> None:
    """Accumulate gradients of ``loss / grad_accum`` (DDP all-reduces on the last micro-step)."""
    (loss / grad_accum).backward()


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler, clip: float) -> float:
    """Clip, step, advance the schedule, zero the gradients; returns the pre-clip grad norm.

    Cost: one host sync (the norm's ``.item()``).
    """
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return float(grad_norm)


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
    restart_backoff(ctx)  # titan: sleep before rejoining on the 2nd+ restart
    with beacon.phase("init"):
        backend = init_distributed(ctx) if distributed else None  # titan: retries, backoff, events
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()
                                         and backend in (None, "nccl"))
    device = torch.device("cuda", ctx.local_rank) if use_cuda else torch.device("cpu")

    cfg = model_config(args)
    torch.manual_seed(args.seed)  # identical initial weights on every rank
    model = GPT(cfg).to(device)
    seed_everything(args.seed, ctx.rank)  # per-rank dropout streams, reproducible
    ddp: torch.nn.Module = DDP(model, device_ids=[device.index] if use_cuda else None) if distributed else model
    faults = WorkerFaults.from_env(ctx).attach(model)  # titan: a drill's in-process faults (no-op otherwise)

    lr = args.lr if args.lr is not None else (3e-3 if args.preset == "tiny" else 3e-4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(args.warmup, args.steps, args.min_lr_ratio))
    faults.bind(optimizer, scheduler)  # titan: a drill's reference run skips the same updates
    corpus = MarkovCorpus(cfg.vocab_size, cfg.seq_len, num_samples=args.num_samples, seed=args.seed)
    sampler = ResumableSampler(len(corpus), args.batch_size, seed=args.seed, rank=ctx.rank,
                               world_size=ctx.world_size)
    app_state: dict[str, Any] = {"model": model, "optimizer": optimizer, "scheduler": scheduler,
                                 "sampler": sampler}
    # titan: the step guard checks, clips and steps; its statistics are saved with the state.
    guard = None if args.no_guard else StepGuard(ddp, optimizer, scheduler=scheduler, max_norm=args.clip, ctx=ctx)
    if guard is not None:
        app_state["guard"] = guard

    ckpt = None if args.no_ckpt else Checkpointer(ctx, seed=args.seed)  # titan: checkpoints
    if guard is not None and ckpt is not None:
        guard.use_checkpointer(ckpt, app_state)  # titan: escalation rolls back to the /dev/shm snapshot
    with beacon.phase("restore"):
        start = ckpt.restore(app_state) if ckpt is not None else 0  # titan: resume after step `start`
    check_progress(ctx, start)  # titan: give up when restarts bring no checkpoint progress
    sdc = None
    if ctx.settings.sdc.enabled and not args.no_sdc:  # titan: silent-corruption checks + in-job repair
        if ckpt is not None:
            ckpt.enable_snapshots()  # verified snapshots: taken only when the replicas agree
        sdc = SDCMonitor(ctx, model, optimizer, ctx.settings.sdc,
                         rollback=(lambda: guard.rollback("silent data corruption")) if guard is not None and ckpt
                         else (lambda: ckpt.rollback(app_state)) if ckpt is not None else None,
                         snapshot=(lambda s: ckpt.snapshot(s, app_state)) if ckpt is not None else None,
                         perturbed=faults.gemm_perturbed)
    if start and distributed:
        # titan: DDP rebuilds its buckets after iteration 1; one discarded step (RNG and grads
        # put back, sampler untouched) gives a resumed run the bucket layout of an unbroken one.
        x0, y0 = (t.unsqueeze(0).to(device) for t in corpus[0])
        ddp_warmup(ddp, lambda m: forward(m, x0, y0))

    ctx.events.emit("workload.config", f"tinygpt {args.preset}: {model.num_params():,} params", data={
        "preset": args.preset, "params": model.num_params(), "model": dataclasses.asdict(cfg),
        "batch_size": args.batch_size, "grad_accum": args.grad_accum, "lr": lr, "steps": args.steps,
        "start_step": start, "device": str(device), "backend": backend, "num_workers": args.num_workers,
        "checkpoints": ckpt is not None, "samples": sampler.consumed,
    })
    # The loader is built after restore: its iterator starts at the committed position.
    # Its own generator keeps the global RNG (dropout) untouched by iterator creation.
    loader = DataLoader(corpus, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                        num_workers=args.num_workers, pin_memory=use_cuda,
                        generator=torch.Generator().manual_seed(args.seed))
    batches = _batches(loader, device)
    if sdc is not None:
        sdc.start(start)  # titan: verify the starting state and snapshot it
    losses: list[float] = []
    t_start = time.perf_counter()
    try:
        last = min(args.steps, args.stop_at or args.steps)
        step = start
        while step < last:  # not a for loop: a guard rollback moves `step` back
            step += 1
            ctx.step = step
            t0 = time.perf_counter()
            bcn = beacon.get_beacon()
            if bcn is not None:
                bcn.step_begin(step)  # titan: the watchdog sees step and phases
            faults.begin_step(step)
            micro_batches = []  # titan: kept so that the guard can replay the whole step
            for micro in range(args.grad_accum):
                with beacon.phase("data"):
                    micro_batches.append(next(batches))

            def fwd_bwd() -> torch.Tensor:
                optimizer.zero_grad(set_to_none=True)
                loss_sum = torch.zeros((), device=device)
                for micro, (x, y) in enumerate(micro_batches):
                    sync = micro == args.grad_accum - 1
                    with contextlib.nullcontext() if sync or not distributed else ddp.no_sync():
                        with beacon.phase("forward"):
                            loss = faults.loss(forward(ddp, x, y))
                        with beacon.phase("backward"):
                            backward(loss, args.grad_accum)
                    loss_sum += loss.detach()
                return loss_sum / args.grad_accum

            step_lr = scheduler.get_last_lr()[0]
            guard_data: dict[str, Any] = {"skipped": False}
            if guard is not None:  # titan: check, decide (same on every rank), replay, clip, step
                res = guard.step(fwd_bwd, samples=lambda: step_samples(sampler, args.grad_accum))
                grad_norm, mean_loss, guard_data = res.grad_norm, res.loss_mean, res.event_data()
                if res.rolled_back_to is not None:  # titan: in-memory snapshot restored
                    step, batches = res.rolled_back_to, _batches(loader, device)
                    continue
            else:
                mean_loss_t = fwd_bwd()
                with beacon.phase("optimizer"):
                    grad_norm = optimizer_step(model, optimizer, scheduler, args.clip)
                mean_loss = _mean_over_ranks(mean_loss_t, ctx.world_size)
            # Commit the consumed samples only now: a prefetching loader never moves the state.
            sampler.advance(args.grad_accum * sampler.global_batch)
            if bcn is not None:
                bcn.step_end(step)
            losses.append(mean_loss)
            ctx.events.emit("step", step=step, data={  # titan: one event per optimizer step
                "loss": mean_loss, "lr": step_lr, "samples": sampler.consumed,
                "step_time_s": time.perf_counter() - t0, **guard_data, "grad_norm": grad_norm,
                **(sdc.event_data() if sdc is not None else {})},
                force=guard_data["skipped"])
            faults.after_step(step, model, optimizer)  # titan: a drill's silent bit flips land here
            if sdc is not None:
                with beacon.phase("sdc"):
                    back = sdc.after_step(step)  # titan: fingerprints every sdc.every_steps, canary
                if back is not None:  # titan: a replica diverged: rolled back to a verified snapshot
                    step, batches = back, _batches(loader, device)
                    continue
            if ckpt is not None:
                with beacon.phase("checkpoint"):  # titan: its own budget, never mistaken for a hang
                    ckpt.maybe_save(step, app_state)  # titan: every checkpoint.every_steps
            if ctx.rank == 0 and args.log_every and step % args.log_every == 0:
                log.info("step %d/%d loss %.4f lr %.2e grad_norm %.3f", step, args.steps, mean_loss,
                         step_lr, grad_norm)
    finally:
        beacon.done()  # titan: training is over; teardown below is not a hang
        del batches  # shuts DataLoader workers down
        if ckpt is not None:
            ckpt.close()  # titan: waits for an async save in flight
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
    ctx = WorkerContext.from_env(settings)  # titan: rank, attempt, run dir, events
    for handler in logging.getLogger().handlers:  # stamp rank/attempt/step on every line
        handler.addFilter(RankLogFilter(ctx))
    ctx.announce()  # titan: worker.started (versions, intra-op threads)
    bcn = beacon.install(ctx)  # titan: beacon + stack dumps for the watchdog (before init_distributed)
    tracer = StepTracer(ctx, ctx.settings.tracing)  # titan: OpenTelemetry spans (off by default)
    if tracer.enabled:
        if bcn is not None:
            bcn.listener = tracer  # the beacon's phase marks become spans
        add_comm_hook_wrapper(tracer.wrap_comm_hook)  # one span per DDP bucket, under backward
    try:
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
