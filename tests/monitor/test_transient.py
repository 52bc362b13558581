"""The agent's fast detectors (``titan.monitor.transient``): host pressure names the node only
when the job's steps slow down *and* the host is under pressure; a sick link is named by the
probe; a busy host's RTT spikes are not a slow link."""

from __future__ import annotations

from titan.monitor.base import metric_key
from titan.monitor.transient import TransientDetectors

PSI_CPU = metric_key("host_pressure_stalled_seconds_total", kind="some", resource="cpu")


class Job:
    """The step times the detector reads each tick (as the beacons would give them)."""

    def __init__(self) -> None:
        self.step_s = 0.1

    def __call__(self, now: float) -> tuple[list[int], list[float]]:
        n = max(1, int(1.0 / self.step_s))
        return [], [self.step_s * (1 + 0.02 * (i % 3)) for i in range(n)]


def _host(t: float, runq: float, psi_rate: float, avail: float, psi: list[float]) -> dict[str, float]:
    psi[0] += psi_rate
    return {"host_procs_running": runq, PSI_CPU: psi[0], "host_memory_available_bytes": avail}


def _run(det: TransientDetectors, job: Job, ticks: range, **host) -> list:
    out = []
    for t in ticks:
        out += [(t, tr) for tr in det.evaluate(float(t), _host(t, **host))]
    return out


def test_host_pressure_fires_once_naming_the_node_when_steps_slow_under_a_longer_run_queue():
    job, psi = Job(), [0.0]
    det = TransientDetectors("node7", beacon_dir=None, steps=job)
    assert _run(det, job, range(0, 30), runq=3, psi_rate=0.2, avail=8e9, psi=psi) == []
    job.step_s = 0.3
    fired = _run(det, job, range(30, 36), runq=11, psi_rate=0.9, avail=8e9, psi=psi)
    assert [tr.transition for _, tr in fired] == ["fire"], fired
    t, tr = fired[0]
    assert t <= 32 and tr.rule == "host_pressure" and tr.data["node_named"] == "node7"
    assert "run_queue" in tr.data["signals"] and tr.data["ratio"] > 2, tr.data
    job.step_s = 0.1
    cleared = _run(det, job, range(36, 44), runq=3, psi_rate=0.2, avail=8e9, psi=psi)
    assert [tr.transition for _, tr in cleared] == ["clear"], cleared


def test_slower_steps_without_host_pressure_are_not_host_pressure():
    job, psi = Job(), [0.0]
    det = TransientDetectors("n", beacon_dir=None, steps=job)
    _run(det, job, range(0, 30), runq=3, psi_rate=0.2, avail=8e9, psi=psi)
    job.step_s = 0.4  # a straggler or a slow link: the host is as calm as before
    assert _run(det, job, range(30, 40), runq=3, psi_rate=0.2, avail=8e9, psi=psi) == []


def test_a_memory_squeeze_is_named_as_such():
    job, psi = Job(), [0.0]
    det = TransientDetectors("n", beacon_dir=None, steps=job)
    _run(det, job, range(0, 30), runq=3, psi_rate=0.2, avail=8e9, psi=psi)
    job.step_s = 0.25
    fired = _run(det, job, range(30, 33), runq=3, psi_rate=0.2, avail=8e9 - 1.5 * 2**30, psi=psi)
    assert fired and "memory_drop" in fired[0][1].data["signals"] and "MemAvailable -1536 MiB" in fired[0][1].message


def _probe(rtt: float, pongs: int, sent: float, lost: float) -> dict[str, float]:
    p = {"peer": "node1"}
    return {metric_key("net_probe_rtt_median_seconds", **p): rtt, metric_key("net_probe_pongs", **p): float(pongs),
            metric_key("net_probe_sent_total", **p): sent, metric_key("net_probe_lost_total", **p): lost}


def test_a_slow_link_is_named_and_single_rtt_spikes_are_not():
    det = TransientDetectors("node0", beacon_dir=None, steps=lambda now: ([], []))
    sent = 0.0
    out = []
    for t in range(40):
        sent += 5
        rtt = 0.0002 if t % 7 else 0.06  # a spike every 7 s: one tick, as a busy host makes them
        out += det.evaluate(float(t), _probe(rtt, 5, sent, 0.0))
    assert out == [], out
    for t in range(40, 44):
        sent += 5
        out += det.evaluate(float(t), _probe(0.05, 5, sent, 0.0))
    fires = [tr for tr in out if tr.transition == "fire"]
    assert [tr.rule for tr in fires] == ["net_link_slow"] and fires[0].data["link"] == ["node0", "node1"], out


