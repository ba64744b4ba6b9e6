"""The write path's settings and machinery: one place for Parquet settings, the shared writer pool,
the dictionary decision and the scan-order cache.

Oracles: the Parquet footer of the files written (pyarrow's own reader, the
bytes fetched with the store's own client), pyarrow compute for the dictionary
rule, plain Python for the pool, and the table's read for every round trip.

On REST + S3 too: one codec, the scan-order cache and the partition cut. The
metadata-JSON check stays on the embedded catalog: it tests that catalog's own
metadata writer, while a REST catalog writes the metadata file on its server.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from backends import Backend, both_backends

from featurelake import threads
from featurelake.datafiles import DICTIONARY_MAX_DISTINCT, DICTIONARY_SAMPLE, _repeats
from featurelake.livefiles import snapshot_files
from featurelake.state import state_of
from featurelake.writer_settings import DEFAULTS, WriterSettings

SCHEMA = pa.schema([
    pa.field("id", pa.int64(), nullable=False),
    pa.field("ts", pa.timestamp("us"), nullable=False),
    pa.field("x", pa.float32()),
    pa.field("kind", pa.string()),
])


def _rows(n: int, start: int = 0, day: int = 0) -> pa.Table:
    ids = np.arange(start, start + n, dtype=np.int64)
    ts = np.datetime64("2024-01-01T00:00:00", "us") + np.timedelta64(day, "D") + np.arange(n).astype("timedelta64[s]")
    rng = np.random.default_rng(start)
    return pa.table({"id": ids, "ts": ts, "x": rng.standard_normal(n, dtype=np.float32), "kind": np.array(["a", "b"])[ids % 2]},
                    schema=SCHEMA)


S3 = pytest.mark.s3


def _codecs(backend: Backend, path: str) -> set[str]:
    md = backend.parquet(path).metadata
    return {md.row_group(r).column(c).compression for r in range(md.num_row_groups) for c in range(md.num_columns)}


def _written_codecs(t, backend: Backend) -> tuple[set[str], set[str]]:
    """Codecs of the current snapshot's data files, and of its update files."""
    ice = t.refresh()
    head = ice.current_snapshot()
    data = set().union(*(_codecs(backend, p) for p in snapshot_files(ice, head)))
    state = state_of(ice.metadata, ice.io, head)
    updates = set().union(*(_codecs(backend, e.update_file) for e in state.entries()))
    return data, updates


@pytest.mark.parametrize(
    "backend, codec",
    [("local", None), ("local", "zstd"), ("local", "snappy"), pytest.param("s3", "zstd", marks=S3)],
    ids=["local-default", "local-zstd", "local-snappy", "s3-zstd"],
    indirect=["backend"],
)
def test_data_and_update_files_use_the_tables_codec_and_read_back_equal(backend, codec):
    lake = backend.lake
    props = {} if codec is None else {"write.parquet.compression-codec": codec}
    t = lake.create_table(f"ns.c_{codec or 'default'}", SCHEMA, primary_key="id", partition_by=["day(ts)"], properties=props)
    rows = pa.concat_tables([_rows(3000, 0, 0), _rows(2000, 3000, 1)])
    t.append(rows)
    order = t.scan_order()
    keys = t.read(columns=["id"]).column("id").to_numpy()
    t.add_column("y", pa.array(keys * 2.0), snapshot_id=order.snapshot_id)
    t.backfill(pa.table({"id": pa.array([5, 4000], pa.int64()), "x": pa.array([7.5, -1.0], pa.float32())}))
    data, updates = _written_codecs(t, backend)
    want = {"LZ4": {"LZ4", "LZ4_RAW"}, "ZSTD": {"ZSTD"}, "SNAPPY": {"SNAPPY"}}[(codec or DEFAULTS.codec).upper()]
    # a column the codec does not shrink (delta-packed ints, distinct floats) is written plain: datafiles.column_codecs
    assert data & want and data <= want | {"UNCOMPRESSED"}, data   # the dictionary-coded "kind" keeps the codec
    assert updates and updates <= want | {"UNCOMPRESSED"}, updates
    got = t.read().sort_by("id")
    expected = rows.to_pandas().set_index("id")
    expected.loc[[5, 4000], "x"] = [7.5, -1.0]
    expected["y"] = expected.index.to_numpy() * 2.0
    assert np.array_equal(got.column("id").to_numpy(), expected.index.to_numpy())
    assert got.column("x").to_pylist() == pytest.approx(expected["x"].tolist())
    assert got.column("y").to_pylist() == pytest.approx(expected["y"].tolist())
    assert got.column("kind").to_pylist() == expected["kind"].tolist()


