"""Did the fault bite, was it seen, by whom: the effect measures and the new verdict checks,
on events shaped like a real run's (each test names the behaviour it proves)."""

from __future__ import annotations

import pytest

from titan.chaos.effect import measure_effect
from titan.chaos.plan import FaultSpec, Plan
from titan.chaos.verdict import judge
from titan.errors import UserError
from titan.events import Event


def ev(kind: str, t: float, at: int | None = None, who: int | None = 0, epid: int = 11, node: str = "node0",
       **data) -> Event:
    """An event of process ``epid`` (``data`` may carry its own ``pid``, as a kill's does)."""
    return Event.from_obj({"v": 1, "kind": kind, "t": t, "mono": t, "run": "r", "node": node, "rank": who,
                           "step": at, "level": "info", "msg": "", "data": data, "pid": epid, "seq": 0})


def steps(t0: float, first: int, n: int, dt: float, *, rank: int = 0, pid: int = 11) -> list[Event]:
    return [ev("step", t0 + (i + 1) * dt, first + i, rank, pid, step_time_s=dt) for i in range(n)]



def _noise(n: int = 20, t0: float = 0.0) -> list[Event]:
    # step times 0.10 ± 0.01 s: a robust spread of ~0.01 s
    return [ev("step", t0 + 0.1 * (i + 1), i + 1, 0, 11, step_time_s=0.1 + (0.01 if i % 2 else -0.01))
            for i in range(n)]


def test_a_stress_that_slowed_the_steps_bites_and_one_that_did_not_has_no_measurable_effect():
    f = FaultSpec(kind="stress", step=21, params={"what": "cpu", "seconds": 2.0})
    base = _noise()
    inj = ev("inject.stress", 2.05, 21, None, 99, what="cpu", seconds=2.0)
    slow = [ev("step", 2.1 + 0.3 * i, 21 + i, 0, 11, step_time_s=0.3) for i in range(1, 7)]
    e = measure_effect(f, inj, [*base, inj, *slow])
    assert e.bit and e.value > 1.0 and e.reference == pytest.approx(0.1, abs=0.011), e
    calm = [ev("step", 2.1 + 0.1 * i, 21 + i, 0, 11, step_time_s=0.1) for i in range(1, 20)]
    e = measure_effect(f, inj, [*base, inj, *calm])
    assert not e.bit, f"unchanged step times must not count as an effect: {e}"


def test_one_slow_step_among_calm_ones_is_not_an_effect_but_a_slowed_typical_step_is():
    # CI, a switched-off stress: the sum of 12 steps' excess passed 2·σ·√n through one pause
    # while the median step got faster (0.035 -> 0.033 s). The typical step must slow.
    f = FaultSpec(kind="stress", step=21, params={"what": "cpu", "seconds": 2.0})
    inj = ev("inject.stress", 2.05, 21, None, 99, what="cpu", seconds=2.0)
    calm = [0.097, 0.099, 0.101, 0.098, 0.095, 0.1, 0.096, 0.099, 0.097, 0.094, 0.098, 0.3]  # one 0.2 s pause
    during = [ev("step", 2.1 + 0.1 * i, 21 + i, 0, 11, step_time_s=d) for i, d in enumerate(calm)]
    e = measure_effect(f, inj, [*_noise(), inj, *during])
    assert e.value > 2 * e.noise, f"the case must be one the sum alone calls an effect: {e}"
    assert not e.bit and "median step did not slow" in e.text, e
    slowed = [ev("step", 2.1 + 0.13 * i, 21 + i, 0, 11, step_time_s=d + 0.03) for i, d in enumerate(calm)]
    e = measure_effect(f, inj, [*_noise(), inj, *slowed])
    assert e.bit, f"every step 0.03 s slower (2 σ) is an effect: {e}"


def test_effects_are_measured_within_the_victims_process_not_a_later_submission():
    # After a preemption the resubmitted job's workers restart attempt numbers at 0; a kill's
    # effect ("the rank ended") must look at the killed pid only.
    f = FaultSpec(kind="kill", step=21, rank=0)
    inj = ev("inject.kill", 2.5, 21, None, 1, pid=11, attempt=0, rank=0)
    later = steps(5.0, 19, 10, 0.1, pid=22)  # another process, same rank, same attempt number 0
    assert measure_effect(f, inj, [*_noise(), inj, *later]).bit
    alive = steps(2.6, 21, 5, 0.1, pid=11)
    e = measure_effect(f, inj, [*_noise(), inj, *alive])
    assert not e.bit and "4 step(s) of pid 11" in e.text, e  # the first lands within 0.2 s: still dying


