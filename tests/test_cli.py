"""The ``featurelake`` command line against a small embedded lake in tmp_path."""
from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from featurelake import Lake
from featurelake.cli import app
from featurelake.synthetic import impressions_table
from featurelake.table import Table

from cli_fixtures import _clean_env, cli, failed, home, ok, runner, table  # noqa: F401  (fixtures and helpers)

TABLE = "ml.samples"


def new_rows(n: int = 30, offset: int = 10**12) -> pa.Table:
    data = impressions_table(n, days=1, seed=7)
    ids = pc.add(data["sample_id"], pa.scalar(offset, pa.int64()))
    return data.set_column(data.schema.get_field_index("sample_id"), data.schema.field("sample_id"), ids)


# ---------------------------------------------------------------- read-only
def test_tables_text_and_json(home):
    out = ok(cli(home, "tables"))
    assert TABLE in out and "200" in out

    listed = json.loads(ok(cli(home, "tables", json_out=True)))
    assert [s["table"] for s in listed] == [TABLE]
    assert listed[0]["rows"] == len(table(home).read())
    assert listed[0]["data_files"] >= 1 and listed[0]["bytes"] > 0


def test_tables_empty_lake(tmp_path):
    Lake(tmp_path / "empty")  # a lake without tables
    assert "No tables" in ok(cli(tmp_path / "empty", "tables"))
    assert json.loads(ok(cli(tmp_path / "empty", "tables", json_out=True))) == []


def test_stats_text_and_json(home):
    out = ok(cli(home, "stats", TABLE))
    assert "rows" in out and "data files" in out and "200" in out

    stats = json.loads(ok(cli(home, "stats", TABLE, json_out=True)))
    assert stats["rows"] == len(table(home).read())
    for key in ("rows", "data_files", "small_files", "update_files", "bytes"):
        assert isinstance(stats[key], int)
    # --json also works after the command
    assert json.loads(ok(runner.invoke(app, ["--home", str(home), "stats", TABLE, "--json"]))) == stats


def test_read_limit_and_columns(home):
    rows = json.loads(ok(cli(home, "read", TABLE, "--limit", "7", json_out=True)))
    assert len(rows) == 7
    assert set(rows[0]) == set(table(home).schema.names)

    rows = json.loads(ok(cli(home, "read", TABLE, "--columns", "sample_id,click", "--limit", "0", json_out=True)))
    assert len(rows) == 200 and all(set(r) == {"sample_id", "click"} for r in rows)

    text = ok(cli(home, "read", TABLE, "--columns", "sample_id,click", "--limit", "5"))
    assert "sample_id" in text and "5 row(s)" in text and "more match" in text


def test_read_filter(home):
    expected = table(home).read(filter="click = 1")
    assert 0 < len(expected) < 200
    rows = json.loads(ok(cli(home, "read", TABLE, "--filter", "click = 1", "--limit", "0", json_out=True)))
    assert len(rows) == len(expected)
    assert {r["click"] for r in rows} == {1}
    assert sorted(r["sample_id"] for r in rows) == sorted(expected["sample_id"].to_pylist())


def test_read_json_values_are_plain(home):
    (row,) = json.loads(ok(cli(home, "read", TABLE, "--limit", "1", json_out=True)))
    assert isinstance(dt.datetime.fromisoformat(row["ts"]), dt.datetime)
    assert isinstance(row["clicked_items"], list) and isinstance(row["context"], list)
    assert all(set(c) == {"slot", "item_id", "weight"} for c in row["context"])


def test_read_with_locator_json_and_jsonl(home):
    rows = json.loads(ok(cli(home, "read", TABLE, "--with-locator", "--columns", "sample_id", json_out=True)))
    assert len(rows) == 20
    assert all(r["_file"].endswith(".parquet") and isinstance(r["_pos"], int) for r in rows)

    lines = ok(cli(home, "read", TABLE, "--with-locator", "--limit", "3", "--jsonl")).splitlines()
    assert len(lines) == 3 and {"_file", "_pos"} <= set(json.loads(lines[0]))


