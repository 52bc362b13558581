"""Taking a checkpoint or snapshot must not change training (found with tinygpt, 2 ranks;
fixed in ``collect``, which now leaves a fresh optimizer fresh).

With 2 ranks, SDC checks on and checkpoints on, tinygpt's losses differ from a run with
``--no-ckpt`` from step 2 on: the SDC monitor's first verified snapshot (before step 1)
goes through ``titan.checkpoint.state.collect`` → DCP ``get_optimizer_state_dict``, which
initialises an empty AdamW state with a zero-lr ``step()`` — leaving ``step = 1`` on every
parameter, so every later bias correction is one step off.
"""

from __future__ import annotations

import torch

from titan.checkpoint.state import collect


def test_collecting_a_fresh_optimizer_leaves_its_state_untouched() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    collect({"model": model, "optimizer": opt}, rank=0)
    steps = [float(s["step"]) for s in opt.state.values()]
    assert not opt.state, f"collect() created optimizer state (step counters {steps}); expected none"
