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
from decimal import Decimal

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


@pytest.mark.parametrize("seed", range(4))
def test_layers_written_in_place_equal_the_overlay_and_keep_the_batch(seed):
    """Columns the reader owns are overlaid in their own buffers: the merged values equal a row-by-row
    overlay; when no null comes or goes the batch itself comes back (nothing rebuilt), the layers'
    values are never written, and columns with nulls written get a new, valid bitmap."""
    rng = np.random.default_rng(seed)
    n = 500
    decoded = {c: pa.array(rng.integers(-1000, 1000, n) * 1.0).cast(typ) for c, typ in (("f", pa.float32()), ("i", pa.int64()))}
    assert all(a.buffers()[1].is_mutable for a in decoded.values())  # pool-allocated, as a decode leaves them
    base = pa.record_batch(list(decoded.values()), names=list(decoded))
    expected = {c: a.to_pylist() for c, a in decoded.items()}
    layers = []
    for k in range(3):
        pos = np.sort(rng.choice(n, size=int(rng.integers(1, n // 4)), replace=False)).astype(np.int64)
        cols = ["f"] if k == 1 else ["f", "i"]
        nulls = seed % 2 == 1 and k == 2
        vals = {c: pa.array(rng.integers(-50, 50, len(pos)), mask=(rng.random(len(pos)) < 0.3) if nulls else None).cast(base.schema.field(c).type)
                for c in cols}
        layers.append((None, pos, pa.record_batch(list(vals.values()), names=cols)))
        for c, v in vals.items():
            for row, x in zip(pos.tolist(), v.to_pylist()):
                expected[c][row] = x
    frozen = [layer[2].to_pydict() for layer in layers]
    got = _apply_layers(base, layers, 0, owned=frozenset(base.schema.names))
    for c in expected:
        assert got.column(c).to_pylist() == expected[c] and got.column(c).validate(full=True) is None
    assert (got is base) == (seed % 2 == 0)
    assert [layer[2].to_pydict() for layer in layers] == frozen


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


# ---------------------------------------------------------------- layers end to end, against an oracle
_TYPES = {"f32": pa.float32(), "f64": pa.float64(), "i32": pa.int32(), "i64": pa.int64(), "ts": pa.timestamp("us"),
          "day": pa.date32(), "dec": pa.decimal128(10, 2), "s": pa.string(), "flag": pa.bool_()}


def _typed(rng, typ: pa.DataType, n: int, null_rate: float) -> pa.Array:
    """``n`` random values of ``typ``, about ``null_rate`` of them null."""
    ints = rng.integers(-1000, 1000, n)
    mask = rng.random(n) < null_rate
    if pa.types.is_string(typ):
        return pa.array([f"v{v}" for v in ints], pa.string(), mask=mask)
    if pa.types.is_boolean(typ):
        return pa.array(ints > 0, mask=mask)
    if pa.types.is_timestamp(typ):
        return pa.array(ints * 1_000_000, pa.int64(), mask=mask).cast(typ)
    if pa.types.is_date(typ):
        return pa.array(ints + 18_000, pa.int32(), mask=mask).cast(typ)
    if pa.types.is_decimal(typ):
        return pa.array([Decimal(int(v)) / 4 for v in ints], typ, mask=mask)
    return pa.array(ints, pa.int64(), mask=mask).cast(typ)


@pytest.mark.parametrize("seed", range(3))
def test_stacked_dense_and_sparse_layers_read_like_an_oracle(tmp_path, seed):
    _stacked_layers(Lake(tmp_path / "lake"), seed)


def test_stacked_layers_on_an_object_store_read_like_an_oracle(s3_lake):
    """The same on S3, where update files are fetched while their data file is."""
    _stacked_layers(s3_lake, 7, files=2, per_file=200)


def _stacked_layers(lake: Lake, seed: int, files: int = 3, per_file: int = 300) -> None:
    """Backfills of every kind stacked on three data files (nulls in the base and written by layers; dense
    under and over sparse; layers touching some of the projected columns; a column added by a sparse
    backfill, so its base is all null) read like a row-by-row oracle: whole, projected, a second time
    (decoded layers cached: an overlay written in place must not have touched them), with no decoded
    layer kept, streamed, and by row ranges (batches that are slices of a decoded row group)."""
    from featurelake import readfiles

    rng = np.random.default_rng(seed)
    n = files * per_file
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)] + [pa.field(c, t) for c, t in _TYPES.items()])
    t = lake.create_table("ns.t", schema, primary_key="id", partition_by=[])
    expected: dict[str, list] = {"id": list(range(n))}
    for c, typ in _TYPES.items():
        expected[c] = _typed(rng, typ, n, 0.2).to_pylist()
    for f in range(files):
        lo, hi = f * per_file, (f + 1) * per_file
        t.append(pa.table({c: pa.array(expected[c][lo:hi], schema.field(c).type) for c in schema.names}, schema=schema))

    def backfill(columns: list[str], fraction: float, null_rate: float) -> None:
        keys = np.arange(n) if fraction >= 1 else np.sort(rng.choice(n, size=int(n * fraction), replace=False))
        keys = rng.permutation(keys)  # the input need not be in key order
        data = {"id": pa.array(keys, pa.int64())}
        for c in columns:
            typ = _TYPES.get(c, pa.float32())
            values = _typed(rng, typ, len(keys), null_rate)
            data[c] = values
            expected.setdefault(c, [None] * n)
            for k, v in zip(keys.tolist(), values.to_pylist()):
                expected[c][k] = v
        t.backfill(pa.table(data))

    def check() -> None:
        names = list(expected)
        projections = [names, ["id", "f32", "i64", "s"], ["f64", "id", "late"] if "late" in expected else ["f64", "id"]]
        for cols in projections:
            for how in ("first", "cached", "cold"):
                if how == "cold":
                    readfiles.LAYERS.clear()
                got = t.read(columns=cols).sort_by("id")
                for c in cols:
                    assert got[c].to_pylist() == expected[c], (how, cols, c)
                    assert got[c].validate(full=True) is None
            streamed = pa.Table.from_batches(list(t.batches(columns=cols, batch_size=128))).sort_by("id")
            for c in cols:
                assert streamed[c].to_pylist() == expected[c], ("batches", c)
        scan = t.scan(names)
        for task in scan.tasks():
            layers = scan.layers_for(task.file.file_path)
            start, stop = sorted(int(v) for v in rng.integers(0, per_file + 1, 2))
            for batch, positions, _ in scan.read_range(task, start, stop, layers=layers, batch_size=37):
                ids = batch.column("id").to_pylist()
                for c in names:
                    assert batch.column(c).to_pylist() == [expected[c][i] for i in ids], ("read_range", c)

    backfill(["f32", "s", "dec"], 1.0, 0.0)  # dense, no nulls
    check()
    backfill(list(_TYPES), 0.3, 0.3)  # sparse on every column, nulls written
    backfill(["i64", "ts"], 0.5, 0.0)  # sparse, some of the projected columns
    check()
    backfill(["f64", "i32"], 1.0, 0.25)  # dense over sparse, with nulls
    backfill(["f64", "f32", "day"], 0.2, 0.5)  # sparse over dense (the dense layer is cached: copied, never written)
    backfill(["late"], 0.2, 0.1)  # a new column set for some rows: its base is all null
    check()
    backfill(["late", "flag"], 0.1, 0.0)
    backfill(["late"], 1.0, 0.5)  # dense on top hides everything under it
    check()


def test_scatter_in_place_writes_only_its_rows_of_a_shared_buffer():
    """An overlay written into a decoded buffer touches only its slice's rows; the validity bitmap it
    rebuilds keeps the slice's offset; the layers' values are never written."""
    from featurelake.overlay import scatter

    whole = pa.array(np.arange(100, dtype=np.float64) * 2).cast(pa.float64())  # pool-allocated (a cast copy): mutable
    assert whole.buffers()[1].is_mutable
    before = whole.to_pylist()
    part = whole.slice(40, 20)
    piece = pa.array([1.5, None, 3.5])
    frozen = piece.to_pylist()
    got = scatter(part, [(np.array([0, 5, 19]), piece)], in_place=True)
    want = before[40:60]
    want[0], want[5], want[19] = 1.5, None, 3.5
    assert got.to_pylist() == want and got.null_count == 1 and got.validate(full=True) is None
    assert whole.slice(0, 40).to_pylist() == before[:40] and whole.slice(60).to_pylist() == before[60:]
    assert piece.to_pylist() == frozen
    copied = scatter(pa.array([1.0, 2.0, 3.0]), [(np.array([1]), pa.array([9.0]))])
    assert copied.to_pylist() == [1.0, 9.0, 3.0]
