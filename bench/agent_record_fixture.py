"""Record a baseline fixture on this machine: the agent's collectors sampled at a high rate.

Usage: .venv/bin/python bench/agent_record_fixture.py --hz 10 --samples 3600 \
           --out tests/monitor/fixtures/clean_hour.jsonl.gz [--load]

``--load`` runs a small torch training loop (one thread) beside it, or the reference
workload ``python -m titan.workloads.tinygpt`` when that exists. The samples are replayed
by the tests as one per second: 3600 samples = an hour-equivalent. Only the series the
default baselines watch are kept, so the fixture stays small (gzip JSONL, one line per
sample: ``{"t": seconds, "m": {key: value}}``).
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from titan.monitor.base import parse_key
from titan.monitor.disk import DiskCollector
from titan.monitor.host import HostCollector
from titan.monitor.net import NetCollector
from titan.monitor.probe import EchoProbe

_LOAD = r"""
import time, torch
torch.set_num_threads(1)
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
opt = torch.optim.AdamW(m.parameters(), 1e-3)
end = time.time() + float(__import__("sys").argv[1])
step = 0
while time.time() < end:
    x = torch.randn(64, 256)
    loss = (m(x) - x).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step(); step += 1
    if step % 200 == 0:
        torch.save(m.state_dict(), "/tmp/titan-fixture-load.pt")  # some disk writes too
print("steps", step)
"""

KEEP = ("net_probe_rtt_seconds", "disk_read_latency_seconds", "disk_write_latency_seconds",
        "host_softirqs_all_per_second", "host_interrupts_all_per_second", "host_cpu_softirq_ratio",
        "host_cpu_iowait_ratio", "host_pressure_ratio", "host_cpu_utilization_ratio",
        "net_tcp_retransmit_ratio")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hz", type=float, default=10.0)
    ap.add_argument("--samples", type=int, default=3600)
    ap.add_argument("--out", required=True)
    ap.add_argument("--load", action="store_true")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="titan-fixture-"))
    p1 = EchoProbe(tmp, "a", host="127.0.0.1", min_probes=50, refresh_s=1.0)
    p2 = EchoProbe(tmp, "b", host="127.0.0.1", min_probes=50, refresh_s=1.0)
    cols = [HostCollector(self_process=False), DiskCollector(watch_path=tmp), NetCollector(probe=p1)]
    load = None
    if a.load:
        duration = a.samples / a.hz + 30
        if (Path(__file__).parents[1] / "src/titan/workloads/tinygpt").is_dir():
            cmd = [sys.executable, "-m", "titan.workloads.tinygpt", "--steps", "1000000", "--threads", "1"]
        else:
            cmd = [sys.executable, "-c", _LOAD, str(duration)]
        load = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print("load:", " ".join(cmd[:3]), "pid", load.pid, file=sys.stderr)
    out = gzip.open(a.out, "wt")
    period = 1.0 / a.hz
    t0 = time.monotonic()
    try:
        for i in range(a.samples + 1):
            now = time.monotonic()
            p2.tick(now)
            m: dict[str, float] = {}
            for c in cols:
                m.update(c.collect(now).metrics)
            kept = {k: float(f"{v:.5g}") for k, v in m.items() if parse_key(k)[0] in KEEP}
            if i > 0:  # the first tick has no rates yet
                out.write(json.dumps({"t": i, "m": kept}, separators=(",", ":")) + "\n")
            time.sleep(max(0.0, t0 + (i + 1) * period - time.monotonic()))
    finally:
        out.close()
        for c in cols:
            c.close()
        p2.close()
        if load is not None:
            load.terminate()
            load.wait(10)
    print(f"wrote {a.out}: {a.samples} samples in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
