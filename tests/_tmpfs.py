"""A private tmpfs of a given size for one test (a real ENOSPC): mount, yield, unmount.

Root only (the tests skip otherwise). The mount point is inside the test's own tmp_path, so
nothing outside the test sees it; unmounting waits for busy files to close, then detaches.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Iterator

import pytest


@contextlib.contextmanager
def mounted_tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """Mount a ``size`` tmpfs (e.g. ``"20m"``) at ``mnt`` (created); skips the test when impossible."""
    mnt.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a {size} tmpfs here: {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        for _ in range(20):
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
                break
            time.sleep(0.5)
        else:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
