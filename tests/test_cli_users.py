"""What CLI users see (issue 15, section 2): each behaviour through typer's runner."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from featurelake import Lake
from featurelake.cli import app
from featurelake.synthetic import impressions_table, user_events_schema, user_events_table
from featurelake.table import Table

from cli_fixtures import _clean_env, cli, failed, home, ok, runner, table  # noqa: F401  (fixtures and helpers)

TABLE = "ml.samples"


def _files(root) -> list[str]:
    return sorted(str(p) for p in root.rglob("*") if p.is_file())


def test_read_limit_keeps_the_engine_batch_size(home, monkeypatch):
    seen = []
    original = Table.batches

    def recording(self, *args, **kwargs):
        seen.append(kwargs.get("batch_size"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Table, "batches", recording)
    rows = json.loads(ok(cli(home, "read", TABLE, "--limit", "3", "--filter", "click = 0", json_out=True)))
    assert len(rows) == 3
    assert seen and all(b is None or b >= 65_536 for b in seen)  # None: the engine's default (64 Ki rows)


def test_version_and_help_import_nothing_heavy():
    for flag in ("--version", "--help"):
        code = (
            f"import sys; sys.argv = ['featurelake', {flag!r}]\n"
            "from featurelake.cli import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('pyiceberg', 'pyarrow', 'dagster', 'pandas', 'duckdb') if m in sys.modules))"
        )
        env = dict(os.environ, PYTHONPATH=os.getcwd())
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
        assert out.splitlines()[-1] == "[]"
        if flag == "--version":
            assert out.splitlines()[0] == "featurelake 0.1.0"


def test_flags_are_flags_in_help(home):
    for args in ([], ["read"], ["gc"], ["branch", "list"]):
        out = ok(runner.invoke(app, [*args, "--help"]))
        assert "--json" in out and "<bool>" not in out
    assert runner.invoke(app, ["--home", str(home), "tables", "--json", "true"]).exit_code == 2  # a flag takes no value


def test_filter_typo_is_explained_in_words(home):
    line = failed(cli(home, "read", TABLE, "--filter", "user_id < 100 adn click = 1"))
    assert "unexpected 'adn' at position 15" in line and "joined by and, or, not" in line
    assert "W:(" not in line and "Expected {" not in line
    line = failed(cli(home, "read", TABLE, "--filter", "click = = 1"))
    assert "condition 'click = = 1' at position 1" in line


def test_errors_name_cli_options(home, tmp_path):
    path = tmp_path / "b.parquet"
    pq.write_table(pa.table({"sample_id": pa.array([999], pa.int64()), "f0": pa.array([1.0], pa.float32())}), path)
    line = failed(cli(home, "backfill", TABLE, str(path)))
    assert "--skip-unknown" in line and "on_unknown" not in line
    pq.write_table(pa.table({"sample_id": pa.array([1], pa.int64()), "click": ["x"]}), path)
    line = failed(cli(home, "upsert", TABLE, str(path)))
    assert "upsert input does not fit" in line and "backfill" not in line


def test_errors_under_json_are_json(home):
    for args in (["--json", "read", TABLE, "--columns", "nope"], ["read", TABLE, "--columns", "nope", "--json"]):
        result = runner.invoke(app, ["--home", str(home), *args])
        assert result.exit_code == 1
        payload = json.loads(result.stdout)
        assert payload["type"] == "SchemaMismatchError" and "nope" in payload["error"]


def test_read_only_commands_do_not_create_a_lake(tmp_path):
    typo = tmp_path / "lkae"
    for args in (["tables"], ["stats", TABLE], ["read", TABLE], ["gc", "--dry-run"], ["sql", "select 1"]):
        line = failed(cli(typo, *args))
        assert "no lake exists at" in line and str(typo) in line
        assert not typo.exists()
    payload = json.loads(runner.invoke(app, ["--home", str(typo), "--json", "tables"]).stdout)
    assert payload["type"] == "LakeNotFoundError"


def test_create_from_a_parquet_schema(tmp_path):
    data = impressions_table(50, days=2)
    path = tmp_path / "rows.parquet"
    pq.write_table(data, path)
    home = tmp_path / "new"
    out = ok(cli(home, "create", TABLE, "--schema", str(path), "--key", "sample_id", "--partition", "day(ts)"))
    assert f"Created table {TABLE}" in out
    t = Lake(home).table(TABLE)
    assert t.primary_key == ["sample_id"] and t.schema.names == data.schema.names
    assert [f.transform.__class__.__name__ for f in t.iceberg.spec().fields] == ["DayTransform"]
    ok(cli(home, "append", TABLE, str(path)))
    assert t.read().num_rows == 50
    # --like is the same option; a bad key creates nothing
    before = _files(home)
    line = failed(cli(home, "create", "ml.other", "--like", str(path), "--key", "nope"))
    assert "nope" in line and not Lake(home).table_exists("ml.other") and _files(home) == before
    payload = json.loads(ok(cli(home, "create", "ml.other", "--like", str(path), "-k", "sample_id", json_out=True)))
    assert payload["primary_key"] == ["sample_id"] and payload["partition_by"] == []


def test_merge_without_changes_is_already_up_to_date(home):
    ok(cli(home, "branch", "create", TABLE, "exp"))
    assert "Already up to date" in ok(cli(home, "merge", TABLE, "exp"))
    payload = json.loads(ok(cli(home, "merge", TABLE, "exp", json_out=True)))
    assert payload["up_to_date"] is True
    table(home).backfill(pa.table({"sample_id": pa.array([0], pa.int64()), "f0": pa.array([5.0], pa.float32())}), branch="exp")
    assert "Merged exp" in ok(cli(home, "merge", TABLE, "exp"))


def test_seq_build_says_when_it_reused_a_build(tmp_path):
    home = tmp_path / "lake"
    st = Lake(home).create_sequence_table("ml.events", user_events_schema(), key="user_id", time="ts")
    st.append(user_events_table(5, 4))
    first = json.loads(ok(cli(home, "seq", "build", "ml.events", json_out=True)))
    assert first["reused"] is False
    again = ok(cli(home, "seq", "build", "ml.events"))
    assert f"Reused build {first['build_id']}" in again and "--force" in again
    assert json.loads(ok(cli(home, "seq", "build", "ml.events", "--force", json_out=True)))["reused"] is False


def test_one_duration_syntax(home):
    assert "Expired" in ok(cli(home, "expire", TABLE, "--older-than", "7d"))
    assert "Would delete" in ok(cli(home, "gc", "--older-than", "12h", "--dry-run"))
    line = failed(cli(home, "expire", TABLE, "--older-than", "7"))
    assert "--older-than '7' is not a duration" in line and "7d" in line
    assert "is not a duration" in failed(cli(home, "gc", "--older-than", "12x"))


def test_long_errors_are_shown_whole(home):
    name = "a_very_long_column_name_" * 25
    line = failed(cli(home, "read", TABLE, "--columns", name))
    assert name in line and "…" not in line


def test_sql_and_stats_for_external_readers(home):
    t = table(home)
    rows = json.loads(ok(cli(home, "sql", "select count(*) as n from ml.samples where click = 1", json_out=True)))
    assert rows == [{"n": t.read(filter="click = 1").num_rows}]
    out = ok(cli(home, "stats", TABLE))
    assert "final for external readers: yes" in out and t.iceberg.metadata_location in out.replace("\n", "")
    t.backfill(pa.table({"sample_id": pa.array([0], pa.int64()), "f0": pa.array([5.0], pa.float32())}))
    assert "final for external readers: no" in ok(cli(home, "stats", TABLE))
    assert json.loads(ok(cli(home, "sql", "select f0 from ml.samples where sample_id = 0", json_out=True))) == [{"f0": 5.0}]
