"""Dense column writes (Table.add_column, Table.scan_order) and the append write path.

Oracles: the general keyed backfill on a twin branch, and numpy computing the
expected column from the keys. The whole-column writes, their refusals (the
store listed before and after) and the dictionary rule also run on REST + S3.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from backends import both_backends

from featurelake import dense, index
from featurelake.errors import DuplicateKeyError, InvalidArgumentError, SnapshotMovedError, UnknownKeyError
from featurelake.merge import snapshot_files
from featurelake.state import StateWriter

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("ts", pa.timestamp("us"), nullable=False),
    pa.field("x", pa.float32()),
    pa.field("kind", pa.string()),
])
DAY = np.timedelta64(1, "D")


def _day(d: int, ids) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    ts = np.datetime64("2024-01-01T00:00:00", "us") + d * DAY + np.arange(len(ids)).astype("timedelta64[s]")
    return pa.table({"id": ids, "ts": ts, "x": (ids * 0.5).astype(np.float32), "kind": np.array(["a", "b"])[ids % 2]}, schema=SCHEMA)


@pytest.fixture
def table(lake):
    """Three day partitions (ids descending inside each, so scan order is not key order), then a delete."""
    t = lake.create_table("ns.t", SCHEMA, primary_key="id", partition_by=["day(ts)"])
    for d in range(3):
        t.append(_day(d, np.arange(d * 500, (d + 1) * 500)[::-1]))
    t.append(pa.concat_tables([_day(3, [2000, 2001]), _day(4, [2100, 2101])]))  # several files in one commit
    t.delete("id >= 100 and id < 150")  # rewrites one file
    return t


def test_scan_order_is_the_read_order(table):
    order = table.scan_order()
    got = table.read(columns=["id"], snapshot_id=order.snapshot_id, with_locator=True)
    assert order.snapshot_id == table.branches()["main"]
    assert len(order.files) == 5 and order.total_rows == got.num_rows == 1454
    expected_files = np.repeat(np.array(order.files, dtype=object), order.rows)
    assert got.column("_file").to_pylist() == expected_files.tolist()
    expected_pos = np.concatenate([np.arange(n) for n in order.rows])
    assert np.array_equal(got.column("_pos").to_numpy(), expected_pos)


@both_backends
def test_add_column_in_scan_order_equals_the_keyed_backfill(table):
    order = table.scan_order()
    keys = table.read(columns=["id"], snapshot_id=order.snapshot_id).column("id").to_numpy()
    values = pa.array((keys * 3 + 1).astype(np.float64))
    table.create_branch("oracle")
    sid = table.add_column("y", values, snapshot_id=order.snapshot_id)
    report = table.last_update_report
    assert report.data_files_touched == len(order.files) and report.rows_updated == len(keys)
    assert report.update_files == 1  # the dense layers are small: one shared update file
    table.backfill(pa.table({"id": pa.array(keys), "y": values}), branch="oracle")
    main = table.read(columns=["id", "y"]).sort_by("id")
    oracle = table.read(columns=["id", "y"], branch="oracle").sort_by("id")
    assert main.equals(oracle)
    assert np.array_equal(main.column("y").to_numpy(), main.column("id").to_numpy() * 3.0 + 1)
    assert table.stats()["update_files"] == 1 and table.stats()["max_update_layers"] == 1  # a dense layer per file, one shared file
    assert sid == table.branches()["main"] != order.snapshot_id


@pytest.mark.parametrize("direct_span", [4, 0], ids=["counting-sort", "sort-merge"])
def test_add_column_by_key_sort_merges_keys_in_any_order(table, monkeypatch, direct_span):
    monkeypatch.setattr(dense, "DIRECT_SPAN", direct_span)  # 0: keys too sparse for direct addressing
    order = table.scan_order()
    keys = table.read(columns=["id"]).column("id").to_numpy()
    perm = np.random.default_rng(3).permutation(len(keys))
    table.add_column("z", pa.array(keys[perm] * 2), snapshot_id=order.snapshot_id, keys=pa.array(keys[perm]))
    got = table.read(columns=["id", "z"])
    assert np.array_equal(got.column("z").to_numpy(), got.column("id").to_numpy() * 2)
    assert table.last_update_report.data_files_touched == len(order.files) and table.last_update_report.update_files == 1


def _nothing_written(table, backend, action, error):
    """``action`` raises ``error``; the store's listing (its own client) and every branch head are unchanged."""
    before_files, before_snaps = backend.files(), table.branches()
    with pytest.raises(error):
        action()
    assert backend.files() == before_files
    assert table.branches() == before_snaps


