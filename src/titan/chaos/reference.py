"""The drill's clean reference: the same job without faults, for the bitwise verdict.

A clean run skips the updates of the steps the faulty run's guard skipped
(``TITAN_CHAOS_SKIP_STEPS``), so an honest recovery ends in exactly the reference's bits.
Both sides are compared by the digests every rank writes at ``Checkpointer.close()``
(``titan.checkpoint.digest``: model and optimizer, this rank's shards). For the built-in
workload the reference is cached under ``<runs>/.reference/<key>/`` by the job's arguments,
the skipped steps, torch's version and a digest of the workload's source. A user's script is
run twice without faults: only when the two clean runs end bit for bit equal is the script
deterministic, and only then is the faulty run's final state compared (otherwise the drill
says so and judges the rest).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from titan.chaos.jobs import final_state, start_job
from titan.chaos.plan import Plan
from titan.checkpoint.digest import compare_digests, read_digests
from titan.events import RunDir, atomic_write_json, read_run
from titan.events.rundir import new_run_id
from titan.settings.env import TITAN_CHAOS_PLAN, TITAN_CHAOS_SKIP_STEPS

if TYPE_CHECKING:
    from titan.chaos.drills import PlanDrill

__all__ = ["BITS_SETS", "CleanRun", "References", "clean_run", "predicted_skips", "skip_kinds", "skip_spec"]

#: Settings of a drill that change what the guard decides, hence the bits: the faulty run and
#: its clean runs use them alike (a spike warm-up of 8 in the faulty run alone once skipped a
#: step there that the default warm-up of 50 let through in the reference: bits differed).
BITS_SETS = ("guard.spike_warmup=8",)

#: The guard's verdict kind a skip-kind fault produces (a reference skips the step as that kind,
#: so a GradScaler backs off exactly as in the faulty run).
_SKIP_KIND = {"nan_grad": "nonfinite", "inf_loss": "nonfinite", "poison_sample": "nonfinite", "spike": "loss_spike"}


@dataclasses.dataclass
class CleanRun:
    """One fault-free run: its final state's digests (rank → digest), how long it took (0
    when cached), its run directory and the last step it reported."""

    digests: dict[int, dict[str, Any]]
    seconds: float
    run_dir: str | None
    last_step: int | None
    cached: bool = False


def skip_spec(skips: Mapping[int, str]) -> str:
    """``TITAN_CHAOS_SKIP_STEPS`` for ``{step: kind}``: ``"4:nonfinite,13:loss_spike"``."""
    return ",".join(f"{s}:{k}" for s, k in sorted(skips.items()))


def skip_kinds(plan: Plan, steps: list[int]) -> dict[int, str]:
    """``{step: verdict kind}`` for the skipped ``steps`` (the kind of the plan's fault there)."""
    kinds = {f.step: _SKIP_KIND.get(f.kind, "nonfinite") for f in plan.faults}
    return {s: kinds.get(s, "nonfinite") for s in steps}


def predicted_skips(plan: Plan) -> dict[int, str]:
    """Steps whose update the plan's skip-kind faults should make the guard skip."""
    from titan.chaos.verdict import expect_for

    return skip_kinds(plan, sorted({f.step for f in plan.faults if expect_for(f).recovery == "skip"}))


def _code_version() -> str:
    """torch's version and a digest of the workload's and Titan's in-process source: a cached
    reference from other code is never reused."""
    import importlib.metadata
    import importlib.util

    h = hashlib.sha256()
    for mod in ("titan.workloads.tinygpt", "titan.guard", "titan.checkpoint", "titan.data"):
        spec = importlib.util.find_spec(mod)  # without importing it (torch)
        for d in list(spec.submodule_search_locations or []) if spec else []:
            for f in sorted(Path(d).glob("*.py")):
                h.update(f.read_bytes())
    try:
        torch_v = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_v = "?"
    return f"{torch_v}:{h.hexdigest()[:16]}"


def _last_step(rd: RunDir) -> int | None:
    steps = [e.step for e in read_run(rd).events if e.kind == "step" and e.step is not None]
    return max(steps) if steps else None


def clean_run(cfg: "PlanDrill", skips: Mapping[int, str], *, cwd: Path, env: dict[str, str], tag: str = "ref",
              cache: bool | None = None) -> CleanRun:
    """Run the job once without faults, skipping ``skips``; bounded by ``cfg.timeout_s``.

    ``cache`` (default: the built-in workload only) reuses a result under
    ``<runs>/.reference/<key>/``. Cost: one ``titan run`` of the job on one node.
    """
    runs = cfg.runs_dir if cfg.runs_dir.is_absolute() else cwd / cfg.runs_dir
    cache = (not cfg.script) if cache is None else cache
    key = hashlib.sha256(json.dumps([cfg.steps, cfg.ckpt_every, cfg.nproc, cfg.seed, list(cfg.workload_args),
                                     skip_spec(skips), _code_version(), BITS_SETS],
                                    sort_keys=True).encode()).hexdigest()[:16]
    cached = runs / ".reference" / key
    if cache and (cached / "meta.json").exists():
        meta = json.loads((cached / "meta.json").read_text())
        return CleanRun(read_digests(cached / "final"), 0.0, meta.get("run_dir"), meta.get("last_step"), True)
    t0 = time.monotonic()
    ref_cfg = dataclasses.replace(cfg, plan=Plan([], name="reference"), nodes=1, node_local=False)
    rd = RunDir.create(runs / ".reference", f"{tag}-{key}-{new_run_id()}")
    e = {k: v for k, v in env.items() if k not in (TITAN_CHAOS_PLAN, TITAN_CHAOS_SKIP_STEPS)}
    if skips:
        e[TITAN_CHAOS_SKIP_STEPS] = skip_spec(skips)
    with open(rd.path / "console.log", "ab") as fh:
        job = start_job(ref_cfg, rd, e, None, [f"watchdog.ledger_path={rd.path / 'ledger.sqlite'}", *BITS_SETS], cwd, fh,
                        launcher_args=("--no-agent",))
        try:
            job.procs[0].wait(cfg.timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            job.stop()
    digests = read_digests(final_state(rd))
    run = CleanRun(digests, time.monotonic() - t0, str(rd.path), _last_step(rd))
    if cache and digests and job.codes() == [0]:
        tmp = cached.with_name(cached.name + f".tmp{new_run_id()}")
        tmp.mkdir(parents=True, exist_ok=True)
        for f in final_state(rd).parent.glob(f"{final_state(rd).name}.rank*.json"):
            shutil.copyfile(f, tmp / f.name)
        atomic_write_json(tmp / "meta.json", {"run_dir": run.run_dir, "last_step": run.last_step})
        try:
            tmp.rename(cached)
        except OSError:  # another drill cached it meanwhile
            shutil.rmtree(tmp, ignore_errors=True)
    return run


class References:
    """The clean runs of one drill, alongside the faulty one: the reference (skipping the
    predicted steps) and, for a user's script, a second identical run that tells whether the
    script is deterministic. Threads; :meth:`result` joins them."""

    def __init__(self, cfg: "PlanDrill", skips: Mapping[int, str], *, cwd: Path, env: dict[str, str]) -> None:
        self.cfg, self.cwd, self.env, self.skips = cfg, cwd, env, dict(skips)
        self.check = bool(cfg.script) if cfg.check_determinism is None else cfg.check_determinism
        self._out: dict[str, CleanRun] = {}
        self._threads = [self._start("ref")] + ([self._start("twin")] if self.check else [])

    def _start(self, tag: str) -> threading.Thread:
        def go() -> None:
            self._out[tag] = clean_run(self.cfg, self.skips, cwd=self.cwd, env=self.env, tag=tag)

        th = threading.Thread(target=go, name=f"titan-drill-{tag}", daemon=True)
        th.start()
        return th

    def result(self, actual: Mapping[int, str]) -> tuple[CleanRun | None, bool | None, str]:
        """(the reference for the skips the faulty run really made, deterministic?, what the
        determinism check found). Runs the reference again when the skips differ."""
        for th in self._threads:
            th.join(self.cfg.timeout_s)
        ref = self._out.get("ref")
        if dict(actual) != self.skips or ref is None or not ref.digests:
            ref = clean_run(self.cfg, actual, cwd=self.cwd, env=self.env, tag="ref")
        if not self.check:
            return ref, None, "not checked (the built-in workload is deterministic: tests/workloads)"
        twin = self._out.get("twin")
        if twin is None or not twin.digests or not ref.digests:
            return ref, None, "unknown: a clean run did not finish"
        same, why = compare_digests(self._out.get("ref", ref).digests, twin.digests)
        if same:
            return ref, True, f"deterministic: two clean runs ended bit for bit equal ({why})"
        return ref, False, (f"not deterministic: two clean runs differ ({why}); the final state is not compared, "
                            "the rest is judged")
