"""Sample tables: append/read round trips against a pyarrow oracle, and bad input writing nothing."""
from __future__ import annotations

from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from backends import both_backends
from featurelake import Lake
from featurelake.errors import (
    BranchNotFoundError,
    DuplicateKeyError,
    FeatureLakeError,
    InvalidNameError,
    NullKeyError,
    SchemaMismatchError,
    TableExistsError,
    TableNotFoundError,
)
from featurelake.synthetic import impressions_for_day, impressions_schema, impressions_table

KEY = "sample_id"


def make_table(lake: Lake, name: str = "ml.samples", partition_by=("day(ts)",)):
    return lake.create_table(name, impressions_schema(), primary_key=KEY, partition_by=list(partition_by))


def same_rows(actual: pa.Table, expected: pa.Table) -> bool:
    """Equal as sets of rows (order-free), after casting to the expected types."""
    actual = actual.select(expected.column_names).cast(expected.schema)
    return actual.sort_by(KEY).equals(expected.sort_by(KEY))


def history(t) -> list[int]:
    return [s["snapshot_id"] for s in t.snapshots()]


@pytest.mark.parametrize("partition_by", [(), ("day(ts)",), ("bucket(4, user_id)", "day(ts)")])
def test_round_trip_matches_oracle(any_lake, partition_by):
    data = impressions_table(3000, days=3, seed=7)
    t = make_table(any_lake, partition_by=partition_by)
    sid = t.append(data)
    assert sid == t.iceberg.metadata.current_snapshot_id
    out = t.read()
    assert out.num_rows == data.num_rows
    assert same_rows(out, data)
    # nested and list columns survive exactly
    assert out.schema.field("context").type.value_type.num_fields == 3
    # plain pyiceberg sees the same rows
    assert same_rows(t.iceberg.scan().to_arrow(), data)


@both_backends
def test_projection_and_filters_match_pyarrow(lake):
    data = impressions_table(4000, days=2, seed=3)
    t = make_table(lake)
    t.append(data)
    cases = {
        "click = 1": pc.equal(data["click"], 1),
        "user_id < 50 and click = 0": pc.and_(pc.less(data["user_id"], 50), pc.equal(data["click"], 0)),
        "f0 > 0.5 or item_id = 3": pc.or_(pc.greater(data["f0"], 0.5), pc.equal(data["item_id"], 3)),
        "not (click = 1)": pc.invert(pc.equal(data["click"], 1)),
        "ts >= '2026-01-02T00:00:00'": pc.greater_equal(data["ts"], pa.scalar(datetime(2026, 1, 2), pa.timestamp("us"))),
        "f1 is null": pc.is_null(data["f1"]),
    }
    for expr, mask in cases.items():
        got = t.read(columns=[KEY, "click"], filter=expr)
        assert got.column_names == [KEY, "click"], expr
        want = data.filter(mask).select([KEY, "click"])
        assert same_rows(got, want), expr


@both_backends
def test_batches_stream_the_same_rows(lake):
    data = impressions_table(5000, days=3, seed=1)
    t = make_table(lake)
    t.append(data)
    batches = list(t.batches(batch_size=700))
    assert all(0 < b.num_rows <= 700 for b in batches)
    assert same_rows(pa.Table.from_batches(batches), data)
    shuffled = pa.Table.from_batches(list(t.batches(batch_size=1000, shuffle=True, seed=5)))
    assert same_rows(shuffled, data)
    assert shuffled.column(KEY).to_pylist() != t.read().column(KEY).to_pylist()
    sampled = pa.Table.from_batches(list(t.batches(sample=0.25, seed=2)))
    assert 0.15 * data.num_rows < sampled.num_rows < 0.35 * data.num_rows
    assert pc.all(pc.is_in(sampled[KEY], value_set=data[KEY])).as_py()


@both_backends
def test_append_streams_batches_in_one_commit(lake):
    t = make_table(lake)
    stream = impressions_for_day(0, 2500, batch_size=400, seed=9)
    before = len(t.iceberg.metadata.snapshots)
    t.append(stream)
    assert len(t.iceberg.metadata.snapshots) == before + 1
    assert same_rows(t.read(), pa.Table.from_batches(list(impressions_for_day(0, 2500, batch_size=400, seed=9))))


