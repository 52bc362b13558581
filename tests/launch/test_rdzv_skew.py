"""A restart joins the rendezvous without torch's round-0 random skew; the first join and
torch's fixed wait for other nodes keep theirs."""

from __future__ import annotations

import time

from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr

from titan.launch.rdzv_auth import _no_restart_skew


def _timed(seconds) -> float:
    t0 = time.monotonic()
    dr._delay(seconds=seconds)
    return time.monotonic() - t0


def test_a_restart_skips_the_random_skew_and_keeps_fixed_waits():
    original = dr._delay
    with _no_restart_skew(True):
        assert _timed((3.0, 3.0)) < 1.0, "a restart still paid the (random) join skew"
        assert _timed(0.3) >= 0.3, "a fixed wait (torch waits 1 s for other nodes) must be kept"
    assert dr._delay is original, "torch's _delay must be restored after the join"


def test_the_first_join_keeps_the_skew():
    with _no_restart_skew(False):
        assert _timed((0.3, 0.3)) >= 0.3, "the first join's skew spreads many nodes' joins: keep it"