def test_a_tick_with_too_few_pongs_is_not_judged():
    det = TransientDetectors("node0", beacon_dir=None, steps=lambda now: ([], []))
    out = []
    for t in range(40):
        out += det.evaluate(float(t), _probe(0.0002 if t < 30 else 0.2, 1, 5.0 * t, 0.0))
    assert out == [], "one pong a tick cannot tell a slow link from a busy host"


def test_a_partition_is_link_down_and_lossy_probes_are_link_loss():
    det = TransientDetectors("node0", beacon_dir=None, steps=lambda now: ([], []))
    sent = lost = 0.0
    out = []
    for t in range(20):
        sent += 5
        out += det.evaluate(float(t), _probe(0.0002, 5, sent, lost))
    for t in range(20, 22):  # every probe lost for 2 s
        sent += 5
        lost += 5
        out += det.evaluate(float(t), _probe(0.0002, 0, sent, lost))
    assert [tr.rule for tr in out if tr.transition == "fire"] == ["net_link_down"], out
    det = TransientDetectors("node0", beacon_dir=None, steps=lambda now: ([], []))
    sent = lost = 0.0
    out = []
    for t in range(20):
        sent += 10
        lost += 1 if t >= 10 else 0  # 10 % of the probes from t = 10 on
        m = _probe(0.0002, 9, sent, lost)
        if t >= 10:  # the probe's send time of the newest lost ping: a tick before it was counted
            m[metric_key("net_probe_last_lost_sent_seconds", peer="node1")] = t - 1.0
        out += det.evaluate(float(t), m)
    fired = [tr for tr in out if tr.transition == "fire"]
    assert [tr.rule for tr in fired] == ["net_link_loss"], out
    assert fired[0].data["evidence_t"] == 10.0, fired[0].data  # fired at t = 11, on probes lost since t = 10


def test_a_second_squeeze_on_top_of_an_active_one_fires_anew():
    job, psi = Job(), [0.0]
    det = TransientDetectors("n", beacon_dir=None, steps=job)
    _run(det, job, range(0, 30), runq=3, psi_rate=0.2, avail=8e9, psi=psi)
    job.step_s = 0.2  # someone else's load: 2x
    first = _run(det, job, range(30, 34), runq=9, psi_rate=0.9, avail=8e9, psi=psi)
    job.step_s = 0.5  # the drill's stress on top: 5x
    second = _run(det, job, range(34, 37), runq=20, psi_rate=0.9, avail=8e9, psi=psi)
    assert [tr.transition for _, tr in first] == ["fire"], first
    assert [tr.transition for _, tr in second][-1] == "fire", second


class FewSteps(Job):
    """A squeeze that nearly froze the job: one slow step every other tick."""

    def __call__(self, now: float) -> tuple[list[int], list[float]]:
        if self.step_s <= 0.15:
            return super().__call__(now)
        return [], ([self.step_s] if int(now) % 2 == 0 else [])


def test_a_squeeze_that_leaves_one_step_in_the_window_is_still_host_pressure():
    # At load 27 a nice -20 stressor left one 1.8 s step in the 2 s window (baseline 0.44 s):
    # the n >= 3 rule alone never fired.
    job, psi = FewSteps(), [0.0]
    det = TransientDetectors("n", beacon_dir=None, steps=job)
    assert _run(det, job, range(0, 30), runq=3, psi_rate=0.2, avail=8e9, psi=psi) == []
    job.step_s = 1.8
    fired = _run(det, job, range(30, 36), runq=11, psi_rate=0.9, avail=8e9, psi=psi)
    assert [tr.transition for _, tr in fired] == ["fire"], fired
    # One step in the window only 2x slower, however loaded the host: not evidence enough.
    job2, psi2 = FewSteps(), [0.0]
    det2 = TransientDetectors("n", beacon_dir=None, steps=job2)
    assert _run(det2, job2, range(0, 30), runq=3, psi_rate=0.2, avail=8e9, psi=psi2) == []
    job2.step_s = 0.2
    assert _run(det2, job2, range(30, 36), runq=11, psi_rate=0.9, avail=8e9, psi=psi2) == []
