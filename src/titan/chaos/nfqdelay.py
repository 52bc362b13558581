"""User-space packet delayer on an NFQUEUE: the ``tc netem delay`` of a kernel without netem.

``python -m titan.chaos.nfqdelay QUEUE DELAY_MS [JITTER_MS]`` (run inside the namespace whose
``iptables-legacy … -j NFQUEUE --queue-num QUEUE`` rule sends it packets) holds every packet
``DELAY_MS`` (± uniform ``JITTER_MS``) and then accepts it, in arrival order per deadline; on
SIGTERM it prints ``delayed N packets B bytes``.
Single-threaded: one ``select`` loop reads the queue without blocking and issues verdicts
when due. Needs PyPI ``NetfilterQueue`` (Debian ``libnetfilter-queue-dev``) and root.
"""

from __future__ import annotations

import heapq
import itertools
import random
import select
import signal
import socket
import sys
import time
from typing import Any

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    from netfilterqueue import NetfilterQueue

    args = argv or sys.argv[1:]
    qnum, delay = int(args[0]), float(args[1]) / 1000.0
    jitter = float(args[2]) / 1000.0 if len(args) > 2 else 0.0
    held: list[tuple[float, int, Any]] = []
    seq = itertools.count()
    count = {"packets": 0, "bytes": 0}

    def on_packet(pkt: Any) -> None:
        d = delay + (random.uniform(-jitter, jitter) if jitter else 0.0)
        count["packets"] += 1
        count["bytes"] += pkt.get_payload_len()
        heapq.heappush(held, (time.monotonic() + max(d, 0.0), next(seq), pkt))

    stop = False

    def on_term(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    nfq = NetfilterQueue()
    nfq.bind(qnum, on_packet, max_len=4096)
    sock = socket.fromfd(nfq.get_fd(), socket.AF_NETLINK, socket.SOCK_RAW)
    sock.setblocking(False)
    print("ready", flush=True)
    try:
        while not stop:
            wait = max(0.0, held[0][0] - time.monotonic()) if held else 0.2
            r, _, _ = select.select([sock], [], [], min(wait, 0.2))
            if r:
                nfq.run(block=False)
            now = time.monotonic()
            while held and held[0][0] <= now:
                heapq.heappop(held)[2].accept()
    finally:
        for _, _, pkt in held:  # never leave packets stranded in the kernel queue
            try:
                pkt.accept()
            except Exception:  # noqa: BLE001
                pass
        nfq.unbind()
        sock.close()
        # What was held back: the evidence that the delay bit (read by Topology.stop_delay).
        print(f"delayed {count['packets']} packets {count['bytes']} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
