"""Command-line flags of ``python -m titan.workloads.tinygpt``."""

from __future__ import annotations

import argparse
from typing import Sequence

from titan.workloads.tinygpt.config import PRESETS

__all__ = ["parse_args"]


def _positive(v: str) -> int:
    n = int(v)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return n


def _nonneg(v: str) -> int:
    n = int(v)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {v}")
    return n


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse flags; argparse exits 2 with one line on a user mistake."""
    p = argparse.ArgumentParser(prog="python -m titan.workloads.tinygpt",
                                description="tinygpt: the Titan reference training workload.")
    p.add_argument("--steps", type=_positive, default=100, help="optimizer steps to train (default 100)")
    p.add_argument("--stop-at", type=_positive, default=None,
                   help="exit 0 after this step (simulates an interruption; the schedule still spans --steps)")
    p.add_argument("--seed", type=int, default=0, help="seed of corpus, sampler, init and dropout")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="model size (default tiny)")
    p.add_argument("--batch-size", type=_positive, default=8, help="per-rank micro-batch (default 8)")
    p.add_argument("--seq-len", type=_positive, default=None, help="sequence length (default: preset's)")
    p.add_argument("--layers", type=_positive, default=None, help="override the preset's n_layer")
    p.add_argument("--width", type=_positive, default=None, help="override the preset's d_model")
    p.add_argument("--heads", type=_positive, default=None, help="override the preset's n_head")
    p.add_argument("--vocab", type=_positive, default=None, help="override the preset's vocab_size")
    p.add_argument("--dropout", type=float, default=None, help="dropout (default: preset's, 0.1)")
    p.add_argument("--grad-accum", type=_positive, default=1, help="micro-batches per optimizer step")
    p.add_argument("--lr", type=float, default=None, help="peak LR (default 3e-3 tiny, 3e-4 100m)")
    p.add_argument("--warmup", type=_nonneg, default=10, help="linear warm-up steps (default 10)")
    p.add_argument("--min-lr-ratio", type=float, default=0.1, help="cosine floor as a fraction of --lr")
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=1.0, help="max gradient norm (clip_grad_norm_)")
    p.add_argument("--num-samples", type=_positive, default=4096, help="corpus size in sequences")
    p.add_argument("--num-workers", type=_nonneg, default=0, help="DataLoader worker processes")
    p.add_argument("--threads", type=_positive, default=None,
                   help="intra-op threads (torch.set_num_threads); default: leave torch's setting")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                   help="parameter dtype (bf16: parameters, gradients and AdamW moments in bf16; loss in fp32)")
    p.add_argument("--ckpt-every", type=_nonneg, default=None,
                   help="checkpoint every K steps (sets checkpoint.every_steps; 0 = off)")
    p.add_argument("--no-ckpt", action="store_true", help="neither restore nor save checkpoints")
    p.add_argument("--no-guard", action="store_true", help="run without the step guard")
    p.add_argument("--no-sdc", action="store_true", help="run without silent-data-corruption checks")
    p.add_argument("--out", default=None, help="save final parameters (torch.save of {name: tensor}) from rank 0")
    p.add_argument("--log-every", type=_nonneg, default=10, help="log a line every N steps on rank 0 (0 = never)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a Titan setting (repeatable)")
    args = p.parse_args(argv)
    if args.dropout is not None and not 0.0 <= args.dropout < 1.0:
        p.error(f"--dropout must be within [0, 1), got {args.dropout}")
    for item in args.overrides:
        if "=" not in item or "." not in item.partition("=")[0]:
            p.error(f"--set expects SECTION.FIELD=VALUE, got {item!r}")
    return args
