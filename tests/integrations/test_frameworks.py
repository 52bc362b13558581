"""Each framework integration drilled as a user would drill their own script.

One drill per framework (their imports cost 2.5–9 s per process, so each drill covers
several faults): ``titan drill -- tests/integrations/scripts/<fw>_train.py`` with a NaN
gradient on rank 1, a SIGKILL of rank 1 mid-way between two checkpoints (mid-epoch), and a
SIGSTOP of rank 0 — 2 gloo ranks, a tiny model built in the script, no download. Each fault
must be detected by its named detector and blamed on the right rank (the hang also on its
phase), the job must recover, and its final model and optimizer must be bit for bit those
of a clean run (which the drill runs twice: the script must be deterministic). Then the
newest checkpoint the drilled run left is truncated and the job is run again under
``titan run``: the truncation is detected, the previous checkpoint is used, the job
finishes (no crash loop).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integrations.conftest import OFFLINE, need
from titan.cli.environment import Environment
from titan.cli.main import run as cli_run
from titan.events import read_run
from titan.exitcodes import ExitCode

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).resolve().parent / "scripts"

#: 64 steps (4 epochs of 16), checkpoints every 5: the kill at step 23 falls mid-epoch 1,
#: 3 steps after the checkpoint of step 20, which the restart must recompute.
PLAN = """
[[faults]]
kind = "nan_grad"
rank = 1
step = 8

[[faults]]
kind = "kill"
rank = 1
step = 23