def test_read_errors_exit_1(home):
    assert "no table" in failed(cli(home, "read", "ml.nope"))
    assert "nope" in failed(cli(home, "read", TABLE, "--branch", "nope"))
    assert "nope" in failed(cli(home, "read", TABLE, "--columns", "sample_id,nope"))
    assert "cannot parse filter" in failed(cli(home, "read", TABLE, "--filter", "click ==== "))
    assert "namespace.table" in failed(cli(home, "stats", "no_namespace"))


# -------------------------------------------------------------------- writes
def test_append_parquet(home, tmp_path):
    path = tmp_path / "new.parquet"
    pq.write_table(new_rows(30), path)
    out = ok(cli(home, "append", TABLE, str(path)))
    t = table(home)
    assert len(t.read()) == 230
    head = t.snapshots()[0]["snapshot_id"]
    assert str(head) in out and "30" in out

    path2 = tmp_path / "more.parquet"
    pq.write_table(new_rows(5, offset=2 * 10**12), path2)
    result = json.loads(ok(cli(home, "append", TABLE, str(path2), json_out=True)))
    assert result["rows"] == 5 and result["snapshot_id"] == table(home).snapshots()[0]["snapshot_id"]
    assert table(home).stats()["rows"] == 235


def test_append_duplicate_keys_exits_1_and_writes_nothing(home, tmp_path):
    before = table(home).snapshots()
    path = tmp_path / "dup.parquet"
    pq.write_table(impressions_table(10, days=1), path)  # sample_ids 0..9 already exist
    line = failed(cli(home, "append", TABLE, str(path)))
    assert "DuplicateKeyError" in line and "already exist" in line
    assert table(home).snapshots() == before


def test_append_bad_inputs(home, tmp_path):
    garbage = tmp_path / "garbage.parquet"
    garbage.write_text("not parquet")
    assert "cannot read" in failed(cli(home, "append", TABLE, str(garbage)))
    pq.write_table(new_rows(3), tmp_path / "rows.parquet")
    assert "nope" in failed(cli(home, "append", TABLE, str(tmp_path / "rows.parquet"), "--branch", "nope"))
    missing = cli(home, "append", TABLE, str(tmp_path / "missing.parquet"))
    assert missing.exit_code == 2  # a usage error, reported by the parser
    assert len(table(home).read()) == 200


def test_snapshots_json_and_time_travel(home, tmp_path):
    pq.write_table(new_rows(10), tmp_path / "new.parquet")
    ok(cli(home, "append", TABLE, str(tmp_path / "new.parquet")))
    snaps = json.loads(ok(cli(home, "snapshots", TABLE, json_out=True)))
    assert snaps == table(home).snapshots()
    assert len(snaps) == 2 and snaps[0]["parent_id"] == snaps[1]["snapshot_id"]
    assert [s["total_rows"] for s in snaps] == [210, 200]
    assert str(snaps[0]["snapshot_id"]) in ok(cli(home, "snapshots", TABLE))

    old = json.loads(ok(cli(home, "read", TABLE, "--snapshot", str(snaps[1]["snapshot_id"]), "-n", "0", json_out=True)))
    assert len(old) == 200
    assert "no snapshot" in failed(cli(home, "read", TABLE, "--snapshot", "12345"))


def test_backfill_then_compact(home, tmp_path):
    path = tmp_path / "scores.parquet"
    pq.write_table(pa.table({"sample_id": pa.array([0, 1, 2], pa.int64()), "score": [0.5, 0.25, 0.125]}), path)
    report = json.loads(ok(cli(home, "backfill", TABLE, str(path), json_out=True)))
    assert report["snapshot_id"] == table(home).snapshots()[0]["snapshot_id"]
    got = table(home).read(columns=["sample_id", "score"], filter="sample_id < 3").sort_by("sample_id")
    assert got["score"].to_pylist() == [0.5, 0.25, 0.125]

    compacted = json.loads(ok(cli(home, "compact", TABLE, json_out=True)))
    assert compacted["table"] == TABLE
    assert table(home).stats()["update_files"] == 0
    got = table(home).read(columns=["sample_id", "score"], filter="sample_id < 3").sort_by("sample_id")
    assert got["score"].to_pylist() == [0.5, 0.25, 0.125]
    assert "Compacted" in ok(cli(home, "compact", TABLE))


