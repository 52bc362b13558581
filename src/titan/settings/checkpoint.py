"""Settings of checkpoints (``titan.checkpoint``)."""

from __future__ import annotations

import dataclasses

from titan.settings.core import register_section, require

__all__ = ["CheckpointConfig", "is_url"]


@register_section("checkpoint")
@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointConfig:
    """When and how checkpoints are saved, kept and loaded.

    ``every_steps`` is the disk interval (0 = only explicit saves, SIGTERM and close);
    ``snapshot_every_steps`` the interval of the per-step in-memory tier (``/dev/shm``, crash
    recovery: a restarted rank resumes from the last step; 0 = off). SDC's verified
    snapshots are a second tier, taken when its replicas agree. ``mode`` is
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
    #: Per-step in-memory tier for crash recovery: interval in steps (0 = off; 1: a restart
    #: loses at most one step) and directory. Never the source of a rollback after a
    #: suspected corruption while SDC is on.
    snapshot_every_steps: int = 0
    snapshot_dir: str = "/dev/shm/titan"
    #: The per-step tier turns itself off (and says so) when its two slots would take more
    #: than this fraction of the snapshot file system.
    snapshot_max_fraction: float = dataclasses.field(default=0.5, metadata={"range": (0.01, 1.0)})
    #: Bound on waiting for an in-flight background save (reported as ``ckpt.failed``).
    wait_timeout_s: float = 600.0
    #: fsync every file and directory (off only for benchmarks on throwaway data).
    fsync: bool = True
    #: When every checkpoint is corrupt, train again from step 0 (event + final line) instead
    #: of stopping with GAVE_UP.
    allow_fresh_start: bool = False
    #: Copies of every node's shards on a buddy node (node-local storage: docs/checkpoint.md):
    #: ``auto`` (on disk, only when the checkpoint folder is not shared by every node),
    #: ``disk`` / ``memory`` (the buddy's local disk or its ``titan run``'s memory, whenever the
    #: folder is node-local), ``off`` (a multi-node job on node-local storage is then refused).
    replicate: str = "auto"
    #: Bound on one replication or fetch request (connect, send, the buddy's write).
    replica_timeout_s: float = 120.0
    #: The durable tier: the checkpoint of every step that is a multiple of this (a multiple
    #: of ``every_steps``) is also copied to ``persist_dir`` — a folder every node sees or an
    #: fsspec URL (``pip install 'titan-resilience[fsspec]'`` plus the store's own package) —
    #: off the training loop; a restore falls back to it when the nodes' own copies and their
    #: buddies' are gone (0 = off).
    persist_every_steps: int = 0
    persist_dir: str = ""
    #: Retention of the durable tier: its newest N steps are kept.
    persist_keep_last: int = 2

    def __post_init__(self) -> None:
        require(self.every_steps >= 0, "every_steps must be >= 0", "use 0 (explicit saves only) or a step count")
        require(self.mode in ("async", "sync"), f"unknown checkpoint mode {self.mode!r}", "use async or sync")
        require(self.keep_last >= 1, "keep_last must be >= 1", "keep at least the newest checkpoint, e.g. 3")
        require(self.keep_every >= 0, "keep_every must be >= 0", "use 0 (off) or a step multiple, e.g. 1000")
        require(self.snapshot_every_steps >= 0, "snapshot_every_steps must be >= 0", "use 0 (off) or a step count")
        require(self.wait_timeout_s > 0, "wait_timeout_s must be > 0", "use seconds, e.g. 600")
        require(self.replicate in ("auto", "disk", "memory", "off"), f"unknown checkpoint.replicate {self.replicate!r}",
                "use auto (default), disk, memory or off")
        require(self.replica_timeout_s > 0, "replica_timeout_s must be > 0", "use seconds, e.g. 120")
        require(self.persist_every_steps >= 0, "persist_every_steps must be >= 0", "use 0 (off) or a step count")
        require(not self.persist_every_steps or bool(self.persist_dir),
                "checkpoint.persist_every_steps needs checkpoint.persist_dir",
                "give a shared folder or an fsspec URL, e.g. --set checkpoint.persist_dir=/shared/exp42")
        require(not self.persist_dir or bool(self.persist_every_steps),
                "checkpoint.persist_dir is set but checkpoint.persist_every_steps is 0 (nothing would be copied)",
                "set how often, e.g. --set checkpoint.persist_every_steps=1000 (a multiple of every_steps)")
        require(not (self.persist_every_steps and self.every_steps) or self.persist_every_steps % self.every_steps == 0,
                f"checkpoint.persist_every_steps={self.persist_every_steps} is not a multiple of "
                f"checkpoint.every_steps={self.every_steps}: only common multiples would be copied",
                f"use a multiple of {self.every_steps}, e.g. {self.every_steps * 10}")
        require(self.persist_keep_last >= 1, "persist_keep_last must be >= 1", "keep at least the newest, e.g. 2")
        if self.persist_dir:
            _check_persist_url(self.persist_dir)


def is_url(where: str) -> bool:
    """An fsspec URL (``scheme://…``, ``file://`` included) rather than a plain folder."""
    head, sep, _ = where.partition("://")
    return bool(sep) and head.replace("+", "").replace("-", "").isalnum()


def _check_persist_url(where: str) -> None:
    """An fsspec URL needs fsspec and the store's implementation, installed here (one line if not)."""
    if not is_url(where):
        return
    scheme = where.split("://", 1)[0]
    try:
        import fsspec
    except ImportError:
        require(False, f"checkpoint.persist_dir {where!r} is a URL and fsspec is not installed",
                "pip install 'titan-resilience[fsspec]' (and the store's package, e.g. s3fs), or give a shared folder")
        return
    try:
        fsspec.get_filesystem_class(scheme)
    except (ImportError, ValueError) as e:
        require(False, f"checkpoint.persist_dir {where!r}: fsspec cannot open {scheme}:// here ({e})"[:300],
                f"install the package fsspec names for {scheme}://, or give a shared folder")
