"""All-reduce across two network-namespace nodes under each link fault, side by side.

    sudo .venv/bin/python bench/chaos_netfaults.py [--iters 30]

Two gloo ranks, one per namespace (``titan.chaos.netns.Topology``), time a 1-float and a
64 KiB all_reduce (median of ``--iters``) with a clean link, 1 % nftables loss, a 10 mbit
tbf, a 50 ms NFQUEUE delay; prints one table with ratios to the clean link.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from titan.chaos.netns import Topology

_WORKER = r"""
import json, os, statistics, sys, time, torch, torch.distributed as dist
rank, addr, port, iters = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.environ["GLOO_SOCKET_IFNAME"] = sys.argv[5]
torch.set_num_threads(1)
dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=rank, world_size=2)
out = {}
for name, n in (("1 float", 1), ("64 KiB", 16384)):
    t = torch.ones(n)
    dist.all_reduce(t)
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter(); dist.all_reduce(t); ts.append(time.perf_counter() - t0)
    out[name] = statistics.median(ts)
if rank == 0:
    print(json.dumps(out))
dist.destroy_process_group()
"""


def _measure(topo: Topology, port: int, iters: int) -> dict[str, float]:
    procs = [subprocess.Popen(topo.exec_prefix(i) + [sys.executable, "-c", _WORKER, str(i), topo.addr(0), str(port),
                                                     str(iters), topo.ns_if(i)], stdout=subprocess.PIPE, text=True)
             for i in range(2)]
    try:
        out = procs[0].communicate(timeout=300)[0]
        procs[1].wait(60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    a = ap.parse_args()
    rows = {}
    with Topology("tcb", 2, subnet=97) as topo:
        rows["clean"] = _measure(topo, 29601, a.iters)
        topo.set_loss(1, 1.0)
        rows["1 % loss"] = _measure(topo, 29602, a.iters)
        topo.clear_nft(1)
        topo.limit_bandwidth(1, "10mbit")
        rows["10 mbit tbf"] = _measure(topo, 29603, a.iters)
        topo.clear_bandwidth(1)
        proc = topo.start_delay(1, 50.0)
        try:
            rows["50 ms delay"] = _measure(topo, 29604, max(5, a.iters // 3))
        finally:
            topo.stop_delay(1, proc)
    base = rows["clean"]
    print(f"{'link':<14}{'1 float ms':>12}{'ratio':>8}{'64 KiB ms':>12}{'ratio':>8}")
    for name, r in rows.items():
        print(f"{name:<14}{r['1 float'] * 1e3:>12.2f}{r['1 float'] / base['1 float']:>8.1f}"
              f"{r['64 KiB'] * 1e3:>12.2f}{r['64 KiB'] / base['64 KiB']:>8.1f}")
    print(time.strftime("%Y-%m-%d"), "iters", a.iters)


if __name__ == "__main__":
    main()
