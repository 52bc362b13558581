"""A kill at any moment of a save never leaves a `latest` that fails to verify or load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from titan.checkpoint.inject import POINTS

HERE = Path(__file__).parent


@pytest.mark.timeout(150)
def test_sigkill_at_every_protocol_boundary_and_at_100_random_times(tmp_path):
    out = subprocess.run([sys.executable, str(HERE / "_ckpt_crashserver.py"), str(tmp_path), "100", "2048"],
                         capture_output=True, text=True, timeout=140)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    committed_from = POINTS.index("renamed")  # from here on the new directory is complete
    for i, point in enumerate(POINTS):
        res = r["points"][point]
        assert res["signal"] == 9, f"{point}: the save was not killed there: {res}"
        assert res["latest_ok"], f"{point}: latest does not verify after the kill: {res}"
        want = 4 if i >= committed_from else 2
        assert res["restored"] == want and res["consumed"] == want, f"{point}: expected step {want}: {res}"
    rand = r["random"]
    killed = sum(x["killed"] for x in rand)
    # The kill times are random: under load fewer land inside a save (43/100 seen at load 8,
    # 94/100 idle). A quarter still proves the test hits saves mid-way.
    assert len(rand) >= 100 and killed >= 25, f"only {killed} of {len(rand)} saves were killed mid-way"
    bad = [x for x in rand if not x["latest_ok"]]
    assert not bad, f"latest failed to verify after {len(bad)} kills, e.g. {bad[:2]}"
    for x in rand:
        if "restored" in x:
            assert x["restored"] >= 1 and x["consumed"] == x["restored"], f"inconsistent restore: {x}"
    # The budget is 60 s (about 15 s idle here); the bound leaves room for a loaded CI box.
    assert r["random_s"] <= 120, f"100 random kills took {r['random_s']:.1f}s"
