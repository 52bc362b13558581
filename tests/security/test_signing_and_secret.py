"""The one signing helper, the job secret and path confinement (standard library only)."""

from __future__ import annotations

import os

import pytest

from titan.errors import UserError
from titan.security import PathEscape, SignatureError, Signer, confined, open_regular, resolve_secret
from titan.settings.env import TITAN_RDZV_SECRET, TITAN_RDZV_SECRET_FILE

KEY = b"k" * 32


def test_sealed_record_round_trips_and_every_alteration_is_caught():
    s = Signer(KEY)
    env = s.seal("titan.test.v1", b"payload", context="run-1")
    assert s.open("titan.test.v1", env, context="run-1") == b"payload"
    flipped = bytearray(env)
    flipped[-1] ^= 1
    cases = {
        "payload flipped": (bytes(flipped), "titan.test.v1", "run-1", "bad_tag"),
        "other purpose": (env, "titan.other.v1", "run-1", "bad_tag"),
        "other context": (env, "titan.test.v1", "run-2", "bad_tag"),
        "unsigned": (b"\x80\x04payload", "titan.test.v1", "run-1", "unsigned"),
        "other key": (Signer(b"x" * 32).seal("titan.test.v1", b"payload", context="run-1"), "titan.test.v1",
                      "run-1", "other_key"),
    }
    for what, (data, purpose, ctx, reason) in cases.items():
        with pytest.raises(SignatureError) as e:
            s.open(purpose, data, context=ctx)
        assert e.value.reason == reason, f"{what}: expected reason {reason}, got {e.value.reason}"


def test_purpose_and_context_are_framed_so_boundaries_cannot_shift():
    s = Signer(KEY)
    assert s.tag("ab", b"c", context="") != s.tag("a", b"c", context="b")
    assert s.tag("a", b"bc", context="") != s.tag("a", b"c", context="b")


def test_short_keys_and_key_in_repr_are_refused():
    with pytest.raises(ValueError):
        Signer(b"short")
    assert "k" * 16 not in repr(Signer(KEY))


def test_secret_precedence_file_flag_then_env_file_then_env_value(tmp_path):
    f1, f2 = tmp_path / "a", tmp_path / "b"
    f1.write_bytes(b"A" * 20 + b"\n")
    f2.write_bytes(b"B" * 20)
    os.chmod(f1, 0o600)
    env = {TITAN_RDZV_SECRET_FILE: str(f2), TITAN_RDZV_SECRET: "C" * 20}
    assert resolve_secret(str(f1), env).key == b"A" * 20
    assert resolve_secret(None, env).key == b"B" * 20
    assert resolve_secret(None, {TITAN_RDZV_SECRET: "C" * 20}).key == b"C" * 20
    assert resolve_secret(None, {TITAN_RDZV_SECRET: "hex:" + "ab" * 16}).key == b"\xab" * 16
    assert resolve_secret(None, {}) is None
    assert resolve_secret(str(f1), {}).warnings == ()
    os.chmod(f2, 0o644)
    assert "readable by others" in resolve_secret(str(f2), {}).warnings[0]


@pytest.mark.parametrize("bad", ["missing", "short", "dir", "device"])
def test_bad_secret_files_are_user_errors(tmp_path, bad):
    p = {"missing": tmp_path / "nope", "short": tmp_path / "s", "dir": tmp_path, "device": "/dev/zero"}[bad]
    if bad == "short":
        p.write_text("abc")
    with pytest.raises(UserError) as e:
        resolve_secret(str(p), {})
    assert e.value.hint, f"{bad}: a user error needs a hint"


def test_confined_refuses_escapes_and_allows_plain_names(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    os.symlink("/etc", tmp_path / "d" / "out")
    os.symlink("f", tmp_path / "d" / "in")
    assert confined(tmp_path / "d", "f") == (tmp_path / "d" / "f").resolve()
    assert confined(tmp_path / "d", "in").name == "in"
    for rel in ("/etc/passwd", "../d/f", "a/../../x", "out/passwd", "", "a\0b", "C:\\x"):
        with pytest.raises(PathEscape):
            confined(tmp_path / "d", rel)


def test_open_regular_does_not_block_on_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "p")
    with pytest.raises(PathEscape, match="FIFO"):
        open_regular(tmp_path / "p")
    with pytest.raises(PathEscape, match="character device"):
        open_regular("/dev/zero")


def test_run_directory_reader_skips_event_files_that_are_devices_or_lead_out(tmp_path):
    from titan.events import RunDir, read_run

    rd = RunDir.create(tmp_path, "r1")
    good = rd.launcher_file("n0")
    good.write_text('{"v": 1, "t": 1.0, "kind": "launcher.started", "level": "info", "msg": "", "run": "r1", '
                    '"node": "n0", "data": {}}\n')
    os.symlink("/dev/zero", rd.events_dir / "n0.rank0.attempt0.pid1.jsonl")
    outside = tmp_path / "outside.jsonl"
    outside.write_text(good.read_text())
    os.symlink(outside, rd.path / "agent.n0.jsonl")
    files = rd.event_files()
    assert files == [good], f"only the regular file inside should be read, got {files}"
    read_run(rd.path)  # must return (it would never end reading /dev/zero)


def test_run_json_and_fault_plan_that_are_devices_are_refused_not_read(tmp_path):
    from titan.chaos.plan import Plan
    from titan.errors import UserError
    from titan.events import RunDir

    rd = RunDir.create(tmp_path, "r2")
    os.symlink("/dev/zero", rd.run_json)
    with pytest.raises(UserError, match="not a regular file"):
        rd.read_run_json()
    os.mkfifo(tmp_path / "plan.toml")
    with pytest.raises(UserError, match="not a regular file"):
        Plan.load(tmp_path / "plan.toml")
