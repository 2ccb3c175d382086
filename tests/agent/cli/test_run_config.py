"""agent/cli/run_config.py: the --config keys are exactly run's options, typed from its signature."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from vllm_sentinel.agent.cli.run import DEFAULTS, run
from vllm_sentinel.agent.cli.run_config import RunConfigError, load_run_config, merged, option_kinds, typed_params


def test_every_run_option_can_be_set_in_the_config_file_and_defaults_to_none():
    kinds = option_kinds(run)
    params = {n: p for n, p in inspect.signature(run).parameters.items() if n != "ctx"}
    assert set(kinds) == set(params)  # nothing on the command line the file cannot hold
    assert kinds["target"] == "list" and kinds["rules"] == "paths" and kinds["metrics_port"] == "int"
    assert kinds["verbose"] == "bool" and kinds["db"] == "path" and kinds["interval"] == "str"
    # no option default hides a value from the file: every one is None until merged with DEFAULTS
    assert all(p.default.default is None for p in params.values()), [n for n, p in params.items() if p.default.default is not None]
    assert set(DEFAULTS) <= set(kinds)


def test_values_are_typed_paths_resolved_from_the_file_and_the_command_line_wins(tmp_path):
    conf = tmp_path / "etc" / "sentinel.yaml"
    conf.parent.mkdir()
    conf.write_text("target: http://a:1\nrules: [r.yaml, /abs/r2.yaml]\nmetrics_port: 9000\nverbose: true\n"
                    "db: ../data/s.duckdb\ninterval: 2s\n")
    got = load_run_config(conf, option_kinds(run))
    assert got["target"].value == ["http://a:1"]
    assert got["rules"].value == [conf.parent / "r.yaml", Path("/abs/r2.yaml")]
    assert got["db"].value == conf.parent / "../data/s.duckdb"
    assert got["interval"].where == f"{conf}:6: interval"
    values = merged(DEFAULTS, got, {"interval": "5s", "verbose": None, "target": ()})
    assert values["interval"] == "5s" and values["verbose"] is True and values["target"] == ["http://a:1"]
    assert values["retention"] == DEFAULTS["retention"]


@pytest.mark.parametrize("text, expected", [
    ("verbose: yes please\n", "x.yaml:1: verbose: expects true or false"),
    ("metrics-port: true\n", "x.yaml:1: metrics-port: expects a whole number"),
    ("config: other.yaml\n", "x.yaml:1: config: a config file cannot name another"),
    ("interval: [1s]\n", "x.yaml:1: interval: expects one value, not list"),
    ("interval: 1s\n  bad: indent\n", "x.yaml:2: not valid YAML"),
])
def test_bad_values_name_file_line_and_fix(tmp_path, text, expected):
    conf = tmp_path / "x.yaml"
    conf.write_text(text)
    with pytest.raises(RunConfigError) as e:
        load_run_config(conf, option_kinds(run))
    assert str(e.value).startswith(str(tmp_path / expected)), str(e.value)


def test_command_line_paths_reach_the_daemon_as_paths_whatever_typer_hands_over():
    """typer 0.27 leaves ctx.params' paths as str (the daemon then failed on db.with_name, seen on the GPU
    host); 0.29 gives Path. Either way run's options come out as Path, lists of them as lists of Path."""
    as_027 = {"db": "/data/s.duckdb", "rules": ["r.yaml", "/abs/r2.yaml"], "reports_dir": None, "interval": "1s",
              "target": ["http://a:1"]}
    got = typed_params(as_027, option_kinds(run))
    assert got["db"] == Path("/data/s.duckdb") and isinstance(got["db"], Path)
    assert got["rules"] == [Path("r.yaml"), Path("/abs/r2.yaml")]
    assert got["reports_dir"] is None and got["interval"] == "1s" and got["target"] == ["http://a:1"]
    assert typed_params(got, option_kinds(run)) == got  # Path in (0.29): unchanged
