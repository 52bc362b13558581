"""A kill during retention cleanup never leaves a committed-looking checkpoint with a file missing.

Issue 15: 3 of 40 kills during cleanup left an older ``step-N/`` with a shard gone (it was
deleted in place). Now a checkpoint is renamed out of the committed namespace first
(``.deleting-…``) and deleted after; the next restore removes what a kill left.
Checkpoints here are real manifests (sizes + CRC-32 of every file) over many small files,
so that a delete takes long enough for random kills to land inside it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest

from titan.checkpoint.manifest import FORMAT, MANIFEST, VERSION, list_committed, step_dir_name, verify

CHECKPOINTS, FILES = 8, 150
PRUNE = """
import sys, time
from pathlib import Path
from titan.checkpoint.commit import prune
print("go", flush=True)
t0 = time.perf_counter()
prune(Path(sys.argv[1]), keep_last=1, keep_every=0)
print(f"done {time.perf_counter() - t0:.4f}", flush=True)
"""


def _template(root: Path) -> Path:
    root.mkdir(parents=True)
    for step in range(1, CHECKPOINTS + 1):
        d = root / step_dir_name(step)
        d.mkdir()
        files = {}
        for i in range(FILES):
            data = os.urandom(64) + bytes([step, i % 256])
            (d / f"__{i}_0.distcp").write_bytes(data)
            files[f"__{i}_0.distcp"] = {"size": len(data), "crc32": zlib.crc32(data)}
        m = {"format": FORMAT, "version": VERSION, "step": step, "world_size": 1, "checksum": "crc32",
             "bytes": sum(f["size"] for f in files.values()), "files": files, "info": {}}
        (d / MANIFEST).write_text(json.dumps(m))
    (root / "latest").write_text(step_dir_name(CHECKPOINTS) + "\n")
    return root


def _torn(root: Path) -> list[str]:
    """Committed-looking checkpoints that fail verification (a file missing or wrong)."""
    return [f"{p.name}: {verify(p).problems[:2]}" for _, p in list_committed(root) if not verify(p).ok]


def _missing(root: Path) -> list[str]:
    """The same check by size only (a stat per file; ``verify`` also reads every byte)."""
    out = []
    for _, p in list_committed(root):
        try:
            files = json.loads((p / MANIFEST).read_text())["files"]
        except (OSError, ValueError) as e:
            out.append(f"{p.name}: manifest {e}")
            continue
        gone = [n for n, f in files.items() if not (p / n).is_file() or (p / n).stat().st_size != f["size"]]
        if gone:
            out.append(f"{p.name}: {len(gone)} of {len(files)} files missing, e.g. {gone[0]}")
    return out


def _prune(root: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PRUNE, str(root)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("point", ["delete", "delete_renamed"])
def test_a_kill_at_each_point_of_a_delete_leaves_only_whole_checkpoints(tmp_path, point):
    from titan.checkpoint.commit import clean_partials

    root = _template(tmp_path / "ckpt")
    p = _prune(root, {"TITAN_CKPT_CRASH_AT": point})
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL, f"the prune was not killed at {point}: {p.returncode}"
    assert not _torn(root), _torn(root)
    left = [e.name for e in root.iterdir() if e.name.startswith(".deleting-")]
    assert len(left) == (1 if point == "delete_renamed" else 0), left
    clean_partials(root)  # what the next restore does first
    assert not [e.name for e in root.iterdir() if e.name.startswith(".deleting-")]


def _forked_prune(root: Path) -> tuple[int, int]:
    """Fork a child that prunes ``root`` (no exec: a kill can land at any moment of the
    cleanup, not of a Python start-up); returns (pid, read end that gets b"go")."""
    from titan.checkpoint.commit import prune

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            os.close(r)
            os.write(w, b"go")
            prune(root, keep_last=1, keep_every=0)
        finally:
            os._exit(0)
    os.close(w)
    return pid, r


@pytest.mark.timeout(180)
def test_forty_kills_at_random_moments_of_cleanup_leave_no_torn_checkpoint(tmp_path):
    template = _template(tmp_path / "template")
    times = []
    for i in range(3):  # how long one whole cleanup takes here (median of 3: the box may be busy)
        root = shutil.copytree(template, tmp_path / f"timing{i}")
        pid, r = _forked_prune(root)
        os.read(r, 2)
        t0 = time.perf_counter()
        os.waitpid(pid, 0)
        os.close(r)
        times.append(time.perf_counter() - t0)
    full_s = sorted(times)[1]
    rng = random.Random(15)
    mid, torn = 0, []
    for trial in range(40):
        root = shutil.copytree(template, tmp_path / f"t{trial}")
        pid, r = _forked_prune(root)
        assert os.read(r, 2) == b"go"
        time.sleep(rng.uniform(0, full_s))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(r)
        n = len(list_committed(root))
        mid += 1 < n < CHECKPOINTS  # killed with some checkpoints deleted and some not
        torn += [f"trial {trial}: {x}" for x in _missing(root)]
        shutil.rmtree(root)
    assert not torn, f"{len(torn)} committed-looking checkpoints with files missing, e.g. {torn[:3]}"
    print(f"{mid} of 40 kills landed inside the cleanup ({full_s * 1000:.0f} ms)")
    # A loaded box shifts the timing; a fifth inside still proves the kills hit the cleanup.
    assert mid >= 6, f"only {mid} of 40 kills landed inside the cleanup (one cleanup: {full_s * 1000:.0f} ms)"
