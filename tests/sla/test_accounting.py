"""Accounting on synthetic event streams with known answers (hand-computed below)."""

from __future__ import annotations

import pytest

from titan.sla.accounting import BUCKETS, account, account_run
from titan.sla.synthetic import SynthRun

pytestmark = pytest.mark.timeout(30)


def _close(seen: dict, expected: dict, tol: float = 1e-5) -> None:
    for k, v in expected.items():
        assert seen[k] == pytest.approx(v, abs=tol), f"bucket {k}: expected {v} s, seen {seen[k]} s (all: {seen})"


def test_clean_run_splits_into_startup_goodput_ckpt_and_shutdown(tmp_path):
    # 5 s start-up, 10 steps of 1 s, a 0.5 s stall after steps 5 and 10, 1 s shutdown: 17 s.
    rd = SynthRun(world=2).startup(5).steps(10, ckpt_every=5, stall=0.5).end(1).write(tmp_path)
    acc = account_run(rd.path)
    assert acc.wall_s == pytest.approx(17.0, abs=1e-5)
    _close(acc.buckets, {"startup": 5, "goodput": 10, "ckpt_stall": 1.0, "shutdown": 1, "recompute": 0,
                         "detection": 0, "restart": 0})
    assert acc.incidents == [], f"expected no incidents, seen {acc.incidents}"
    assert acc.outcome["succeeded"] is True


def test_kill_and_restart_charges_detection_restart_and_lost_steps(tmp_path):
    # Steps 1-7 (ckpt after 5), kill 0.4 s into step 8, detected 2 s later, restart 3 s
    # resuming from step 5, steps 6-12 again (ckpt after 10), 1 s shutdown.
    s = (SynthRun(world=2).startup(5).steps(7, ckpt_every=5, stall=0.5).fault("inject.kill", rank=1, after=0.4)
         .detect(2).restart(3, resume_from=5).steps(7, ckpt_every=5, stall=0.5).end(1))
    acc = account_run(s.write(tmp_path).path)
    assert acc.wall_s == pytest.approx(26.4, abs=1e-5)
    # Kept: steps 1-5 of attempt 0 and 6-12 of attempt 1; lost: steps 6, 7 (2 s) + 0.4 s partial.
    _close(acc.buckets, {"startup": 5, "goodput": 12, "ckpt_stall": 1.0, "recompute": 2.4, "detection": 2,
                         "restart": 3, "shutdown": 1})
    (inc,) = acc.incidents
    assert inc.kind == "restart" and inc.onset_source == "inject.kill" and inc.rank == 1
    assert inc.detection_s == pytest.approx(2.0, abs=1e-5)
    assert inc.rto_s == pytest.approx(2 + 3 + 1, abs=1e-5), f"RTO: onset → first kept step; seen {inc.rto_s}"
    assert inc.rpo_steps == 2 and inc.resumed_from == 5
    assert inc.rpo_s == pytest.approx(2.4, abs=1e-5)
    # Catch-up: the first kept step past step 7 is step 8, three steps after recovery.
    assert inc.caught_up_t - inc.recovered_t == pytest.approx(2.0, abs=1e-5)


def test_hang_without_injection_starts_at_the_last_progress_beacon(tmp_path):
    s = (SynthRun(world=2).startup(2).steps(4).detect(10, kind="hang.detected")
         .restart(3, resume_from=4).steps(2).end(0))
    acc = account_run(s.write(tmp_path).path)
    (inc,) = acc.incidents
    assert inc.onset_source == "last progress" and inc.detect_kind == "hang.detected"
    assert inc.detection_s == pytest.approx(10, abs=1e-5)
    assert inc.rpo_steps == 0
    _close(acc.buckets, {"detection": 10, "restart": 3, "recompute": 0, "goodput": 6, "startup": 2})


def test_guard_skipped_step_is_badput_and_an_incident(tmp_path):
    rd = SynthRun(world=2).startup(1).steps(6, skipped=(4,)).end(0).write(tmp_path)
    acc = account_run(rd.path)
    _close(acc.buckets, {"goodput": 5, "skipped_replayed": 1})
    (inc,) = acc.incidents
    # A skipped update is not lost work: nothing is recomputed (RPO 0); it is counted as skipped.
    assert inc.kind == "guard" and inc.step == 4 and inc.rpo_steps == 0 and inc.skipped_steps == 1, inc
    assert set(inc.data["kinds"]) == {"guard.nonfinite", "guard.skip"}
    assert inc.rto_s == pytest.approx(1.0, abs=1e-5), "the next kept step (5) ends 1 s after the skip"


