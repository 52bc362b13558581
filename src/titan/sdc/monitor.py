"""Cross-replica state fingerprints and compute canaries during training, with in-job repair.

Every ``sdc.every_steps`` each data-parallel replica fingerprints its parameters and
optimizer state (``titan.sdc.fingerprint``) and one all-gather of one int64 per rank
compares them. Agreement → the state is good: the in-memory snapshot is taken then, so every
snapshot is verified. Disagreement →

* ≥ 3 replicas: the rank(s) off the majority are named; a second all-gather of per-tensor
  fingerprints names the tensors;
* 2 replicas: nobody can tell yet; after the repair, the rank whose pre-rollback
  fingerprint differs from the replayed one is named (its own per-tensor list names the
  tensor);

then every rank rolls back to the last verified snapshot and replays the steps since (same
data, same RNG) without restarting processes. The odd node gets a strike; a second
mismatch on the same node within ``escalate_window_steps`` escalates (exclusion: the
worker exits so that the node ledger keeps the node out of the next rendezvous).

Assumption (docs/failure-model.md): every post-reduce computation is bit-identical across
replicas — same kernels, thread counts and ISA; the clip coefficient comes from the
all-reduced norm.
"""

from __future__ import annotations

import collections
import time
from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.distributed as dist
from torch import nn

from titan.errors import TitanAbort, TitanError
from titan.exitcodes import ExitCode
from titan.sdc.canary import GemmCanary
from titan.sdc.fingerprint import as_signed, digest, pick_method, state_fingerprints

if TYPE_CHECKING:
    from titan.settings.sdc import SDCConfig
    from titan.worker.context import WorkerContext

__all__ = ["SDCMonitor"]


