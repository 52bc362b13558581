"""Reference workloads that exercise Titan end to end.

``titan.workloads.tinygpt`` is a small decoder-only transformer trained on a synthetic,
seeded Markov-chain corpus; ``python -m titan.workloads.tinygpt --help`` lists its flags.
Importing this package is cheap: it does not import torch.
"""

from __future__ import annotations

__all__ = ["tinygpt"]