@both_backends
def test_add_column_refused_when_the_snapshot_moved(table, backend):
    order = table.scan_order()
    keys = table.read(columns=["id"], snapshot_id=order.snapshot_id).column("id").to_numpy()
    table.append(_day(9, [5000]))  # the branch moves on
    _nothing_written(table, backend, lambda: table.add_column("y", pa.array(keys), snapshot_id=order.snapshot_id), SnapshotMovedError)
    assert "y" not in table.schema.names


@both_backends
def test_add_column_bad_input_writes_nothing(table, backend):
    order = table.scan_order()
    n, sid = order.total_rows, order.snapshot_id
    keys = table.read(columns=["id"]).column("id").to_numpy()
    _nothing_written(table, backend, lambda: table.add_column("y", pa.array(np.ones(n - 1)), snapshot_id=sid), InvalidArgumentError)
    _nothing_written(table, backend, lambda: table.add_column("y", pa.array(np.ones(n)), snapshot_id=None), InvalidArgumentError)
    missing = keys.copy()
    missing[0] = 10**9  # one key not in the table, one row without a value
    _nothing_written(table, backend, lambda: table.add_column("y", pa.array(np.ones(n)), snapshot_id=sid, keys=pa.array(missing)), UnknownKeyError)
    repeated = keys.copy()
    repeated[0] = repeated[1]
    _nothing_written(table, backend, lambda: table.add_column("y", pa.array(np.ones(n)), snapshot_id=sid, keys=pa.array(repeated)), DuplicateKeyError)
    assert "y" not in table.schema.names


def test_append_indexes_its_files_from_memory(table):
    """Keys of files just written are indexed as written (partition split, sort): the index is right."""
    table.append(pa.concat_tables([_day(6, [7001, 7000]), _day(5, [6000]), _day(6, [7002])]))
    report = table.verify_index()
    assert report["ok"] and report["uncovered_files"] == 0, report
    with pytest.raises(DuplicateKeyError):
        table.append(_day(7, [7002]))


def test_index_extend_does_not_read_back_files_whose_keys_it_is_given(table):
    ice = table.refresh()
    head = ice.metadata.snapshot_by_id(table.branches()["main"])
    writer = StateWriter(table._state(ice, head), ice.io, table._platform_dir(ice))
    ghost = f"{ice.location()}/data/never-written.parquet"  # reading it back would fail
    index.extend(ice, writer, [ghost], ["id"], set(snapshot_files(ice, head)) | {ghost}, known={ghost: pa.table({"id": pa.array([42], pa.int64())})})
    new = [s for s in writer.index_segments if ghost in index._open(ice.io, s).files]
    assert len(new) == 1 and new[0]["rows"] == 1


@both_backends
def test_data_files_use_dictionaries_only_where_values_repeat(backend):
    t = backend.lake.create_table("ns.enc", SCHEMA, primary_key="id", partition_by=["day(ts)"])
    rng = np.random.default_rng(0)
    rows = _day(0, np.arange(5000)).set_column(2, pa.field("x", pa.float32()), pa.array(rng.standard_normal(5000, dtype=np.float32)))
    t.append(rows)
    [path] = [f.file_path for f in snapshot_files(t.refresh(), t.refresh().current_snapshot()).values()]
    md = backend.parquet(path).metadata
    cols = {md.schema.column(i).name: md.row_group(0).column(i) for i in range(md.num_columns)}
    assert "PLAIN_DICTIONARY" not in cols["x"].encodings and "RLE_DICTIONARY" not in cols["x"].encodings  # distinct floats
    assert "RLE_DICTIONARY" in cols["kind"].encodings  # two values
    assert cols["id"].statistics is not None and cols["id"].statistics.has_min_max  # the key keeps its bounds
    assert cols["x"].statistics is None or not cols["x"].statistics.has_min_max  # no bounds the table would not keep
    got = t.read().sort_by("id")
    assert got.equals(rows.cast(got.schema).sort_by("id"))
