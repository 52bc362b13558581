"""Warm workers (``titan.warm``) under a real ``titan run``: every worker, the restarted ones
too, is forked by the node's zygote, and torchrun's agent sees its exit exactly as it would a
cold worker's (exit code, signal); a zygote that is gone sends the workers the cold way, and
the events say why. Plus the stub's and the zygote's pieces that need no launch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from titan.cli.environment import Environment
from titan.cli.main import run as cli_run
from titan.events import read_run
from titan.exitcodes import ExitCode
from titan.warm.pool import STUB_PATH
from titan.warm.zygote import script_imports

# Announces itself, then does what PLAN[attempt][rank] says once every rank of the attempt
# has announced: "ok", "exit:N", "kill" (SIGKILL itself), "kill-zygote" (SIGKILL the zygote,
# then itself).
SCRIPT = textwrap.dedent('''
    import json, os, signal, sys, time
    import torch  # preloaded by the zygote: a warm worker finds it imported
    from titan.worker import WorkerContext
    ctx = WorkerContext.from_env()
    ctx.announce()
    ctx.events.emit("test.imported", data={"torch_before_main": "torch" in sys.modules, "argv": sys.argv[1:]})
    plan = json.loads(sys.argv[1])
    what = plan.get(str(ctx.attempt), {}).get(str(ctx.rank), "ok")
    if what != "ok":
        t0 = time.monotonic()
        while (len(list(ctx.run_dir.events_dir.glob(f"*.attempt{ctx.attempt}.*.jsonl"))) < ctx.world_size
               and time.monotonic() - t0 < 20):
            time.sleep(0.05)
    if what.startswith("exit:"):
        sys.exit(int(what[5:]))
    if what == "kill-zygote":
        with open(os.path.join(os.environ["TITAN_WARM_DIR"], "state.json")) as f:
            os.kill(json.load(f)["pid"], signal.SIGKILL)
        time.sleep(0.5)
        what = "kill"
    if what == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
''')


@pytest.fixture
def script(tmp_path):
    p = tmp_path / "warm_worker.py"
    p.write_text(SCRIPT)
    return p


@pytest.fixture(autouse=True)
def _restarts_allowed(monkeypatch):
    # Attempts without a training step are the point here, not a crash loop to give up on.
    for var, value in {"TITAN_WATCHDOG_STRIKE_LIMIT": "1000", "TITAN_WATCHDOG_GIVEUP_RESTARTS": "1000",
                       "TITAN_WATCHDOG_GIVEUP_SAME_FAILURE": "1000", "TITAN_WATCHDOG_RESTART_BACKOFF_S": "0"}.items():
        monkeypatch.setenv(var, value)


def titan(argv: list[str], cwd) -> tuple[ExitCode, str, str]:
    """The CLI in-process (exit code, stdout, stderr)."""
    env = Environment.captured(cwd)
    code = cli_run(argv, env)
    return code, env.stdout.getvalue(), env.stderr.getvalue()


def _run(tmp_path, script, plan: dict, *sets: str) -> tuple[ExitCode, list]:
    code, out, err = titan(["run", "--nproc-per-node", "2", "--max-restarts", "3", "--json",
                            "--runs-dir", str(tmp_path / "runs"), "--set", "warm.enabled=true",
                            *[a for s in sets for a in ("--set", s)], "--", str(script), json.dumps(plan)], tmp_path)
    res = json.loads(out)
    assert code == ExitCode.SUCCEEDED, f"expected SUCCEEDED, saw {code!r}: {res}\n{err[-3000:]}"
    return code, read_run(res["run_dir"]).events


@pytest.mark.timeout(300)
def test_workers_are_forked_warm_their_exits_reach_the_agent_and_without_a_zygote_they_start_cold(tmp_path, script):
    # attempt 0: rank 1 exits 17; attempt 1: rank 0 SIGKILLed; attempt 2: rank 1 kills the
    # zygote (no respawn allowed), then itself; attempt 3: cold, and says why.
    plan = {"0": {"1": "exit:17"}, "1": {"0": "kill"}, "2": {"1": "kill-zygote"}}
    _, evs = _run(tmp_path, script, plan, "warm.max_respawns=0")
    spawn = {(e.attempt, e.rank): e.data.get("spawn") for e in evs if e.kind == "worker.started"}
    assert sorted(spawn) == [(a, r) for a in range(4) for r in (0, 1)], f"expected 4 attempts x 2 ranks: {spawn}"
    assert all(spawn[(a, r)] == "warm" for a in range(3) for r in (0, 1)), \
        f"attempts 0-2 should be forked by the zygote: {spawn}"
    assert all(str(spawn[(3, r)]).startswith("cold: zygote") for r in (0, 1)), \
        f"attempt 3 (zygote gone) should start cold and name the zygote as the reason: {spawn}"
    imported = [e.data["torch_before_main"] for e in evs if e.kind == "test.imported" and e.attempt < 3]
    assert imported and all(imported), "a warm worker should find torch already imported"
    failed = [(e.data["attempt"], e.data["global_rank"], e.data["exit_code"], e.data["signal"])
              for e in evs if e.kind == "worker.failed"]
    assert any(f[:3] == (0, 1, 17) for f in failed), \
        f"rank 1's exit 17 in attempt 0 did not reach the agent as exit 17: {failed}"
    assert any(f[:2] == (1, 0) and f[3] == "SIGKILL" for f in failed), \
        f"rank 0's SIGKILL in attempt 1 did not reach the agent as SIGKILL: {failed}"
    warm = [(e.data.get("event"), e.level) for e in evs if e.kind == "launcher.warm"]
    assert warm[:2] == [("started", "info"), ("ready", "info")] and ("gone", "warning") in warm, \
        f"launcher.warm events: {warm}"


def test_the_stub_starts_the_worker_cold_when_there_is_no_zygote(tmp_path):
    target = tmp_path / "w.py"
    target.write_text("import os, sys\nprint(os.environ['TITAN_SPAWN'], sys.argv[1:])\nsys.exit(5)\n")
    env = {k: v for k, v in os.environ.items() if k != "TITAN_WARM_DIR"}
    p = subprocess.run([sys.executable, "-S", "-I", "-u", STUB_PATH, "script", str(target), "a", "b"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 5, (p.returncode, p.stderr)
    assert p.stdout.strip() == "cold: no zygote on this node (warm.enabled is off) ['a', 'b']", p.stdout


def test_script_imports_reads_top_level_absolute_imports_without_running_the_script(tmp_path):
    s = tmp_path / "train.py"
    s.write_text("import os, json as j\nfrom torch import nn\nfrom . import rel\nraise SystemExit('never run')\n"
                 "def f():\n    import inside\n")
    assert script_imports(s) == ["os", "json", "torch"]
    (tmp_path / "bad.py").write_text("def (:\n")
    assert script_imports(tmp_path / "bad.py") == []