def test_a_machine_load_that_slows_every_step_from_the_fault_on_is_not_its_effect():
    # At load 40 a switched-off stress 'bit': the other jobs' load rose as it began and
    # stayed (0.41 -> 0.45 s median). A fault's slowdown ends with it; the load's does not.
    f = FaultSpec(kind="stress", step=21, params={"what": "cpu", "seconds": 2.0})
    inj = ev("inject.stress", 2.05, 21, None, 99, what="cpu", seconds=2.0)
    slower = [ev("step", 2.05 + 0.125 * (i + 1), 21 + i, 0, 11, step_time_s=0.125) for i in range(40)]
    e = measure_effect(f, inj, [*_noise(), inj, *slower])
    assert not e.bit and "as slow after it" in e.text, e
    back = [ev("step", 4.1 + 0.1 * (i + 1), 37 + i, 0, 11, step_time_s=0.1) for i in range(10)]
    e = measure_effect(f, inj, [*_noise(), inj, *slower[:16], *back])
    assert e.bit, f"steps 25 % slower during the fault and back to normal after it: an effect: {e}"


def test_a_kill_that_did_nothing_is_no_effect_even_when_the_last_steps_land_within_the_grace():
    # A switched-off kill at step 22 of 28 at 30 ms a step: the victim's last six steps all
    # land within the 0.2 s grace, then it exits normally; it was not ended.
    f = FaultSpec(kind="kill", step=21, rank=0)
    inj = ev("inject.kill", 2.01, 21, None, 1, pid=11, attempt=0, rank=0, noop=True)
    tail = steps(2.0, 21, 6, 0.03, pid=11)
    e = measure_effect(f, inj, [*_noise(), inj, *tail])
    assert not e.bit, f"a victim that finished every step was not ended: {e}"
    failed = ev("worker.failed", 2.3, None, None, 1, pid=11, signal="SIGKILL", global_rank=0)
    assert measure_effect(f, inj, [*_noise(), inj, *tail[:1], failed]).bit, "killed after one more step"


def test_a_slow_save_bites_against_the_saves_before_it():
    f = FaultSpec(kind="disk", step=20, params={"what": "slow_fsync", "seconds": 0.5})
    saves = [ev("ckpt.saved", s / 10, s, 0, step=s, total_s=0.4 + 0.01 * (s % 3)) for s in (5, 10, 15)]
    inj = ev("inject.disk", 1.9, 20, None, what="slow_fsync", seconds=0.5)
    late = ev("ckpt.saved", 6.0, 20, 0, step=20, total_s=3.5)
    assert measure_effect(f, inj, [*saves, inj, late]).bit
    same = ev("ckpt.saved", 2.5, 20, 0, step=20, total_s=0.41)
    assert not measure_effect(f, inj, [*saves, inj, same]).bit


@pytest.mark.parametrize("what, end, expect", [
    ("loss", {"dropped_packets": 140}, True), ("loss", {"dropped_packets": 0}, False),
    ("delay", {"delayed_packets": 900, "delayed_bytes": 10**6}, True), ("delay", {}, False),
    ("bandwidth", {"shaped_packets": 55}, True), ("bandwidth", {"shaped_packets": 1}, False),
])
def test_link_faults_bite_by_the_injectors_own_counters(what, end, expect):
    f = FaultSpec(kind="net", step=21, params={"what": what, "seconds": 1.0})
    inj = ev("inject.net", 2.05, 21, None, what=what, seconds=1.0)
    healed = ev("inject.net_healed", 3.1, None, None, what=what, planned_step=21, **end)
    assert measure_effect(f, inj, [*_noise(), inj, healed], end=healed).bit is expect


def test_a_short_partition_bites_by_the_packets_it_dropped_even_when_the_steps_did_not_stall():
    # At load 27 a 1 s cut stalled 0.46 s steps for 1.0 s, inside three steps' noise: the
    # partition's own drop counter is the evidence; a switched-off cut counts nothing.
    f = FaultSpec(kind="net", step=21, params={"what": "partition", "seconds": 1.0})
    inj = ev("inject.net", 2.05, 21, None, what="partition", seconds=1.0)
    going = steps(2.1, 21, 12, 0.1)
    for dropped, expect in ((37, True), (0, False)):
        healed = ev("inject.net_healed", 3.1, None, None, what="partition", planned_step=21, dropped_packets=dropped)
        e = measure_effect(f, inj, [*_noise(), inj, *going, healed], end=healed)
        assert e.bit is expect and e.what == "packets dropped", (dropped, e)


def _guarded(plan_f: FaultSpec, inject: Event, *extra: Event) -> list[Event]:
    return [*_noise(), inject, *extra, ev("guard.skip", 2.3, plan_f.step), *steps(2.4, plan_f.step + 1, 3, 0.1)]


def test_the_verdict_fails_a_fault_that_did_nothing_with_that_reason_even_when_detected():
    plan = Plan().nan_grad(rank=1, step=21)
    f = plan.faults[0]
    inert = ev("inject.grad", 2.1, 21, 1, 12, rank=1, before=0.5, after=0.5)  # the hook changed nothing
    seen = ev("guard.nonfinite", 2.2, 21, 0, ranks=[1])
    (v,) = judge(plan, _guarded(f, inert, seen), final_equal=True, launcher_ok=True)
    assert not v.passed and v.checks["measurable effect"] is False, v
    assert any(r.startswith("no measurable effect") for r in v.reasons), v.reasons
    real = ev("inject.grad", 2.1, 21, 1, 12, rank=1, before=0.5, after="nan")
    (w,) = judge(plan, _guarded(f, real, seen), final_equal=True, launcher_ok=True)
    assert w.passed and w.detector == "guard.nonfinite" and w.culprit == "ranks [1] (guard)", w


