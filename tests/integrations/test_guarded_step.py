"""The guarded optimizer step the three integrations share (titan.integrations._core), on a
plain model in one process: the framework's own ``optimizer.step()`` call becomes the
guard's step; a non-finite step is skipped and told; the loss is the micro-batches' mean."""

from __future__ import annotations

import math

import torch

from titan.integrations._core import GuardedStep
from titan.worker import WorkerContext


def _setup(tmp_path):
    torch.manual_seed(0)
    ctx = WorkerContext.from_env(run_dir=tmp_path / "run", env={}, wire=False)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.5, total_iters=10)
    seen = []
    g = GuardedStep(ctx, model, opt, on_result=seen.append)
    return ctx, model, opt, sched, g, seen


def _backward(model, bad: bool = False) -> torch.Tensor:
    loss = model(torch.ones(3, 4)).pow(2).mean()
    loss.backward()
    if bad:
        model.weight.grad[0, 0] = float("nan")
    return loss


def test_the_frameworks_step_call_is_guarded_and_a_nan_step_is_skipped(tmp_path):
    ctx, model, opt, sched, g, seen = _setup(tmp_path)
    w0 = model.weight.detach().clone()
    g.add_loss(_backward(model))
    opt.step()  # what the framework calls
    sched.step()
    w1 = model.weight.detach().clone()
    assert not torch.equal(w0, w1), "a clean step did not update the weights"
    assert seen[-1].skipped is False and seen[-1].step == 1 and math.isfinite(seen[-1].loss)
    opt.zero_grad()
    g.add_loss(_backward(model, bad=True))
    opt.step()
    assert seen[-1].skipped is True and seen[-1].reason == "nonfinite", seen[-1]
    assert torch.equal(model.weight.detach(), w1), "a skipped step changed the weights"
    assert all(p.grad is None for p in model.parameters()), "a skipped step left its gradients"
    assert g.step_count == 2 and g.guard_s > 0 and g.update_s > 0


def test_the_loss_the_guard_judges_is_the_mean_of_the_micro_batches(tmp_path):
    ctx, model, opt, sched, g, seen = _setup(tmp_path)
    for v in (1.0, 3.0):
        g.add_loss(torch.tensor(v))
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    assert seen[-1].loss == 2.0, f"expected the mean 2.0, the guard saw {seen[-1].loss}"


def test_a_closure_runs_inside_the_guarded_step_and_close_puts_the_step_back(tmp_path):
    ctx, model, opt, sched, g, seen = _setup(tmp_path)
    calls = []

    def closure():
        calls.append(1)
        return _backward(model)

    out = opt.step(closure)
    assert calls == [1] and isinstance(out, torch.Tensor) and seen[-1].step == 1
    g.close()
    before = model.weight.detach().clone()
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    assert len(seen) == 1, "after close() the optimizer step still went through the guard"
    assert not torch.equal(before, model.weight.detach())


def test_the_frameworks_clipping_norm_is_the_guards_and_a_subsets_is_not(tmp_path):
    ctx, model, opt, sched, g, seen = _setup(tmp_path)
    params = list(model.parameters())
    g.add_loss(_backward(model))
    g.note_grad_norm(torch.tensor(123.0), params)  # what the framework's clip_grad_norm_ returned
    opt.step()
    assert seen[-1].grad_norm == 123.0, f"the guard did not use the noted norm: {seen[-1].grad_norm}"
    assert g.guard.check._norms is None, "the guard read the gradients although the norm was noted"
    opt.zero_grad()
    g.add_loss(_backward(model))
    want = float(torch.nn.utils.get_total_norm([p.grad for p in params]))
    g.note_grad_norm(torch.tensor(123.0), [model.weight])  # a subset's norm is not the step's
    opt.step()
    assert seen[-1].grad_norm == want, (seen[-1].grad_norm, want)