def test_in_process_replay_charges_the_first_execution(tmp_path):
    s = SynthRun(world=2).startup(1).steps(6)
    s.step = 4  # the guard rolls back two steps in memory and replays 5 and 6
    s.steps(3).end(0)
    acc = account_run(s.write(tmp_path).path)
    _close(acc.buckets, {"goodput": 7, "skipped_replayed": 2, "recompute": 0})


def test_eval_is_its_own_bucket(tmp_path):
    rd = SynthRun(world=1).startup(1).steps(3).eval(2.5).steps(3).end(0).write(tmp_path)
    acc = account_run(rd.path)
    _close(acc.buckets, {"eval": 2.5, "goodput": 6, "startup": 1})


def test_final_failure_is_fatal_with_rpo_since_the_last_checkpoint(tmp_path):
    s = SynthRun(world=2).startup(1).steps(8, ckpt_every=5, stall=0.5).fault(after=0.2).detect(1).end(2, exit_code=1)
    acc = account_run(s.write(tmp_path).path)
    (inc,) = acc.incidents
    assert inc.kind == "fatal" and inc.rpo_steps == 3, f"steps 6-8 after checkpoint 5 are lost; seen {inc}"
    assert acc.outcome["succeeded"] is False
    _close(acc.buckets, {"detection": 1, "shutdown": 2, "recompute": 0.2})


def test_buckets_partition_the_wall_time_with_no_catch_all(tmp_path):
    assert not {"other", "unknown", "unaccounted"} & set(BUCKETS)
    s = (SynthRun(world=3).startup(3).steps(9, ckpt_every=3, stall=0.3, skipped=(2,)).eval(1)
         .fault(after=0.7).detect(1.5).restart(2.5, resume_from=9).steps(4).fault("inject.hang", after=0.1)
         .detect(4, kind="hang.detected").restart(1, resume_from=9).steps(6, ckpt_every=3, stall=0.2).end(0.5))
    acc = account(s.events, {})
    segs = acc.segments
    assert segs[0][0] == acc.t0 and segs[-1][1] == acc.t1
    gaps = [(a[1], b[0]) for a, b in zip(segs, segs[1:]) if abs(a[1] - b[0]) > 1e-9]
    assert not gaps, f"expected a gap-free partition, seen gaps {gaps}"
    assert sum(acc.buckets.values()) == pytest.approx(acc.wall_s, rel=1e-9)
    assert acc.reconciliation["within_1pct"]
    assert len([i for i in acc.incidents if i.kind == "restart"]) == 2
    # Second incident: 4 steps after resume at 9 are lost (10-13) plus 0.1 s.
    second = [i for i in acc.incidents if i.kind == "restart"][1]
    assert second.rpo_steps == 4 and second.rpo_s == pytest.approx(4.1, abs=1e-5)


def test_reconciliation_uses_the_recorded_wall_time(tmp_path):
    s = SynthRun(world=1).startup(1).steps(5)
    acc = account(s.events, {"started_t": s.t_start, "ended_t": s.t + 0.5})
    assert acc.reconciliation["reference"].startswith("run.json")
    assert acc.reconciliation["error_fraction"] == pytest.approx(0.5 / 6.5, rel=1e-6)
    assert not acc.reconciliation["within_1pct"]


def test_node_clock_offsets_are_applied_before_accounting(tmp_path):
    import json as _json

    # Node n0's clock runs 100 s ahead of rank 0's reference; the reader's offsets undo it.
    s = SynthRun(world=1).startup(2).steps(4).end(0)
    rd = s.write(tmp_path)
    obj = _json.loads(rd.run_json.read_text())
    obj.update(clock_offsets={"n0": 100.0}, started_t=s.t_start - 100.0, ended_t=s.t - 100.0)
    rd.run_json.write_text(_json.dumps(obj))
    acc = account_run(rd.path)
    assert acc.t0 == pytest.approx(s.t_start - 100.0), "expected times on the reference clock"
    assert acc.reconciliation["error_fraction"] < 1e-6


def _guard_event(s, kind, step, t, **data):
    from titan.events import Event

    return Event(kind=kind, t=t, mono=0.0, run="synth", node="n0", rank=0, attempt=s.attempt, step=step,
                 level="warning", data={"step": step, **data})


