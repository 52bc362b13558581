"""Nothing that comes from a log, an event, a file name or a setting is read as rich markup.

gloo writes ``[/__w/pytorch/…/pair.cc:537]`` into every run with a killed rank; rich reads
``[/…]`` as a closing tag (``MarkupError``) and ``[bold]`` as a style (the text vanishes).
Every verb's human output is fed those strings and must print them literally; the CLI's own
colours are styles, so no markup tag is left in its sources either.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from titan.cli.environment import Environment
from titan.cli.main import run as cli
from titan.events import Event
from titan.sla.synthetic import SynthRun

pytestmark = pytest.mark.timeout(120)

GLOO = "[/__w/x/pair.cc:537]"
TRICKY = (GLOO, "[bold]", "[/]")
TEXT = f"Connection closed by peer {GLOO} [bold] at [/] :warning: end"


def _cli(tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    env = Environment.captured(tmp_path, env={"PATH": "/usr/bin:/bin", "COLUMNS": "400"})
    code = cli(list(argv), env)
    return int(code), env.stdout.getvalue(), env.stderr.getvalue()


def _assert_literal(out: str, what: str, *, strings: tuple[str, ...] = TRICKY) -> None:
    missing = [s for s in strings if s not in out]
    assert not missing, f"{what}: expected {missing} printed literally, seen:\n{out[-3000:]}"


def _run_with_markup(tmp_path: Path, runs: str = "runs") -> Path:
    s = SynthRun(world=2).startup(1).steps(4).fault("inject.kill", rank=1, after=0.2)
    s.emit("worker.failed", rank=1, step=4, level="error", msg=TEXT, data={"exit_code": 10})
    s.detect(0.5).restart(1, resume_from=0).steps(3).end(0.2)
    return s.write(tmp_path / runs, "synth").path


@pytest.mark.parametrize("extra", [[], ["--kind", "worker"]], ids=["all", "kind-worker"])
def test_events_prints_gloo_brackets_literally(tmp_path, extra):
    rd = _run_with_markup(tmp_path)
    code, out, err = _cli(tmp_path, "events", str(rd), *extra)
    assert code == 0 and "Traceback" not in err, f"expected exit 0, seen {code}: {err[-2000:]}"
    _assert_literal(out, "titan events")
    assert ":warning:" in out, "emoji codes in data must not turn into emoji"


def test_triage_prints_log_lines_literally(tmp_path):
    log = tmp_path / "job[bold].log"
    log.write_text("2026-11-30T13:00:00Z [rank0]: step 10 loss 3.2\n"
                   f"2026-11-30T13:00:05Z [rank1]: RuntimeError: {TEXT}\n"
                   "2026-11-30T13:00:06Z torch.distributed.elastic.multiprocessing.errors.ChildFailedError: [/]\n")
    code, out, err = _cli(tmp_path, "triage", str(log))
    assert code in (4, 5) and "Traceback" not in err, f"expected exit 4/5, seen {code}: {err[-2000:]}"
    _assert_literal(out, "titan triage")
    assert "job[bold].log" in out, out


def test_report_table_prints_paths_literally(tmp_path):
    rd = _run_with_markup(tmp_path, runs="runs[bold]x[/]")
    code, out, err = _cli(tmp_path, "report", str(rd), "--no-triage")
    assert code == 0, f"expected exit 0, seen {code}: {err[-2000:]}"
    _assert_literal(out, "titan report", strings=("runs[bold]x[/]",))


def test_run_prints_its_run_dir_literally(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("print('hello')\n")
    env = Environment.captured(tmp_path, env={**__import__("os").environ, "COLUMNS": "400"})
    code = cli(["run", "--no-agent", "--runs-dir", str(tmp_path / "runs[bold]y[/]"), "--", str(script)], env)
    err = env.stderr.getvalue()
    assert int(code) == 0, f"expected exit 0, seen {code}: {err[-2000:]}"
    _assert_literal(err, "titan run", strings=("runs[bold]y[/]",))


def _fault_verdict(**kw):
    from titan.chaos.verdict import FaultVerdict

    base = dict(id="f0-kill", kind="kill", what=None, rank=1, node=None, step=18, expected="detected; restart",
                expected_text="", injected=True, detected=True, detected_by=f"launcher (worker.failed {GLOO})",
                detection_s=1.2, attributed_ok=True, attribution=f"rank 1 [bold] {GLOO}", recovered=True,
                recovery="restart [/]", rto_s=3.0, steps_lost=2, final_state_equal=True, passed=False,
                checks={"detected [bold]": False})
    base.update(kw)
    return FaultVerdict(**base)


def test_plan_drill_tables_print_data_literally(tmp_path):
    from titan.chaos.drills import PlanReport
    from titan.cli._drill_plan import _print

    report = PlanReport(passed=False, run_dir=str(tmp_path / "[bold]run"), plan="p[/]", nodes=1, steps=30,
                        target_steps=30, failures=1, restarts=1, submissions=1, rto_s=3.0, steps_recomputed=2,
                        final_state_equal=True, reference=None, skipped_steps=[], launcher_exit=[0], wall_s=20.0,
                        reference_s=None, faults=[_fault_verdict()], problems=[f"problem {GLOO}"])
    env = Environment.captured(tmp_path, env={"COLUMNS": "400"})
    _print(env, report)
    out = env.stdout.getvalue()
    _assert_literal(out, "titan drill --plan table")
    assert "[bold]run" in out and "p[/]" in out, out


def test_foundation_drill_table_prints_data_literally(tmp_path):
    from titan.chaos.drill import DrillConfig, DrillReport
    from titan.cli.cmd_drill import _print

    report = DrillReport(passed=False, run_dir=str(tmp_path / "[bold]run"), steps=60, target_steps=60, failures=1,
                         restarts=1, rto_s=2.0, steps_lost=5, steps_recomputed=5,
                         kill={"rank": 1, "pid": 123, "step": 35}, resumed_from=30, launcher_exit=0,
                         checks={f"check {GLOO}": True}, wall_s=20.0, problems=["[/] went wrong"])
    env = Environment.captured(tmp_path, env={"COLUMNS": "400"})
    _print(env, DrillConfig(), report)
    _assert_literal(env.stdout.getvalue(), "titan drill (kill) table")


def test_preflight_compare_prints_values_literally(tmp_path):
    a, b = tmp_path / "a[bold].json", tmp_path / "b.json"
    a.write_text(json.dumps({"torch": {"version": f"2.13 {GLOO}"}, "env": {"X": "[/]"}}))
    b.write_text(json.dumps({"torch": {"version": "2.13 [bold]"}, "env": {"X": "1"}}))
    code, out, err = _cli(tmp_path, "preflight", "--compare", str(a), str(b))
    assert code != 0 and "Traceback" not in err, f"expected a mismatch exit, seen {code}: {err[-2000:]}"
    _assert_literal(out, "titan preflight --compare", strings=(*TRICKY, "a[bold].json"))


def test_nodes_prints_node_ids_and_details_literally(tmp_path):
    from titan.ledger import Ledger

    path = tmp_path / "ledger.sqlite"
    led = Ledger(path)
    led.add("node[bold]", "guard", run="r[/]", detail=TEXT)
    code, out, err = _cli(tmp_path, "nodes", "--ledger", str(path), "--strikes")
    assert code == 0, f"expected exit 0, seen {code}: {err[-2000:]}"
    _assert_literal(out, "titan nodes --strikes", strings=("node[bold]", "r[/]", GLOO))
    code, out, err = _cli(tmp_path, "nodes", "--ledger", str(path))
    assert code == 0, f"expected exit 0, seen {code}: {err[-2000:]}"
    _assert_literal(out, "titan nodes", strings=("node[bold]",))


def test_ckpt_ls_prints_manifest_problems_literally(tmp_path):
    ck = tmp_path / "checkpoints" / "step-00000005"
    ck.mkdir(parents=True)
    (ck / "manifest.json").write_text(json.dumps({"format": "titan-checkpoint", "version": f"{GLOO} [bold] [/]",
                                                  "files": {}, "step": 5}))
    code, out, err = _cli(tmp_path, "ckpt", "ls", str(tmp_path))
    assert code == 0, f"expected exit 0, seen {code}: {err[-2000:]}"
    _assert_literal(out, "titan ckpt ls")


def test_gather_prints_conflicting_names_literally(tmp_path):
    parts = []
    for i in range(2):
        p = tmp_path / f"part{i}"
        (p / "events").mkdir(parents=True)
        (p / "run.json").write_text(json.dumps({"run_id": "r"}))
        (p / "worker[bold]x[red].log").write_text(f"version {i}\n")
        parts.append(str(p))
    code, out, err = _cli(tmp_path, "gather", str(tmp_path / "merged"), *parts)
    assert code == 0, f"expected exit 0, seen {code}: {err[-2000:]}"
    _assert_literal(err, "titan gather", strings=("worker[bold]x[red].log",))


_TAG = re.compile(r"\[/\]|\[/?(bold|dim|italic|red|green|yellow|blue|cyan|magenta|white|reverse|underline)( [a-z ]+)?\]")


def test_cli_sources_carry_no_markup_tags():
    """Consoles print with markup off: a ``[red]…[/]`` in the CLI's code would show literally."""
    root = Path(__file__).resolve().parents[2] / "src" / "titan" / "cli"
    hits = []
    for f in sorted(root.glob("*.py")):
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if _TAG.search(line) and "``" not in line and not line.lstrip().startswith("#"):
                hits.append(f"{f.name}:{n}: {line.strip()}")
    assert not hits, "style with rich.text.Text / titan.cli.environment.styled, not markup tags:\n" + "\n".join(hits)


def test_console_keeps_brackets_and_styles_its_own_words(tmp_path):
    from titan.cli.environment import styled

    env = Environment.captured(tmp_path, env={"COLUMNS": "200"})
    env.console.print(styled(("problem:", "red"), f" {TEXT}"))
    env.console.print(f"{GLOO} [bold]x[/]")
    out = env.stdout.getvalue()
    assert out.splitlines() == [f"problem: {TEXT}", f"{GLOO} [bold]x[/]"], out
    assert sys.stdout is not env.stdout
