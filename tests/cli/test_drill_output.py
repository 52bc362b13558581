"""`titan drill`'s terminal output: the verdict table fits 100 columns and wraps only at
word boundaries, the summary explains its counts, and the progress bar names the phase
(start-up, fault, detection, restart, restore, recompute) from the run's events."""

from __future__ import annotations

from titan.chaos.drills import PlanReport
from titan.chaos.progress import DrillPhase
from titan.chaos.verdict import FaultVerdict
from titan.cli._drill_plan import _print
from titan.cli.environment import Environment
from titan.sla.synthetic import SynthRun


def _fault(kind, step, rank, **kw):
    base = dict(id=f"f-{kind}", kind=kind, what=None, rank=rank, node=None, step=step, expected="detected; restart",
                expected_text="launcher: worker.failed with the signal -> group restart", injected=True,
                detected=True, detected_by="launcher (worker.failed)", detection_s=1.61, attributed_ok=True,
                attribution="rank 1 SIGKILL", recovered=True, recovery="restart, resumed from step 15", rto_s=6.02,
                steps_lost=2, final_state_equal=True, passed=True, checks={"detected": True}, incident=3)
    base.update(kw)
    return FaultVerdict(**base)


def _report(tmp_path):
    faults = [
        _fault("nan_grad", 4, 1, detected_by="guard (guard.nonfinite)", attribution="ranks [1]",
               recovery="step skipped on every rank", rto_s=0.17, steps_lost=0, steps_skipped=1, incident=1),
        _fault("spike", 13, 0, detected_by="guard (guard.spike)", attribution="ranks [0]",
               recovery="step skipped on every rank", rto_s=0.28, steps_lost=0, steps_skipped=1, incident=2),
        _fault("kill", 18, 1),
        _fault("hang", 24, 0, what="collective", detected_by="watchdog (hang.detected)", detection_s=4.21,
               attribution="rank 0 node node0 phase comm step 24", recovery="restart, resumed from step 20",
               rto_s=9.26, steps_lost=3, incident=4, passed=False, checks={"detected": True, "recovered": False}),
    ]
    return PlanReport(passed=False, run_dir=str(tmp_path / "runs" / "20261201-194514-8f3c2a"), plan="quick", nodes=1,
                      steps=30, target_steps=30, failures=4, restarts=2, submissions=1, rto_s=9.26, steps_recomputed=5,
                      final_state_equal=True, reference="ref.pt", skipped_steps=[4, 13], launcher_exit=[0],
                      wall_s=25.07, reference_s=12.3, faults=faults, drill_s=27.1,
                      figures={"wall_s": 25.07, "interruptions": 2, "steps_lost": 5, "steps_skipped": 2})


def test_drill_table_fits_100_columns_and_never_splits_a_word(tmp_path):
    r = _report(tmp_path)
    env = Environment.captured(tmp_path, env={"COLUMNS": "100"})
    _print(env, r)
    out = env.stdout.getvalue()
    wide = [ln for ln in out.splitlines() if len(ln) > 100]
    assert not wide, f"lines wider than 100 columns: {wide}"
    flat = " ".join(out.split())  # a word folded across lines is not in here
    for f in r.faults:
        for text in (f.attribution, f.recovery, f.detected_by.split(" (")[0], f.kind, "SIGKILL", "detected"):
            split = [w for w in text.split() if w not in flat]
            assert not split, f"{split} of {text!r} split or missing:\n{out}"
    for claim in ("2 interruption(s), each recovered by a group restart", "2 restart(s)",
                  "4 worker process(es) exited with an error", "the peers that lost it",
                  "target: whom the plan aims the fault at", "steps lost and recomputed 5"):
        assert claim in " ".join(out.split()), f"expected {claim!r} in:\n{out}"
    assert "rank 1" in out and "1/—" not in out, "the target column says 'rank 1', not '1/—'"


def test_progress_phase_follows_start_fault_detection_restart_restore_and_recompute():
    s = (SynthRun(world=2).startup(2).steps(8, ckpt_every=5).fault("inject.kill", rank=1, after=0.3).detect(1.0)
         .restart(2.0, resume_from=5).steps(6).end(0.5))
    ph, seen = DrillPhase(), []
    for ev in sorted(s.events, key=lambda e: e.t):
        ph.feed(ev)
        if not seen or seen[-1] != ph.text():
            seen.append(ph.text())
    assert seen == ["starting", "training", "killed rank 1, detecting", "restarting (detected: worker.failed)",
                    "restoring from the checkpoint", "recomputing 0/3 lost steps", "recomputing 1/3 lost steps",
                    "recomputing 2/3 lost steps", "recomputing 3/3 lost steps", "training"], seen
