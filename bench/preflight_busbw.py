"""Bus bandwidth of gloo over loopback vs the physical limit (a raw bidirectional socket exchange).

Run: .venv/bin/python bench/preflight_busbw.py [--max-mb 64] [--iters 5]
Prints a table and the ratio at the largest size; side by side in one run (ratios, not
absolute numbers, are what this noisy machine can tell).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import threading
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from titan.preflight.selftest import bus_factor, sizes_up_to


def _gloo(rank: int, port: int, max_bytes: int, iters: int, q) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    rows = []
    for size in sizes_up_to(max_bytes, start=65536):
        t = torch.ones(size // 4)
        dist.all_reduce(t)
        ts = []
        for _ in range(iters):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            ts.append(time.perf_counter() - t0)
        med = statistics.median(ts)
        rows.append((size, med, size / med * bus_factor("all_reduce", 2) / 1e9))
    if rank == 0:
        q.put(rows)
    dist.destroy_process_group()


def _raw_send(port: int, nbytes: int, iters: int, go, q) -> None:
    deadline = time.monotonic() + 30
    while True:  # the receiver's process may still be starting
        try:
            conn = socket.create_connection(("127.0.0.1", port))
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    payload = memoryview(b"\0" * nbytes)
    for _ in range(iters):
        go.wait()
        conn.sendall(payload)
    conn.close()


def _raw_recv(port: int, nbytes: int, iters: int, go, q) -> None:
    srv = socket.create_server(("127.0.0.1", port))
    conn, _ = srv.accept()
    buf = bytearray(4 << 20)
    times = []
    for _ in range(iters):
        go.wait()
        t0 = time.perf_counter()
        got = 0
        while got < nbytes:
            got += conn.recv_into(buf, min(len(buf), nbytes - got))
        times.append(time.perf_counter() - t0)
    q.put(nbytes / statistics.median(times) / 1e9)
    conn.close()


def _raw_bidirectional(ctx, nbytes: int, iters: int) -> float:
    """Two TCP streams at once, A→B and B→A, each end in its own process (no GIL contention)."""
    q = ctx.SimpleQueue()
    go = ctx.Barrier(4)
    p1, p2 = _free_port(), _free_port()
    ps = [ctx.Process(target=_raw_recv, args=(p1, nbytes, iters, go, q)),
          ctx.Process(target=_raw_recv, args=(p2, nbytes, iters, go, q)),
          ctx.Process(target=_raw_send, args=(p1, nbytes, iters, go, q)),
          ctx.Process(target=_raw_send, args=(p2, nbytes, iters, go, q))]
    for p in ps:
        p.start()
    rates = [q.get(), q.get()]
    for p in ps:
        p.join(120)
        if p.is_alive():
            p.kill()
    return min(rates)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-mb", type=int, default=64)
    ap.add_argument("--iters", type=int, default=5)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    max_bytes = a.max_mb << 20
    raw = _raw_bidirectional(ctx, max_bytes, a.iters)
    port = _free_port()
    ps = [ctx.Process(target=_gloo, args=(r, port, max_bytes, a.iters, q)) for r in range(2)]
    for p in ps:
        p.start()
    rows = q.get()
    for p in ps:
        p.join(600)
        if p.is_alive():
            p.kill()
    print(f"{'bytes':>12} {'time ms':>9} {'busbw GB/s':>11}")
    for size, t, bw in rows:
        print(f"{size:>12,} {t * 1e3:>9.2f} {bw:>11.3f}")
    print(f"raw bidirectional socket exchange of {max_bytes >> 20} MiB: {raw:.3f} GB/s per direction")
    print(f"gloo all_reduce busbw at {max_bytes >> 20} MiB / raw: {rows[-1][2] / raw:.2f}")


if __name__ == "__main__":
    main()