def test_an_undetected_fault_fails_unless_the_plan_marks_it_survive_only():
    f_args = dict(step=21, what="cpu", seconds=2.0)
    inj = ev("inject.stress", 2.05, 21, None, 99, what="cpu", seconds=2.0)
    slow = [ev("step", 2.1 + 0.3 * i, 21 + i, 0, 11, step_time_s=0.3) for i in range(1, 7)]
    evs = [*_noise(), inj, *slow]
    (v,) = judge(Plan().add("stress", **f_args), evs, final_equal=True, launcher_ok=True)
    assert not v.passed and v.checks["detected"] is False and "not detected by agent.alert host_pressure" in v.reasons
    marked = Plan().add("stress", survive_only="a drill of the verdict: nobody watches this host", **f_args)
    (w,) = judge(marked, evs, final_equal=True, launcher_ok=True)
    assert w.passed and "detected" not in w.checks and w.survive_only.startswith("a drill"), w
    alert = ev("agent.alert", 3.0, None, None, 7, rule="host_pressure", evidence="steps 3.0x slower; cpu_wait 1 -> 3")
    (x,) = judge(Plan().add("stress", **f_args), [*evs, alert], final_equal=True, launcher_ok=True)
    assert x.passed and x.detector == "agent.alert host_pressure" and x.culprit.startswith("node node0"), x


def test_a_host_alert_for_another_node_is_blamed_on_the_wrong_target():
    inj = ev("inject.stress", 2.05, 21, None, 99, what="cpu", seconds=2.0)
    slow = [ev("step", 2.1 + 0.3 * i, 21 + i, 0, 11, step_time_s=0.3) for i in range(1, 7)]
    alert = ev("agent.alert", 3.0, None, None, 7, node="node1", rule="host_pressure", evidence="x")
    (v,) = judge(Plan().add("stress", step=21, what="cpu", seconds=2.0), [*_noise(), inj, *slow, alert],
                 final_equal=True, launcher_ok=True)
    assert not v.passed and v.attributed_ok is False and "blamed the wrong target" in v.reasons[0], v


def test_survive_only_needs_a_reason():
    with pytest.raises(UserError, match="survive_only must be the reason"):
        FaultSpec(kind="stress", step=3, survive_only="  ")
    f = FaultSpec.from_dict({"kind": "stress", "step": 3, "survive_only": "too short to see"})
    assert f.survive_only == "too short to see" and f.to_dict()["survive_only"] == "too short to see"


def test_a_link_alert_counted_late_belongs_to_the_fault_its_evidence_happened_in():
    # CI 2026-12-04 (2 of 12 runs): the 10 % loss fault's net_link_loss came 3.9 s after the
    # link healed — after the next fault (a bandwidth squeeze, which net_link_loss may also
    # detect) was injected. The alert's evidence_t (the newest lost probe's send time) says
    # when the link lost the probes: the loss fault's, and not the squeeze's.
    plan = (Plan().add("net", step=21, what="loss", percent=10.0, seconds=1.0)
            .add("net", step=30, what="bandwidth", rate="4mbit", seconds=1.0))
    loss, bw = plan.faults
    link = ["node0", "node1"]
    inj1 = ev("inject.net", 2.05, 21, None, 99, what="loss", seconds=1.0)
    heal1 = ev("inject.net_healed", 3.1, None, None, 99, what="loss", planned_step=21, dropped_packets=140)
    inj2 = ev("inject.net", 3.5, 30, None, 99, what="bandwidth", seconds=1.0)
    heal2 = ev("inject.net_healed", 4.6, None, None, 99, what="bandwidth", planned_step=30, shaped_packets=55)
    going = steps(2.1, 21, 30, 0.1)

    def alert(t: float, **data) -> Event:
        return ev("agent.alert", t, None, None, 7, rule="net_link_loss", link=link, evidence="probe loss", **data)

    late = alert(4.0, evidence_t=2.9)  # counted during the squeeze, lost during the loss fault
    v1, v2 = judge(plan, sorted([*_noise(), inj1, heal1, inj2, heal2, *going, late], key=lambda e: e.t),
                   final_equal=True, launcher_ok=True)
    assert v1.detected and v1.detector == "agent.alert net_link_loss" and v1.culprit.startswith("link node0<->node1"), v1
    assert not v2.detected, "the loss fault's alert was also taken for the squeeze's detection"
    # Without the evidence time the late alert is the squeeze's, and the loss fault went unseen.
    w1, w2 = judge(plan, sorted([*_noise(), inj1, heal1, inj2, heal2, *going, alert(4.0)], key=lambda e: e.t),
                   final_equal=True, launcher_ok=True)
    assert not w1.detected and w2.detected
    # An evidence time outside the alert's own reach (later than the alert) is not believed.
    x1, _ = judge(plan, sorted([*_noise(), inj1, heal1, inj2, heal2, *going, alert(4.0, evidence_t=9.0)],
                               key=lambda e: e.t), final_equal=True, launcher_ok=True)
    assert not x1.detected
