"""What a DDP comm hook costs by itself, side by side in one run (run under torchrun/titan run).

The guard reads each gradient bucket before its all-reduce, so it needs DDP's one comm
hook; this prices that against DDP without a hook, on the MLP of
``bench/integrations_overhead.py`` (forward + backward, batch 32, 1 intra-op thread):

* ``no hook``        — DDP's C++ path: the division by the world size is folded into the
  copy of each gradient into its bucket, no Python runs during the reduction;
* ``allreduce_hook`` — torch's default Python hook: the same reduction, with the division
  as a pass of its own and a Python callback per bucket on the backend's thread;
* ``guard``          — ``titan.guard.ddp``'s hook: ``allreduce_hook`` plus the pre-reduce
  read of each bucket (``foreach_norm``);
* ``guard + ride``   — and the step vector's all-reduce launched with the last bucket;
* ``post-acc + ride`` — a prototype of the alternative, *not* what the guard does: no comm
  hook (DDP's C++ path), each parameter's local gradient read at the end of the backward
  from post-accumulate-grad hooks (one ``foreach_norm``), then the step vector's all-reduce —
  which gives up what a comm hook carries: per-bucket beacon counters, the drill's
  collective hang, tracing spans, bucket labels in culprit records.

Variants alternate every ``--per`` steps (``--rounds`` times), so machine noise hits them
alike; medians of wall and of this process's CPU time per forward+backward.

    .venv/bin/titan run --nproc-per-node 2 -- bench/ddp_hook_cost.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist
from torch import nn


def _mlp(width: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                         nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 16))


class _PostAcc:
    """The prototype: local norms at the end of the backward, then the vector's all-reduce."""

    def __init__(self, model: nn.Module, size: int) -> None:
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.size, self.queued, self.work = size, False, None
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _hook(self, _p: torch.Tensor) -> None:
        if not self.queued:  # runs before DDP's own end-of-backward callback: grads still local
            self.queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._end)

    def _end(self) -> None:
        self.queued = False
        torch.stack(list(torch._foreach_norm([p.grad for p in self.params], 2.0)))
        self.work = dist.all_reduce(torch.zeros(self.size), async_op=True)

    def take(self) -> None:
        if self.work is not None:
            self.work.wait()
            self.work = None


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--per", type=int, default=5, help="steps per variant and round")
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=32)
    a = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    from titan.guard.ddp import DDPCheck

    world = dist.get_world_size()
    models: dict[str, nn.Module] = {}
    checks: dict[str, DDPCheck] = {}
    post: dict[str, _PostAcc] = {}
    for name in ("no hook", "allreduce_hook", "guard", "guard + ride", "post-acc + ride"):
        m = nn.parallel.DistributedDataParallel(_mlp(a.width))
        if name == "allreduce_hook":
            m.register_comm_hook(None, allreduce_hook)
        elif name == "post-acc + ride":
            post[name] = _PostAcc(m, 3 + 3 * world)
        elif name.startswith("guard"):
            checks[name] = DDPCheck(m)
            if name == "guard + ride":
                checks[name].ride = lambda: torch.zeros(3 + 3 * world)
        models[name] = m
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(a.batch, 256, generator=g), torch.randint(0, 16, (a.batch,), generator=g)
    rows: dict[str, list[tuple[float, float]]] = {k: [] for k in models}
    load0 = os.getloadavg()[0]
    for r in range(a.rounds + 1):
        for name, m in models.items():
            for _ in range(a.per):
                chk = checks.get(name)
                if chk is not None:
                    chk.begin_step()
                m.zero_grad(set_to_none=False)
                t0, c0 = time.perf_counter(), time.process_time()
                nn.functional.cross_entropy(m(x), y).backward()
                if chk is not None:
                    chk.take_ride()
                if name in post:
                    post[name].take()
                if r:  # round 0: warm-up (DDP rebuilds its buckets after its first iteration)
                    rows[name].append((time.perf_counter() - t0, time.process_time() - c0))
    if dist.get_rank() == 0:
        base = None
        print(f"world {world}, {a.rounds * a.per} steps per variant, load average {load0:.1f} -> "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        for name, v in rows.items():
            w, c = statistics.median(t for t, _ in v) * 1e3, statistics.median(t for _, t in v) * 1e3
            base = base or (w, c)
            print(f"{name:15s} fwd+bwd wall {w:7.3f} ms ({w - base[0]:+.3f})  CPU {c:7.3f} ms ({c - base[1]:+.3f})",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
