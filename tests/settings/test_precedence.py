"""One precedence: defaults < config file < TITAN_* environment < CLI flags."""

from __future__ import annotations

import pytest

from titan.errors import UserError
from titan.settings import load_settings, settings_from_json


def test_each_layer_overrides_the_one_below(tmp_path):
    cfg = tmp_path / "titan.toml"
    cfg.write_text("[run]\nmax_restarts = 7\nruns_dir = 'from-file'\n[dist]\npg_timeout_s = 100\n")
    s = load_settings(config_file=cfg, env={"TITAN_RUN_MAX_RESTARTS": "8"}, cli={"dist.pg_timeout_s": "50"})
    assert s.run.runs_dir == "from-file"            # file over default
    assert s.run.max_restarts == 8                   # env over file
    assert s.dist.pg_timeout_s == 50.0               # flag over file
    assert s.dist.init_attempts == 3                 # default
    assert s.sources["run.max_restarts"] == "environment TITAN_RUN_MAX_RESTARTS"


def test_config_file_from_environment_variable(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[events]\nstep_every = 5\n")
    assert load_settings(env={"TITAN_CONFIG": str(cfg)}).events.step_every == 5


def test_node_id_has_its_own_variable():
    assert load_settings(env={"TITAN_NODE_ID": "nodeA"}).run.node_id == "nodeA"


@pytest.mark.parametrize("text, match", [
    ("[run\nmax_restarts = 1", "not valid TOML"),
    ("[run]\nmax_restartz = 1\n", "unknown setting run.max_restartz"),
    ("[nosuch]\nx = 1\n", "unknown settings section 'nosuch'"),
    ("[run]\nmax_restarts = 'many'\n", "is not a valid int"),
    ("[run]\nmax_restarts = -1\n", "max_restarts must be >= 0"),
    ("run = 3\n", "must be a \\[section\\] table"),
])
def test_malformed_settings_file_is_one_clear_user_error(tmp_path, text, match):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    with pytest.raises(UserError, match=match) as ei:
        load_settings(config_file=cfg, env={})
    assert ei.value.hint, "every user error carries a hint"


def test_timeout_hierarchy_is_checked_when_built():
    with pytest.raises(UserError, match="timeout hierarchy violated"):
        load_settings(env={}, cli={"dist.pg_timeout_s": 900, "run.rdzv_join_timeout_s": 600})


def test_bad_environment_value_names_the_variable():
    with pytest.raises(UserError, match="TITAN_DIST_INIT_ATTEMPTS"):
        load_settings(env={"TITAN_DIST_INIT_ATTEMPTS": "three"})


def test_workers_get_exactly_the_launchers_settings():
    s = load_settings(env={}, cli={"run.max_restarts": 9, "events.step_every": 4})
    back = settings_from_json(s.to_json())
    assert back.to_dict() == s.to_dict()