def test_time_travel_and_reopen_from_disk(tmp_path):
    home = tmp_path / "lake"
    lake = Lake(home)
    t = make_table(lake)
    day0 = impressions_table(500, days=1, seed=1)
    first = t.append(day0)
    day1 = pa.Table.from_batches(list(impressions_for_day(1, 700, seed=1)))
    t.append(day1)
    reopened = Lake(home).table("ml.samples")
    assert reopened.read().num_rows == 1200
    assert same_rows(reopened.read(snapshot_id=first), day0)
    assert Lake(home).tables() == ["ml.samples"]


@both_backends
def test_delete_and_overwrite_match_oracle(lake):
    data = impressions_table(3000, days=3, seed=4)
    t = make_table(lake)
    t.append(data)
    t.delete("user_id < 200")
    expected = data.filter(pc.greater_equal(data["user_id"], 200))
    assert same_rows(t.read(), expected)
    day = "ts >= '2026-01-02T00:00:00' and ts < '2026-01-03T00:00:00'"
    replacement = pa.Table.from_batches(list(impressions_for_day(1, 400, seed=99)))
    t.overwrite(replacement, day)
    t.overwrite(replacement, day)  # re-materializing the same day never duplicates
    in_day = pc.and_(
        pc.greater_equal(expected["ts"], pa.scalar(datetime(2026, 1, 2), pa.timestamp("us"))),
        pc.less(expected["ts"], pa.scalar(datetime(2026, 1, 3), pa.timestamp("us"))),
    )
    assert same_rows(t.read(), pa.concat_tables([expected.filter(pc.invert(in_day)), replacement]))


@both_backends
def test_stats_count_rows_files_and_bytes(lake):
    t = make_table(lake)
    assert t.stats()["rows"] == 0
    t.append(impressions_table(1000, days=2))
    s = t.stats()
    assert s["rows"] == 1000
    assert s["data_files"] == len(t.iceberg.inspect.files())
    assert s["bytes"] == sum(t.iceberg.inspect.files()["file_size_in_bytes"].to_pylist())
    assert s["small_files"] == s["data_files"]
    assert s["update_files"] == 0


def test_tables_and_names(any_lake):
    make_table(any_lake, "ml.a")
    make_table(any_lake, "research.b")
    assert any_lake.tables() == ["ml.a", "research.b"]
    with pytest.raises(TableExistsError):
        make_table(any_lake, "ml.a")
    with pytest.raises(TableNotFoundError):
        any_lake.table("ml.missing")
    for bad in ["nonamespace", "a.b.c", "ml.bad-name", "ml.", "1x.y'"]:
        with pytest.raises(InvalidNameError):
            any_lake.create_table(bad, impressions_schema(), primary_key=KEY)
    with pytest.raises(InvalidNameError):
        any_lake.create_table("ml.c", impressions_schema(), primary_key=KEY, partition_by=["dya(ts)"])
    with pytest.raises(SchemaMismatchError):
        any_lake.create_table("ml.c", impressions_schema(), primary_key="nope")
    assert any_lake.tables() == ["ml.a", "research.b"]


def test_primary_key_is_an_identifier_field(lake):
    t = make_table(lake)
    schema = t.iceberg.schema()
    assert [schema.find_column_name(i) for i in schema.identifier_field_ids] == [KEY]
    assert schema.find_field(KEY).required
    props = t.iceberg.metadata.properties
    assert props["write.metadata.metrics.default"] == "none"
    assert props[f"write.metadata.metrics.column.{KEY}"] == "full"
    assert props["write.metadata.metrics.column.ts"] == "full"


# ------------------------------------------------------------------ bad input
@pytest.fixture
def filled(any_lake):
    t = make_table(any_lake)
    data = impressions_table(600, days=2, seed=5)
    t.append(data)
    return t, data


def _unchanged(t, snapshots_before, data):
    assert history(t) == snapshots_before
    assert same_rows(t.read(), data)