def test_writer_settings_come_from_table_properties_with_defaults_for_the_rest():
    s = WriterSettings.of({"write.parquet.compression-codec": "zstd", "write.parquet.compression-level": "3",
                           "write.parquet.row-group-limit": "1000"})
    assert (s.codec, s.level, s.row_group_rows, s.page_bytes) == ("zstd", 3, 1000, DEFAULTS.page_bytes)
    assert WriterSettings.of({"write.parquet.compression-codec": "uncompressed"}).parquet_kwargs()["compression"] == "none"
    assert WriterSettings.of({}) == DEFAULTS


def test_row_group_limit_property_is_honoured(lake):
    t = lake.create_table("ns.rg", SCHEMA, primary_key="id", properties={"write.parquet.row-group-limit": "1000"})
    t.append(_rows(4500))
    [path] = list(snapshot_files(t.refresh(), t.refresh().current_snapshot()))
    assert pq.ParquetFile(path.removeprefix("file://")).metadata.num_row_groups == 5
    assert t.read().sort_by("id").column("id").to_pylist() == list(range(4500))


@pytest.mark.parametrize("kind", ["int-repeating", "int-distinct", "float-distinct", "float-rounded", "timestamp", "chunked", "nulls",
                                  "string", "nan"])
def test_dictionary_decision_follows_the_distinct_count_rule(kind):
    rng = np.random.default_rng(1)
    n = 10_000
    col = {
        "int-repeating": lambda: pa.chunked_array([pa.array(rng.integers(0, 50, n))]),
        "int-distinct": lambda: pa.chunked_array([pa.array(rng.permutation(n))]),
        "float-distinct": lambda: pa.chunked_array([pa.array(rng.standard_normal(n, dtype=np.float32))]),
        "float-rounded": lambda: pa.chunked_array([pa.array(np.round(rng.standard_normal(n), 1))]),
        "timestamp": lambda: pa.chunked_array([pa.array(np.datetime64("2024-01-01", "us") + rng.integers(0, 100, n).astype("timedelta64[s]"))]),
        "chunked": lambda: pa.chunked_array([pa.array(rng.integers(0, 3000, 1000)), pa.array(rng.integers(0, 3000, n))]),
        "nulls": lambda: pa.chunked_array([pa.array([None if i % 3 else float(i % 7) for i in range(n)])]),
        "string": lambda: pa.chunked_array([pa.array([f"s{i % 100}" for i in range(n)])]),
        "nan": lambda: pa.chunked_array([pa.array(np.where(rng.random(n) < 0.9, np.nan, 1.0))]),
    }[kind]()
    sample = col.slice(0, DICTIONARY_SAMPLE)
    valid = len(sample) - sample.null_count
    distinct = pc.count_distinct(sample).as_py()
    oracle = distinct <= DICTIONARY_MAX_DISTINCT * valid
    if kind == "nan":  # numpy counts each NaN as its own value: only ever "no dictionary" for NaN-heavy floats
        assert _repeats(col) is False
    else:
        assert _repeats(col) is oracle, (kind, distinct, valid)


def test_run_all_waits_for_every_task_before_it_raises():
    finished = []

    def task(i: int) -> int:
        if i == 0:
            raise ValueError("first fails at once")
        time.sleep(0.2)
        finished.append(i)
        return i

    with pytest.raises(ValueError, match="first fails"):
        threads.run_all(task, range(4))
    assert sorted(finished) == [1, 2, 3]  # nothing still running after the raise (a cleanup may delete now)
    finished.clear()
    with pytest.raises(ValueError):
        threads.run_all(task, range(10), threads=2)  # fewer threads than items
    assert sorted(finished) == list(range(1, 10))


def test_run_all_keeps_order_caps_threads_and_nests_without_deadlock():
    running, peak, lock = [0], [0], threading.Lock()

    def task(i: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.01)
        with lock:
            running[0] -= 1
        return i * i

    assert threads.run_all(task, range(20), threads=3) == [i * i for i in range(20)]
    assert peak[0] <= 3
    # a task that itself fans out (more than the pool's threads) must not wait on its own pool
    nested = threads.run_all(lambda i: sum(threads.run_all(lambda j: i * j, range(threads.MAX_THREADS * 2))),
                             range(threads.MAX_THREADS * 2))
    assert nested == [i * sum(range(threads.MAX_THREADS * 2)) for i in range(threads.MAX_THREADS * 2)]


