"""Slow-disk detection from the saves' own times (``titan.checkpoint.slowsave``): a save that
is slow because the disk's fsync is slow raises ``ckpt.slow`` data naming the probe; a save
that is slow for another reason (the disk answers fast) raises nothing."""

from __future__ import annotations

import os

import pytest

from titan.checkpoint.slowsave import SaveTimeDetector, fsync_probe


def test_a_slow_save_on_a_fast_disk_is_not_a_slow_disk(tmp_path):
    det = SaveTimeDetector(tmp_path)
    for s in (0.40, 0.42, 0.38, 0.41):
        assert det.observe(s) is None
    assert det.observe(3.0) is None, "the 4 KiB fsync probe is fast here: CPU contention, not the disk"
    assert det.baseline()[0] == pytest.approx(0.405, abs=0.01), "a slow save never enters the baseline"


@pytest.mark.skipif(os.geteuid() != 0, reason="the slow disk is a FUSE mount: needs root")
def test_a_save_slowed_by_a_slow_fsync_is_flagged_once_per_episode_with_the_probe(tmp_path):
    pytest.importorskip("mfusepy")
    from titan.chaos.oslevel import mount_slow_fs

    mnt, control = tmp_path / "ckpt", tmp_path / "delay"
    undo = mount_slow_fs(tmp_path / "backing", mnt, control)
    try:
        det = SaveTimeDetector(mnt)
        for s in (0.30, 0.33, 0.31):
            assert det.observe(s) is None
        assert det.observe(0.32) is None  # the probe baseline is taken now, on the fast disk
        control.write_text("0.3")
        hit = det.observe(2.5)
        assert hit is not None and hit["ratio"] > 7 and hit["fsync_probe_s"] >= 0.29, hit
        assert hit["fsync_baseline_s"] < 0.1, hit
        assert det.observe(2.6) is None, "one ckpt.slow per episode"
        control.write_text("0")
        assert det.observe(0.31) is None and det.observe(2.7) is None  # fast disk again: not the disk
    finally:
        undo()
    assert fsync_probe(tmp_path) is not None