[[faults]]
kind = "kill"
rank = 0
step = 46
signal = "SIGSTOP"
"""

FRAMEWORKS = {"transformers": ("transformers", "hf_train.py", "hf-out"),
              "lightning": ("lightning", "pl_train.py", "pl-out"),
              "accelerate": ("accelerate", "acc_train.py", "checkpoints")}


def _drill(tmp_path: Path, script: str) -> dict:
    plan = tmp_path / "plan.toml"
    plan.write_text(PLAN)
    env = Environment.captured(tmp_path)
    env.env.update(OFFLINE)
    env.env["TITAN_WATCHDOG_LEDGER_PATH"] = str(tmp_path / "ledger.sqlite")
    code = cli_run(["drill", "--json", "--nproc-per-node", "2", "--timeout", "500", "--plan", str(plan),
                    "--runs-dir", str(tmp_path / "runs"), "--", str(SCRIPTS / script), "--epochs", "4"], env)
    out = env.stdout.getvalue()
    assert out.strip(), f"titan drill printed no report (exit {code!r}):\n{env.stderr.getvalue()[-3000:]}"
    rep = json.loads(out)
    if not (code == ExitCode.SUCCEEDED and rep["passed"]):
        bad = {f["id"]: {k: v for k, v in f["checks"].items() if not v} for f in rep["faults"]}
        raise AssertionError(f"drill of {script} failed (exit {code!r}); failed checks {bad}; problems "
                             f"{rep['problems']}; see {rep['run_dir']}\n{json.dumps(rep, indent=1)[:5000]}")
    return rep


def _check_drill(rep: dict) -> None:
    nan = next(f for f in rep["faults"] if f["kind"] == "nan_grad")
    kill, stop = [f for f in rep["faults"] if f["kind"] == "kill"]
    assert nan["detected_by"].startswith("guard") and nan["attributed_ok"], nan
    assert kill["detected_by"].startswith("launcher") and kill["attributed_ok"] and kill["recovered"], kill
    assert kill["steps_lost"] >= 1, f"the kill lost no step: nothing was recomputed after the restart: {kill}"
    assert stop["detected_by"].startswith("watchdog") and stop["attributed_ok"] and stop["recovered"], stop
    assert "phase" in (stop["attribution"] or ""), f"the hang's verdict names no phase: {stop['attribution']}"
    assert rep["deterministic"] is True, rep["determinism"]
    assert rep["final_state_equal"] is True, f"final state differs from the clean run's: {rep}"
    evs = read_run(rep["run_dir"]).events
    skips = {e.rank for e in evs if e.kind == "step" and e.step == 8 and e.data.get("skipped")}
    assert skips == {0, 1}, f"step 8 (NaN on rank 1) was not skipped on both ranks: skipped on {sorted(skips)}"
    # The verdict rode DDP's gradient all-reduce (no exchange after the backward), the NaN step's too.
    steps = [e for e in evs if e.kind == "step"]
    alone = sorted({e.step for e in steps if not e.data.get("rode")})
    assert not alone, f"steps whose verdict did not ride DDP's all-reduce: {alone}"
    culprits = [e.data.get("ranks") for e in evs if e.kind == "guard.nonfinite"]
    assert culprits and culprits[0] == [1], f"guard.nonfinite should name rank 1: {culprits}"
    caps = [e for e in evs if e.kind == "launcher.capabilities"]
    off = {k: v for k, v in caps[0].data["capabilities"].items() if not v["live"]} if caps else {"report": "none"}
    assert not off, f"capabilities off under the integration: {off}"


def _triage_names_rank1(run_dir: str, tmp_path: Path) -> None:
    env = Environment.captured(tmp_path)
    cli_run(["triage", "--json", run_dir], env)
    text = env.stdout.getvalue()
    rep = json.loads(text)
    found = json.dumps(rep)
    assert '"rank": 1' in found or "rank 1" in found, f"titan triage does not name rank 1: {text[:3000]}"


def _truncate_newest_and_rerun(rep: dict, out_name: str, script: str, tmp_path: Path) -> None:
    """Cut the newest checkpoint's biggest file in half; `titan run` must fall back."""
    out = Path(rep["run_dir"]) / out_name
    files = [p for p in out.rglob("*") if p.is_file() and (p.suffix in (".ckpt", ".distcp", ".safetensors"))]
    assert files, f"no checkpoint files under {out}"
    newest_step = max(int("".join(c for c in p.parent.name.split("-")[-1] if c.isdigit()) or 0)
                      if p.suffix != ".ckpt" else int(p.stem.split("step=")[-1]) for p in files)
    victims = [p for p in files if (p.suffix == ".ckpt" and p.stem.endswith(f"step={newest_step}"))
               or (p.suffix != ".ckpt" and p.parent.name.endswith(f"{newest_step:08d}" if out_name == "checkpoints"
                                                                  else f"-{newest_step}"))]
    assert victims, f"found no file of the newest checkpoint (step {newest_step}) under {out}"
    v = max(victims, key=lambda p: p.stat().st_size)
    with open(v, "r+b") as f:
        f.truncate(v.stat().st_size // 2)
    env = dict(os.environ, **OFFLINE, TITAN_WATCHDOG_LEDGER_PATH=str(tmp_path / "ledger2.sqlite"))
    args = [sys.executable, "-m", "titan", "run", "--nproc-per-node", "2", "--runs-dir", str(tmp_path / "rerun"),
            "--set", "checkpoint.every_steps=5", "--", str(SCRIPTS / script), "--epochs", "4"]
    if out_name == "checkpoints":
        args[args.index("--set"):args.index("--set")] = ["--set", f"checkpoint.dir={out}"]
    else:
        args += ["--out", str(out)]
    p = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    (run_dir,) = list((tmp_path / "rerun").iterdir())
    evs = read_run(run_dir).events
    corrupt = [e for e in evs if e.kind == "ckpt.corrupt"]
    loaded = [e for e in evs if e.kind == "ckpt.loaded"]
    assert p.returncode == 0, f"the rerun after truncating {v.name} failed ({p.returncode}):\n{p.stdout[-3000:]}"
    assert corrupt and (v.name in json.dumps(corrupt[0].data) or str(newest_step) in json.dumps(corrupt[0].data)), \
        f"truncated {v} but no ckpt.corrupt names it: {[e.data for e in corrupt]}"
    failed = [e for e in evs if e.kind == "worker.failed"]
    assert not failed, (f"a worker of the rerun failed (one attempt expected): "
                        f"{[(e.data.get('global_rank'), e.data.get('signal'), e.attempt) for e in failed]}\n"
                        f"{p.stderr[-3000:]}")
    steps = {int(e.data["step"]) for e in loaded}
    assert steps and max(steps) < newest_step, \
        f"expected a resume from a checkpoint before step {newest_step}, got ckpt.loaded steps {sorted(steps)}"


@pytest.mark.slow  # 1.5–4 min each (six launches of a framework's imports): make test-slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("fw", list(FRAMEWORKS))
def test_drill_of_a_framework_job_kill_nan_hang_then_a_truncated_checkpoint(fw, tmp_path):
    module, script, out_name = FRAMEWORKS[fw]
    need(module)
    rep = _drill(tmp_path, script)
    _check_drill(rep)
    _triage_names_rank1(rep["run_dir"], tmp_path)
    _truncate_newest_and_rerun(rep, out_name, script, tmp_path)


def _script(tmp_path: Path, script: str, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TITAN_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(OFFLINE, PYTHONPATH=str(ROOT / "src"))
    p = subprocess.run([sys.executable, str(SCRIPTS / script), *args], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=400)
    assert p.returncode == 0, f"{script} {' '.join(args)} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return p


@pytest.mark.timeout(600)
@pytest.mark.parametrize("fw", ["transformers", "lightning"])
def test_a_run_that_began_without_titan_resumes_into_a_guarded_one(fw, tmp_path):
    """A plain run (no Titan) leaves its own checkpoints; the Titan-wired script adopts them:
    resumes from the newest (said unverified in ckpt.loaded) and trains on, guarded."""
    module, script, _ = FRAMEWORKS[fw]
    need(module)
    out = tmp_path / "out"
    _script(tmp_path, script, "--plain", "--max-steps", "10", "--out", str(out))
    p = _script(tmp_path, script, "--epochs", "1", "--out", str(out))  # one process: 32 steps
    assert "final step 32" in p.stdout, f"the adopted run did not finish its 32 steps:\n{p.stdout[-2000:]}"
    (run_dir,) = [d for d in (tmp_path / "runs").iterdir() if d.is_dir()]
    evs = read_run(run_dir).events
    loaded = [e.data for e in evs if e.kind == "ckpt.loaded"]
    assert loaded and loaded[0]["step"] == 10 and loaded[0].get("adopted") is True \
        and loaded[0].get("verified") is False, f"expected an adopted, unverified resume at step 10: {loaded}"
    steps = sorted({e.step for e in evs if e.kind == "step"})
    assert steps and steps[0] == 11 and steps[-1] == 32, f"guarded steps should run 11..32, saw {steps[:3]}…{steps[-3:]}"
    saved = [e.data for e in evs if e.kind == "ckpt.saved"]
    assert saved, "the adopted run committed no checkpoint of its own"


@pytest.mark.timeout(600)  # three processes; ~10 s idle, 2 min under load 30
def test_an_accelerate_loop_killed_mid_epoch_resumes_bit_for_bit_in_one_process(tmp_path):
    """The data position Accelerate's save_state does not keep, in one process (no launcher):
    a run that crashes mid-epoch 1 (3 steps after the checkpoint of step 40) and is started
    again ends with the model and optimizer bit for bit those of a run never interrupted. The
    loader shuffles with its own ``torch.Generator`` (a common way to make the order
    reproducible), which advances every epoch: the resumed epoch 1 replayed epoch 0's order
    before TitanAccelerate saved the loader's generators (as under 2 ranks with the generator
    Accelerate synchronises, which the drill covers)."""
    need("accelerate")
    from titan.checkpoint.digest import compare_digests, read_digests

    def run(name: str, *args: str, rc: int = 0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TITAN_", "RANK", "WORLD_SIZE", "LOCAL_"))}
        env.update(OFFLINE, PYTHONPATH=str(ROOT / "src"), TITAN_CHECKPOINT_EVERY_STEPS="5", TITAN_CHECKPOINT_MODE="sync",
                   TITAN_CHECKPOINT_DIR=str(tmp_path / name / "ckpt"), TITAN_FINAL_STATE=str(tmp_path / name / "final"))
        (tmp_path / name).mkdir(exist_ok=True)
        p = subprocess.run([sys.executable, str(SCRIPTS / "acc_train.py"), "--epochs", "2", "--seeded-loader", *args],
                           cwd=tmp_path / name,
                           env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == rc, f"acc_train.py {args} exited {p.returncode}, expected {rc}:\n{p.stderr[-3000:]}"

    run("clean")
    run("crashed", "--exit-after", "43", rc=9)
    assert not read_digests(tmp_path / "crashed" / "final"), "the crashed run wrote a final state"
    run("crashed")
    clean, resumed = read_digests(tmp_path / "clean" / "final"), read_digests(tmp_path / "crashed" / "final")
    assert clean and clean[0]["step"] == 64, f"the clean run should end at step 64: {clean and clean[0]['step']}"
    equal, why = compare_digests(clean, resumed)
    assert equal is True, f"the resumed run differs from the uninterrupted one: {why}"
