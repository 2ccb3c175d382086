"""`report` command: writes the report for an id from a real database file; clear errors otherwise."""

from __future__ import annotations

import shutil

from test_assemble import INSTANCE, RULES_TEXT, built_db  # noqa: F401  (the module-scoped database fixture)
from typer.testing import CliRunner

from vllm_sentinel.agent.cli.report import app

runner = CliRunner()


def _id(path) -> str:
    import duckdb
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute("SELECT id FROM incidents WHERE instance = ?", [INSTANCE]).fetchone()[0]
    finally:
        con.close()


def test_report_command_writes_markdown_and_charts(built_db, tmp_path) -> None:  # noqa: F811
    db = tmp_path / "s.duckdb"
    shutil.copyfile(built_db, db)
    iid = _id(db)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES_TEXT)
    result = runner.invoke(app, [iid, "--out", str(tmp_path / "out"), "--db", str(db), "--rules", str(rules)])
    assert result.exit_code == 0, result.output
    md = tmp_path / "out" / iid / "report.md"
    assert str(md) in result.stdout and md.read_text().startswith("# queue_blocking on 127.0.0.1:8000")
    assert (tmp_path / "out" / iid / "chart-waiting_max.png").exists()


def test_unknown_incident_is_a_clear_error(built_db, tmp_path) -> None:  # noqa: F811
    db = tmp_path / "s.duckdb"
    shutil.copyfile(built_db, db)
    result = runner.invoke(app, ["zzzz", "--out", str(tmp_path), "--db", str(db)])
    assert result.exit_code == 1 and "no incident 'zzzz'" in result.output


def test_missing_database_is_a_clear_error(tmp_path) -> None:
    result = runner.invoke(app, ["x", "--db", str(tmp_path / "none.duckdb")])
    assert result.exit_code == 1 and "does not exist" in result.output


def test_without_the_rule_file_the_report_charts_the_stored_evidence_expressions(built_db, tmp_path) -> None:  # noqa: F811
    db = tmp_path / "s.duckdb"
    shutil.copyfile(built_db, db)
    iid = _id(db)
    result = runner.invoke(app, [iid, "--out", str(tmp_path / "out"), "--db", str(db)])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "out" / iid / "report.md").read_text()
    # the incident row keeps each evidence expression, so the charts survive a rule file that changed
    assert "not in the loaded rule files" not in text
    assert list((tmp_path / "out" / iid).glob("*.png"))
