"""Project-wide test fixtures.

``reference_run`` (session-scoped, owned by the launcher area): ONE clean 2-rank
``titan run`` of the tinygpt workload, made once per pytest session and shared —
dropout on (the preset's 0.1), every detector enabled (step guard, hang and straggler
watchdog, node agent: their defaults; SDC fingerprints and canary every 10 steps), checkpoints every ``REFERENCE.ckpt_every`` steps, fixed seed,
one intra-op thread, ``REFERENCE.steps`` steps. It returns a ``ReferenceRun``:
``run_dir`` (a ``titan.events.RunDir``: events, run.json, checkpoints of a fault-free
run), ``params`` (final parameters from rank 0, ``torch.load`` → ``{name: tensor}``),
``workload_args`` (the exact workload flags minus ``--out FILE``, to re-run the same job
under faults and compare bit for bit) and ``launcher_args``. Use it for bitwise comparisons and false-positive checks
(a detector that fires on this run is wrong). Do not write into its run directory.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from titan.events import RunDir
from titan.settings.env import TITAN_RDZV_SECRET

# One rendezvous secret for the whole test session: every `titan run` the tests start, in
# process or as a subprocess (several "nodes" of one job), shares it (docs/security.md).
os.environ.setdefault(TITAN_RDZV_SECRET, "hex:" + os.urandom(32).hex())


@pytest.fixture(autouse=True)
def _private_node_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test gets its own node ledger: failures that tests cause on purpose must not
    add strikes to this machine's real ledger (``titan run`` refuses to start on a node
    over its strike limit — titan.watchdog / issue 5)."""
    monkeypatch.setenv("TITAN_WATCHDOG_LEDGER_PATH", str(tmp_path / "node-ledger.sqlite"))


@pytest.fixture(autouse=True)
def _strict_json_in_run_dirs(tmp_path: Path) -> Iterator[None]:
    """Every run directory a test leaves in its ``tmp_path`` is strict JSON (no NaN/Infinity)."""
    yield
    from _strict_json_scan import violations

    bad = violations(tmp_path)
    if bad:
        pytest.fail("lines a strict JSON parser rejects (events must write non-finite numbers as "
                    "\"nan\"/\"inf\", docs/events.md):\n  " + "\n  ".join(bad), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _strict_json_in_fixture_run_dirs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The same over the whole session's temporary tree (module- and session-scoped fixtures:
    the reference run, drill runs), once at the end."""
    yield
    from _strict_json_scan import violations

    bad = violations(tmp_path_factory.getbasetemp())
    if bad:
        pytest.fail("run directories of this session hold lines a strict JSON parser rejects:\n  "
                    + "\n  ".join(bad), pytrace=False)


@dataclasses.dataclass(frozen=True)
class ReferenceRun:
    """The shared clean run (see the module docstring)."""

    run_dir: RunDir
    params: Path
    workload_args: tuple[str, ...]
    launcher_args: tuple[str, ...]
    steps: int
    seed: int
    ckpt_every: int


@dataclasses.dataclass(frozen=True)
class _RefSpec:
    steps: int = 30
    seed: int = 1234
    ckpt_every: int = 10
    nproc: int = 2


REFERENCE = _RefSpec()


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> ReferenceRun:
    """One clean 2-rank tinygpt run under ``titan run`` (about 20-40 s here, once)."""
    root = tmp_path_factory.mktemp("reference")
    params = root / "final_params.pt"
    workload = ("-m", "titan.workloads.tinygpt", "--steps", str(REFERENCE.steps), "--seed", str(REFERENCE.seed),
                "--ckpt-every", str(REFERENCE.ckpt_every), "--threads", "1", "--log-every", "0")
    # SDC rounds and the canary every 10 steps (default 50 > the run's 30 steps), so the
    # clean run exercises every detector: guard, watchdog, stragglers, SDC, agent.
    launcher = ("--nproc-per-node", str(REFERENCE.nproc), "--max-restarts", "0",
                "--set", "sdc.every_steps=10", "--set", "sdc.canary_every_steps=10")
    env = {**os.environ, "TITAN_WATCHDOG_LEDGER_PATH": str(root / "node-ledger.sqlite")}
    titan = Path(sys.executable).with_name("titan")
    cmd = [str(titan), "run", *launcher, "--runs-dir", str(root / "runs"), "--run-id", "reference", "--json",
           "--", *workload, "--out", str(params)]
    p = subprocess.Popen(cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=240)
    finally:
        if p.poll() is None:  # timed out: end the launcher and its workers (its process group)
            os.killpg(p.pid, 9)
            p.wait(10)
    if p.returncode != 0:
        from titan.events import read_run

        why = [f"{e.kind}: {e.msg}" for e in read_run(root / "runs" / "reference").events
               if e.level in ("warning", "error", "critical")]
        raise AssertionError(f"the clean reference run failed (exit {p.returncode}): a broken workload, or a "
                             f"detector firing on a clean run (a false positive). Warnings and errors:\n  "
                             + "\n  ".join(why[-15:]) +
                             f"\nlauncher stderr tail:\n{err[-1500:]}")
    res = json.loads(out)
    assert params.is_file(), f"the workload wrote no final parameters to {params}"
    return ReferenceRun(RunDir(res["run_dir"]), params, workload, launcher, REFERENCE.steps, REFERENCE.seed,
                        REFERENCE.ckpt_every)