def test_bad_input_writes_nothing(filled):
    t, data = filled
    before = history(t)
    fresh = pa.Table.from_batches(list(impressions_for_day(5, 50, seed=2)))

    with pytest.raises(SchemaMismatchError) as e:
        t.append(fresh.append_column("surprise", pa.array(range(50))))
    assert "surprise" in e.value.fields
    with pytest.raises(SchemaMismatchError) as e:
        t.append(fresh.set_column(fresh.schema.get_field_index("click"), "click", pa.array(["x"] * 50)))
    assert "click" in str(e.value)
    with pytest.raises(SchemaMismatchError):
        t.append(fresh.drop_columns([KEY]))
    nulls = fresh.set_column(0, KEY, pa.array([None] + list(range(10**12, 10**12 + 49)), pa.int64()))
    with pytest.raises(NullKeyError):
        t.append(nulls)
    with pytest.raises(DuplicateKeyError) as e:
        t.append(pa.concat_tables([fresh, fresh.slice(0, 3)]))
    assert e.value.count == 3
    with pytest.raises(DuplicateKeyError) as e:
        t.append(pa.concat_tables([fresh, data.slice(10, 2)]))
    assert set(e.value.keys) == set(data.slice(10, 2)[KEY].to_pylist())
    with pytest.raises(BranchNotFoundError):
        t.append(fresh, branch="nope")
    with pytest.raises(BranchNotFoundError):
        t.read(branch="nope")
    with pytest.raises(BranchNotFoundError):
        t.read(snapshot_id=12345)
    with pytest.raises(SchemaMismatchError):
        t.read(columns=["nope"])
    with pytest.raises(FeatureLakeError):
        t.read(filter="nope = 1")
    with pytest.raises(FeatureLakeError):
        t.read(filter="click === ")
    _unchanged(t, before, data)
    # the branch that was refused was not created behind our back
    assert "nope" not in t.iceberg.metadata.refs


@both_backends
def test_failed_stream_leaves_no_files_referenced(backend):
    lake = backend.lake
    t = make_table(lake)
    good = impressions_for_day(0, 300, batch_size=100)

    def stream():
        yield from good
        bad = pa.Table.from_batches(list(impressions_for_day(1, 10)))
        yield bad.set_column(0, KEY, pa.array([0] * 10, pa.int64()))  # repeats a key

    with pytest.raises(DuplicateKeyError):
        t.append(stream())
    assert t.read().num_rows == 0
    assert not t.iceberg.metadata.snapshots
    left = backend.files(".parquet")  # the failing chunk is checked before any file is written
    assert not left, f"files left in the warehouse (from this test or an earlier one on the worker): {left}"


def test_from_env(tmp_path, monkeypatch):
    monkeypatch.delenv("FEATURELAKE_CATALOG_URI", raising=False)
    monkeypatch.setenv("FEATURELAKE_HOME", str(tmp_path / "home"))
    lake = Lake.from_env()
    assert lake.home == (tmp_path / "home").resolve()
    make_table(lake, "ml.x")
    monkeypatch.setenv("FEATURELAKE_CATALOG_URI", f"sqlite:///{tmp_path / 'home' / 'catalog.db'}")
    monkeypatch.setenv("FEATURELAKE_WAREHOUSE", str(tmp_path / "home" / "warehouse"))
    configured = Lake.from_env()
    assert configured.home is None
    assert configured.tables() == ["ml.x"]


def test_tables_are_iceberg_format_version_2(any_lake):
    t = any_lake.create_table("ml.v", impressions_schema(), primary_key="sample_id", partition_by=["day(ts)"])
    t.append(impressions_table(20, days=1))
    t.backfill(pa.table({"sample_id": pa.array([0], pa.int64()), "click": pa.array([1], pa.int32())}))
    ice = t.iceberg
    assert ice.metadata.format_version == 2
    import json

    with ice.io.new_input(ice.metadata_location).open() as f:  # as any Iceberg reader sees it
        assert json.loads(f.read())["format-version"] == 2
