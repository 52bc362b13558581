"""Hardware self-tests run inside every rank of a preflight job.

* collective sweep: all_reduce / all_gather / reduce_scatter from 4 KiB to ``max_bytes``,
  with algorithm and bus bandwidth by nccl-tests' formulas;
* pairwise send/recv between every pair of members (≥ 3), so a slow link or node is
  localised — a collective's time is the same on every member and cannot tell;
* a GEMM canary on identical seeded inputs, compared bitwise within groups of identical
  hardware and software, else against a float64 reference within a tolerance;
* checkpoint-folder write / fsync / read from all ranks at once.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
from pathlib import Path
from typing import Any

__all__ = ["collective_sweep", "pairwise_bandwidth", "gemm_canary", "io_test", "bus_factor", "sizes_up_to",
           "round_robin_pairs", "INJECT_GEMM_ENV"]

#: Fault injection for tests and drills: ranks listed here (comma-separated) perturb one
#: element of their canary GEMM result, as a GPU computing wrong answers would.
INJECT_GEMM_ENV = "TITAN_INJECT_PREFLIGHT_GEMM_RANKS"


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: all_reduce 2(n-1)/n, all_gather/reduce_scatter (n-1)/n."""
    if n <= 1:
        return 1.0
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def sizes_up_to(max_bytes: int, start: int = 4096) -> list[int]:
    out, s = [], start
    while s <= max_bytes:
        out.append(s)
        s *= 4
    if not out or out[-1] != max_bytes:
        out.append(max_bytes)
    return out


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def collective_sweep(max_bytes: int, device: Any, iters: int = 5, duration_s: float = 0.0) -> list[dict[str, Any]]:
    """Time each collective per size (median of ``iters``; repeat sweeps for ``duration_s``).

    Sizes are the total message size as nccl-tests counts it (for all_gather and
    reduce_scatter: the gathered tensor). Collectives: 3 × sizes × iters.
    """
    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    results: dict[tuple[str, int], list[float]] = {}
    t_end = time.monotonic() + duration_s
    while True:
        for size in sizes_up_to(max_bytes):
            numel = max(n, size // 4) // n * n
            full = torch.ones(numel, dtype=torch.float32, device=device)
            chunk = torch.empty(numel // n, dtype=torch.float32, device=device)
            ops = {
                "all_reduce": lambda: dist.all_reduce(full),
                "all_gather": lambda: dist.all_gather_into_tensor(full, chunk),
                "reduce_scatter": lambda: dist.reduce_scatter_tensor(chunk, full),
            }
            for op, fn in ops.items():
                fn()  # warm-up (connection set-up, allocator)
                for _ in range(iters):
                    _sync(device)
                    t0 = time.perf_counter()
                    fn()
                    _sync(device)
                    results.setdefault((op, numel * 4), []).append(time.perf_counter() - t0)
        if time.monotonic() >= t_end:
            break
    rows = []
    for (op, nbytes), ts in sorted(results.items()):
        t = statistics.median(ts)
        alg = nbytes / t
        rows.append({"op": op, "bytes": nbytes, "time_s": t, "algbw_GBps": alg / 1e9,
                     "busbw_GBps": alg * bus_factor(op, n) / 1e9, "max_time_s": max(ts)})
    return rows


def round_robin_pairs(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs covering every pair once (circle method)."""
    members = list(range(n)) + ([None] if n % 2 else [])
    m = len(members)
    rounds = []
    for _ in range(m - 1):
        pairs = [(members[i], members[m - 1 - i]) for i in range(m // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs if a is not None and b is not None])
        members = [members[0]] + [members[-1]] + members[1:-1]
    return rounds


def pairwise_bandwidth(nbytes: int, device: Any, iters: int = 5) -> dict[str, float]:
    """Ping-pong ``nbytes`` between every pair; returns ``{"i-j": GB/s}`` on every rank.

    Pairs run in rounds of disjoint pairs, with a barrier between rounds. The best of
    ``iters`` exchanges counts: contention from other work only ever slows an exchange, so
    the fastest one measures the link (the median flagged healthy loopback pairs under load).
    """
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    mine: dict[str, float] = {}
    for rnd in round_robin_pairs(n):
        for a, b in rnd:
            if rank not in (a, b):
                continue
            peer = b if rank == a else a
            times = []
            for i in range(iters + 1):
                _sync(device)
                t0 = time.perf_counter()
                if rank == a:
                    dist.send(buf, peer)
                    dist.recv(buf, peer)
                else:
                    dist.recv(buf, peer)
                    dist.send(buf, peer)
                _sync(device)
                if i:  # first exchange sets the connection up
                    times.append(time.perf_counter() - t0)
            if rank == a:
                mine[f"{a}-{b}"] = 2 * buf.numel() * 4 / min(times) / 1e9
        dist.barrier()
    gathered: list[dict[str, float] | None] = [None] * n
    dist.all_gather_object(gathered, mine)
    out: dict[str, float] = {}
    for g in gathered:
        out.update(g or {})
    return out


def gemm_canary(device: Any, size: int = 256, seed: int = 1234) -> dict[str, Any]:
    """Multiply seeded matrices; return the result's SHA-256 and its error vs float64."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    a = torch.randn(size, size, generator=g, dtype=torch.float32)
    b = torch.randn(size, size, generator=g, dtype=torch.float32)
    c = (a.to(device) @ b.to(device)).cpu()
    ranks = os.environ.get(INJECT_GEMM_ENV, "")
    rank = int(os.environ.get("RANK", "0"))
    if ranks and str(rank) in ranks.split(","):
        c[size // 2, size // 3] += abs(float(c[size // 2, size // 3])) * 1e-3 + 1e-3
    ref = a.double() @ b.double()
    rel = float(((c.double() - ref).abs().max() / ref.abs().max()).item())
    return {"sha256": hashlib.sha256(c.numpy().tobytes()).hexdigest(), "max_rel_err": rel, "size": size, "seed": seed}


def io_test(folder: Path, nbytes: int, rank: int, repeats: int = 3) -> dict[str, Any]:
    """Write, fsync and read back ``nbytes`` in ``folder`` (called on all ranks at once);
    the best of ``repeats`` rounds (other work only ever slows a round down)."""
    rounds = [_io_round(folder, nbytes, rank) for _ in range(repeats)]
    best = max(rounds, key=lambda r: r["write_MBps"])
    best["fsync_s"] = min(r["fsync_s"] for r in rounds)
    best["read_MBps"] = max(r["read_MBps"] for r in rounds)
    return best


def _io_round(folder: Path, nbytes: int, rank: int) -> dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".titan-preflight-io.rank{rank}.{os.getpid()}"
    block = os.urandom(1 << 20)
    try:
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            written = 0
            while written < nbytes:
                written += os.write(fd, block[: min(len(block), nbytes - written)])
            t1 = time.perf_counter()
            os.fsync(fd)
            t2 = time.perf_counter()
        finally:
            os.close(fd)
        t3 = time.perf_counter()
        with open(path, "rb") as f:
            while f.read(1 << 20):
                pass
        t4 = time.perf_counter()
    finally:
        try:
            path.unlink()
        except OSError:
            pass
    return {"bytes": nbytes, "write_MBps": nbytes / max(t2 - t0, 1e-9) / 1e6, "fsync_s": t2 - t1,
            "read_MBps": nbytes / max(t4 - t3, 1e-9) / 1e6}
