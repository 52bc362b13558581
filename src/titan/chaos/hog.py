"""Titan's own stressors, for machines without stress-ng: a CPU burner and a memory allocator.

``python -m titan.chaos.hog cpu|vm WORKERS SECONDS [BYTES_PER_WORKER]`` starts ``WORKERS``
processes for ``SECONDS``. ``cpu``: each spins in a loop. ``vm``: each allocates
``BYTES_PER_WORKER`` (default 768 MiB) as an anonymous ``mmap`` and writes one byte per
page — real resident memory, not a reservation — then keeps re-touching the pages
(as ``stress-ng --vm --vm-keep`` does) until the time is up, so the kernel cannot reclaim
them and the memory bandwidth is used too. Exits 0; the parent (the drill's injector)
measures what was taken.
"""

from __future__ import annotations

import mmap
import multiprocessing as mp
import sys
import time

__all__ = ["burn", "hold", "main"]

PAGE = mmap.PAGESIZE


def burn(seconds: float) -> None:
    """Spin for ``seconds`` (one CPU)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sum(range(10_000))


def hold(nbytes: int, seconds: float) -> None:
    """Take ``nbytes`` of resident memory for ``seconds`` (every page written, re-touched)."""
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    deadline = time.monotonic() + seconds
    value = 1
    while time.monotonic() < deadline:
        for off in range(0, nbytes, PAGE):
            buf[off] = value
            if off % (256 * PAGE) == 0 and time.monotonic() >= deadline:
                break
        value = value % 255 + 1
    buf.close()


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    what, workers, seconds = args[0], int(args[1]), float(args[2])
    nbytes = int(args[3]) if len(args) > 3 else 768 << 20
    if what not in ("cpu", "vm"):
        print(f"hog: unknown stressor {what!r} (cpu or vm)", file=sys.stderr)
        return 2
    target, targs = (burn, (seconds,)) if what == "cpu" else (hold, (nbytes, seconds))
    procs = [mp.Process(target=target, args=targs) for _ in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
