"""Settings of silent-data-corruption detection (``titan.sdc``)."""

from __future__ import annotations

import dataclasses

from titan.settings.core import register_section, require

__all__ = ["SDCConfig"]


@register_section("sdc")
@dataclasses.dataclass(frozen=True, kw_only=True)
class SDCConfig:
    """Cross-replica fingerprints every ``every_steps`` and a GEMM canary every
    ``canary_every_steps``. A round that agrees takes the verified in-memory snapshot when
    ``snapshot_on_agree``; a mismatch rolls back to it and replays, so the replay after a
    corruption is at most ``every_steps`` steps. The per-step tier
    (``checkpoint.snapshot_every_steps``) is a separate, unverified tier for crash recovery:
    a rollback after a suspected corruption never uses it, so its cadence is free."""

    enabled: bool = True
    every_steps: int = 50
    canary_every_steps: int = 50
    canary_size: int = 128
    #: ``auto``: xxHash3 of the raw bytes on CPU (measured 60× faster than a torch checksum
    #: here), a position-weighted int64 checksum on the device for CUDA tensors.
    hash: str = "auto"
    snapshot_on_agree: bool = True
    #: A second mismatch on the same node within this many steps escalates (exclusion).
    escalate_window_steps: int = 1000

    def __post_init__(self) -> None:
        require(self.every_steps >= 1 and self.canary_every_steps >= 0, "sdc.every_steps must be >= 1 and "
                "sdc.canary_every_steps >= 0", "e.g. every_steps = 50, canary_every_steps = 50 (0 = no canary)")
        require(self.every_steps <= 100, "sdc.every_steps must be <= 100 (bounds the replay after a corruption)",
                "use 50")
        require(self.hash in ("auto", "xxhash", "checksum"), f"unknown sdc.hash {self.hash!r}", "use auto, xxhash or checksum")
        require(self.canary_size >= 8, "sdc.canary_size must be >= 8", "e.g. 128")
        require(self.escalate_window_steps >= 1, "sdc.escalate_window_steps must be >= 1", "e.g. 1000")
