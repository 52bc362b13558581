"""Corrupt checkpoints are detected and skipped; tampered ones are refused without running anything."""

from __future__ import annotations

import io
import json
import os
import pickle
import zlib
from pathlib import Path

import pytest
import torch

from titan.checkpoint import Checkpointer
from titan.checkpoint.manifest import MANIFEST, verify
from titan.checkpoint.storage import UnsafeCheckpointError, safe_unpickle_metadata

from _ckpt_model import build, context, events, params, same, train_steps

pytestmark = pytest.mark.timeout(60)


def _two_checkpoints(tmp_path: Path):
    ctx = context(tmp_path, every_steps=2, mode="sync")
    st = build()
    ck = Checkpointer(ctx)
    train_steps(st, 0, 4, ck)
    ck.close()
    return ctx, ctx.run_dir.checkpoints / "step-00000002", ctx.run_dir.checkpoints / "step-00000004"


def _shard(d: Path) -> Path:
    return next(d.glob("*.distcp"))


def _flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x01
    p.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "no_manifest"])
def test_damaged_newest_checkpoint_is_detected_and_previous_used(tmp_path, damage):
    ctx, older, newest = _two_checkpoints(tmp_path)
    shard = _shard(newest)
    if damage == "flip":
        _flip(shard)
    elif damage == "truncate":
        os.truncate(shard, shard.stat().st_size - 100)
    elif damage == "delete":
        shard.unlink()
    else:
        (newest / MANIFEST).unlink()
    assert not verify(newest).ok
    st = build(seed=5)
    start = Checkpointer(ctx).restore(st)
    assert start == 2, f"expected the previous checkpoint (step 2), got {start}"
    (corrupt,) = events(tmp_path, "ckpt.corrupt")
    want = {"flip": "checksum", "truncate": "size", "delete": "missing", "no_manifest": "no manifest"}[damage]
    assert want in " ".join(corrupt.data["reasons"]), f"reason should mention {want!r}: {corrupt.data}"
    assert not newest.exists() and Path(corrupt.data["moved_to"]).exists(), "corrupt checkpoint not moved aside"
    ref = build()
    train_steps(ref, 0, 2)
    assert same(params(st), params(ref)), "the fallback did not load step 2's state"


def _evil_payload(marker: Path) -> bytes:
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    return pickle.dumps(Evil())


def _rewrite_manifest_sum(ckpt: Path, name: str) -> None:
    """What someone who can also rewrite the manifest would do: the checksum then passes."""
    m = json.loads((ckpt / MANIFEST).read_text())
    data = (ckpt / name).read_bytes()
    m["files"][name] = {"size": len(data), "crc32": zlib.crc32(data)}
    (ckpt / MANIFEST).write_text(json.dumps(m))


def test_tampered_metadata_is_refused_and_runs_nothing(tmp_path):
    ctx, older, newest = _two_checkpoints(tmp_path)
    marker = tmp_path / "pwned"
    (newest / ".metadata").write_bytes(_evil_payload(marker))
    _rewrite_manifest_sum(newest, ".metadata")
    assert verify(newest).ok  # the checksum cannot catch this; the unpickler must
    start = Checkpointer(ctx).restore(build(seed=5))
    assert not marker.exists(), "a tampered .metadata executed a command during load"
    assert start == 2
    (corrupt,) = events(tmp_path, "ckpt.corrupt")
    assert "refused" in " ".join(corrupt.data["reasons"]), corrupt.data
    with pytest.raises(UnsafeCheckpointError):
        safe_unpickle_metadata(_evil_payload(marker))
    assert not marker.exists()


def test_tampered_bytes_item_is_refused_and_runs_nothing(tmp_path):
    """Replace a pickled (non-tensor) item inside the shard with a payload of the same size."""
    ctx, older, newest = _two_checkpoints(tmp_path)
    from titan.checkpoint.storage import safe_unpickle_metadata as load_md

    md = load_md((newest / ".metadata").read_bytes())
    marker = tmp_path / "pwned"
    # The sampler's state is a byte item (a torch.save'd dict); find where it lies.
    idx, info = next((i, s) for i, s in md.storage_data.items() if i.fqn == "sampler.consumed")
    shard = newest / info.relative_path
    data = bytearray(shard.read_bytes())
    # Append an evil torch.save archive to the shard and point the metadata at it.
    b2 = io.BytesIO()
    torch.save(_EvilHolder(marker), b2, _use_new_zipfile_serialization=True)
    payload = b2.getvalue()
    off = len(data)
    data += payload
    shard.write_bytes(bytes(data))
    info.offset, info.length = off, len(payload)
    (newest / ".metadata").write_bytes(pickle.dumps(md))
    _rewrite_manifest_sum(newest, ".metadata")
    _rewrite_manifest_sum(newest, info.relative_path)
    assert verify(newest).ok
    start = Checkpointer(ctx).restore(build(seed=5))
    assert not marker.exists(), "a tampered byte item executed a command during load"
    assert start == 2
    (corrupt,) = events(tmp_path, "ckpt.corrupt")
    assert "not plain data" in " ".join(corrupt.data["reasons"]), corrupt.data
    # Control: stock DCP (pickle + weights_only=False) does run it — so the test can fail.
    import torch.distributed.checkpoint as dcp

    moved = Path(corrupt.data["moved_to"])
    template = {"sampler": {"seed": 0, "consumed": 0}}
    with pytest.warns(UserWarning):
        dcp.load(template, checkpoint_id=moved, no_dist=True)
    assert marker.exists(), "control failed: stock DCP did not execute the payload"


class _EvilHolder:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))
