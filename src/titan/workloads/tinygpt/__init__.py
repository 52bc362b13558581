"""tinygpt: the reference LLM workload (model, corpus, resumable sampler, training loop).

Run it with ``python -m titan.workloads.tinygpt --steps 20`` (single process) or under
``titan run`` / torchrun for several ranks. See ``docs/workload.md``.
"""

from __future__ import annotations

from titan.workloads.tinygpt.config import PRESETS, GPTConfig
from titan.workloads.tinygpt.data import MarkovCorpus, ResumableSampler
from titan.workloads.tinygpt.model import GPT

__all__ = ["GPT", "GPTConfig", "MarkovCorpus", "PRESETS", "ResumableSampler"]