def test_backfill_unknown_key_exits_1_unless_skipped(home, tmp_path):
    path = tmp_path / "labels.parquet"
    pq.write_table(pa.table({"sample_id": pa.array([0, 999], pa.int64()), "click": pa.array([1, 1], pa.int32())}), path)
    assert "999" in failed(cli(home, "backfill", TABLE, str(path)))
    out = ok(cli(home, "backfill", TABLE, str(path), "--skip-unknown"))
    assert "Backfilled 1 row(s)" in out


def test_missing_engine_method_is_a_clean_error(home, monkeypatch):
    monkeypatch.delattr(Table, "compact")
    assert "compact" in failed(cli(home, "compact", TABLE))


# `featurelake demo` runs for real in tests/dagster/test_dagster_demo.py::test_demo_command_on_a_small_lake


# ----------------------------------------------------------- installed script
def _script() -> Path:
    """The console script of the environment under test (the interpreter running pytest)."""
    script = Path(sys.executable).parent / "featurelake"
    assert script.exists(), f"{script} is missing: install this checkout with `pip install -e .[dev]`"
    return script


def test_console_script_json_tables(home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEATURELAKE_")}
    proc = subprocess.run(
        [str(_script()), "--home", str(home), "--json", "tables"], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    assert [(s["table"], s["rows"]) for s in listed] == [(TABLE, 200)]

    bad = subprocess.run(
        [str(_script()), "--home", str(home), "read", "ml.nope"], capture_output=True, text=True, env=env, timeout=60
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr and "no table" in bad.stderr


def test_cli_does_not_import_dagster():
    code = "import sys, featurelake.cli; print('dagster' in sys.modules or 'platform_defs' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_lake_from_environment(home, tmp_path, monkeypatch):
    # FEATURELAKE_HOME is the default home
    monkeypatch.setenv("FEATURELAKE_HOME", str(home))
    assert [s["table"] for s in json.loads(ok(runner.invoke(app, ["--json", "tables"])))] == [TABLE]
    # FEATURELAKE_CATALOG_URI wins over FEATURELAKE_HOME, but not over --home
    monkeypatch.setenv("FEATURELAKE_CATALOG_URI", f"sqlite:///{tmp_path / 'other.db'}")
    monkeypatch.setenv("FEATURELAKE_WAREHOUSE", str(tmp_path / "other-warehouse"))
    Lake.from_env().create_table("ml.other", pa.schema([pa.field("k", pa.int64(), nullable=False)]), primary_key="k")
    assert [s["table"] for s in json.loads(ok(runner.invoke(app, ["--json", "tables"])))] == ["ml.other"]
    assert [s["table"] for s in json.loads(ok(cli(home, "tables", json_out=True)))] == [TABLE]
    monkeypatch.delenv("FEATURELAKE_WAREHOUSE")
    assert "FEATURELAKE_WAREHOUSE" in failed(runner.invoke(app, ["tables"]))


def _run_on_a_terminal(argv: list[str], env: dict) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a pseudo-terminal; return its exit status and all it wrote."""
    import pty

    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    return proc.wait(timeout=60), out.decode(errors="replace")


def test_long_operations_show_progress_on_a_terminal(home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FEATURELAKE_")}
    env.update(TERM="xterm-256color", COLUMNS="120", FORCE_COLOR="1")
    env.pop("NO_COLOR", None)
    argv = [str(_script()), "--home", str(home), "compact", TABLE]
    rc, shown = _run_on_a_terminal(argv, env)
    assert rc == 0, shown
    assert "Compacting ml.samples@main" in shown  # the progress line, drawn on the terminal
    assert "\r" in shown or "\x1b[" in shown  # redrawn in place (a live display), not printed as a log line
    assert "Compacted ml.samples@main" in shown
    # not a terminal: the same command prints its result and no progress
    piped = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)
    assert piped.returncode == 0 and "Compacting" not in piped.stdout + piped.stderr
