"""The ``featurelake`` CLI for branches, tags, upsert, revert and maintenance, against a lake in tmp_path."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from featurelake.synthetic import impressions_table

from cli_fixtures import _clean_env, cli, failed, home, ok, runner, table  # noqa: F401  (fixtures and helpers)
from index_corruption import drop_entries, rewrite_index

TABLE = "ml.samples"
KEY = "sample_id"


def parquet(tmp_path: Path, name: str, data: pa.Table) -> str:
    path = tmp_path / name
    pq.write_table(data, path)
    return str(path)


def clicks(tmp_path: Path, name: str, ids: list[int], value: int) -> str:
    return parquet(tmp_path, name, pa.table({KEY: pa.array(ids, pa.int64()), "click": pa.array([value] * len(ids), pa.int32())}))


def new_rows(n: int, offset: int = 10**12) -> pa.Table:
    data = impressions_table(n, days=1, seed=7)
    return data.set_column(0, KEY, pc.add(data[KEY], pa.scalar(offset, pa.int64())))


# ------------------------------------------------------------------ branches
def test_branch_create_list_diff_drop(home, tmp_path):
    created = json.loads(ok(cli(home, "branch", "create", TABLE, "exp", json_out=True)))
    assert created["snapshot_id"] == table(home).branches()["main"] == table(home).branches()["exp"]
    assert "Created branch old" in ok(cli(home, "branch", "create", TABLE, "old", "--from", str(created["snapshot_id"])))

    ok(cli(home, "backfill", TABLE, clicks(tmp_path, "c.parquet", [0, 1, 2], 1), "--branch", "exp"))
    listed = {r["name"]: r for r in json.loads(ok(cli(home, "branch", "list", TABLE, json_out=True)))}
    assert set(listed) == {"main", "exp", "old"} and {r["type"] for r in listed.values()} == {"branch"}
    assert listed["exp"]["exclusive_bytes"] > 0 and listed["exp"]["shared_bytes"] > 0
    assert listed["main"]["rows"] == 200
    text = ok(cli(home, "branch", "list", TABLE))
    assert "exp" in text and "exclusive" in text

    diff = json.loads(ok(cli(home, "branch", "diff", TABLE, "exp", json_out=True)))
    assert diff["columns_updated"] == ["click"] and diff["update_files_added"] >= 1 and diff["rows_added"] == 0
    assert "click" in ok(cli(home, "branch", "diff", TABLE, "exp", "--against", "main"))

    assert "Dropped branch old" in ok(cli(home, "branch", "drop", TABLE, "old"))
    assert set(table(home).branches()) == {"main", "exp"}
    assert "old" in failed(cli(home, "branch", "drop", TABLE, "old"))
    assert "main" in failed(cli(home, "branch", "drop", TABLE, "main"))
    assert "nope" in failed(cli(home, "branch", "create", TABLE, "x", "--from", "nope"))


def test_merge_clean_then_conflict(home, tmp_path):
    ok(cli(home, "branch", "create", TABLE, "a"))
    ok(cli(home, "branch", "create", TABLE, "b"))
    ok(cli(home, "backfill", TABLE, clicks(tmp_path, "a.parquet", [0, 1, 2], 1), "-b", "a"))
    ok(cli(home, "backfill", TABLE, clicks(tmp_path, "b.parquet", [0, 1, 2], 0), "-b", "b"))

    merged = json.loads(ok(cli(home, "branch", "merge", TABLE, "a", json_out=True)))
    assert merged["snapshot_id"] == table(home).branches()["main"] == table(home).branches()["a"]
    before = table(home).branches()

    result = cli(home, "merge", TABLE, "b", "--into", "main")  # the top-level alias
    line = failed(result)
    assert "MergeConflictError" in line and "click" in line and ".parquet" in line
    assert "conflict" in result.stdout and "click" in result.stdout

    result = cli(home, "branch", "merge", TABLE, "b", json_out=True)
    failed(result)
    payload = json.loads(result.stdout)
    assert payload["source"] == "b" and payload["into"] == "main"
    assert payload["conflicts"] and all(set(c) == {"file", "column", "reason"} for c in payload["conflicts"])
    conflict = next(c for c in payload["conflicts"] if c["column"] == "click")
    assert conflict["file"].endswith(".parquet")
    assert table(home).branches() == before  # nothing written
    got = table(home).read(columns=[KEY, "click"], filter="sample_id < 3")
    assert set(got["click"].to_pylist()) == {1}


def test_rebase_then_fast_forward_merge(home, tmp_path):
    ok(cli(home, "branch", "create", TABLE, "exp"))
    ok(cli(home, "append", TABLE, parquet(tmp_path, "new.parquet", new_rows(10))))
    scores = pa.table({KEY: pa.array([0, 1], pa.int64()), "score": [0.5, 0.25]})
    ok(cli(home, "backfill", TABLE, parquet(tmp_path, "s.parquet", scores), "-b", "exp"))

    assert json.loads(ok(cli(home, "branch", "diff", TABLE, "exp", json_out=True)))["behind"] == 1
    rebased = json.loads(ok(cli(home, "rebase", TABLE, "exp", "--onto", "main", json_out=True)))
    assert rebased["snapshot_id"] == table(home).branches()["exp"]
    assert table(home).stats("exp")["rows"] == 210
    assert "Rebased" in ok(cli(home, "branch", "rebase", TABLE, "exp"))

    assert "Merged exp into" in ok(cli(home, "merge", TABLE, "exp"))
    got = table(home).read(columns=[KEY, "score"], filter="sample_id < 2").sort_by(KEY)
    assert got["score"].to_pylist() == [0.5, 0.25] and table(home).stats()["rows"] == 210


def test_tag_create_read_drop(home, tmp_path):
    tagged = json.loads(ok(cli(home, "tag", TABLE, "v1", json_out=True)))
    assert tagged["snapshot_id"] == table(home).tags()["v1"]
    ok(cli(home, "append", TABLE, parquet(tmp_path, "new.parquet", new_rows(5))))
    assert len(json.loads(ok(cli(home, "read", TABLE, "-b", "v1", "-n", "0", json_out=True)))) == 200
    listed = {r["name"]: r for r in json.loads(ok(cli(home, "branch", "list", TABLE, json_out=True)))}
    assert listed["v1"]["type"] == "tag" and listed["v1"]["rows"] == 200
    assert "v1" in failed(cli(home, "tag", TABLE, "v1"))  # tags are immutable
    assert "Tagged" in ok(cli(home, "tag", TABLE, "v0", "--ref", str(tagged["snapshot_id"])))
    assert table(home).tags()["v0"] == tagged["snapshot_id"]
    assert "Dropped tag v1" in ok(cli(home, "tag", TABLE, "v1", "--drop"))
    assert set(table(home).tags()) == {"v0"}


# -------------------------------------------------------------- upsert, revert
def test_upsert_reports_updated_and_inserted(home, tmp_path):
    existing = table(home).read(filter="sample_id < 4").sort_by(KEY)
    existing = existing.set_column(existing.schema.get_field_index("click"), "click", pa.array([7] * 4, pa.int32()))
    data = pa.concat_tables([existing, new_rows(3).cast(existing.schema)])
    report = json.loads(ok(cli(home, "upsert", TABLE, parquet(tmp_path, "u.parquet", data), json_out=True)))
    assert (report["rows_updated"], report["rows_inserted"], report["rows"]) == (4, 3, 7)
    assert report["bytes_written"] > 0 and report["snapshot_id"] == table(home).branches()["main"]
    assert table(home).stats()["rows"] == 203
    assert table(home).read(columns=["click"], filter="sample_id < 4")["click"].to_pylist() == [7] * 4

    text = ok(cli(home, "upsert", TABLE, parquet(tmp_path, "u2.parquet", data)))
    assert "7 updated, 0 inserted" in text and "bytes written" in text


def test_revert(home, tmp_path):
    ok(cli(home, "append", TABLE, parquet(tmp_path, "new.parquet", new_rows(10))))
    appended = table(home).branches()["main"]
    out = ok(cli(home, "revert", TABLE, str(appended)))
    assert f"Reverted snapshot {appended}" in out
    assert table(home).stats()["rows"] == 200
    assert "12345" in failed(cli(home, "revert", TABLE, "12345"))


# ---------------------------------------------------------------- maintenance
def test_expire_and_gc(home, tmp_path):
    ok(cli(home, "branch", "create", TABLE, "exp"))
    ok(cli(home, "backfill", TABLE, clicks(tmp_path, "c.parquet", list(range(50)), 1), "-b", "exp"))
    ok(cli(home, "compact", TABLE, "-b", "exp"))
    ok(cli(home, "branch", "drop", TABLE, "exp"))
    expired = json.loads(ok(cli(home, "expire", TABLE, "--older-than", "0", json_out=True)))
    assert expired["expired"] and expired["retain_last"] == 1

    young = json.loads(ok(cli(home, "gc", json_out=True)))  # default: only files older than 72 h go
    assert young["files"] == [] and young["kept_young"] > 0
    dry = json.loads(ok(cli(home, "gc", "--older-than-hours", "0", "--dry-run", json_out=True)))
    assert dry["dry_run"] and dry["files"] and dry["bytes"] > 0
    assert all(os.path.exists(p.removeprefix("file://")) for p in dry["files"])
    assert "Would delete" in ok(cli(home, "gc", "--older-than-hours", "0", "--dry-run"))

    out = ok(cli(home, "gc", "--older-than-hours", "0"))
    assert f"Deleted {len(dry['files'])} file(s)" in out
    assert not any(os.path.exists(p.removeprefix("file://")) for p in dry["files"])
    assert table(home).read().num_rows == 200
    assert json.loads(ok(cli(home, "gc", "--older-than-hours", "0", json_out=True)))["files"] == []
    assert "Expired 0 snapshot(s)" in ok(cli(home, "expire", TABLE, "--older-than", "1d"))
    assert cli(home, "expire", TABLE).exit_code == 2  # --older-than is required


def test_columns_delete_restore_purge(home):
    deleted = json.loads(ok(cli(home, "columns", "delete", TABLE, "f7", json_out=True)))
    assert deleted["hidden_name"] != "f7" and "f7" not in table(home).schema.names
    assert "f7" in failed(cli(home, "read", TABLE, "--columns", "f7"))
    assert "Restored column f7" in ok(cli(home, "columns", "restore", TABLE, "f7"))
    assert "f7" in table(home).schema.names
    assert "sample_id" in failed(cli(home, "columns", "delete", TABLE, "sample_id"))  # the key stays

    ok(cli(home, "columns", "delete", TABLE, "f6"))
    assert "purged after" in failed(cli(home, "columns", "purge", TABLE, "f6"))  # 7 days of grace
    assert "Purged column f6" in ok(cli(home, "columns", "purge", TABLE, "f6", "--grace-days", "0"))
    assert "f6" in failed(cli(home, "columns", "restore", TABLE, "f6"))


def test_index_rebuild_and_verify(home):
    verified = json.loads(ok(cli(home, "index", "verify", TABLE, json_out=True)))
    assert verified["ok"] is True and verified["rows"] == 200
    rebuilt = json.loads(ok(cli(home, "index", "rebuild", TABLE, json_out=True)))
    assert rebuilt["rows"] == 200 and rebuilt["snapshot_id"] == table(home).branches()["main"]
    assert "ok" in ok(cli(home, "index", "verify", TABLE, "--branch", "main"))

    rewrite_index(table(home), drop_entries(3))  # a real index that lost three entries
    assert "missing 3" in failed(cli(home, "index", "verify", TABLE))
    result = cli(home, "index", "verify", TABLE, json_out=True)
    failed(result)
    report = json.loads(result.stdout)
    assert report["ok"] is False and report["missing"] == 3 and report["wrong"] == 0
    ok(cli(home, "index", "rebuild", TABLE))
    assert json.loads(ok(cli(home, "index", "verify", TABLE, json_out=True)))["ok"] is True


# ------------------------------------------------------------------- bad files
def test_read_skips_bad_files_within_budget(home):
    t = table(home)
    tasks = list(t.scan().tasks())
    assert len(tasks) == 2  # one file per day
    bad = tasks[0].file.file_path
    with open(bad.removeprefix("file://"), "r+b") as f:
        f.write(b"garbage!" * 64)
    assert "CorruptFileError" in failed(cli(home, "read", TABLE, "-n", "0"))

    result = cli(home, "read", TABLE, "-n", "0", "--max-bad-file-ratio", "0.5", json_out=True)
    rows = json.loads(ok(result))
    assert 0 < len(rows) < 200
    warning = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(warning) == 1 and warning[0].startswith("Warning") and bad in warning[0]
    assert f"{200 - len(rows)} row(s)" in warning[0]
