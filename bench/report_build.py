"""Cost of accounting and of building the report, by run size (side by side, one run).

    .venv/bin/python bench/report_build.py [--sizes 1000,10000,50000] [--world 8]

For each size: a synthetic run with that many ``step`` events (``world`` ranks, two
restarts), timed for reading + accounting (``account_run``) and for the whole report
(``write_report``: read, account, figures, page, summaries); ratios to the smallest size.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from titan.report import write_report
from titan.sla.accounting import account_run
from titan.sla.synthetic import SynthRun


def build(root: Path, n_events: int, world: int) -> Path:
    steps = max(30, n_events // world)
    third = steps // 3
    s = (SynthRun(world=world).startup(5).steps(third, ckpt_every=50, stall=0.5).fault(after=0.3).detect(2)
         .restart(10, resume_from=(third // 50) * 50).steps(third, ckpt_every=50, stall=0.5).fault("inject.hang")
         .detect(30, kind="hang.detected").restart(10, resume_from=((2 * third) // 50) * 50)
         .steps(steps - 2 * third, ckpt_every=50, stall=0.5).end(2))
    return s.write(root, f"bench-{n_events}").path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000,50000")
    ap.add_argument("--world", type=int, default=8)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in a.sizes.split(",")):
            rd = build(Path(tmp), n, a.world)
            t = time.perf_counter()
            acc = account_run(rd)
            t_acc = time.perf_counter() - t
            t = time.perf_counter()
            rep = write_report(rd, run_triage=False)
            t_rep = time.perf_counter() - t
            rows.append((n, len(acc.execs), t_acc, t_rep, rep.html.stat().st_size))
    base = rows[0]
    print(f"{'step events':>12} {'executions':>10} {'account s':>10} {'report s':>9} {'page MB':>8} {'× account':>10} {'× report':>9}")
    for n, ex, ta, tr, size in rows:
        print(f"{n:>12} {ex:>10} {ta:>10.3f} {tr:>9.3f} {size / 1e6:>8.2f} {ta / base[2]:>10.1f} {tr / base[3]:>9.1f}")


if __name__ == "__main__":
    main()
