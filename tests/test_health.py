"""featurelake.health: compaction-relevant counters from cheap metadata only.

The tests marked ``@both_backends`` also run on REST + S3: there the data and
update files are deleted from the bucket with the test's own S3 client, and the
forecast is checked against expiry and GC on the bucket.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from backends import both_backends

from featurelake.errors import BranchNotFoundError, CorruptFileError
from featurelake.health import (
    clear_caches,
    lake_health,
    maintenance_forecast,
    read_counters,
    table_health,
)
from featurelake.synthetic import impressions_for_day, impressions_schema

KEY = "sample_id"


def day(d: int, n: int, batch: int) -> pa.Table:
    t = pa.Table.from_batches(list(impressions_for_day(d, n, seed=batch)))
    return t.set_column(0, KEY, pa.array([d * 10**9 + batch * 10**4 + j for j in range(n)], pa.int64()))


@pytest.fixture(autouse=True)
def _cold():
    clear_caches()
    yield
    clear_caches()


@pytest.fixture
def table(lake):
    return lake.create_table("ml.samples", impressions_schema(), primary_key=KEY, partition_by=["day(ts)"])


def _fill(table, batches: int = 3, days=(0, 1), rows: int = 40) -> None:
    for b in range(batches):
        for d in days:
            table.append(day(d, rows, b))


def _backfill(table, value: float, limit: int | None = None) -> None:
    keys = table.read(columns=[KEY])[KEY]
    if limit is not None:
        keys = keys.slice(0, limit)
    table.backfill(pa.table({KEY: keys, "score": pa.array([value] * len(keys), pa.float64())}))


def test_empty_table(table):
    h = table_health(table)
    assert h["snapshot_id"] is None and h["data_files"] == 0 and h["small_files"] == 0
    assert h["update_files"] == 0 and h["max_update_layers"] == 0


@both_backends
def test_counts_agree_with_stats(table):
    _fill(table)
    _backfill(table, 1.0)
    _backfill(table, 2.0, limit=10)
    h = table_health(table)
    s = table.stats()
    for key in ("rows", "data_files", "small_files", "update_files", "max_update_layers", "data_bytes", "update_bytes", "bytes"):
        assert h[key] == s[key], key
    assert h["snapshot_id"] == s["snapshot_id"]
    assert h["data_files"] == 6 and h["small_files"] == 6
    assert h["compactable_small_files"] == 6  # 3 small files in each of 2 day partitions
    assert h["max_update_layers"] == 2 and h["files_with_updates"] == 6
    assert h["table"] == "ml.samples" and h["branch"] == "main"


def test_lone_small_files_are_not_compactable(table):
    for d in range(4):  # one small file per day partition: nothing to bin-pack
        table.append(day(d, 30, 0))
    h = table_health(table)
    assert h["small_files"] == 4 and h["compactable_small_files"] == 0
    table.append(day(0, 30, 1))
    assert table_health(table)["compactable_small_files"] == 2


@both_backends
def test_reads_no_data_or_update_file(table, backend):
    """The data and update files can vanish: health is computed from metadata alone."""
    _fill(table)
    _backfill(table, 1.0)
    expected = table_health(table)
    clear_caches()
    data = backend.name_of(table.iceberg.location()).rstrip("/") + "/data/"
    doomed = [f for f in backend.files() if f.startswith(data)]
    for f in doomed:
        backend.remove(f)
    assert len(doomed) >= 7  # 6 data files + at least one update file
    assert table_health(table) == expected
    with pytest.raises(CorruptFileError, match="missing"):  # while a real read now fails
        table.read()


@both_backends
def test_cached_by_snapshot_and_manifest(table):
    _fill(table)
    table_health(table)
    cold = read_counters().get("manifests", 0)
    assert cold >= 1
    table_health(table)
    assert read_counters().get("manifests", 0) == cold  # unchanged snapshot: nothing read
    _backfill(table, 1.0)  # a metadata-only commit for Iceberg: the same data manifests
    h = table_health(table)
    assert read_counters().get("manifests", 0) == cold
    assert h["update_files"] == 1 and read_counters()["states"] == 1  # six dense layers in one shared file
    assert h["files_with_updates"] == 6
    table.append(day(5, 20, 0))  # only the new manifest is read
    table_health(table)
    assert read_counters()["manifests"] - cold <= 2


def test_skip_manifests_below_threshold(table):
    _fill(table, batches=1)
    h = table_health(table, skip_manifests_below=10)
    assert h["manifests_read"] is False and h["small_files"] is None
    assert h["data_files"] == 2 and read_counters().get("manifests", 0) == 0
    h = table_health(table, skip_manifests_below=2)
    assert h["manifests_read"] is True and h["small_files"] == 2


def test_branches(lake, table):
    _fill(table, batches=2)
    table.create_branch("research")
    _backfill(table, 1.0)  # on main
    keys = table.read(columns=[KEY], branch="research")[KEY]
    table.backfill(pa.table({KEY: keys, "other": pc.cast(keys, pa.float64())}), branch="research")
    table.backfill(pa.table({KEY: keys, "other": pc.cast(keys, pa.float64())}), branch="research")
    main, research = table_health(table, "main"), table_health(table, "research")
    assert main["max_update_layers"] == 1 and research["max_update_layers"] == 2
    assert main["data_files"] == research["data_files"] == 4
    rows = {(h["table"], h["branch"]): h for h in lake_health(lake)}
    assert set(rows) == {("ml.samples", "main"), ("ml.samples", "research")}
    assert rows[("ml.samples", "research")]["update_files"] == research["update_files"]
    assert [h["branch"] for h in lake_health(lake, branches=["research"])] == ["research"]
    with pytest.raises(BranchNotFoundError):
        table_health(table, "nope")


def test_health_after_compaction(table):
    _fill(table)
    _backfill(table, 1.0)
    table.compact()
    h = table_health(table)
    assert h["data_files"] == 2 and h["compactable_small_files"] == 0
    assert h["update_files"] == 0 and h["max_update_layers"] == 0
    assert h["rows"] == 240


@both_backends
def test_forecast_matches_expiry_then_gc(lake, table):
    _fill(table)
    _backfill(table, 1.0)
    table.compact()
    cutoff = datetime.now(timezone.utc) + timedelta(seconds=1)
    forecast = maintenance_forecast(lake, cutoff, retain_last=1)
    assert forecast["snapshots"] >= 7 and forecast["files"] > 0
    expired = table.expire_snapshots(cutoff, retain_last=1)
    report = lake.collect_garbage(older_than=timedelta(0), dry_run=True)
    assert len(expired) == forecast["snapshots"]
    assert (len(report.files), report.bytes) == (forecast["files"], forecast["bytes"])
    assert forecast["tables"]["ml.samples"]["snapshots"] == len(expired)
