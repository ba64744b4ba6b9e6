"""The reader's fast paths against plain oracles.

* update layers overlaid by scatter (numeric columns) or one take (others),
  with nulls on either side, dense and sparse layers stacked, checked against
  a row-by-row Python overlay;
* footers and plans cached across reads: a data file rewritten underneath
  (same path) is parsed again, never served from the cache;
* the per-column codec choice: distinct floats are written plain, columns
  that compress keep the table's codec, and values read back equal (on local
  disk and on S3, the footers read back with the store's own client).

The footer-cache check stays local: on an object store data files are
immutable by design and a fragment keeps its footer (no HEAD per read).
"""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from backends import both_backends

from featurelake import Lake
from featurelake.datafiles import column_codecs, delta_columns
from featurelake.overlay import apply_layers as _apply_layers, take_newest as _take_newest


def _layer(n: int, rng, typ: pa.DataType, dense: bool, null_rate: float):
    pos = None if dense else np.sort(rng.choice(n, size=rng.integers(1, n), replace=False)).astype(np.int64)
    m = n if dense else len(pos)
    vals = rng.integers(-100, 100, m)
    mask = rng.random(m) < null_rate
    return pos, pa.array(vals, mask=mask).cast(typ)


@pytest.mark.parametrize("typ", [pa.float32(), pa.float64(), pa.int64(), pa.int32(), pa.int8(), pa.string()])
@pytest.mark.parametrize("seed", range(6))
def test_overlaid_layers_equal_a_row_by_row_overlay(typ, seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(50, 400))
    base_vals = pa.array(rng.integers(-100, 100, n), mask=rng.random(n) < 0.2 * (seed % 2)).cast(typ)
    base = pa.record_batch([base_vals, pa.array(np.arange(n))], names=["x", "untouched"])
    layers = []
    for k in range(int(rng.integers(1, 5))):
        pos, vals = _layer(n, rng, typ, dense=bool(rng.random() < 0.3), null_rate=0.3 * (k % 2))
        layers.append((None, pos, pa.record_batch([vals], names=["x"])))
    start, stop = sorted(int(v) for v in rng.integers(0, n + 1, 2))
    chunk = base.slice(start, stop - start)
    got = _apply_layers(chunk, layers, start)

    expected = base_vals.to_pylist()
    for _, pos, values in layers:
        vals = values.column(0).to_pylist()
        for i, row in enumerate(range(n) if pos is None else pos.tolist()):
            expected[row] = vals[i]
    assert got.column("x").to_pylist() == expected[start:stop]
    assert got.column("x").type == typ
    assert got.column("untouched") is chunk.column("untouched") or got.column("untouched").equals(chunk.column("untouched"))
    assert got.column("x").validate(full=True) is None


def test_take_newest_agrees_with_scatter_on_numbers():
    rng = np.random.default_rng(3)
    col = pa.array(rng.standard_normal(100), mask=rng.random(100) < 0.1)
    updates = [(np.array([1, 5, 7]), pa.array([1.0, None, 3.0])), (np.array([5, 9]), pa.array([4.0, 5.0]))]
    layers = [(None, np.array([1, 5, 7]), pa.record_batch([updates[0][1]], names=["x"])),
              (None, np.array([5, 9]), pa.record_batch([updates[1][1]], names=["x"]))]
    scattered = _apply_layers(pa.record_batch([col], names=["x"]), layers, 0).column("x")
    assert scattered.equals(_take_newest(col, updates))


def test_a_data_file_rewritten_underneath_is_not_served_from_the_footer_cache(tmp_path):
    lake = Lake(tmp_path / "lake")
    t = lake.create_table("ns.t", pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("x", pa.float64())]), primary_key="id")
    t.append(pa.table({"id": pa.array(range(100), pa.int64()), "x": pa.array(np.arange(100.0))}))
    assert t.read().num_rows == 100  # footer and plan now cached
    (task,) = t.scan().tasks()
    path = task.file.file_path.removeprefix("file://")
    rows = pq.read_table(path)
    st = os.stat(path)
    # same path, other content (x doubled), a different mtime: the cached footer must not be used
    pq.write_table(rows.set_column(1, rows.schema.field(1), pa.array(np.arange(100.0) * 2)), path, compression="none")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert t.read().column("x").to_pylist() == (np.arange(100.0) * 2).tolist()


@both_backends
def test_floats_that_do_not_compress_are_written_plain_and_read_back_equal(backend):
    rng = np.random.default_rng(0)
    n = 20_000
    data = pa.table({
        "id": pa.array(np.arange(n), pa.int64()),  # sorted: compresses
        "noise": pa.array(rng.standard_normal(n).astype(np.float32)),  # distinct floats: does not
        "rounded": pa.array(np.round(rng.standard_normal(n), 1)),  # few distinct values: compresses
        "name": pa.array([f"user-{i % 50}" for i in range(n)]),
    })
    leaves = [(c, c) for c in data.column_names]
    assert delta_columns(data, leaves) == ["id"]
    codecs = column_codecs(data, leaves, "zstd", delta={"id"})
    assert codecs == {"id": "none", "noise": "none", "rounded": "zstd", "name": "zstd"}
    assert column_codecs(data, leaves, "zstd")["id"] == "zstd"  # not delta-packed: sorted ids compress
    assert column_codecs(data, leaves, "uncompressed") == "none"

    lake = backend.lake
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("noise", pa.float32()),
                        pa.field("rounded", pa.float64()), pa.field("name", pa.string())])
    t = lake.create_table("ns.t", schema, primary_key="id", properties={"write.parquet.compression-codec": "zstd"})
    t.append(data)
    (task,) = t.scan().tasks()
    meta = backend.parquet(task.file.file_path).metadata.row_group(0)
    written = {meta.column(i).path_in_schema: meta.column(i).compression for i in range(meta.num_columns)}
    assert written == {"id": "UNCOMPRESSED", "noise": "UNCOMPRESSED", "rounded": "ZSTD", "name": "ZSTD"}
    assert "DELTA_BINARY_PACKED" in meta.column(0).encodings
    assert meta.column(0).total_compressed_size < n  # sorted ids: about a bit each, not 8 bytes
    got = t.read().sort_by("id")
    for name in data.column_names:
        assert got[name].to_pylist() == data[name].to_pylist(), name


@both_backends
def test_a_compression_level_applies_to_the_compressed_columns_only(backend):
    rng = np.random.default_rng(1)
    n = 5_000
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("name", pa.string()), pa.field("noise", pa.float64())])
    t = backend.lake.create_table("ns.t", schema, primary_key="id",
                                             properties={"write.parquet.compression-codec": "zstd",
                                                                         "write.parquet.compression-level": "9"})
    data = pa.table({"id": pa.array(np.arange(n), pa.int64()), "name": pa.array([f"n{i % 7}" for i in range(n)]),
                     "noise": pa.array(rng.standard_normal(n))})
    t.append(data)
    (task,) = t.scan().tasks()
    meta = backend.parquet(task.file.file_path).metadata.row_group(0)
    assert [meta.column(i).compression for i in range(3)] == ["UNCOMPRESSED", "ZSTD", "UNCOMPRESSED"]
    got = t.read().sort_by("id")
    for name in data.column_names:
        assert got[name].to_pylist() == data[name].to_pylist(), name
