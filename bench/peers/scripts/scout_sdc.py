"""Measure (5), SCOUT's side: the tinygpt loop with ``enable_resiliency`` (SCOUT only) takes
the flips of ``titan.chaos.flips`` (the same harness that gives Titan its flips).

Wired as LM Resiliency's docs/api.md ("Configure Protection": ``enable_checkpoint=False``
for SCOUT only; ``fault_callback`` receives each ``ReplayResult``; gloo groups passed as
``group``/``nccl_group``) at ``interval=10`` (its documented example cadence), ≥ 3 ranks
(exact localisation needs three equivalent peers). On this CPU-only torch, SCOUT's replay
calls ``torch.cuda.synchronize`` unconditionally: it is replaced by a no-op here (a shim,
reported as such). Exact C3 verifies that peers have synchronized RNG (docs/scout.md,
"equivalent peers must use … deterministic behavior"), so every rank draws dropout from
rank 0's stream here (tinygpt seeds each rank differently; with that, every check is
inconclusive and counts as SDC). A flip lands after optimizer step S as Titan's worker applies it
(parameter / AdamW state element in place; local gradient through a tensor hook before the
all-reduce). Measurement scaffolding, not SCOUT's: at the start of every check interval
each rank keeps a copy of its state, and after the interval's check a flipped interval is
put back to that copy, so each flip is judged on its own. ``--no-detection`` gives the
A/B baseline (measure 5 measures overhead in-run instead). ``--dtype bf16`` trains with bf16
parameters (the flips are then drawn in bf16's bit layout). Writes ``$PEERS_LOG_DIR/scout.rank<r>.json``.
"""
import argparse
import copy
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

if not torch.cuda.is_available():  # the CUDA shim (see the docstring)
    torch.cuda.synchronize = lambda *a, **k: None

from lm_resiliency import ReplayHarnessConfig, enable_resiliency

from peers.common import workload
from titan.chaos.flips import flip_bit, pick_element
from titan.workloads.tinygpt.rng import seed_everything


def _check_dtype(f: dict, t: torch.Tensor) -> None:
    """A flip drawn in one dtype's bit layout must land in a tensor of that dtype."""
    if str(t.dtype).removeprefix("torch.") != f.get("dtype", "float32"):
        raise ValueError(f"flip at step {f['step']} drawn for {f.get('dtype')}, tensor holds {t.dtype}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flips", required=True, help="JSON list of FlipSpec fields")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--interval", type=int, default=10)
    ap.add_argument("--no-detection", action="store_true")
    a, rest = ap.parse_known_args()
    args = workload.parse_args(rest)
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    w = workload.build(args, rank, world)
    seed_everything(args.seed, 0)  # SCOUT needs synchronized RNG across peers (docs/scout.md): rank 0's stream everywhere
    model = DDP(w.model)
    params = {n: p for n, p in w.model.named_parameters()}
    flips = [f for f in json.loads(open(a.flips).read()) if f["rank"] == rank]
    reports: list[dict] = []

    def on_fault(result) -> None:  # SCOUT's fault_callback
        reports.append({"t": time.time(), "step": step, "sdc_bitmap": list(result.sdc_bitmap),
                        "straggler_bitmap": list(result.straggler_bitmap),
                        "c3": {k: getattr(v.status, "value", str(v.status)) for k, v in (result.c3_results or {}).items()},
                        "c3_evidence": {k: [str(x) for x in v.evidence][:8] for k, v in (result.c3_results or {}).items()
                                        if getattr(v.status, "value", "") != "agree"}})

    group = dist.new_group(backend="gloo")
    handle = None
    if not a.no_detection:
        # SCOUT finds the embedding by name (embed_tokens / wte / tok_embeddings); tinygpt's is
        # tok_emb, so that one recipe is switched off (docs/scout.md: "zero disables that recipe")
        # its straggler localisation times a replay with CUDA events (layer_replay.py
        # _instrumented_replay: torch.cuda.current_stream), a GPU-only path: on CPU a noisy
        # replay timing reached it and crashed the run, so straggler flags are off
        # (straggler_min_slowdown_ms, enable_temporal); measure (5) is about SDC only
        handle = enable_resiliency(w.model, w.optimizer, interval=a.interval, enable_checkpoint=False,
                                   replay=ReplayHarnessConfig(embedding_check_interval=0, enable_temporal=False,
                                                              straggler_min_slowdown_ms=1e9),
                                   group=group, nccl_group=group, device=torch.device("cpu"), fault_callback=on_fault)
    done: list[dict] = []
    grad_due: dict | None = None

    def grad_hook_for(name: str):
        def hook(g: torch.Tensor):
            nonlocal grad_due
            if grad_due is None or grad_due["tensor"] != name:
                return None
            f, grad_due = grad_due, None
            g = g.clone()
            _check_dtype(f, g)
            r = flip_bit(g, f["index"], f["bit"])
            done.append({**f, "t": time.time(), "before": r.before, "after": r.after,
                         "dtype": str(g.dtype).removeprefix("torch.")})
            return g
        return hook

    for n, p in params.items():
        p.register_hook(grad_hook_for(n))
    saved = None
    times: list[float] = []
    batches = w.batches()
    step = 0
    for step in range(1, a.steps + 1):
        if (step - 1) % a.interval == 0:  # an interval starts: keep a copy (scaffolding)
            saved = (copy.deepcopy(w.model.state_dict()), copy.deepcopy(w.optimizer.state_dict()))
            flipped_here = False
        for f in flips:
            if f["step"] == step and f["kind"] == "grad":
                name, idx = pick_element(params, f["seed"]) if f["tensor"] == "*" else (f["tensor"], f["index"])
                grad_due = {**f, "tensor": name, "index": idx}
                flipped_here = True
        t0 = time.perf_counter()
        x, y = next(batches)
        w.optimizer.zero_grad(set_to_none=True)
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(w.model.parameters(), w.clip)
        w.optimizer.step()  # SCOUT checks at its interval from inside the optimizer step
        w.scheduler.step()
        w.commit()
        times.append(time.perf_counter() - t0)
        for f in flips:
            if f["step"] == step and f["kind"] != "grad":
                name, idx = pick_element(params, f["seed"]) if f["tensor"] == "*" else (f["tensor"], f["index"])
                t = params[name].data if f["kind"] == "param" else w.optimizer.state[params[name]][f["kind"]]
                _check_dtype(f, t)
                r = flip_bit(t, idx, f["bit"])
                done.append({**f, "tensor": name, "index": idx, "t": time.time(), "before": r.before, "after": r.after,
                             "dtype": str(t.dtype).removeprefix("torch.")})
                flipped_here = True
        flag = torch.tensor([1.0 if flipped_here else 0.0])
        if step % a.interval == 0:
            dist.all_reduce(flag)  # did any rank flip in this interval? then every rank goes back
            if flag.item() > 0 and saved is not None:
                w.model.load_state_dict(saved[0])
                w.optimizer.load_state_dict(saved[1])
    if handle is not None:
        handle.close()
    out = {"rank": rank, "world": world, "interval": a.interval, "detection": not a.no_detection,
           "flips": done, "reports": reports, "step_times": times, "shim": "torch.cuda.synchronize -> no-op; straggler localisation (CUDA events) off"}
    with open(os.path.join(os.environ["PEERS_LOG_DIR"], f"scout.rank{rank}.json"), "w") as fh:
        json.dump(out, fh)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
