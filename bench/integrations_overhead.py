"""What the Hugging Face Trainer integration adds to a step, side by side in one run.

Two Trainers on the same model architecture, data and arguments in one process — ``plain``
(no Titan) and ``titan`` (``TitanCallback``) — trained in interleaved blocks of ``--block``
optimizer steps (A, B, A, B, …) so that machine noise hits them alike. A timing callback
splits each step at the Trainer's own hooks: ``fwd+bwd`` (on_step_begin → on_pre_optimizer_step:
forward, backward with the DDP all-reduce — and under Titan the guard's comm hook — and
clipping; under Titan also the guard's step vector, which rides DDP's last bucket),
``optimizer`` (→ on_optimizer_step: the update; under Titan the guard's decision around it,
which the guarded step also times apart), ``rest`` (→ on_step_end);
beside it each variant's CPU time per step (this process, all threads: what a step
computes, not what it waits for — much less sensitive to the machine's load) and, per
block, per thread. All three integrations share the guarded step
(titan.integrations._core), so its cost is theirs too. Run it under ``titan run`` so the
beacons are live as in production:

    .venv/bin/titan run --nproc-per-node 2 -- bench/integrations_overhead.py --blocks 6 --block 30

``--model gpt2`` trains a GPT-2 built locally from a config (``GPT2LMHeadModel``: ``--layers``,
``--embd``, ``--vocab``; random weights, no download) on random token sequences of ``--seq``
(``--batch`` sequences per rank): a language model's step, whose compute per parameter is
6 × its tokens instead of the MLP's 6 × its rows. A plain block longer than the watchdog's
idle timeout (30 s; the beacon sits in ``idle`` while the plain Trainer runs) needs
``--set watchdog.idle_timeout_s=…`` on ``titan run``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch
from torch import nn
from transformers import Trainer, TrainerCallback, TrainingArguments


class Mlp(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                                 nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 16))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
        return {"loss": nn.functional.cross_entropy(self.net(x), labels)}


class Tokens(torch.utils.data.Dataset):
    """Random token sequences (a language model's batch shape; no download, no tokenizer)."""

    def __init__(self, n: int, seq: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def build(a: argparse.Namespace) -> tuple[nn.Module, torch.utils.data.Dataset]:
    """The model and data of ``--model``: the MLP, or a GPT-2 built locally from a config
    (``transformers.GPT2LMHeadModel``, random weights) on random tokens."""
    n = a.batch * 2 * a.block
    if a.model == "mlp":
        return Mlp(a.width), Data(n)
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=a.layers, n_embd=a.embd, n_head=max(1, a.embd // 64), vocab_size=a.vocab,
                     n_positions=a.seq, bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM")
    return GPT2LMHeadModel(cfg), Tokens(n, a.seq, a.vocab)


class Data(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, 256, generator=g), torch.randint(0, 16, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.x[i], "labels": self.y[i]}


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each of this process's threads, summed by thread name
    (``/proc/self/task``; clock-tick resolution: meaningful over a block, not a step)."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        name = raw[raw.index("(") + 1:raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2:].split()
        name = "main" if tid == str(os.getpid()) else name
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


class Timing(TrainerCallback):
    """Wall-clock split of each step at the Trainer's hooks, and the step's CPU time (this
    process, all its threads: what the step computed, without the time it waited)."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, float, float]] = []
        self.cpu: list[float] = []
        self._t: list[float] = []
        self._c = 0.0

    def on_step_begin(self, *a, **k):  # noqa: ANN002, ANN003
        self._t = [time.perf_counter()]
        self._c = time.process_time()

    def on_pre_optimizer_step(self, *a, **k):  # noqa: ANN002, ANN003
        self._t.append(time.perf_counter())

    def on_optimizer_step(self, *a, **k):  # noqa: ANN002, ANN003
        self._t.append(time.perf_counter())

    def on_step_end(self, *a, **k):  # noqa: ANN002, ANN003
        t = self._t + [time.perf_counter()]
        if len(t) == 4:
            self.rows.append((t[1] - t[0], t[2] - t[1], t[3] - t[2]))
            self.cpu.append(time.process_time() - self._c)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=6, help="blocks per variant (A and B alternate)")
    p.add_argument("--block", type=int, default=30, help="optimizer steps per block")
    p.add_argument("--model", choices=("mlp", "gpt2"), default="mlp",
                   help="mlp: 256->W->W->W->16 on random vectors; gpt2: a GPT-2 built from a config on random tokens")
    p.add_argument("--width", type=int, default=1024, help="mlp: hidden width")
    p.add_argument("--batch", type=int, default=32, help="rows (mlp) or sequences (gpt2) per rank and step")
    p.add_argument("--layers", type=int, default=4, help="gpt2: transformer blocks")
    p.add_argument("--embd", type=int, default=256, help="gpt2: embedding width (one head per 64)")
    p.add_argument("--vocab", type=int, default=8192, help="gpt2: vocabulary (tied input/output embedding)")
    p.add_argument("--seq", type=int, default=256, help="gpt2: tokens per sequence")
    p.add_argument("--json", default="")
    p.add_argument("--profile", default="", help="cProfile each variant's blocks after the first pair (main "
                   "thread only) into PREFIX.<variant>.rank<r>.pstats")
    p.add_argument("--profile-cpu", action="store_true", help="profile the main thread's CPU time "
                   "(time.thread_time), not wall time: what the code computes, not what it waits for")
    a = p.parse_args()
    # One intra-op thread per rank, also at --nproc-per-node 1 (torchrun sets OMP_NUM_THREADS=1
    # only for several ranks; Accelerate sets as many threads as cores when it is unset).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    from titan.integrations.transformers import TitanCallback

    out = os.path.join(os.environ.get("TITAN_RUN_DIR", "."), "bench-out")
    trainers, timing, guarded = {}, {}, {}
    for name in ("plain", "titan"):
        args = TrainingArguments(output_dir=f"{out}/{name}", per_device_train_batch_size=a.batch,
                                 max_steps=a.block, save_strategy="no", logging_strategy="no", report_to="none",
                                 use_cpu=True, ddp_backend="gloo", ddp_find_unused_parameters=False, seed=0,
                                 disable_tqdm=True, max_grad_norm=1.0, learning_rate=1e-4)
        torch.manual_seed(0)
        model, data = build(a)
        tr = Trainer(model=model, args=args, train_dataset=data)
        timing[name] = Timing()
        tr.add_callback(timing[name])
        if name == "titan":
            guarded[name] = TitanCallback(tr, done_at_train_end=False)  # train() runs once per block
        trainers[name] = tr
    profs = {}
    if a.profile:
        import cProfile

        timer = (time.thread_time,) if a.profile_cpu else ()
        profs = {"plain": cProfile.Profile(*timer), "titan": cProfile.Profile(*timer)}
    load0 = os.getloadavg()[0]
    guard_s, guard_n = 0.0, 0  # the guard's own time, blocks after the first (warm-up) only
    rode = 0  # titan blocks whose last step's vector rode DDP's all-reduce
    threads: dict[str, dict[str, float]] = {"plain": {}, "titan": {}}  # CPU s by thread, blocks after the first
    for b in range(2 * a.blocks):
        name = ("plain", "titan")[b % 2]
        g = guarded["titan"].step
        before = (g.guard_s, g.step_count) if g is not None else (0.0, 0)
        prof = profs.get(name) if b > 1 else None
        if prof is not None:
            prof.enable()
        c0 = thread_cpu()
        trainers[name].train()
        c1 = thread_cpu()
        if prof is not None:
            prof.disable()
        if b > 1:
            for k, v in c1.items():
                threads[name][k] = threads[name].get(k, 0.0) + v - c0.get(k, 0.0)
        g = guarded["titan"].step
        if name == "titan" and b > 1 and g is not None:
            guard_s, guard_n = guard_s + g.guard_s - before[0], guard_n + a.block
        if name == "titan" and g is not None and g.last is not None:
            rode += int(getattr(g.last, "rode", False))  # the block's last step
    load1 = os.getloadavg()[0]
    rank = int(os.environ.get("RANK", "0"))
    for name, prof in profs.items():
        prof.dump_stats(f"{a.profile}.{name}.rank{rank}.pstats")
    res = {}
    for name, t in timing.items():
        rows = t.rows[1:]  # the first step of a run carries DDP's set-up
        res[name] = {k: statistics.median(r[i] for r in rows) * 1e3 for i, k in enumerate(("fwd_bwd", "optimizer", "rest"))}
        res[name]["step"] = statistics.median(sum(r) for r in rows) * 1e3
        res[name]["mean"] = statistics.fmean(sum(r) for r in rows) * 1e3
        res[name]["cpu"] = statistics.median(t.cpu[1:]) * 1e3
        res[name]["steps"] = len(rows)
    res["titan"]["guard_mean"] = guard_s / max(guard_n, 1) * 1e3
    res["load"] = [load0, load1]
    res["threads"] = threads
    res["params"] = sum(q.numel() for q in trainers["plain"].model.parameters())
    if rank == 0:
        shape = (f"gpt2 {a.layers}x{a.embd}, vocab {a.vocab}, {a.batch}x{a.seq} tokens per rank" if a.model == "gpt2"
                 else f"mlp width {a.width}, batch {a.batch} per rank")
        print(f"model: {shape}, {res['params'] / 1e6:.2f} M parameters", flush=True)
        for name in ("plain", "titan"):
            r = res[name]
            print(f"{name:6s} step {r['step']:.3f} ms  fwd+bwd {r['fwd_bwd']:.3f}  optimizer {r['optimizer']:.3f}  "
                  f"rest {r['rest']:.3f}  ({r['steps']} steps); mean step {r['mean']:.3f} ms; step CPU "
                  f"{r['cpu']:.3f} ms", flush=True)
        d = res["titan"]["step"] - res["plain"]["step"]
        dc = res["titan"]["cpu"] - res["plain"]["cpu"]
        print(f"CPU per step {dc:+.3f} ms = {100 * dc / res['plain']['cpu']:+.2f} % of the plain step's", flush=True)
        print(f"overhead {d:.3f} ms/step = {100 * d / res['plain']['step']:.2f} % of the plain step; guard "
              f"exchange+decision {res['titan']['guard_mean']:.3f} ms/step (mean over {guard_n} steps after the "
              f"first block); load average {load0:.1f} -> {load1:.1f}; the verdict rode DDP's all-reduce in "
              f"{rode}/{a.blocks} titan blocks", flush=True)
        n = (a.blocks - 1) * a.block
        names = sorted(set(threads["plain"]) | set(threads["titan"]))
        print("CPU ms per step by thread (plain -> titan): " + "; ".join(
            f"{k} {threads['plain'].get(k, 0) / n * 1e3:.2f} -> {threads['titan'].get(k, 0) / n * 1e3:.2f}"
            for k in names if threads["plain"].get(k, 0) + threads["titan"].get(k, 0) > 0.005 * n), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
