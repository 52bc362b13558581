"""Binary layout of a beacon file, shared by the writer (worker) and readers (watchdog).

One file per local rank, memory-mapped by the worker and read with plain ``pread``-style
access by the watchdog (no collective, no lock, no GIL of the worker). Little endian,
every integer 8-byte aligned so single fields are written atomically on the platforms we
run on. A *generation* counter brackets multi-field updates (seqlock): odd while the
writer is inside an update, so a reader retries instead of seeing a torn phase.

Layout (offsets in bytes)::

    0    magic "TITANBC1", version, header size
    ...  identity: pid, proc start ticks, rank, local rank, world, attempt, node
    ...  progress: gen, heartbeat, step, phase index, phase start (mono/wall ns),
         last update (mono/wall ns), state (running/done), dump request/done
    ...  collectives: SLOTS x (issued, completed)
    ...  phase names: PHASES x 24 bytes
    ...  step ring: RING x (step, compute ns, step ns)
    ...  phase-duration ring: PRING x (phase index, duration ns)
"""

from __future__ import annotations

import dataclasses
import struct

__all__ = [
    "MAGIC", "VERSION", "SLOTS", "PHASES", "RING", "PRING", "SIZE", "STATE_RUNNING", "STATE_DONE",
    "BeaconSnapshot", "decode", "F",
]

MAGIC = b"TITANBC1"
VERSION = 1
SLOTS = 4
PHASES = 32
NAME_LEN = 24
RING = 128
PRING = 512
STATE_RUNNING = 1
STATE_DONE = 2

_HEAD = struct.Struct("<8sII")  # magic, version, header size
_IDENT = struct.Struct("<qqqqqq32s")  # pid, start ticks, rank, local rank, world, attempt, node
_PROG = struct.Struct("<qqqqqqqqqqqq")  # see F below


class F:
    """Byte offsets of the single fields the writer updates in place."""

    HEAD = 0
    IDENT = _HEAD.size  # 16
    PROG = IDENT + _IDENT.size  # 16 + 80 = 96
    GEN = PROG + 0
    HEARTBEAT = PROG + 8
    STEP = PROG + 16
    PHASE = PROG + 24
    PHASE_MONO = PROG + 32
    PHASE_WALL = PROG + 40
    LAST_MONO = PROG + 48
    LAST_WALL = PROG + 56
    STATE = PROG + 64
    DUMP_REQ = PROG + 72
    DUMP_DONE = PROG + 80
    STEP_COUNT = PROG + 88  # entries ever written to the step ring
    COLL = PROG + _PROG.size  # SLOTS x (issued, completed)
    NAMES = COLL + SLOTS * 16
    STEP_RING = NAMES + PHASES * NAME_LEN
    PCOUNT = STEP_RING + RING * 24  # entries ever written to the phase ring
    PRING_OFF = PCOUNT + 8


SIZE = F.PRING_OFF + PRING * 16
_RING_ENTRY = struct.Struct("<qqq")
_PR_ENTRY = struct.Struct("<qq")


@dataclasses.dataclass
class BeaconSnapshot:
    """What a reader sees in one beacon file at one moment."""

    path: str
    pid: int
    start_ticks: int
    rank: int
    local_rank: int
    world: int
    attempt: int
    node: str
    heartbeat: int
    step: int
    phase: str
    phase_mono_ns: int
    phase_wall_ns: int
    last_mono_ns: int
    last_wall_ns: int
    state: int
    dump_req: int
    dump_done: int
    issued: list[int]
    completed: list[int]
    names: list[str]
    step_count: int
    step_ring: list[tuple[int, int, int]]  # (step, compute_ns, step_ns), oldest first
    phase_count: int
    phase_ring: list[tuple[str, int]]  # (phase, duration_ns), oldest first

    @property
    def done(self) -> bool:
        return self.state == STATE_DONE


def decode(buf: bytes, path: str = "") -> BeaconSnapshot | None:
    """Decode a beacon image; ``None`` when it is not (yet) a complete beacon."""
    if len(buf) < SIZE:
        return None
    magic, version, _hs = _HEAD.unpack_from(buf, 0)
    if magic != MAGIC or version != VERSION:
        return None
    pid, ticks, rank, lrank, world, attempt, node = _IDENT.unpack_from(buf, F.IDENT)
    p = _PROG.unpack_from(buf, F.PROG)
    coll = struct.unpack_from(f"<{SLOTS * 2}q", buf, F.COLL)
    names = [buf[F.NAMES + i * NAME_LEN:F.NAMES + (i + 1) * NAME_LEN].rstrip(b"\0").decode("utf-8", "replace")
             for i in range(PHASES)]
    step_count = p[11]
    n = min(step_count, RING)
    ring = [_RING_ENTRY.unpack_from(buf, F.STEP_RING + ((step_count - n + i) % RING) * 24) for i in range(n)]
    pcount = struct.unpack_from("<q", buf, F.PCOUNT)[0]
    m = min(pcount, PRING)
    pr = []
    for i in range(m):
        idx, dur = _PR_ENTRY.unpack_from(buf, F.PRING_OFF + ((pcount - m + i) % PRING) * 16)
        pr.append((names[idx] if 0 <= idx < PHASES else "?", dur))
    phase_idx = p[3]
    return BeaconSnapshot(
        path=path, pid=pid, start_ticks=ticks, rank=rank, local_rank=lrank, world=world, attempt=attempt,
        node=node.rstrip(b"\0").decode("utf-8", "replace"), heartbeat=p[1], step=p[2],
        phase=names[phase_idx] if 0 <= phase_idx < PHASES else "?", phase_mono_ns=p[4], phase_wall_ns=p[5],
        last_mono_ns=p[6], last_wall_ns=p[7], state=p[8], dump_req=p[9], dump_done=p[10],
        issued=list(coll[0::2]), completed=list(coll[1::2]), names=names, step_count=step_count,
        step_ring=[tuple(e) for e in ring], phase_count=pcount, phase_ring=pr,  # type: ignore[misc]
    )
