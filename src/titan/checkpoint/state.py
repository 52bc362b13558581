"""What goes into a checkpoint: every app-state object, plus this rank's RNG streams.

The state dict is ``{name: obj.state_dict(), ..., "rng": {"rank<r>": {...}}}``. Models and
optimizers go through ``torch.distributed.checkpoint.state_dict`` (FQN keys, DDP/FSDP
aware, a fresh optimizer's lazy state created so it can be loaded into). RNG states are
stored as tensors — Python ``random``, NumPy's legacy global generator, torch CPU and
every CUDA device — under a per-rank key, because DCP keeps one copy of a key that
several ranks save (checked: rank 0 got rank 1's state back, silently).
"""

from __future__ import annotations

import logging
import random
from typing import Any, Mapping

import torch

from titan.errors import UserError

__all__ = ["RNG_KEY", "capture_rng", "restore_rng", "reseed_rng", "collect", "apply", "ddp_warmup"]

log = logging.getLogger(__name__)

RNG_KEY = "rng"


def capture_rng() -> dict[str, torch.Tensor]:
    """This process's RNG states as tensors (cost: a few KB copied; no device sync on CPU)."""
    import numpy as np

    ver, internal, gauss = random.getstate()
    np_state = np.random.get_state(legacy=True)
    out = {
        "python_state": torch.tensor(internal, dtype=torch.int64),
        "python_meta": torch.tensor([ver, gauss is not None], dtype=torch.int64),
        "python_gauss": torch.tensor(0.0 if gauss is None else gauss, dtype=torch.float64),
        "numpy_keys": torch.from_numpy(np_state[1].astype(np.int64)),
        "numpy_meta": torch.tensor([np_state[2], np_state[3]], dtype=torch.int64),
        "numpy_gauss": torch.tensor(float(np_state[4]), dtype=torch.float64),
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            out[f"cuda{i}"] = torch.cuda.get_rng_state(i)
    return out


def restore_rng(state: Mapping[str, torch.Tensor]) -> None:
    """Set every RNG from ``capture_rng`` output. CUDA devices beyond those saved are left as is."""
    import numpy as np

    meta = state["python_meta"].tolist()
    internal = tuple(int(v) for v in state["python_state"].tolist())
    gauss = float(state["python_gauss"]) if meta[1] else None
    random.setstate((int(meta[0]), internal, gauss))
    nm = state["numpy_meta"].tolist()
    np.random.set_state(("MT19937", state["numpy_keys"].numpy().astype(np.uint32), int(nm[0]), int(nm[1]),
                         float(state["numpy_gauss"])))
    torch.set_rng_state(state["torch_cpu"].to(torch.uint8).cpu())
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            key = f"cuda{i}"
            if key in state:
                torch.cuda.set_rng_state(state[key].to(torch.uint8).cpu(), i)


def reseed_rng(seed: int, rank: int, step: int | None = None) -> int:
    """Re-derive this rank's RNG streams from ``(seed, rank[, step])`` (world size changed).

    NumPy ``SeedSequence`` mixing like the reference workload's ``seed_everything``; the
    step keeps a resumed run from replaying the dropout masks of its first steps.
    """
    import numpy as np

    entropy = [seed, rank] + ([step] if step is not None else [])
    s = int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> 1)
    random.seed(s)
    np.random.seed(s % 2**32)
    torch.manual_seed(s)
    return s


def _single_model(app_state: Mapping[str, Any]) -> torch.nn.Module | None:
    models = [v for v in app_state.values() if isinstance(v, torch.nn.Module)]
    return models[0] if len(models) == 1 else None


def collect(app_state: Mapping[str, Any], rank: int, *, with_rng: bool = True) -> dict[str, Any]:
    """Build the state dict to save (or the template to load into).

    Raises ``UserError`` for a reserved key or an object without ``state_dict``.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    if RNG_KEY in app_state:
        raise UserError(f"app_state key {RNG_KEY!r} is reserved for RNG state", "rename that entry")
    model = _single_model(app_state)
    sd: dict[str, Any] = {}
    for name, obj in app_state.items():
        if isinstance(obj, torch.nn.Module):
            sd[name] = get_model_state_dict(obj)
        elif isinstance(obj, torch.optim.Optimizer) and model is not None:
            fresh = not obj.state
            sd[name] = get_optimizer_state_dict(model, obj)
            if fresh:
                # DCP initialises an empty optimizer's state with a zero-lr step() (AdamW:
                # step=1 everywhere) to learn its structure; the live optimizer must stay
                # fresh, or saving at step 0 would change the run (found with tinygpt).
                obj.state.clear()
        elif hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):
            sd[name] = obj.state_dict()
        else:
            raise UserError(f"app_state[{name!r}] ({type(obj).__name__}) has no state_dict/load_state_dict",
                            "pass objects with both methods (model, optimizer, scheduler, sampler, ...)")
    if with_rng:
        sd[RNG_KEY] = {f"rank{rank}": capture_rng()}
    return sd


def apply(app_state: Mapping[str, Any], sd: Mapping[str, Any]) -> None:
    """Load ``sd`` (as filled by ``dcp.load``) into the app-state objects; RNG last."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    model = _single_model(app_state)
    for name, obj in app_state.items():
        if isinstance(obj, torch.nn.Module):
            set_model_state_dict(obj, sd[name])
        elif isinstance(obj, torch.optim.Optimizer) and model is not None:
            set_optimizer_state_dict(model, obj, sd[name])
        else:
            obj.load_state_dict(sd[name])
    rng = sd.get(RNG_KEY)
    if rng:
        (only,) = rng.values()
        restore_rng(only)


def ddp_warmup(ddp_model: torch.nn.Module, loss_fn: Any) -> None:
    """One discarded forward/backward after a restore, with RNG and gradients put back.

    DDP rebuilds its gradient buckets after its first iteration; at world size >= 3 gloo's
    all-reduce result depends on an element's offset in the bucket, so a resumed run whose
    first real step uses the initial layout differs in the last bits (measured: 31,274 of
    279,296 parameters after 5 steps). ``loss_fn(ddp_model)`` must return a scalar loss
    from a batch that does not advance the sampler. Cost: one forward + backward + the
    gradient all-reduce.
    """
    saved = capture_rng()
    params = [p for p in ddp_model.parameters() if p.requires_grad]
    grads = [p.grad for p in params]
    loss = loss_fn(ddp_model)
    loss.backward()
    for p, g in zip(params, grads):
        p.grad = g
    restore_rng(saved)