def _sharded(model: nn.Module) -> bool:
    """True when parameters are sharded across ranks (FSDP2 DTensors or FSDP1 flat params)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - older torch
        DTensor = ()  # type: ignore[assignment]  # noqa: N806
    return any(isinstance(p, DTensor) or type(p).__name__ == "FlatParameter" for p in model.parameters())


class SDCMonitor:
    """Call :meth:`after_step` after every optimizer step (collective on round steps)."""

    def __init__(self, ctx: "WorkerContext", model: nn.Module, optimizer: torch.optim.Optimizer,
                 cfg: "SDCConfig", *, rollback: Callable[[], int] | None = None,
                 snapshot: Callable[[int], None] | None = None, perturbed: Callable[[], bool] | None = None) -> None:
        self.ctx, self.model, self.optimizer, self.cfg = ctx, model, optimizer, cfg
        self._rollback, self._snapshot = rollback, snapshot
        self.world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        self.device = next(model.parameters()).device
        self.method = pick_method(cfg.hash, self.device)
        self.canary = GemmCanary(self.device, cfg.canary_size, perturbed=perturbed) if cfg.canary_every_steps else None
        self.pending: dict[str, Any] | None = None  # a repair whose replay is under way
        self.mismatches: dict[str, list[int]] = collections.defaultdict(list)  # node -> steps
        self.canary_flagged: set[int] = set()
        self.rounds = 0
        self._node_list: list[str] | None = None
        self._refs: list[int] | None = None
        self.fingerprints = self.world > 1 and not _sharded(model)
        if self.world == 1:
            ctx.events.emit("sdc.unavailable", "one replica: cross-replica fingerprints have nothing to compare "
                            "(the canary still runs)", level="info")
        elif not self.fingerprints:
            # FSDP/HSDP: ranks hold different shards, so they are not replicas of each other.
            # Comparing across HSDP replica groups is not built; say so instead of raising
            # false mismatches.
            ctx.events.emit("sdc.unavailable", "sharded parameters (FSDP): no replica of a shard inside the job's "
                            "process group to compare with; fingerprints off (the canary still runs)", level="warning")

    @property
    def replaying(self) -> bool:
        """True while steps rolled back by a repair are being recomputed."""
        return self.pending is not None

    def event_data(self) -> dict[str, Any]:
        return {"replay": True} if self.pending is not None else {}

    # --- collectives ----------------------------------------------------------------
    def _gather_int(self, value: int) -> list[int]:
        if self.world == 1:
            return [value]
        t = torch.tensor([value], dtype=torch.int64, device=self.device if self.device.type == "cuda" else "cpu")
        out = [torch.zeros_like(t) for _ in range(self.world)]
        dist.all_gather(out, t)
        return [int(x.item()) for x in out]

    def _gather_list(self, values: list[int]) -> list[list[int]]:
        if self.world == 1:
            return [values]
        t = torch.tensor([as_signed(v) for v in values], dtype=torch.int64,
                         device=self.device if self.device.type == "cuda" else "cpu")
        out = [torch.zeros_like(t) for _ in range(self.world)]
        dist.all_gather(out, t)
        return [[v & 0xFFFFFFFFFFFFFFFF for v in x.tolist()] for x in out]

    def _nodes(self) -> list[str]:
        """Node id of every rank (one all-gather the first time; all ranks call it together)."""
        if self._node_list is None:
            out: list[Any] = [self.ctx.node]
            if self.world > 1:
                out = [None] * self.world
                dist.all_gather_object(out, self.ctx.node)
            self._node_list = out
        return self._node_list

    # --- the round ------------------------------------------------------------------
    def start(self, step: int) -> None:
        """Verify the starting state (fresh or restored) and take the first verified snapshot."""
        # A fresh optimizer has no state yet, and saving it would create some (DCP's
        # optimizer state dict initialises AdamW with a zero-lr step): the first verified
        # snapshot is then taken at the first round.
        if not self.fingerprints:
            return
        back = self._fingerprint_round(step, force_snapshot=bool(self.optimizer.state))
        assert back is None or self.pending is not None

    def after_step(self, step: int) -> int | None:
        """Run the canary and fingerprint rounds due at ``step``.

        Returns the step the loop must continue after when a repair rolled the state back,
        else None. Cost on a round step: one read of the state (hash) and one all-gather
        of one int64 per rank; on a canary step one 128×128 GEMM and one int64 all-gather.
        Raises ``TitanAbort`` when a node corrupts twice within the window.
        """
        if self.canary is not None and step % self.cfg.canary_every_steps == 0:
            self._canary_round(step)
        if step % self.cfg.every_steps or not self.fingerprints:
            return None
        return self._fingerprint_round(step)

    def _canary_round(self, step: int) -> None:
        assert self.canary is not None
        mine = self.canary.checksum()
        all_ = self._gather_int(mine)
        if self._refs is None:
            self._refs = self._gather_int(self.canary.reference)
        refs = self._refs
        nodes = self._nodes()
        counts = collections.Counter(all_)
        top, n = counts.most_common(1)[0]
        for r, (v, ref) in enumerate(zip(all_, refs)):
            off_peers = self.world >= 3 and n * 2 > self.world and v != top
            if (v != ref or off_peers) and r not in self.canary_flagged:
                self.canary_flagged.add(r)
                node = nodes[r]
                why = "changed since start-up" if v != ref else "differs from identical peers"
                if r == self.ctx.rank:  # the flagged rank reports: one finding, one strike
                    self.ctx.events.emit("sdc.canary", f"rank {r} on {node}: compute canary {why}", level="error",
                                         step=step, data={"rank": r, "node": node, "why": why})
                    self.ctx.events.emit("guard.strike", f"strike against {node}: compute canary", level="warning",
                                         step=step, data={"node": node, "rank": r, "cause": "sdc.canary"})

    def _fingerprint_round(self, step: int, force_snapshot: bool = False) -> int | None:
        t0 = time.perf_counter()
        names, fps = state_fingerprints(self.model, self.optimizer, self.method)
        mine = digest(fps)
        digests = self._gather_int(mine)
        self.rounds += 1
        seconds = time.perf_counter() - t0
        if len(set(digests)) == 1:
            if self.pending is not None and self.pending["step"] == step:
                self._repaired(step, names, fps, digests)
            if self._snapshot is not None and (self.cfg.snapshot_on_agree or force_snapshot):
                self._snapshot(step)
            self.ctx.events.emit("sdc.round", level="debug", step=step, data={"agree": True, "seconds": seconds})
            return None
        return self._mismatch(step, names, fps, digests)

    def _mismatch(self, step: int, names: list[str], fps: list[int], digests: list[int]) -> int | None:
        nodes = self._nodes()
        if self.pending is not None and self.pending["step"] == step:
            # The replay reproduced the disagreement: not a transient flip.
            self.ctx.events.emit("sdc.persistent", f"replicas still disagree after replay at step {step}",
                                 level="critical", step=step, data={"digests": digests})
            raise TitanAbort(f"silent data corruption persists after replay at step {step}", int(ExitCode.GAVE_UP))
        counts = collections.Counter(digests)
        top, n = counts.most_common(1)[0]
        culprits: dict[int, list[str]] = {}
        if self.world >= 3 and n * 2 > self.world:
            per_rank = self._gather_list(fps)
            ref_rank = digests.index(top)
            for r, d in enumerate(digests):
                if d != top:
                    culprits[r] = [nm for nm, a, b in zip(names, per_rank[r], per_rank[ref_rank]) if a != b]
        diverged: list[str] = []
        if not culprits and self.world >= 2:
            # No majority: name the tensors the replicas disagree on (exact); the rank is
            # named after the replay when the evidence allows (see _repaired).
            per_rank = self._gather_list(fps)
            diverged = [nm for i, nm in enumerate(names) if len({pr[i] for pr in per_rank}) > 1]
        data = {"digests": digests, "culprits": {str(r): t for r, t in culprits.items()}, "diverged": diverged,
                "nodes": {str(r): nodes[r] for r in culprits}, "method": self.method}
        msg = (f"replicas disagree at step {step}: " + ", ".join(f"rank {r} on {nodes[r]} ({', '.join(t[:3])})"
                                                             for r, t in culprits.items())
               if culprits else f"2 replicas disagree at step {step}: culprit named after the replay")
        self.ctx.events.emit("sdc.mismatch", msg, level="error", step=step, data=data)
        for r in culprits:
            self._strike(step, r, nodes[r])
        if self._rollback is None:
            self.ctx.events.emit("sdc.unrepaired", "no snapshot to roll back to; restart from the checkpoint",
                                 level="critical", step=step)
            raise TitanAbort(f"silent data corruption at step {step} and no snapshot to repair from",
                             int(ExitCode.JOB_FAILED))
        try:
            restored = self._rollback()
        except TitanError as e:
            self.ctx.events.emit("sdc.unrepaired", f"rollback failed: {e}", level="critical", step=step)
            restored = None
        if restored is None:
            raise TitanAbort(f"silent data corruption at step {step} and no snapshot to repair from",
                             int(ExitCode.JOB_FAILED))
        self.pending = {"step": step, "digests": digests, "culprits": culprits, "fps": fps, "names": names,
                        "restored": restored, "t0": time.time(), "diverged": diverged}
        self.ctx.events.emit("sdc.rollback", f"rolled back to verified snapshot at step {restored}; replaying "
                             f"{step - restored} steps", level="warning", step=step, phase="repair",
                             data={"restored_step": restored, "replay_steps": step - restored})
        return restored

    def _repaired(self, step: int, names: list[str], fps: list[int], digests: list[int]) -> None:
        assert self.pending is not None
        pend, self.pending = self.pending, None
        nodes = self._nodes()
        culprits = pend["culprits"]
        # Which tensors did the replay change on this rank? (local: pre-rollback vs replayed)
        mine = [nm for nm, a, b in zip(names, pend["fps"], fps) if a != b]
        changed: list[Any] = [mine]
        if self.world > 1:
            changed = [None] * self.world
            dist.all_gather_object(changed, mine)
        note = ""
        if not culprits:
            # Two replicas: the rank whose pre-rollback state differs from the replayed one
            # while the other's equals it. Exact when the corruption had not yet passed
            # through an all-reduce; once it had, every replica moved off the clean
            # trajectory and nothing in the end states tells them apart (docs/sdc.md).
            moved = [r for r in range(self.world) if pend["digests"][r] != digests[r]]
            if len(moved) == 1:
                r = moved[0]
                culprits = {r: changed[r]}
                self._strike(step, r, nodes[r])
            else:
                note = (f"culprit unknown: the corruption reached the all-reduce before the round, so all "
                        f"{len(moved)} replicas left the clean trajectory; diverged tensors: "
                        f"{', '.join(pend['diverged'][:4])}. Use >= 3 replicas or a shorter sdc.every_steps to name it")
        self.ctx.events.emit("sdc.repaired", f"repaired in-job: replayed to step {step}; culprit "
                             + (", ".join(f"rank {r} on {nodes[r]} ({', '.join(t[:3])})" for r, t in culprits.items())
                                or "unknown"), level="warning", step=step, phase="repair",
                             data={"culprits": {str(r): t for r, t in culprits.items()},
                                   "nodes": {str(r): nodes[r] for r in culprits}, "restored_step": pend["restored"],
                                   "changed_by_replay": {str(r): len(t) for r, t in enumerate(changed) if t},
                                   "diverged": pend["diverged"],
                                   "note": note, "seconds": time.time() - pend["t0"]})

    def _strike(self, step: int, rank: int, node: str) -> None:
        hist = self.mismatches[node]
        hist.append(step)
        if rank == self.ctx.rank:  # one strike per finding, written by the culprit rank
            self.ctx.events.emit("guard.strike", f"strike against {node}: silent data corruption", level="warning",
                                 step=step, data={"node": node, "rank": rank, "cause": "sdc.mismatch"})
        recent = [s for s in hist if step - s <= self.cfg.escalate_window_steps]
        if len(recent) >= 2:
            self.ctx.events.emit("sdc.escalate", f"{node} corrupted state twice within "
                                 f"{self.cfg.escalate_window_steps} steps: excluding it", level="critical",
                                 step=step, data={"node": node, "rank": rank, "steps": recent})
            raise TitanAbort(f"node {node} corrupted state twice; restarting without it", int(ExitCode.JOB_FAILED))
