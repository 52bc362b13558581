"""A user script under ``titan run`` whose data is poisoned: the guard escalates to abort.

Used by ``test_escalation_under_titan_run.py``; the few Titan lines are marked.
"""

import torch
from torch import nn

from titan.guard import StepGuard
from titan.worker import WorkerContext
from titan.worker.errors import fault_boundary


def main() -> None:
    ctx = WorkerContext.from_env()  # titan
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = StepGuard(model, opt, max_norm=1.0, ctx=ctx)  # titan
    x = torch.full((8, 4), float("nan"))  # every batch poisoned: persistent, step after step
    with fault_boundary(ctx):  # titan: TitanAbort -> exit code (3 = GAVE_UP)
        for step in range(1, 50):
            ctx.step = step

            def fwd_bwd() -> torch.Tensor:
                opt.zero_grad(set_to_none=True)
                loss = model(x).pow(2).mean()
                loss.backward()
                return loss.detach()

            guard.step(fwd_bwd, samples=list(range(8)))  # titan
    ctx.events.close()


if __name__ == "__main__":
    main()
