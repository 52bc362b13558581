"""The bad-input table of `tests/cli/test_bad_input.py`: one ``Case`` per bad input.

Every verb and every flag has at least one case (``test_every_flag_of_every_verb_has_a_case``
checks it against the real parser). A case names the argv, the exit code ``titan --help``
documents for it, and a substring its ``titan: error:`` line must hold. ``setup`` prepares
the workspace copy first (damaged checkpoints, odd files); ``env`` adds variables.

Workspace files (built once per module, copied per case): ``ok.py`` (a script), ``file.txt``,
``garbage.bin`` (binary), ``list.json`` (a JSON list), ``bad.toml`` (not TOML), ``fp.json``
(a fingerprint), ``run/`` (a run directory with events and two real checkpoints, steps 2 and
4), ``ledger.sqlite`` (a node ledger with one strike), ``notsqlite.db``, ``other.sqlite`` (an
SQLite file without a ledger table) and ``plans/*.toml`` (fault plans, each wrong one way).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Callable

ESC = "\x1b"


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    argv: tuple[str, ...]
    needle: str  # in the `titan: error:` line (or in stdout when ``error`` is False)
    code: int = 2
    setup: Callable[[Path], None] | None = None
    env: tuple[tuple[str, str], ...] = ()
    error: bool = True  # exactly one error line + hint (False: a listing that reports damage)
    subprocess: bool = False  # a real `python -m titan` process instead of in-process
    spawn_ok: bool = False  # the case legitimately runs a command (gather --fetch-command)


def c(id: str, *argv: str, needle: str, **kw) -> Case:  # noqa: A002, ANN003
    return Case(id=id, argv=tuple(argv), needle=needle, **kw)


# --- workspace damage helpers -------------------------------------------------------------
def _ck(ws: Path) -> Path:
    return ws / "run" / "checkpoints"


def latest_is_a_dir(ws: Path) -> None:
    (_ck(ws) / "latest").unlink()
    (_ck(ws) / "latest").mkdir()


def truncated_metadata(ws: Path) -> None:
    md = _ck(ws) / "step-00000004" / ".metadata"
    md.write_bytes(md.read_bytes()[:40])


def garbage_metadata(ws: Path) -> None:
    md = _ck(ws) / "step-00000004" / ".metadata"
    md.write_bytes(bytes((i * 37) % 256 for i in range(md.stat().st_size)))


def _edit_manifest(ws: Path, fn: Callable[[dict], None]) -> None:
    p = _ck(ws) / "step-00000004" / "manifest.json"
    m = json.loads(p.read_text())
    fn(m)
    p.write_text(json.dumps(m))


def manifest_without_size(ws: Path) -> None:
    _edit_manifest(ws, lambda m: m["files"][".metadata"].pop("size"))


def manifest_string_crc(ws: Path) -> None:
    _edit_manifest(ws, lambda m: m["files"][".metadata"].update(crc32="deadbeef"))


def manifest_dev_zero(ws: Path) -> None:
    _edit_manifest(ws, lambda m: m["files"].update({"/dev/zero": {"size": 0, "crc32": 0}}))


def manifest_garbage(ws: Path) -> None:
    (_ck(ws) / "step-00000004" / "manifest.json").write_bytes(b"\x00\xff{not json")


def manifest_missing(ws: Path) -> None:
    (_ck(ws) / "step-00000004" / "manifest.json").unlink()


def run_json_garbled(ws: Path) -> None:
    (ws / "run" / "run.json").write_text("{not json")


def only_step_events(ws: Path) -> None:
    for f in (ws / "run" / "events").iterdir():
        if not f.name.startswith("n0.rank0.attempt0.1."):
            f.unlink()


def second_run(ws: Path) -> None:
    shutil.copytree(ws / "run", ws / "run2")


def out_dir_with_file(ws: Path) -> None:
    (ws / "outdir").mkdir()
    (ws / "outdir" / "x").write_text("x")


def existing_drill_run(ws: Path) -> None:
    (ws / "runs" / "badinput-old" / "chaos").mkdir(parents=True)
    (ws / "runs" / "badinput-old" / "chaos" / "verdict.json").write_text('{"passed": true}')


def overhead_files(ws: Path) -> None:
    (ws / "ov_types.json").write_text(json.dumps({"guard": {"fraction": "abc"}}))
    (ws / "ov_nan.json").write_text('{"guard": {"fraction": NaN}}')
    (ws / "ov_list.json").write_text(json.dumps({"guard": [1, 2]}))
    (ws / "ov_key.json").write_text(json.dumps({"guard": {"speedup": 2}}))
    (ws / "ov_empty.json").write_text("{}")


PLANS = {
    "rank7": '[[faults]]\nkind = "kill"\nrank = 7\nstep = 5\n',
    "rank_neg": '[[faults]]\nkind = "kill"\nrank = -1\nstep = 5\n',
    "factor_str": '[[faults]]\nkind = "spike"\nrank = 0\nstep = 5\nfactor = "abc"\n',
    "signal": '[[faults]]\nkind = "kill"\nrank = 0\nstep = 5\nsignal = "SIGFOO"\n',
    "step_bool": '[[faults]]\nkind = "kill"\nrank = 0\nstep = true\n',
    "step_zero": '[[faults]]\nkind = "kill"\nrank = 0\nstep = 0\n',
    "kind": '[[faults]]\nkind = "meteor"\nstep = 5\n',
    "param": '[[faults]]\nkind = "kill"\nrank = 0\nstep = 5\nforce = 3\n',
    "where": '[[faults]]\nkind = "hang"\nrank = 0\nstep = 5\nwhere = "moon"\n',
    "seconds_inf": '[[faults]]\nkind = "hang"\nrank = 0\nstep = 5\nseconds = inf\n',
    "node": '[[faults]]\nkind = "kill"\nrank = 0\nstep = 5\nnode = "a/b"\n',
    "bit": '[[faults]]\nkind = "bitflip"\nrank = 0\nstep = 5\nbit = 64\n',
    "empty": 'name = "nothing"\n',
    "not_table": 'faults = 3\n',
    "syntax": '[[faults]\nkind = \n',
    "late": '[[faults]]\nkind = "kill"\nrank = 0\nstep = 500\n',
}


def _p(name: str) -> str:
    return f"plans/{name}.toml"


ZERO = ("zero", "/dev/zero")

CASES: list[Case] = [
    # ---- top level -------------------------------------------------------------------------
    c("top: no verb", needle="no verb given"),
    c("top: unknown verb", "frobnicate", needle="invalid choice: 'frobnicate'"),
    c("top: unknown global flag", "--frobnicate", needle="unrecognized arguments"),
    c("top: python -m titan without a verb", needle="no verb given", subprocess=True),
    c("top: escape bytes in an argument", "events", f"{ESC}[31mred", needle="contains a control character"),
    c("top: escape bytes in a --set value", "run", "--set", f"run.node_id=a{ESC}]0;pwned", "--", "ok.py",
      needle="contains a control character"),

    # ---- run -------------------------------------------------------------------------------
    c("run: --explain-timeouts with a bad --rdzv-conf", "run", "--explain-timeouts", "--rdzv-conf", "bogus",
      needle="is not KEY=VALUE"),
    c("run: no script", "run", needle="no training script"),
    c("run: missing script", "run", "--", "nope.py", needle="training script 'nope.py' does not exist"),
    c("run: script is a folder", "run", "--", "run", needle="does not exist"),
    c("run: -m without module", "run", "--", "-m", needle="-m needs a module name"),
    c("run: missing module", "run", "--", "-m", "titan_no_such_module_xyz", needle="not found"),
    c("run: launcher option after --", "run", "--", "--nproc-per-node", "2", needle="unknown launcher option"),
    c("run: --nproc-per-node 0", "run", "--nproc-per-node", "0", "--", "ok.py", needle="--nproc-per-node '0'"),
    c("run: --nproc-per-node 1e12", "run", "--nproc-per-node", "1000000000000", "--", "ok.py",
      needle="is not a number within 1 … 1024"),
    c("run: --nproc-per-node text", "run", "--nproc-per-node", "many", "--", "ok.py", needle="--nproc-per-node 'many'"),
    c("run: --nnodes 2:1", "run", "--nnodes", "2:1", "--", "ok.py", needle="need 0 < MIN <= MAX"),
    c("run: --nnodes garbage", "run", "--nnodes", "x:y", "--", "ok.py", needle="is not N or MIN:MAX"),
    c("run: --nnodes 1e9", "run", "--nnodes", "1:1000000000", "--rdzv-endpoint", "h:1", "--run-id", "a", "--", "ok.py",
      needle="at most 100,000 nodes"),
    c("run: multi-node without endpoint", "run", "--nnodes", "1:2", "--", "ok.py", needle="needs --rdzv-endpoint"),
    c("run: multi-node without run id", "run", "--nnodes", "2", "--rdzv-endpoint", "h:29400", "--", "ok.py",
      needle="needs --run-id"),
    c("run: unknown --rdzv-backend", "run", "--rdzv-backend", "zk", "--", "ok.py", needle="unknown --rdzv-backend"),
    c("run: --rdzv-endpoint garbage:::", "run", "--nnodes", "2", "--rdzv-endpoint", "garbage:::", "--run-id", "a",
      "--", "ok.py", needle="--rdzv-endpoint 'garbage:::' is not HOST[:PORT]"),
    c("run: --rdzv-endpoint shell", "run", "--rdzv-endpoint", "h;rm -rf x:1", "--", "ok.py", needle="bad host"),
    c("run: --rdzv-endpoint port 0", "run", "--rdzv-endpoint", "h:0", "--", "ok.py", needle="bad port '0'"),
    c("run: --rdzv-endpoint port 70000", "run", "--rdzv-endpoint", "h:70000", "--", "ok.py", needle="bad port '70000'"),
    c("run: --rdzv-id with a slash", "run", "--rdzv-id", "a/b", "--", "ok.py", needle="invalid rendezvous id"),
    c("run: --rdzv-conf not K=V", "run", "--rdzv-conf", "is_host", "--", "ok.py", needle="is not KEY=VALUE"),
    c("run: --rdzv-conf bad number", "run", "--rdzv-conf", "join_timeout=abc", "--", "ok.py",
      needle="join_timeout='abc' is not a whole number"),
    c("run: --rdzv-conf bad bool", "run", "--rdzv-conf", "is_host=maybe", "--", "ok.py", needle="is not a boolean"),
    c("run: --rdzv-conf unknown key", "run", "--rdzv-conf", "colour=blue", "--", "ok.py",
      needle="unknown --rdzv-conf key 'colour'"),
    c("run: --max-restarts -1", "run", "--max-restarts", "-1", "--", "ok.py", needle="--max-restarts: -1 is out of range"),
    c("run: --max-restarts text", "run", "--max-restarts", "lots", "--", "ok.py", needle="'lots' is not a whole number"),
    c("run: --node-id with a slash", "run", "--node-id", "a/b", "--", "ok.py", needle="invalid node id"),
    c("run: --run-id ..", "run", "--run-id", "../x", "--", "ok.py", needle="invalid run id"),
    c("run: --run-id with a trailing newline", "run", "--run-id", "x\n", "--", "ok.py", needle="invalid run id"),
    c("run: --runs-dir under a file", "run", "--runs-dir", "file.txt/runs", "--", "ok.py",
      needle="cannot create run directory"),
    c("run: --local-addr shell", "run", "--local-addr", "a;b", "--", "ok.py", needle="--local-addr 'a;b'"),
    c("run: --local-addr 999.1.1.1", "run", "--local-addr", "999.1.1.1", "--", "ok.py", needle="not a host name"),
    c("run: --rdzv-secret-file missing", "run", "--rdzv-secret-file", "nope.secret", "--", "ok.py",
      needle="secret file nope.secret does not exist"),
    c("run: --rdzv-secret-file is a device", "run", "--rdzv-secret-file", "/dev/zero", "--", "ok.py",
      needle="not a regular file"),
    c("run: --insecure-rdzv does not hide a bad flag", "run", "--insecure-rdzv", "--nnodes", "0", "--", "ok.py",
      needle="--nnodes"),
    c("run: --no-agent does not hide a bad flag", "run", "--no-agent", "--nproc-per-node", "-2", "--", "ok.py",
      needle="--nproc-per-node"),
    c("run: --json error stays one line", "run", "--json", "--nproc-per-node", "0", "--", "ok.py",
      needle="--nproc-per-node '0'"),
    c("run: --config missing", "run", "--config", "none.toml", "--", "ok.py", needle="cannot read settings file"),
    c("run: --config not TOML", "run", "--config", "bad.toml", "--", "ok.py", needle="is not valid TOML"),
    c("run: --config /dev/zero", "run", "--config", "/dev/zero", "--", "ok.py", needle="is not a regular file"),
    c("run: --config binary", "run", "--config", "garbage.bin", "--", "ok.py", needle="is not UTF-8 text"),
    c("run: --set without =", "run", "--set", "run.max_restarts", "--", "ok.py", needle="is not SECTION.FIELD=VALUE"),
    c("run: --set unknown section", "run", "--set", "bogus.x=1", "--", "ok.py", needle="unknown settings section"),
    c("run: --set unknown key", "run", "--set", "run.bogus=1", "--", "ok.py", needle="unknown setting run.bogus"),
    c("run: --set wrong type", "run", "--set", "run.max_restarts=abc", "--", "ok.py", needle="is not a valid int"),
    c("run: --set inf join + 1e15 pg", "run", "--set", "run.rdzv_join_timeout_s=inf", "--set", "dist.pg_timeout_s=1e15",
      "--", "ok.py", needle="pg_timeout_s = 1e+15 is out of range"),
    c("run: --set join inf", "run", "--set", "run.rdzv_join_timeout_s=inf", "--", "ok.py",
      needle="rdzv_join_timeout_s = inf is not a finite number"),
    c("run: --set pg nan", "run", "--set", "dist.pg_timeout_s=nan", "--", "ok.py", needle="is not a finite number"),
    c("run: --set pg above join", "run", "--set", "dist.pg_timeout_s=700", "--", "ok.py",
      needle="dist.pg_timeout_s (700) must be < run.rdzv_join_timeout_s (600)"),
    c("run: --set warm-up above pg", "run", "--set", "watchdog.warmup_timeout_s=1000", "--", "ok.py",
      needle="watchdog.warmup_timeout_s (1000) must be < dist.pg_timeout_s (300)"),
    c("run: --set idle above pg", "run", "--set", "watchdog.idle_timeout_s=400", "--", "ok.py",
      needle="watchdog.idle_timeout_s (400) must be < dist.pg_timeout_s"),
    c("run: --set 1e6 s heartbeat", "run", "--set", "run.rdzv_keep_alive_interval_s=1000000", "--", "ok.py",
      needle="the rendezvous heartbeat"),
    c("run: --set a spinning monitor interval", "run", "--set", "run.monitor_interval_s=1e-9", "--", "ok.py",
      needle="monitor_interval_s = 1e-09 is out of range"),
    c("run: --set a spinning watchdog poll", "run", "--set", "watchdog.poll_interval_s=0", "--", "ok.py",
      needle="poll_interval_s = 0 is out of range"),
    c("run: --set guard.spike_z inf", "run", "--set", "guard.spike_z=inf", "--", "ok.py", needle="spike_z = inf"),
    c("run: --set agent interval nan", "run", "--set", "agent.sample_event_every_s=nan", "--", "ok.py",
      needle="sample_event_every_s = nan"),
    c("run: --set 1e308 queue", "run", "--set", "events.queue_size=100000000000", "--", "ok.py",
      needle="queue_size = 100,000,000,000 is out of range"),
    c("run: --set node id escapes in env", "run", "--", "ok.py", env=(("TITAN_NODE_ID", f"n{ESC}[2J"),),
      needle="invalid node id"),
    c("run: env setting not a number", "run", "--", "ok.py", env=(("TITAN_RUN_MAX_RESTARTS", "abc"),),
      needle="environment TITAN_RUN_MAX_RESTARTS"),
    c("run: env setting inf", "run", "--", "ok.py", env=(("TITAN_DIST_PG_TIMEOUT_S", "inf"),), needle="is not a finite number"),
    c("run: subprocess --nproc-per-node 0", "run", "--nproc-per-node", "0", "--", "ok.py", needle="--nproc-per-node",
      subprocess=True),

    # ---- drill -----------------------------------------------------------------------------
    c("drill: --set bogus=1", "drill", "--set", "bogus=1", needle="is not SECTION.FIELD=VALUE"),
    c("drill: --set unknown setting", "drill", "--set", "guard.bogus=1", needle="unknown setting guard.bogus"),
    c("drill: --set pg 700", "drill", "--set", "dist.pg_timeout_s=700", needle="timeout hierarchy violated"),
    c("drill: --set inf", "drill", "--set", "guard.spike_z=inf", needle="spike_z = inf"),
    c("drill: --nproc 0", "drill", "--nproc", "0", needle="--nproc: 0 is out of range"),
    c("drill: --nproc 1e6", "drill", "--nproc", "1000000", needle="out of range"),
    c("drill: --nproc-per-node 0", "drill", "--nproc-per-node", "0", needle="--nproc-per-node/--nproc: 0 is out of range"),
    c("drill: a script that does not exist", "drill", "--", "nothere.py", needle="training script 'nothere.py' does not exist"),
    c("drill: --steps with a script", "drill", "--steps", "10", "--", "ok.py", needle="--steps does not apply to a script"),
    c("drill: --nodes 2 with a script", "drill", "--nodes", "2", "--", "ok.py", needle="--nodes 2 drills the built-in"),
    c("drill: a tinygpt-only plan for a script", "drill", "--plan", "net", "--", "ok.py",
      needle="made for tinygpt's steps"),
    c("drill: the kill drill with a script", "drill", "--kill-rank", "1", "--", "ok.py",
      needle="kill drill of the built-in workload"),
    c("drill: --timeout 0", "drill", "--timeout", "0", needle="--timeout: 0 s is out of range"),
    c("drill: --timeout nan", "drill", "--timeout", "nan", needle="'nan' is not a finite number"),
    c("drill: --steps 0", "drill", "--steps", "0", needle="--steps: 0 is out of range"),
    c("drill: --steps before the plan's last fault", "drill", "--steps", "5", needle="ends before the plan's last fault"),
    c("drill: --ckpt-every 0", "drill", "--ckpt-every", "0", "--kill-rank", "1", needle="--ckpt-every: 0 is out of range"),
    c("drill: --ckpt-every 1 kill drill", "drill", "--ckpt-every", "1", "--kill-rank", "1",
      needle="checkpoints at least 2 steps apart"),
    c("drill: --kill-rank 5 of 2", "drill", "--kill-rank", "5", needle="--kill-rank 5 is not a rank of 2"),
    c("drill: --kill-rank -1", "drill", "--kill-rank", "-1", needle="--kill-rank: -1 is out of range"),
    c("drill: --kill-after-ckpt 7", "drill", "--kill-after-ckpt", "7", needle="--kill-after-ckpt 7 is not a checkpoint step"),
    c("drill: --kill-after-ckpt past the end", "drill", "--kill-after-ckpt", "60", needle="ends before the kill"),
    c("drill: --lost-steps 10", "drill", "--lost-steps", "10", needle="lost steps must be within"),
    c("drill: --lost-steps 0", "drill", "--lost-steps", "0", needle="--lost-steps: 0 is out of range"),
    c("drill: --plan quick --kill-rank 1", "drill", "--plan", "quick", "--kill-rank", "1",
      needle="does not take --plan"),
    c("drill: --no-reference with the kill drill", "drill", "--kill-rank", "1", "--no-reference",
      needle="does not take --no-reference"),
    c("drill: --set with the kill drill", "drill", "--lost-steps", "3", "--set", "guard.enabled=false",
      needle="does not take --set"),
    c("drill: --nodes 2 with the kill drill", "drill", "--kill-after-ckpt", "10", "--nodes", "2",
      needle="does not take --nodes"),
    c("drill: --nodes 3", "drill", "--nodes", "3", needle="invalid choice: 3"),
    c("drill: --node-local on one node", "drill", "--plan", "node-loss", "--node-local",
      needle="--node-local needs --nodes 2"),
    c("drill: node-loss plan with shared checkpoints", "drill", "--plan", "node-loss", "--nodes", "2",
      needle="without --node-local the checkpoints are shared"),
    c("drill: --node-local with the kill drill", "drill", "--kill-rank", "1", "--node-local",
      needle="does not take --node-local"),
    c("drill: --duration without soak", "drill", "--duration", "60", needle="--duration only applies to --plan soak"),
    c("drill: --every without soak", "drill", "--plan", "quick", "--every", "5", needle="--every only applies"),
    c("drill: --duration inf", "drill", "--plan", "soak", "--duration", "inf", needle="not a finite number"),
    c("drill: --every 0", "drill", "--plan", "soak", "--every", "0", needle="--every: 0 s is out of range"),
    c("drill: soak --every > --duration", "drill", "--plan", "soak", "--duration", "10", "--every", "20",
      needle="soak needs 0 < --every <= --duration"),
    c("drill: --seed -1", "drill", "--seed", "-1", needle="--seed: -1 is out of range"),
    c("drill: --seed 2**40", "drill", "--seed", str(2**40), needle="out of range"),
    c("drill: --run-id existing", "drill", "--run-id", "badinput-old", setup=existing_drill_run,
      needle="already exists"),
    c("drill: --run-id existing (kill drill)", "drill", "--kill-rank", "1", "--run-id", "badinput-old",
      setup=existing_drill_run, needle="already exists"),
    c("drill: --run-id ../x", "drill", "--run-id", "../x", needle="invalid run id"),
    c("drill: --runs-dir is a file", "drill", "--runs-dir", "file.txt", needle="--runs-dir file.txt is not a folder"),
    c("drill: --json error", "drill", "--json", "--nproc", "0", needle="--nproc: 0 is out of range"),
    c("drill: --plan unknown", "drill", "--plan", "nosuchplan", needle="no built-in plan and no file"),
    c("drill: --plan /dev/zero", "drill", "--plan", "/dev/zero", needle="is not a regular file"),
    c("drill: plan rank 7 of 2", "drill", "--plan", _p("rank7"), needle="names rank 7, but the drill has 2 rank(s)"),
    c("drill: plan rank -1", "drill", "--plan", _p("rank_neg"), needle="rank must be a whole number >= 0"),
    c("drill: plan factor 'abc'", "drill", "--plan", _p("factor_str"), needle="factor must be a finite number"),
    c("drill: plan signal SIGFOO", "drill", "--plan", _p("signal"), needle="'SIGFOO' is not a signal name"),
    c("drill: plan step = true", "drill", "--plan", _p("step_bool"), needle="step must be a whole number"),
    c("drill: plan step 0", "drill", "--plan", _p("step_zero"), needle="step must be a whole number"),
    c("drill: plan unknown kind", "drill", "--plan", _p("kind"), needle="unknown fault kind 'meteor'"),
    c("drill: plan unknown parameter", "drill", "--plan", _p("param"), needle="unknown parameter(s) force"),
    c("drill: plan hang where=moon", "drill", "--plan", _p("where"), needle="'moon' is not one of"),
    c("drill: plan seconds inf", "drill", "--plan", _p("seconds_inf"), needle="seconds must be a finite number"),
    c("drill: plan node a/b", "drill", "--plan", _p("node"), needle="invalid node id"),
    c("drill: plan bit 64", "drill", "--plan", _p("bit"), needle="bit must be a whole number within 0 … 63"),
    c("drill: plan without faults", "drill", "--plan", _p("empty"), needle="has no faults"),
    c("drill: plan faults not a list", "drill", "--plan", _p("not_table"), needle="'faults' must be a list"),
    c("drill: plan syntax error", "drill", "--plan", _p("syntax"), needle="does not parse"),
    c("drill: plan fault past --steps", "drill", "--plan", _p("late"), "--steps", "40", needle="ends before the plan's"),

    # ---- events ----------------------------------------------------------------------------
    c("events: missing run dir", "events", "nope", needle="does not exist"),
    c("events: a file", "events", "file.txt", needle="does not exist"),
    c("events: not a run dir", "events", "plans", needle="is not a Titan run directory"),
    c("events: garbled run.json", "events", "run", setup=run_json_garbled, needle="is not valid JSON"),
    c("events: --kind with spaces", "events", "run", "--kind", "a b", needle="is not an event kind"),
    c("events: --rank -5", "events", "run", "--rank", "-5", needle="--rank: -5 is out of range"),
    c("events: --rank text", "events", "run", "--rank", "one", needle="is not a whole number"),
    c("events: --node a/b", "events", "run", "--node", "a/b", needle="invalid node id"),
    c("events: --since garbage", "events", "run", "--since", "yesterday", needle="cannot parse time 'yesterday'"),
    c("events: --since nan", "events", "run", "--since", "nan", needle="is not within 1970 … 9999"),
    c("events: --until 1e400", "events", "run", "--until", "1e400", needle="is not within 1970 … 9999"),
    c("events: --since after --until", "events", "run", "--since", "2000", "--until", "1000",
      needle="--since is after --until"),
    c("events: --level bogus", "events", "run", "--level", "bogus", needle="invalid choice: 'bogus'"),
    c("events: --json error", "events", "nope", "--json", needle="does not exist"),

    # ---- preflight -------------------------------------------------------------------------
    c("preflight: --nproc 0", "preflight", "--nproc", "0", needle="--nproc: 0 is out of range"),
    c("preflight: --nproc 100000", "preflight", "--nproc", "100000", needle="out of range"),
    c("preflight: --max-bytes 1", "preflight", "--max-bytes", "1", needle="--max-bytes: 1 is out of range"),
    c("preflight: --max-bytes 1e15", "preflight", "--max-bytes", "1000000000000000", needle="out of range"),
    c("preflight: --duration nan", "preflight", "--duration", "nan", needle="not a finite number"),
    c("preflight: --duration -1", "preflight", "--duration", "-1", needle="--duration: -1 s is out of range"),
    c("preflight: --io-bytes 0", "preflight", "--io-bytes", "0", needle="--io-bytes: 0 is out of range"),
    c("preflight: --io-dir file.txt", "preflight", "--io-dir", "file.txt", needle="--io-dir file.txt is not an existing folder"),
    c("preflight: --io-dir missing", "preflight", "--io-dir", "nope/ckpt", needle="is not an existing folder"),
    c("preflight: --io-dir file.txt (subprocess)", "preflight", "--io-dir", "file.txt", needle="is not an existing folder",
      subprocess=True),
    c("preflight: --packages shell", "preflight", "--packages", "torch;rm", needle="is not a package name"),
    c("preflight: --baseline a list", "preflight", "--baseline", "list.json", needle="is not a fingerprint"),
    c("preflight: --baseline missing", "preflight", "--baseline", "nope.json", needle="cannot read --baseline file"),
    c("preflight: --baseline binary", "preflight", "--baseline", "garbage.bin", needle="is not UTF-8 text"),
    c("preflight: --compare binary", "preflight", "--compare", "garbage.bin", "fp.json", needle="is not UTF-8 text"),
    c("preflight: --compare a list", "preflight", "--compare", "list.json", "fp.json", needle="is not a fingerprint"),
    c("preflight: --compare not JSON", "preflight", "--compare", "bad.toml", "fp.json", needle="is not valid JSON"),
    c("preflight: --compare /dev/zero", "preflight", "--compare", "/dev/zero", "fp.json", needle="is not a regular file"),
    c("preflight: --compare one file", "preflight", "--compare", "fp.json", needle="needs two or more fingerprints"),
    c("preflight: --save and --compare", "preflight", "--save", "x.json", "--compare", "fp.json",
      needle="not allowed with argument --save"),
    c("preflight: --save into a missing folder", "preflight", "--save", "nodir/x.json", needle="does not exist"),
    c("preflight: --save onto a folder", "preflight", "--save", "run", needle="--save run is a folder"),
    c("preflight: --timeout 0", "preflight", "--timeout", "0", needle="--timeout: 0 s is out of range"),
    c("preflight: --timeout inf", "preflight", "--timeout", "inf", needle="not a finite number"),
    c("preflight: --config bad", "preflight", "--config", "bad.toml", needle="is not valid TOML"),
    c("preflight: --set bad", "preflight", "--set", "dist.pg_timeout_s=-1", needle="pg_timeout_s = -1 is out of range"),
    c("preflight: --json error", "preflight", "--json", "--nproc", "0", needle="out of range"),

    # ---- plan ------------------------------------------------------------------------------
    c("plan: --gpus missing", "plan", needle="the following arguments are required: --gpus"),
    c("plan: --gpus 0", "plan", "--gpus", "0", needle="--gpus: 0 is out of range"),
    c("plan: --gpus 1e12", "plan", "--gpus", "1000000000000", "--no-sim", needle="1,000,000,000,000 is out of range"),
    c("plan: --gpus 1e12 as float", "plan", "--gpus", "1e12", needle="'1e12' is not a whole number"),
    c("plan: --fleet unknown", "plan", "--gpus", "8", "--fleet", "mars", needle="invalid choice: 'mars'"),
    c("plan: --fleet with --mtbi-h", "plan", "--gpus", "8", "--fleet", "llama3", "--mtbi-h", "3",
      needle="--fleet and --mtbi-h both give the failure rate"),
    c("plan: --mtbi-h and --rate-per-gpu-hour", "plan", "--gpus", "8", "--mtbi-h", "5", "--rate-per-gpu-hour", "0.1",
      needle="not allowed with argument --mtbi-h"),
    c("plan: --mtbi-h 1e-300", "plan", "--gpus", "8", "--mtbi-h", "1e-300", needle="--mtbi-h: 1e-300 h is out of range"),
    c("plan: --mtbi-h nan", "plan", "--gpus", "8", "--mtbi-h", "nan", needle="not a finite number"),
    c("plan: --rate-per-gpu-hour inf", "plan", "--gpus", "8", "--rate-per-gpu-hour", "inf", needle="not a finite number"),
    c("plan: --rate-per-gpu-hour 0", "plan", "--gpus", "8", "--rate-per-gpu-hour", "0", needle="out of range"),
    c("plan: rate too high for the GPUs", "plan", "--gpus", "10000000", "--rate-per-gpu-hour", "10", "--no-sim",
      needle="means an interruption every"),
    c("plan: --ckpt-stall-s 1e308", "plan", "--gpus", "8", "--ckpt-stall-s", "1e308", needle="1e+308 s is out of range"),
    c("plan: --ckpt-stall-s -1", "plan", "--gpus", "8", "--ckpt-stall-s", "-1", needle="out of range"),
    c("plan: --restart-s nan", "plan", "--gpus", "8", "--restart-s", "nan", "--no-sim", needle="'nan' is not a finite number"),
    c("plan: --restart-s 1e300", "plan", "--gpus", "8", "--restart-s", "1e300", needle="out of range"),
    c("plan: --interval-s 0", "plan", "--gpus", "8", "--interval-s", "0", needle="--interval-s: 0 s is out of range"),
    c("plan: --interval-s nan", "plan", "--gpus", "8", "--interval-s", "nan", needle="not a finite number"),
    c("plan: --from missing", "plan", "--gpus", "8", "--from", "nope", needle="does not exist"),
    c("plan: --from with both costs", "plan", "--gpus", "8", "--from", "run", "--ckpt-stall-s", "5", "--restart-s", "60",
      needle="--from measures what"),
    c("plan: --from a run without saves or restarts", "plan", "--gpus", "8", "--from", "run",
      setup=only_step_events, needle="has no checkpoint saves and no restarts"),
    c("plan: --replicas 1e9", "plan", "--gpus", "8", "--replicas", "1000000000", needle="out of range"),
    c("plan: --replicas 0", "plan", "--gpus", "8", "--replicas", "0", needle="--replicas: 0 is out of range"),
    c("plan: --replicas with --no-sim", "plan", "--gpus", "8", "--replicas", "4", "--no-sim",
      needle="--no-sim skips the simulation that --replicas configures"),
    c("plan: --horizon-days inf", "plan", "--gpus", "8", "--horizon-days", "inf", needle="not a finite number"),
    c("plan: --horizon-days 0", "plan", "--gpus", "8", "--horizon-days", "0", needle="out of range"),
    c("plan: --seed -1", "plan", "--gpus", "8", "--seed", "-1", needle="--seed: -1 is out of range"),
    c("plan: --seed with --no-sim", "plan", "--gpus", "8", "--seed", "3", "--no-sim", needle="--no-sim skips"),
    c("plan: --json error", "plan", "--gpus", "0", "--json", needle="out of range"),

    # ---- report ----------------------------------------------------------------------------
    c("report: missing run dir", "report", "nope", needle="does not exist"),
    c("report: second run dir missing (nothing written for the first)", "report", "run", "nope", needle="nope does not exist"),
    c("report: a run dir twice", "report", "run", "run", needle="is given twice"),
    c("report: garbled run.json", "report", "run", setup=run_json_garbled, needle="is not valid JSON"),
    c("report: --sla-hours nan", "report", "run", "--sla-hours", "nan", needle="'nan' is not a finite number"),
    c("report: --sla-hours inf", "report", "run", "--sla-hours", "inf", needle="not a finite number"),
    c("report: --sla-hours 0", "report", "run", "--sla-hours", "0", needle="--sla-hours: 0 h is out of range"),
    c("report: --overhead binary", "report", "run", "--no-triage", "--overhead", "garbage.bin", needle="is not UTF-8 text"),
    c("report: --overhead /dev/zero", "report", "run", "--overhead", "/dev/zero", needle="is not a regular file"),
    c("report: --overhead missing", "report", "run", "--overhead", "nope.json", needle="cannot read --overhead file"),
    c("report: --overhead not JSON", "report", "run", "--overhead", "bad.toml", needle="is not JSON"),
    c("report: --overhead a list", "report", "run", "--overhead", "list.json", needle="is not a JSON object"),
    c("report: --overhead wrong field type", "report", "run", "--overhead", "ov_types.json", setup=overhead_files,
      needle="guard.fraction = 'abc' is not a number"),
    c("report: --overhead NaN", "report", "run", "--overhead", "ov_nan.json", setup=overhead_files,
      needle="guard.fraction = nan is not a number"),
    c("report: --overhead value not an object", "report", "run", "--overhead", "ov_list.json", setup=overhead_files,
      needle="'guard' is not an object of fields"),
    c("report: --overhead unknown field", "report", "run", "--overhead", "ov_key.json", setup=overhead_files,
      needle="unknown field 'speedup'"),
    c("report: --overhead empty", "report", "run", "--overhead", "ov_empty.json", setup=overhead_files,
      needle="is not a JSON object of measurements"),
    c("report: --out is a file", "report", "run", "--no-triage", "--out", "file.txt",
      needle="--out file.txt exists and is not a folder"),
    c("report: --out under a file", "report", "run", "--out", "file.txt/sub", needle="is not a folder"),
    c("report: --json error", "report", "nope", "--json", needle="does not exist"),

    # ---- agent -----------------------------------------------------------------------------
    c("agent: --prometheus-port 70000", "agent", "--prometheus-port", "70000", needle="70,000 is out of range"),
    c("agent: --prometheus-port -1", "agent", "--prometheus-port", "-1", needle="out of range"),
    c("agent: --prometheus-addr 999.1.1.1", "agent", "--prometheus-addr", "999.1.1.1", needle="not a host name"),
    c("agent: --prometheus-addr shell", "agent", "--prometheus-addr", "a;b", needle="not a host name"),
    c("agent: --run-dir missing", "agent", "--once", "--run-dir", "nope", needle="does not exist"),
    c("agent: --run-dir not a run dir", "agent", "--once", "--run-dir", "plans", needle="is not a Titan run directory"),
    c("agent: --node a/b", "agent", "--once", "--node", "a/b", needle="invalid node id"),
    c("agent: --interval-s nan", "agent", "--once", "--interval-s", "nan", needle="not a finite number"),
    c("agent: --interval-s 0", "agent", "--interval-s", "0", needle="--interval-s: 0 s is out of range"),
    c("agent: --interval-s 1e-9 (would spin)", "agent", "--interval-s", "1e-9", needle="1e-09 s is out of range"),
    c("agent: --duration-s inf", "agent", "--duration-s", "inf", needle="not a finite number"),
    c("agent: --duration-s 0", "agent", "--duration-s", "0", needle="out of range"),
    c("agent: --once with --duration-s", "agent", "--once", "--duration-s", "5",
      needle="--once takes one sample and exits; --duration-s does not apply"),
    c("agent: --once with --prometheus-port", "agent", "--once", "--prometheus-port", "9464",
      needle="--prometheus-port does not apply"),
    c("agent: --config missing", "agent", "--config", "none.toml", needle="cannot read settings file"),
    c("agent: --set collector", "agent", "--set", "agent.collectors=gpu,teapot", needle="unknown collector(s) teapot"),
    c("agent: --set nan", "agent", "--set", "agent.interval_s=nan", needle="interval_s = nan"),
    c("agent: env node id", "agent", "--once", env=(("TITAN_NODE_ID", "a/b"),), needle="invalid node id"),
    c("agent: --json error", "agent", "--json", "--interval-s", "-1", needle="out of range"),

    # ---- triage ----------------------------------------------------------------------------
    c("triage: no path", "triage", needle="the following arguments are required: PATH"),
    c("triage: missing path", "triage", "nope", needle="no such file or directory"),
    c("triage: --jobs 0", "triage", "run", "--jobs", "0", needle="--jobs: 0 is out of range"),
    c("triage: --jobs 1e12", "triage", "run", "--jobs", "1000000000000", needle="out of range"),
    c("triage: --window nan", "triage", "run", "--window", "nan", needle="not a finite number"),
    c("triage: --window -1", "triage", "run", "--window", "-1", needle="--window: -1 s is out of range"),
    c("triage: --skew inf", "triage", "run", "--skew", "inf", needle="not a finite number"),
    c("triage: --rules missing", "triage", "run", "--rules", "nope.toml", needle="cannot read rules file"),
    c("triage: --rules binary", "triage", "run", "--rules", "garbage.bin", needle="is not UTF-8 text"),
    c("triage: --rules /dev/zero", "triage", "run", "--rules", "/dev/zero", needle="is not a regular file"),
    c("triage: --set jobs 1e6", "triage", "run", "--set", "triage.jobs=1000000", needle="jobs = 1,000,000 is out of range"),
    c("triage: --config bad", "triage", "run", "--config", "bad.toml", needle="is not valid TOML"),
    c("triage: --no-save with a bad flag", "triage", "run", "--no-save", "--window", "0", needle="out of range"),
    c("triage: --json error", "triage", "nope", "--json", needle="no such file or directory"),

    # ---- nodes -----------------------------------------------------------------------------
    c("nodes: --ledger a folder", "nodes", "--ledger", "run", needle="is not a file"),
    c("nodes: --ledger not SQLite", "nodes", "--ledger", "notsqlite.db", needle="is not an SQLite file"),
    c("nodes: --ledger another SQLite file", "nodes", "--ledger", "other.sqlite", needle="but not a node ledger"),
    c("nodes: --ledger in a missing folder", "nodes", "--ledger", "nonexistent/dir/x", needle="does not exist"),
    c("nodes: --ledger missing folder (subprocess)", "nodes", "--ledger", "nonexistent/dir/x", needle="does not exist",
      subprocess=True),
    c("nodes: --add to a missing folder", "nodes", "--ledger", "nonexistent/dir/x", "--add", "n1", "manual",
      needle="does not exist"),
    c("nodes: --add bad node", "nodes", "--ledger", "ledger.sqlite", "--add", "a/b", "manual", needle="invalid node id"),
    c("nodes: --add node with escapes", "nodes", "--ledger", "ledger.sqlite", "--add", f"n{ESC}[2J", "manual",
      needle="contains a control character"),
    c("nodes: --add node with a trailing newline", "nodes", "--ledger", "ledger.sqlite", "--add", "n1\n", "manual",
      needle="invalid node id"),
    c("nodes: --add bad kind", "nodes", "--ledger", "ledger.sqlite", "--add", "n1", "bogus", needle="unknown strike kind"),
    c("nodes: --add one value", "nodes", "--ledger", "ledger.sqlite", "--add", "n1", needle="expected 2 arguments"),
    c("nodes: --clear bad node", "nodes", "--ledger", "ledger.sqlite", "--clear", "a/b", needle="invalid node id"),
    c("nodes: --clear and --add", "nodes", "--ledger", "ledger.sqlite", "--clear", "n1", "--add", "n1", "manual",
      needle="not allowed with argument --clear"),
    c("nodes: --strikes on a bad ledger", "nodes", "--strikes", "--ledger", "notsqlite.db", needle="is not an SQLite file"),
    c("nodes: --set strike_limit 0", "nodes", "--set", "watchdog.strike_limit=0", needle="strike_limit >= 1"),
    c("nodes: --set window inf", "nodes", "--set", "watchdog.strike_window_s=inf", needle="not a finite number"),
    c("nodes: --config missing", "nodes", "--config", "none.toml", needle="cannot read settings file"),
    c("nodes: --json error", "nodes", "--json", "--ledger", "notsqlite.db", needle="is not an SQLite file"),
    c("nodes: env ledger path in a missing folder", "nodes",
      env=(("TITAN_WATCHDOG_LEDGER_PATH", "nonexistent/x.sqlite"),), needle="does not exist"),

    # ---- ckpt ------------------------------------------------------------------------------
    c("ckpt: unknown action", "ckpt", "bogus", "run", needle="invalid choice: 'bogus'"),
    c("ckpt: missing dir", "ckpt", "ls", "nope", needle="is not a directory"),
    c("ckpt: a file", "ckpt", "verify", "file.txt", needle="is not a directory"),
    c("ckpt: no checkpoints", "ckpt", "verify", "plans", needle="no committed checkpoints"),
    c("ckpt: verify --step -1", "ckpt", "verify", "run", "--step", "-1", needle="--step: -1 is out of range"),
    c("ckpt: verify --step 99999", "ckpt", "verify", "run", "--step", "99999", needle="no checkpoint step-00099999"),
    c("ckpt: inspect --step -1", "ckpt", "inspect", "run", "--step", "-1", needle="out of range"),
    c("ckpt: inspect --step 99999", "ckpt", "inspect", "run", "--step", "99999", needle="no checkpoint step-00099999"),
    c("ckpt: ls --step", "ckpt", "ls", "run", "--step", "2", needle="--step does not apply"),
    c("ckpt: inspect --quick", "ckpt", "inspect", "run", "--quick", needle="--quick only applies to verify"),
    c("ckpt: inspect when latest is a folder", "ckpt", "inspect", "run", setup=latest_is_a_dir,
      needle="no checkpoint (latest)"),
    c("ckpt: ls when latest is a folder", "ckpt", "ls", "run", setup=latest_is_a_dir, needle="step-00000004",
      code=0, error=False),
    c("ckpt: inspect truncated .metadata", "ckpt", "inspect", "run", setup=truncated_metadata,
      needle="step-00000004: .metadata is damaged"),
    c("ckpt: verify truncated .metadata", "ckpt", "verify", "run", setup=truncated_metadata, code=1,
      needle="1 of 2 checkpoint(s) failed verification"),
    c("ckpt: inspect garbage .metadata", "ckpt", "inspect", "run", setup=garbage_metadata, needle="step-00000004"),
    c("ckpt: verify garbage .metadata", "ckpt", "verify", "run", setup=garbage_metadata, code=1,
      needle="failed verification"),
    c("ckpt: ls garbage .metadata", "ckpt", "ls", "run", setup=garbage_metadata, needle="step-00000004", code=0,
      error=False),
    c("ckpt: verify manifest without size", "ckpt", "verify", "run", setup=manifest_without_size, code=1,
      needle="failed verification"),
    c("ckpt: ls manifest without size", "ckpt", "ls", "run", "--json", setup=manifest_without_size, needle='"step": 4',
      code=0, error=False),
    c("ckpt: verify manifest with a string crc32", "ckpt", "verify", "run", setup=manifest_string_crc, code=1,
      needle="failed verification"),
    c("ckpt: verify --quick manifest with a string crc32", "ckpt", "verify", "run", "--quick",
      setup=manifest_string_crc, code=1, needle="failed verification"),
    c("ckpt: verify a manifest naming /dev/zero (subprocess, bounded)", "ckpt", "verify", "run",
      setup=manifest_dev_zero, code=1, needle="failed verification", subprocess=True),
    c("ckpt: inspect garbage manifest", "ckpt", "inspect", "run", setup=manifest_garbage,
      needle="step-00000004: manifest unreadable"),
    c("ckpt: verify garbage manifest", "ckpt", "verify", "run", "--json", setup=manifest_garbage, code=1,
      needle="failed verification"),
    c("ckpt: ls garbage manifest", "ckpt", "ls", "run", setup=manifest_garbage, needle="manifest unreadable", code=0,
      error=False),
    c("ckpt: verify --step without manifest", "ckpt", "verify", "run", "--step", "4", setup=manifest_missing, code=1,
      needle="failed verification"),
    c("ckpt: inspect without manifest", "ckpt", "inspect", "run", "--step", "4", setup=manifest_missing,
      needle="no manifest"),

    # ---- gather ----------------------------------------------------------------------------
    c("gather: no sources", "gather", "out", needle="the following arguments are required: SOURCE"),
    c("gather: OUT is a file", "gather", "file.txt", "run", needle="exists and is not a folder"),
    c("gather: OUT not empty", "gather", "outdir", "run", setup=out_dir_with_file, needle="exists and is not empty"),
    c("gather: OUT inside the source", "gather", "run/merged", "run", needle="is inside the source"),
    c("gather: OUT deep inside the source", "gather", "run/events/x/merged", "run", needle="is inside the source"),
    c("gather: OUT is the source", "gather", "run", "run", needle="exists and is not empty"),
    c("gather: OUT name not an id", "gather", "bad name!", "run", needle="invalid run id"),
    c("gather: source twice", "gather", "out", "run", "run", needle="is given twice"),
    c("gather: same source two ways", "gather", "out", "run", "alias", setup=lambda ws: (ws / "alias").symlink_to("run"),
      needle="are the same folder"),
    c("gather: source a file", "gather", "out", "file.txt", needle="file.txt is not a folder"),
    c("gather: source not a run dir", "gather", "out", "plans", needle="is not a Titan run directory"),
    c("gather: different run ids", "gather", "out", "run", "run2",
      setup=lambda ws: (second_run(ws), (ws / "run2" / "run.json").write_text('{"run_id": "other"}')),
      needle="belong to different runs"),
    c("gather: host with ;", "gather", "--fetch-command", "true", "out", "a;b:/x", needle="host 'a;b' is not a host name"),
    c("gather: host with /", "gather", "--fetch-command", "true", "out", "a/b:/x", needle="host 'a/b' is not a host name"),
    c("gather: host with $()", "gather", "--fetch-command", "true", "out", "$(id):/x", needle="is not a host name"),
    c("gather: source without a colon", "gather", "--fetch-command", "true", "out", "nocolon", needle="is not HOST:PATH"),
    c("gather: empty remote path", "gather", "--fetch-command", "true", "out", "node1:", needle="is not [USER@]HOST:PATH"),
    c("gather: bad user", "gather", "--fetch-command", "true", "out", "a b@node1:/x", needle="is not [USER@]HOST:PATH"),
    c("gather: template with an unknown field", "gather", "--fetch-command", "cp {src} {dest}", "out", "node1:/x",
      needle="is not a template of {host}, {path} and {dest}"),
    c("gather: fetch fails", "gather", "--fetch-command", "false", "out", "node1:/x", needle="fetching node1:/x failed",
      spawn_ok=True),
    c("gather: --force does not allow OUT in a source", "gather", "--force", "run/m", "run", needle="is inside the source"),
    c("gather: --json error", "gather", "--json", "file.txt", "run", needle="exists and is not a folder"),
]
