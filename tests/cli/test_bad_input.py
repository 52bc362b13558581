"""Bad input over every verb and flag: one line, the documented exit code, nothing written.

Each case of ``badinput_cases.CASES`` runs against a fresh copy of a workspace (a real run
directory with two real checkpoints, a real node ledger, fault plans, odd files) and must:

* exit with the code ``titan --help`` documents for it (2 for user error);
* print exactly one ``titan: error:`` line and one ``hint:`` line on stderr, nothing else
  (listing cases that report damage print it on stdout and exit 0 instead);
* never print a traceback, nor a raw control character;
* leave no process behind, and start none: in-process cases run with a tripwire on
  ``subprocess.Popen`` and ``os.fork`` (a bad ``--io-dir`` must fail before torchrun starts);
* create or change nothing under the named roots: the workspace (cwd, ``--runs-dir``, the
  run directory), ``$XDG_STATE_HOME/titan`` (the default node ledger), ``$TMPDIR``, the
  snapshot directory (``checkpoint.snapshot_dir``, here a per-case folder) and
  ``/dev/shm/titan`` (shared with other test runs: no new entry may carry this table's
  ``badinput`` run ids) — a hash of every path, file content and symlink target before and after.

Most cases run in-process through the CLI's injectable environment (``titan.cli.environment``);
the ``subprocess`` ones start ``python -m titan`` for real, in a new session, and check that
no process of that session survives. The per-case timeout is a hang guard; the table's speed
(about 0.05 s a case here) is reported by ``--durations``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import unicodedata
from pathlib import Path

import psutil
import pytest

from badinput_cases import CASES, PLANS, Case
from titan.cli.environment import Environment
from titan.cli.main import build_parser, run as cli_run

SHM = Path("/dev/shm/titan")
pytestmark = pytest.mark.timeout(5, func_only=True)  # a hang guard per case (setup excluded)


# --- the workspace, built once ----------------------------------------------------------------
@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace with a real run directory (events, run.json, checkpoints 2 and 4), a ledger,
    plans and odd files. Built once (~2 s: imports torch, saves two DCP checkpoints)."""
    import warnings

    sys.path.insert(0, str(Path(__file__).parents[1] / "checkpoint"))
    from _ckpt_model import build, context, train_steps

    from titan.checkpoint import Checkpointer
    from titan.events import EventWriter
    from titan.ledger import Ledger

    warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled", category=UserWarning)
    ws = tmp_path_factory.mktemp("badinput") / "ws"
    ws.mkdir()
    ck = Checkpointer(context(ws / "run", every_steps=2, mode="sync"))
    train_steps(build(), 0, 4, ck)
    ck.close()
    rd = ws / "run"
    (rd / "run.json").write_text(json.dumps({"run_id": "run", "node_id": "n0", "outcome": "succeeded"}))
    (rd / "events").mkdir(exist_ok=True)
    with EventWriter(rd / "events" / "n0.rank0.attempt0.1.jsonl", run="run", node="n0", rank=0, attempt=0) as w:
        w.emit("step", step=1)
    (ws / "ok.py").write_text("print('hi')\n")
    (ws / "file.txt").write_text("hello\n")
    (ws / "garbage.bin").write_bytes(bytes(range(256)) * 8)
    (ws / "list.json").write_text("[1, 2]")
    (ws / "bad.toml").write_text("[run\nmax_restarts = = 3\n")
    (ws / "fp.json").write_text(json.dumps({"python": {"version": "3.11"}, "torch": {"version": "2.13.0"}}))
    (ws / "plans").mkdir()
    for name, text in PLANS.items():
        (ws / "plans" / f"{name}.toml").write_text(text)
    Ledger(ws / "ledger.sqlite").add("n1", "manual", detail="from the table's template")
    (ws / "notsqlite.db").write_text("not a database\n")
    import sqlite3

    con = sqlite3.connect(ws / "other.sqlite")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    # Warm the imports a bad case would pay for the first time (torchrun's parser, DCP).
    import torch.distributed.run  # noqa: F401

    import titan.checkpoint.storage  # noqa: F401
    return ws


def _tree(root: Path) -> dict[str, str]:
    """Path → digest of content / link target / 'dir' for everything under ``root``."""
    out: dict[str, str] = {}
    if not root.exists():
        return out
    for p in sorted(root.rglob("*")):
        rel = str(p.relative_to(root))
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_dir():
            out[rel] = "dir"
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[rel] = "other"
    return out


def _changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return sorted([f"+{k}" for k in after.keys() - before.keys()] + [f"-{k}" for k in before.keys() - after.keys()]
                  + [f"~{k}" for k in before.keys() & after.keys() if before[k] != after[k]])


def _shm_ours() -> set[str]:
    try:
        return {p.name for p in SHM.iterdir() if "badinput" in p.name}
    except OSError:
        return set()


class _Spawned(BaseException):
    """Raised by the tripwire: a bad-input case tried to start a process (not catchable as Exception)."""


_ALLOW = threading.Event()  # set while the test itself (or a spawn_ok case) starts a process


