"""Names read from a manifest, ``latest`` or ``.metadata`` stay inside the checkpoint.

A manifest entry for ``/dev/zero`` once made ``titan ckpt verify`` hang, and one for
``/etc/shadow`` printed that file's size; both must be refused as damage, quickly, without
opening or measuring anything outside.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from pathlib import Path

import pytest

from titan.checkpoint import Checkpointer
from titan.checkpoint.manifest import LATEST, MANIFEST, read_latest, verify
from titan.checkpoint.storage import UnsafeCheckpointError, load_metadata_file
from titan.cli.environment import Environment
from titan.cli.main import run
from titan.exitcodes import ExitCode

from _ckpt_model import build, context, events, train_steps

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def run_dir(tmp_path):
    ctx = context(tmp_path / "run", every_steps=2, mode="sync")
    ck = Checkpointer(ctx)
    train_steps(build(), 0, 4, ck)
    ck.close()
    return tmp_path / "run"


def _newest(run_dir: Path) -> Path:
    return run_dir / "checkpoints" / "step-00000004"


def _add_entry(ckpt: Path, name: str, size: int = 4) -> None:
    m = json.loads((ckpt / MANIFEST).read_text())
    m["files"][name] = {"size": size, "crc32": 0}
    (ckpt / MANIFEST).write_text(json.dumps(m))


def _verify_cli(tmp_path: Path, run_dir: Path) -> tuple[int, dict, str]:
    env = Environment.captured(tmp_path)
    code = run(["ckpt", "verify", str(run_dir), "--json"], env)
    out = env.stdout.getvalue()
    return code, {r["name"]: r for r in json.loads(out)}, out + env.stderr.getvalue()


@pytest.mark.parametrize("entry", ["/dev/zero", "/etc/shadow", "../../../../../../etc/passwd", "sub/../../x",
                                   "symlink-out", "fifo", "device-link"])
def test_manifest_entry_outside_or_not_a_file_is_refused_as_damage(tmp_path, run_dir, entry):
    ckpt = _newest(run_dir)
    name = entry
    if entry == "symlink-out":
        os.symlink("/etc/passwd", ckpt / "evil.distcp")
        name = "evil.distcp"
    elif entry == "fifo":
        os.mkfifo(ckpt / "pipe.distcp")  # opening it for reading would block forever
        name = "pipe.distcp"
    elif entry == "device-link":
        os.symlink("/dev/zero", ckpt / "zero.distcp")  # inside by name, a device by nature
        name = "zero.distcp"
    _add_entry(ckpt, name)
    code, res, text = _verify_cli(tmp_path, run_dir)
    assert code == ExitCode.JOB_FAILED, f"verify should fail on a manifest naming {entry!r}, got {code}: {text}"
    bad = res["step-00000004"]
    assert not bad["ok"] and any("refused (damaged manifest)" in p for p in bad["problems"]), bad
    assert res["step-00000002"]["ok"], "the untouched checkpoint must still verify"
    if entry == "/etc/shadow" and os.path.exists("/etc/shadow"):
        real = os.stat("/etc/shadow").st_size
        assert not re.search(rf"\bsize {real}\b", text), f"the size of /etc/shadow leaked: {text}"


def test_latest_naming_a_path_is_ignored_not_followed(tmp_path, run_dir):
    root = run_dir / "checkpoints"
    assert read_latest(root) == "step-00000004"
    (root / LATEST).write_text("../../../etc\n")
    assert read_latest(root) is None, "a `latest` pointing outside its folder must be refused"
    (root / LATEST).unlink()
    os.symlink("/dev/zero", root / LATEST)
    assert read_latest(root) is None, "a `latest` that is a device must be refused without reading it"


def test_metadata_naming_a_data_file_outside_is_refused_before_reading(tmp_path, run_dir):
    ckpt = _newest(run_dir)
    md = load_metadata_file(ckpt)  # the real one passes
    info = next(iter(md.storage_data.values()))
    info.relative_path = "../../../../../../../dev/zero"
    (ckpt / ".metadata").write_bytes(pickle.dumps(md))
    with pytest.raises(UnsafeCheckpointError, match="dev/zero"):
        load_metadata_file(ckpt)
    # The same checkpoint through a restore: refused as damage, the previous one is used.
    m = json.loads((ckpt / MANIFEST).read_text())
    data = (ckpt / ".metadata").read_bytes()
    import zlib

    m["files"][".metadata"] = {"size": len(data), "crc32": zlib.crc32(data)}
    (ckpt / MANIFEST).write_text(json.dumps(m))
    assert verify(ckpt).ok  # checksums cannot catch it; confinement must
    ctx = context(run_dir, every_steps=2, mode="sync")
    start = Checkpointer(ctx).restore(build(seed=5))
    assert start == 2, f"expected the fallback to step 2, got {start}"
    (corrupt,) = events(run_dir, "ckpt.corrupt")
    assert "refused" in " ".join(corrupt.data["reasons"]), corrupt.data


def test_manifest_file_that_is_a_device_is_refused(tmp_path, run_dir):
    ckpt = _newest(run_dir)
    (ckpt / MANIFEST).unlink()
    os.symlink("/dev/zero", ckpt / MANIFEST)
    res = verify(ckpt)
    assert not res.ok and "not a regular file" in res.reason, res.reason