@both_backends
def test_scan_order_of_a_past_snapshot_stays_its_read_order(lake):
    t = lake.create_table("ns.so", SCHEMA, primary_key="id", partition_by=["day(ts)"])
    t.append(_rows(300, 0, 0))
    t.append(_rows(200, 1000, 1))
    first = t.scan_order()
    t.append(_rows(100, 5000, 2))
    t.delete("id < 50")
    again = t.scan_order(snapshot_id=first.snapshot_id)
    assert again == first
    for order in (first, t.scan_order()):
        keys = t.read(columns=["id"], snapshot_id=order.snapshot_id, with_locator=True)
        files = keys.column("_file").to_pylist()
        assert list(dict.fromkeys(files)) == list(order.files)
        assert [files.count(f) for f in order.files] == list(order.rows)


def test_metadata_json_is_pyicebergs_document_for_every_commit_of_a_long_history(lake):
    """The lake's catalog writes each schema's JSON once; every metadata file must still be exactly
    the document pyiceberg would write (same keys and values) and parse back to the same metadata."""
    import json

    from pyiceberg.table.metadata import TableMetadataUtil

    from featurelake.metadata_json import metadata_json

    nested = pa.schema([*SCHEMA, pa.field("tags", pa.list_(pa.struct([pa.field("k", pa.string()), pa.field("v", pa.float64())]))),
                        pa.field("m", pa.map_(pa.string(), pa.int64()))])
    t = lake.create_table("ns.meta", nested, primary_key="id", partition_by=["day(ts)"])
    rows = _rows(200)
    rows = rows.append_column("tags", pa.array([[{"k": "a", "v": 1.0}]] * 200, nested.field("tags").type))
    rows = rows.append_column("m", pa.array([[("x", 1)]] * 200, nested.field("m").type))
    t.append(rows)
    for i in range(6):  # a schema per new column, plus a soft delete (a rename) and an append between
        order = t.scan_order()
        t.add_column(f"c{i}", pa.array(np.full(order.total_rows, i, np.float32)), snapshot_id=order.snapshot_id)
        if i == 2:
            t.soft_delete_column("c0")
        if i == 3:
            t.append(_rows(10, 10_000, 1).append_column("tags", pa.nulls(10, nested.field("tags").type))
                     .append_column("m", pa.nulls(10, nested.field("m").type)))
    ice = t.refresh()
    assert len(ice.metadata.schemas) >= 7
    with open(ice.metadata_location.removeprefix("file://"), "rb") as f:
        written = f.read()
    parsed = TableMetadataUtil.parse_raw(written)
    assert json.loads(written) == json.loads(parsed.model_dump_json())  # the file is pyiceberg's document
    assert json.loads(metadata_json(parsed)) == json.loads(parsed.model_dump_json())
    assert TableMetadataUtil.parse_raw(metadata_json(parsed)) == parsed
    got = t.read(columns=["id", "c5"]).sort_by("id")
    assert got.num_rows == 210 and set(got.column("c5").to_pylist()) == {5.0}


@pytest.mark.parametrize(
    "backend, layout",
    [("local", "contiguous-out-of-order"), ("local", "interleaved"), pytest.param("s3", "interleaved", marks=S3)],
    ids=["local-contiguous-out-of-order", "local-interleaved", "s3-interleaved"],
    indirect=["backend"],
)
def test_partitions_are_cut_in_input_order_whether_contiguous_or_not(backend, layout):
    """Days given as runs (sliced without a copy) or interleaved (sorted): one file per day, each file's rows
    in input order, every row read back, the index right."""
    t = backend.lake.create_table(f"ns.p_{layout.replace('-', '_')}", SCHEMA, primary_key="id", partition_by=["day(ts)"])
    days = [_rows(300, 1000 * d, d).take(pa.array(np.random.default_rng(d).permutation(300))) for d in (2, 0, 1)]
    if layout == "contiguous-out-of-order":
        batch = pa.concat_tables(days)
    else:
        batch = pa.concat_tables([d.slice(i, 50) for i in range(0, 300, 50) for d in days])
    t.append(batch)
    ice = t.refresh()
    files = list(snapshot_files(ice, ice.current_snapshot()))
    assert len(files) == 3
    for path in files:
        got = backend.parquet(path).read().column("id").to_pylist()
        day_of = got[0] // 1000
        expected = [k for k in batch.column("id").to_pylist() if k // 1000 == day_of]
        assert got == expected  # input order inside the partition
    assert t.read().sort_by("id").equals(batch.sort_by("id").cast(t.read().schema))
    assert t.verify_index()["ok"]