@pytest.fixture(scope="module", autouse=True)
def tripwire():
    """For the whole module no process may start unless ``_ALLOW`` is set: not by a case, nor
    by a thread a case left behind (a drill's reference run, a launcher)."""
    mp = pytest.MonkeyPatch()
    popen_init, fork, spawn = subprocess.Popen.__init__, os.fork, os.posix_spawn

    def guarded(real):  # noqa: ANN001, ANN202
        def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            if not _ALLOW.is_set():
                raise _Spawned(f"a bad-input case started a process: {args[1:3]!r}")
            return real(*args, **kwargs)

        return call

    mp.setattr(subprocess.Popen, "__init__", guarded(popen_init))
    mp.setattr(os, "fork", guarded(fork))
    mp.setattr(os, "posix_spawn", guarded(spawn))
    yield
    mp.undo()


def _no_control(text: str) -> list[str]:
    return [repr(ch) for ch in set(text) if unicodedata.category(ch) == "Cc" and ch not in "\n\t"]


@pytest.mark.parametrize("case", CASES, ids=[k.id for k in CASES])
def test_bad_input(case: Case, template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(template, ws, symlinks=True)
    state, tmp, snap = tmp_path / "state", tmp_path / "tmp", tmp_path / "shm"
    for d in (state / "titan", tmp, snap):
        d.mkdir(parents=True)
    if case.setup is not None:
        case.setup(ws)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TITAN_")}
    env.update(XDG_STATE_HOME=str(state), TMPDIR=str(tmp), TITAN_CHECKPOINT_SNAPSHOT_DIR=str(snap),
               COLUMNS="120", PYTHONPATH=os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH")])))
    env.update(dict(case.env))
    monkeypatch.delenv("TITAN_WATCHDOG_LEDGER_PATH", raising=False)  # the default ledger lives under XDG
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    roots = {"cwd": ws, "XDG_STATE_HOME/titan": state / "titan", "TMPDIR": tmp, "snapshot_dir": snap}
    before = {name: _tree(r) for name, r in roots.items()}
    shm_before = _shm_ours()
    me = psutil.Process()
    kids_before = {p.pid for p in me.children(recursive=True)}

    if case.subprocess:
        _ALLOW.set()
        try:
            p = subprocess.Popen([sys.executable, "-m", "titan", *case.argv], cwd=ws, env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
        finally:
            _ALLOW.clear()
        try:
            out, err = p.communicate(timeout=15)
        finally:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
        code = p.returncode
        left = [q.pid for q in psutil.process_iter(["pid"]) if _pgid(q.pid) == p.pid]
        assert not left, f"{case.id}: processes of its session outlived `titan`: {left}"
    else:
        e = Environment.captured(ws, env)
        if case.spawn_ok:
            _ALLOW.set()
        try:
            code = int(cli_run(list(case.argv), e))
        finally:
            _ALLOW.clear()
        out, err = e.stdout.getvalue(), e.stderr.getvalue()

    shown = f"\n--- stderr ---\n{err[-2000:]}\n--- stdout ---\n{out[-1000:]}"
    assert code == case.code, f"{case.id}: expected exit {case.code}, saw {code}{shown}"
    assert "Traceback" not in err + out, f"{case.id}: a traceback was printed{shown}"
    assert not _no_control(err + out), f"{case.id}: raw control characters {_no_control(err + out)} printed{shown}"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if case.error:
        assert len(lines) == 2 and lines[0].startswith("titan: error: ") and lines[1].startswith("hint: "), \
            f"{case.id}: expected exactly `titan: error: …` + `hint: …` on stderr{shown}"
        assert case.needle in lines[0], f"{case.id}: expected {case.needle!r} in the error line{shown}"
        assert len(lines[1]) > len("hint: ") + 3, f"{case.id}: empty hint{shown}"
    else:
        assert "titan: error:" not in err, f"{case.id}: a listing must not fail{shown}"
        assert case.needle in out, f"{case.id}: expected {case.needle!r} on stdout{shown}"
    for name, r in roots.items():
        changed = _changes(before[name], _tree(r))
        assert not changed, f"{case.id}: {name} ({r}) changed: {changed[:10]}{shown}"
    assert _shm_ours() == shm_before, f"{case.id}: /dev/shm/titan got {_shm_ours() - shm_before}"
    left = [p for p in me.children(recursive=True) if p.pid not in kids_before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]
    for p in left:
        p.kill()
    assert not left, f"{case.id}: left processes behind: {[p.cmdline() for p in left]}"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


# --- the table covers the CLI ------------------------------------------------------------------
def _flags() -> dict[str, set[str]]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "verb")
    out = {}
    for verb, p in sub.choices.items():
        names = set()
        for a in p._actions:
            if a.option_strings and "-h" not in a.option_strings:
                names.add(max(a.option_strings, key=len))
        out[verb] = names
    return out


def test_every_flag_of_every_verb_has_a_case() -> None:
    """The table is over the real parser: a new flag without a bad-input case fails here."""
    missing = []
    for verb, flags in _flags().items():
        argvs = [k.argv for k in CASES if k.argv[:1] == (verb,)]
        assert argvs, f"no case for `titan {verb}`"
        missing += [f"titan {verb} {f}" for f in sorted(flags) if not any(f in a for a in argvs)]
    assert not missing, f"flags without a bad-input case: {missing}"


def test_the_table_is_large_and_ids_are_unique() -> None:
    ids = [k.id for k in CASES]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
    assert len(CASES) >= 150, f"the table holds {len(CASES)} cases; the issue asks for at least 150"
    assert sum(k.subprocess for k in CASES) >= 3, "a few cases must run as real processes"
