"""The shared clean reference run (tinygpt under `titan run`, watchdog on) flags nothing:
no hang, no straggler, no strike — while the watchdog did run and learn its timeouts."""

from __future__ import annotations

import pytest

from titan.events import read_run


@pytest.mark.timeout(300)
def test_the_clean_reference_run_flags_nothing(reference_run):
    evs = read_run(reference_run.run_dir).events
    kinds = [e.kind for e in evs]
    assert "watchdog.started" in kinds, "the watchdog did not run in the reference run"
    fired = [f"{e.kind}: {e.msg}" for e in evs if e.kind in ("hang.detected", "hang.observed", "straggler.detected",
                                                               "node.strike", "node.excluded")]
    assert not fired, f"false positives on the clean run: {fired}"
    (stopped,) = [e for e in evs if e.kind == "watchdog.stopped"]
    learned = stopped.data["timeouts"]
    assert learned.get("forward", {}).get("samples", 0) >= 20, f"phases were not learned: {learned}"
