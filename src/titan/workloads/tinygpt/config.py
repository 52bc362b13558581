"""Model configuration and presets of tinygpt."""

from __future__ import annotations

import dataclasses

__all__ = ["GPTConfig", "PRESETS"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Shape of the decoder-only transformer. ``dropout > 0`` by default on purpose:
    it makes every forward pass consume RNG, so checkpoint/resume must restore RNG state
    to reproduce a run bit for bit."""

    vocab_size: int = 256
    seq_len: int = 64
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 128
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if min(self.vocab_size, self.seq_len, self.n_layer, self.n_head, self.d_model) < 1:
            raise ValueError("vocab_size, seq_len, n_layer, n_head and d_model must be >= 1")
        if self.d_model % self.n_head:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_head ({self.n_head})")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be within [0, 1), got {self.dropout}")


#: ``tiny``: ~0.44M parameters, a step of batch 8x64 takes tens of ms on a 2-core CPU.
#: ``100m``: ~55M parameters (the size measured for DCP in MACHINE-NOTES), for benchmarks.
PRESETS: dict[str, GPTConfig] = {
    "tiny": GPTConfig(),
    "100m": GPTConfig(vocab_size=8192, seq_len=256, n_layer=10, n_head=10, d_model=640),
}