def test_a_replayed_step_charges_its_first_pass_up_to_the_fault_report():
    s = SynthRun(world=1).startup(1).steps(5)
    # Step 3 runs from t0+3 to t0+4: the guard reports a non-finite gradient 0.4 s in and replays.
    s.events += [_guard_event(s, "guard.nonfinite", 3, s.t_start + 3.4),
                 _guard_event(s, "guard.replay", 3, s.t_start + 3.8, classification="transient")]
    s.events.sort(key=lambda e: e.t)
    acc = account(s.events, {})
    _close(acc.buckets, {"goodput": 4.6, "skipped_replayed": 0.4})
    (inc,) = acc.incidents
    assert inc.kind == "guard" and inc.rpo_s == pytest.approx(0.4, abs=1e-5)
    assert inc.rpo_steps == 0, "the replayed update was applied: no step lost"


def test_an_in_process_rollback_makes_the_re_executed_steps_recompute():
    s = SynthRun(world=1).startup(1).steps(6)
    s.events.append(_guard_event(s, "guard.rollback", 4, s.t, restored_step=4, reason="3 skips"))
    s.step = 4
    s.steps(2).end(0)
    acc = account(s.events, {})
    _close(acc.buckets, {"goodput": 6, "recompute": 2, "skipped_replayed": 0})


def test_an_attempt_that_dies_in_init_is_an_incident_and_its_time_restart(tmp_path):
    # Workers start, init fails after 3 s (detected at t=4 s), the group restarts and steps.
    s = SynthRun(world=2).startup(3).detect(1, kind="worker.failed").restart(2, resume_from=0).steps(3).end(0)
    acc = account_run(s.write(tmp_path).path)
    _close(acc.buckets, {"startup": 4, "restart": 2, "goodput": 3, "detection": 0})
    (inc,) = acc.incidents
    assert inc.kind == "restart" and inc.data.get("stepless") and inc.rpo_steps == 0
    assert inc.rto_s == pytest.approx(7.0, abs=1e-5), "from the attempt's last event (t=0) to the first kept step"


def test_a_job_that_never_steps_and_is_not_restarted_is_startup_then_shutdown(tmp_path):
    s = SynthRun(world=1).startup(3).detect(1).end(2, exit_code=1)
    acc = account_run(s.write(tmp_path).path)
    _close(acc.buckets, {"startup": 4, "shutdown": 2, "restart": 0})
    (inc,) = acc.incidents
    assert inc.kind == "fatal" and inc.rto_s is None


def test_a_fault_gets_the_incident_it_caused_not_the_previous_one_a_few_steps_before():
    # CI: at 20 ms a step a NaN at step 4 and a spike at step 13 are 0.18 s apart, inside the
    # window's slack; the spike was matched to the NaN's incident (the first in the window).
    from titan.sla.figures import incident_in_window

    s = SynthRun(world=2).startup(1).steps(20, step_time=0.02, skipped=(4, 13))
    t_step = {e.step: e.t for e in s.events if e.kind == "step" and e.rank == 0}
    injects = {}
    for step, kind, rank in ((4, "inject.nan_grad", 1), (13, "inject.spike", 0)):
        t = t_step[step] - 0.015  # injected during the step, before the guard's report
        s.emit(kind, rank=rank, step=step, t=t, data={"rank": rank})
        injects[step] = t
    s.events.sort(key=lambda e: e.t)
    acc = account(s.end(0).events, {})
    guard = [i for i in acc.incidents if i.kind == "guard"]
    assert [i.step for i in guard] == [4, 13], acc.incidents
    assert injects[13] - 0.5 < guard[0].onset_t, "the case must put the NaN's incident inside the spike's slack"
    for step, t in injects.items():
        inc = incident_in_window(acc, t, kinds=("guard",))
        assert inc is not None and inc.step == step and inc.rank == (1 if step == 4 else 0), (step, inc)


def test_a_preempted_and_resubmitted_job_charges_the_gap_to_restart_not_goodput(tmp_path):
    # 5 s start-up, steps 1-10 (ckpt after 5 and 10), the preempted job exits 1 s later; the
    # resubmitted one (its attempts numbered from 0 again) starts 6 s after that and steps
    # 11-15. Before: the resubmission's first step spanned the 7 s gap, counted as goodput.
    r = SynthRun(world=2).startup(5).steps(10, ckpt_every=5, stall=0.5).end(1, exit_code=9)
    r.attempt = 0
    r.emit("launcher.started", rank=None, data={"world": 2})
    r.startup(6)
    for rank in range(2):
        r.emit("ckpt.loaded", rank=rank, step=10, data={"step": 10})
    rd = r.steps(5).end(1).write(tmp_path)
    acc = account_run(rd.path)
    _close(acc.buckets, {"goodput": 15, "restart": 7, "startup": 5, "shutdown": 1, "ckpt_stall": 1.0})
