"""Silent data corruption: cross-replica fingerprints, compute canaries, in-job repair."""

from __future__ import annotations

from titan.sdc.canary import GemmCanary
from titan.sdc.fingerprint import digest, named_state, state_fingerprints, tensor_fingerprint
from titan.sdc.monitor import SDCMonitor

__all__ = ["GemmCanary", "SDCMonitor", "digest", "named_state", "state_fingerprints", "tensor_fingerprint"]
