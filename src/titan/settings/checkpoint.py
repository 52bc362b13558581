"""Settings of checkpoints (``titan.checkpoint``)."""

from __future__ import annotations

import dataclasses

from titan.settings.core import register_section, require

__all__ = ["CheckpointConfig"]


@register_section("checkpoint")
@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """When and how checkpoints are saved, kept and loaded.

    ``every_steps`` is the disk interval (0 = only explicit saves, SIGTERM and close);
    ``snapshot_every_steps`` the in-memory (``/dev/shm``) interval (0 = off). ``mode`` is
    ``async`` (training blocks only while state is copied; the write runs in a background
    thread on its own process group) or ``sync``. Retention keeps the newest ``keep_last``
    plus every step that is a multiple of ``keep_every`` (0 = none extra).
    """

    every_steps: int = 100
    mode: str = "async"
    keep_last: int = 3
    keep_every: int = 0
    #: Directory for checkpoints; empty = ``<run dir>/checkpoints``.
    dir: str = ""
    #: Verify the manifest's checksums before loading (cost: one read of every file).
    verify_on_load: bool = True
    #: On SIGTERM finish the current step, save and exit with ExitCode.PREEMPTED.
    save_on_sigterm: bool = True
    #: In-memory snapshot interval in steps (0 = off) and its directory.
    snapshot_every_steps: int = 0
    snapshot_dir: str = "/dev/shm/titan"
    #: Bound on waiting for an in-flight background save (reported as ``ckpt.failed``).
    wait_timeout_s: float = 600.0
    #: fsync every file and directory (off only for benchmarks on throwaway data).
    fsync: bool = True

    def __post_init__(self) -> None:
        require(self.every_steps >= 0, "every_steps must be >= 0", "use 0 (explicit saves only) or a step count")
        require(self.mode in ("async", "sync"), f"unknown checkpoint mode {self.mode!r}", "use async or sync")
        require(self.keep_last >= 1, "keep_last must be >= 1", "keep at least the newest checkpoint, e.g. 3")
        require(self.keep_every >= 0, "keep_every must be >= 0", "use 0 (off) or a step multiple, e.g. 1000")
        require(self.snapshot_every_steps >= 0, "snapshot_every_steps must be >= 0", "use 0 (off) or a step count")
        require(self.wait_timeout_s > 0, "wait_timeout_s must be > 0", "use seconds, e.g. 600")
