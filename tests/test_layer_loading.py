"""Update layers loaded for a first read, against an oracle that applies the updates by hand.

A first read of a snapshot (nothing derived from its update files kept: no
decoded layers, footers or open readers; ``readfiles.forget_files``) loads the
layers on the calling thread while the reader threads decode the data files
(featurelake.read: ``_feed_layers``; a reader thread that gets there first
loads its own). These tests check that path, and the cached one, against a
pyarrow/numpy oracle: the table's columns as numpy arrays with every backfill
written into them by hand, in commit order.

* several data files, stacked sparse and dense layers, new and existing
  columns, nulls, projections: first read == cached read == oracle, on the
  embedded lake and on S3 + REST;
* a damaged update file (garbage bytes; positions out of order) gives a
  featurelake.errors error, never wrong data, on the concurrent path (many
  files) too; with a bad-file budget the damaged file's rows are skipped and
  every row returned equals the oracle.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from backends import both_backends

from featurelake import readfiles
from featurelake.errors import CorruptFileError, FeatureLakeError

FILES = 6
PER_FILE = 700


class Oracle:
    """The table as numpy arrays (values and validity) with each backfill applied by hand."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.values: dict[str, np.ndarray] = {}
        self.valid: dict[str, np.ndarray] = {}
        self.types: dict[str, pa.DataType] = {}

    def set(self, column: str, keys: np.ndarray, values: pa.Array) -> None:
        typ = values.type
        text = pa.types.is_string(typ)
        if column not in self.values:
            self.values[column] = np.full(self.n, "", dtype=object) if text else np.zeros(self.n, dtype=typ.to_pandas_dtype())
            self.valid[column] = np.zeros(self.n, dtype=bool)
            self.types[column] = typ
        self.values[column][keys] = values.fill_null("" if text else 0).to_numpy(zero_copy_only=False)
        self.valid[column][keys] = np.asarray(values.is_valid())

    def table(self, columns: list[str], ids: np.ndarray | None = None) -> pa.Table:
        rows = np.arange(self.n) if ids is None else ids
        return pa.table(
            {c: pa.array(self.values[c][rows], type=self.types[c], mask=~self.valid[c][rows]) for c in columns}
        )


def _build(lake, rng: np.random.Generator):
    """A table of FILES data files and an oracle of it; returns (table, oracle, backfill)."""
    n = FILES * PER_FILE
    oracle = Oracle(n)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("a", pa.float32()),
                        pa.field("b", pa.int64()), pa.field("s", pa.string())])
    t = lake.create_table("ns.layers", schema, primary_key="id", partition_by=[])
    ids = np.arange(n, dtype=np.int64)
    oracle.set("id", ids, pa.array(ids))
    oracle.set("a", ids, pa.array(rng.standard_normal(n).astype(np.float32), mask=rng.random(n) < 0.1))
    oracle.set("b", ids, pa.array(rng.integers(-1000, 1000, n)))
    oracle.set("s", ids, pa.array([f"s{i}" for i in range(n)]))
    for f in range(FILES):
        rows = ids[f * PER_FILE:(f + 1) * PER_FILE]
        t.append(oracle.table(schema.names, rows).cast(schema))

    def backfill(column: str, fraction: float, typ: pa.DataType, null_rate: float = 0.0) -> None:
        keys = ids if fraction >= 1 else np.sort(rng.choice(n, size=int(n * fraction), replace=False))
        keys = rng.permutation(keys)
        if pa.types.is_string(typ):
            values = pa.array([f"u{rng.integers(1_000_000)}" for _ in keys], mask=rng.random(len(keys)) < null_rate)
        else:
            values = pa.array(rng.integers(-500, 500, len(keys)), mask=rng.random(len(keys)) < null_rate).cast(typ)
        t.backfill(pa.table({"id": pa.array(keys, pa.int64()), column: values}))
        oracle.set(column, keys, values)

    return t, oracle, backfill


def _update_files(t) -> list[str]:
    return sorted({e.update_file for e in t.scan().state.entries()})


def _check(t, oracle: Oracle, columns: list[str]) -> None:
    """First read (update files forgotten), cached read and streamed read all equal the oracle."""
    expected = oracle.table(columns)
    for how in ("first", "cached", "first"):
        if how == "first":
            readfiles.forget_files(_update_files(t))
        got = t.read(columns=columns).sort_by("id") if "id" in columns else None
        if got is None:
            got = t.read(columns=columns + ["id"]).sort_by("id").select(columns)
        for c in columns:
            assert got.column(c).to_pylist() == expected.column(c).to_pylist(), (how, columns, c)
    streamed = pa.Table.from_batches(list(t.batches(columns=columns + (["id"] if "id" not in columns else [])))).sort_by("id")
    for c in columns:
        assert streamed.column(c).to_pylist() == expected.column(c).to_pylist(), ("batches", c)


@both_backends
def test_first_read_with_stacked_layers_equals_the_oracle(lake):
    rng = np.random.default_rng(7)
    t, oracle, backfill = _build(lake, rng)
    backfill("a", 0.1, pa.float32())  # sparse, existing column
    backfill("new", 1.0, pa.float32())  # dense, a new column
    _check(t, oracle, ["id", "a", "new"])
    backfill("b", 0.3, pa.int64(), null_rate=0.2)  # sparse with nulls
    backfill("a", 0.05, pa.float32(), null_rate=0.5)  # stacked sparse on sparse
    backfill("s", 0.2, pa.string())  # a variable-width column
    backfill("new", 0.1, pa.float32())  # sparse over dense
    _check(t, oracle, ["id", "a", "b", "s", "new"])
    _check(t, oracle, ["a", "new"])  # a projection without the key
    backfill("a", 1.0, pa.float32(), null_rate=0.1)  # dense on top hides the layers under it
    _check(t, oracle, ["id", "a", "b", "s", "new"])


def test_first_read_on_few_threads_and_nested_reads_equals_the_oracle(lake):
    """The own-pool path (threads=...) and a read started inside a reader thread give the same rows."""
    from concurrent.futures import ThreadPoolExecutor

    from featurelake.readfiles import reader_pool

    rng = np.random.default_rng(11)
    t, oracle, backfill = _build(lake, rng)
    backfill("a", 0.2, pa.float32())
    backfill("b", 0.2, pa.int64())
    expected = oracle.table(["id", "a", "b"])
    readfiles.forget_files(_update_files(t))
    got = t.scan(columns=["id", "a", "b"]).to_table(threads=3).sort_by("id")
    assert got.equals(expected.cast(got.schema))
    readfiles.forget_files(_update_files(t))
    nested = reader_pool(2).submit(lambda: t.read(columns=["id", "a", "b"])).result().sort_by("id")
    assert nested.equals(expected.cast(nested.schema))
    with ThreadPoolExecutor(4) as pool:  # first reads racing each other
        readfiles.forget_files(_update_files(t))
        for r in pool.map(lambda _: t.read(columns=["id", "a", "b"]).sort_by("id"), range(8)):
            assert r.equals(expected.cast(r.schema))


def _sparse_update_of(t, column: str) -> str:
    """One update file of a sparse layer touching ``column``."""
    fid = t.iceberg.schema().find_field(column).field_id
    return next(e.update_file for e in t.scan().state.entries() if not e.dense and fid in e.field_ids)


def _unpacked(monkeypatch) -> None:
    """Every layer in an update file of its own (as before packing; large layers still are)."""
    from featurelake import updatefiles

    monkeypatch.setattr(updatefiles, "PACK_PART_BYTES", 0)


@both_backends
@pytest.mark.parametrize("pack", [False, True], ids=["own-files", "packed"])
def test_a_garbage_update_file_fails_the_read_and_skips_cleanly(backend, pack, monkeypatch):
    """A damaged update file fails the reads of the data files whose layers it holds (a shared file:
    all of them); under a budget exactly those data files are skipped and every row returned is right."""
    if not pack:
        _unpacked(monkeypatch)
    lake = backend.lake
    rng = np.random.default_rng(3)
    t, oracle, backfill = _build(lake, rng)
    backfill("a", 0.3, pa.float32())
    backfill("b", 0.3, pa.int64())
    bad = _sparse_update_of(t, "b")
    hit = {e.data_file for e in t.scan().state.entries() if e.update_file == bad}
    assert len(hit) == (FILES if pack else 1)
    original = backend.read_bytes(bad)
    backend.overwrite(bad, b"PAR1" + b"\x00garbage" * (len(original) // 9) + b"PAR1")
    readfiles.forget_files([bad])
    with pytest.raises(CorruptFileError):
        t.read(columns=["id", "a", "b"])  # many files: the layers are loaded on the calling thread
    with pytest.raises(FeatureLakeError):
        list(t.batches(columns=["id", "b"]))
    # with a budget the bad data file is skipped: every row returned is right
    with pytest.warns(UserWarning, match="skipping bad file"):
        got = t.read(columns=["id", "a", "b"], max_bad_file_ratio=1.0 if pack else 0.5).sort_by("id")
    expected_rows = FILES * PER_FILE - sum(task.file.record_count for task in t.scan().tasks() if task.file.file_path in hit)
    assert got.num_rows == expected_rows
    ids = got.column("id").to_numpy()
    expected = oracle.table(["id", "a", "b"], ids)
    assert got.equals(expected.cast(got.schema))
    backend.overwrite(bad, original)  # repaired: the next read is whole and right again
    readfiles.forget_files([bad])
    full = t.read(columns=["id", "a", "b"]).sort_by("id")
    assert full.equals(oracle.table(["id", "a", "b"]).cast(full.schema))


def _rewrite_row_groups(path: str, change) -> None:
    """Rewrite ``path`` row group by row group (each through ``change(i, table)``), keeping its row groups."""
    f = pq.ParquetFile(path)
    groups = [change(i, f.read_row_group(i)) for i in range(f.num_row_groups)]
    with pq.ParquetWriter(path + ".tmp", f.schema_arrow) as out:
        for g in groups:
            out.write_table(g, row_group_size=g.num_rows)
    import os

    os.replace(path + ".tmp", path)


@pytest.mark.parametrize("pack", [False, True], ids=["own-files", "packed"])
def test_update_file_positions_out_of_order_are_an_error_not_wrong_rows(lake, tmp_path, pack, monkeypatch):
    if not pack:
        _unpacked(monkeypatch)
    rng = np.random.default_rng(5)
    t, oracle, backfill = _build(lake, rng)
    backfill("a", 0.3, pa.float32())
    bad = _sparse_update_of(t, "a")
    groups = pq.ParquetFile(bad).num_row_groups
    assert groups == (FILES if pack else 1)
    table = pq.read_table(bad)  # _pos and values, field ids in the schema's metadata
    shuffled_group = groups - 1  # the last data file's layer (the only one of an own file)
    _rewrite_row_groups(bad, lambda i, g: g.take(pa.array(rng.permutation(g.num_rows))) if i == shuffled_group else g)
    readfiles.forget_files([bad])
    with pytest.raises(CorruptFileError, match="out of order"):
        t.read(columns=["id", "a"])
    with pytest.raises(CorruptFileError, match="out of order"):
        list(t.batches(columns=["id", "a"]))
    offsets = np.cumsum([0] + [pq.ParquetFile(bad).metadata.row_group(i).num_rows for i in range(groups)])
    _rewrite_row_groups(bad, lambda i, g: table.slice(offsets[i], offsets[i + 1] - offsets[i]))
    readfiles.forget_files([bad])
    got = t.read(columns=["id", "a"]).sort_by("id")
    assert got.equals(oracle.table(["id", "a"]).cast(got.schema))


def test_a_missing_update_file_is_a_corrupt_file_error_on_the_concurrent_path(lake):
    import os

    rng = np.random.default_rng(9)
    t, _, backfill = _build(lake, rng)
    backfill("a", 0.3, pa.float32())
    bad = _sparse_update_of(t, "a")
    os.remove(bad)
    readfiles.forget_files([bad])
    with pytest.raises(CorruptFileError, match="missing"):
        t.read(columns=["id", "a"])


class _Interrupt(BaseException):
    """Stands for a KeyboardInterrupt raised in the calling thread while it loads layers."""


def test_an_interrupted_feed_leaves_no_reader_thread_waiting(lake, monkeypatch):
    import threading
    import time

    from featurelake.layerload import LayerLoading
    from featurelake.read import Scan

    rng = np.random.default_rng(13)
    t, oracle, backfill = _build(lake, rng)
    backfill("a", 0.2, pa.float32())
    backfill("b", 0.2, pa.int64())
    main = threading.get_ident()
    calls = []

    def interrupting(original):  # the calling thread's first load (a layer, or a shared file's layers) is interrupted
        def interrupted(self, entry):
            if threading.get_ident() == main:
                calls.append(entry)
                if len(calls) == 1:
                    raise _Interrupt()
            return original(self, entry)
        return interrupted

    def slow_bases(original):  # reader threads decode their data files slowly: the calling thread feeds first
        def read_columns(self, *args, **kwargs):
            if threading.get_ident() != main:
                time.sleep(0.05)
            yield from original(self, *args, **kwargs)
        return read_columns

    originals = {name: getattr(LayerLoading, name) for name in ("_load_layer", "_load_parts")}
    for name, original in originals.items():
        monkeypatch.setattr(LayerLoading, name, interrupting(original))
    read_columns = Scan._read_columns
    monkeypatch.setattr(Scan, "_read_columns", slow_bases(read_columns))
    readfiles.forget_files(_update_files(t))
    with pytest.raises(_Interrupt):
        t.read(columns=["id", "a", "b"])
    for name, original in originals.items():
        monkeypatch.setattr(LayerLoading, name, original)
    monkeypatch.setattr(Scan, "_read_columns", read_columns)
    # the reader threads finished (the shared pool serves the next read) and nothing half-loaded was kept
    got = t.read(columns=["id", "a", "b"]).sort_by("id")
    assert got.equals(oracle.table(["id", "a", "b"]).cast(got.schema))
    readfiles.forget_files(_update_files(t))
    got = t.read(columns=["id", "a", "b"]).sort_by("id")
    assert got.equals(oracle.table(["id", "a", "b"]).cast(got.schema))


def test_forget_files_takes_locations_in_any_spelling(lake):
    from featurelake import openfiles

    rng = np.random.default_rng(17)
    t, _, backfill = _build(lake, rng)
    backfill("a", 0.2, pa.float32())
    t.read(columns=["id", "a"])
    files = _update_files(t)  # small update files are read whole, not kept open: their decoded layers are kept
    data_files = [task.file.file_path for task in t.scan().tasks()]
    assert any(readfiles._names_path(k, set(files)) for k in readfiles.LAYERS.items)
    assert any(openfiles.idle_count(p) for p in data_files)
    readfiles.forget_files(["file://" + p for p in files + data_files])
    assert not any(openfiles.idle_count(p) for p in data_files)
    assert not any(readfiles._names_path(k, set(files)) for k in readfiles.LAYERS.items)


def test_small_update_files_read_whole_equal_the_kept_open_reader_and_pyarrow(lake, monkeypatch):
    """The small-file path (read in one call, parsed from memory, columns picked by leaf index) gives
    exactly what the kept-open reader gives and what pyarrow reads of the file by hand: flat and
    nested columns, several columns in one update file read one projection at a time, sparse and dense."""
    from dataclasses import replace

    from featurelake import openfiles
    from featurelake.layerload import POS_FIELD_ID, SMALL_LAYER_FILE_BYTES

    _unpacked(monkeypatch)  # the paths of a whole update file (packed layers: test_packed_layers.py)
    n = 900
    rng = np.random.default_rng(23)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("x", pa.float64())])
    t = lake.create_table("ns.small", schema, primary_key="id", partition_by=[])
    for f in range(3):
        t.append(pa.table({"id": np.arange(f * 300, (f + 1) * 300, dtype=np.int64), "x": rng.standard_normal(300)}))
    keys = np.sort(rng.choice(n, 200, replace=False))
    t.backfill(pa.table({  # one update file per data file holding four columns, two of them nested
        "id": pa.array(keys),
        "x": pa.array(rng.standard_normal(200), mask=rng.random(200) < 0.2),
        "l": pa.array([[int(v)] * int(v % 3) if v % 5 else None for v in keys], pa.list_(pa.int64())),
        "st": pa.array([{"p": int(v), "q": f"q{v}"} for v in keys], pa.struct([("p", pa.int32()), ("q", pa.string())])),
        "f": pa.array(keys.astype(np.float32)),
    }))
    t.backfill(pa.table({"id": np.arange(n, dtype=np.int64), "f": rng.standard_normal(n).astype(np.float32)}))  # dense
    assert any(len(e.field_ids) == 4 for e in t.scan().state.entries())
    ice = t.iceberg.schema()
    for columns in (["x"], ["l", "f"], ["st"], ["id", "x", "l", "st", "f"]):
        scan = t.scan(columns=columns)
        entries = [e for e in scan.state.entries() if any(i in scan.read_ids for i in e.field_ids)]
        assert entries and all(0 < e.bytes <= SMALL_LAYER_FILE_BYTES for e in entries)
        for e in entries:
            ids = tuple(i for i in e.field_ids if i in scan.read_ids)
            key = openfiles.file_key(e.update_file)
            readfiles.forget_files([e.update_file])
            pos, values = scan._decode_layer(e, ids, key)  # the small-file path
            kept_pos, kept = scan._decode_layer(replace(e, bytes=0), ids, key)  # size unknown: a kept-open reader
            assert values.equals(kept) and values.schema.equals(kept.schema)
            by_hand = pq.read_table(e.update_file)
            names = [ice.find_column_name(i) for i in ids]
            assert values.to_pydict() == by_hand.select(names).to_pydict()
            if e.dense:
                assert pos is None and kept_pos is None
            else:
                pos_name = next(f.name for f in by_hand.schema if f.metadata and int(f.metadata[b"PARQUET:field_id"]) == POS_FIELD_ID)
                assert np.array_equal(pos, kept_pos) and np.array_equal(pos, by_hand.column(pos_name).to_numpy())
        readfiles.forget_files(_update_files(t))
        first = t.read(columns=columns)
        assert first.equals(t.read(columns=columns))  # first read == cached read


def test_leaf_projection_tells_files_apart_by_field_id():
    """Files whose columns share names and types but not field ids get their own projections
    (the cache compares Parquet schemas field ids included): never a column taken by name alone."""
    import io

    def reader(ids: tuple[int, int]):
        schema = pa.schema([pa.field(name, pa.float32(), metadata={"PARQUET:field_id": str(fid)}) for name, fid in zip("ab", ids)])
        sink = io.BytesIO()
        pq.write_table(pa.table({"a": pa.array([1.0], pa.float32()), "b": pa.array([2.0], pa.float32())}).cast(schema), sink)
        r = readfiles.ParquetReader()
        r.open(pa.BufferReader(sink.getvalue()), pre_buffer=False)
        return r

    readfiles.clear_caches()
    for ids, expected in (((7, 8), ["a"]), ((8, 7), ["b"]), ((7, 8), ["a"]), ((9, 10), [])):
        _, columns, extra, leaves, flat = readfiles.leaf_projection(reader(ids), frozenset({7}), ())
        assert columns == expected and extra == [] and leaves == [ord(c) - ord("a") for c in expected] and flat


def test_flat_update_files_read_column_by_column_equal_pyarrow_and_the_table_path(lake, monkeypatch):
    """A flat update file (every column one leaf) is decoded column by column (``read_column``): with
    several row groups, nulls, strings and a column cast on read it gives what the table path
    (``read_all``, as nested files take) and pyarrow reading the file by hand give, and a first read
    through it equals the oracle."""
    from featurelake import layerload, openfiles
    from featurelake.layerload import POS_FIELD_ID

    _unpacked(monkeypatch)  # the paths of a whole update file (packed layers: test_packed_layers.py)
    flat_calls = []
    decode_flat = layerload._decode_flat
    monkeypatch.setattr(layerload, "_decode_flat", lambda *a: flat_calls.append(1) or decode_flat(*a))
    n = 1_200
    rng = np.random.default_rng(31)
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("i", pa.int32()), pa.field("s", pa.string())])
    t = lake.create_table("ns.flat", schema, primary_key="id", partition_by=[])
    oracle = Oracle(n)
    ids = np.arange(n, dtype=np.int64)
    oracle.set("id", ids, pa.array(ids))
    oracle.set("i", ids, pa.array(rng.integers(-9, 9, n).astype(np.int32)))
    oracle.set("s", ids, pa.array([f"s{v}" for v in ids]))
    for f in range(2):
        t.append(oracle.table(schema.names, ids[f * 600:(f + 1) * 600]).cast(schema))
    keys = np.sort(rng.choice(n, 700, replace=False))
    i_new = pa.array(rng.integers(-99, 99, 700).astype(np.int32), mask=rng.random(700) < 0.3)
    s_new = pa.array([f"u{v}" for v in keys], mask=rng.random(700) < 0.2)
    t.backfill(pa.table({"id": pa.array(keys), "i": i_new, "s": s_new}))
    oracle.set("i", keys, i_new)
    oracle.set("s", keys, s_new)
    ice = t.iceberg.schema()
    scan = t.scan(columns=["id", "i", "s"])
    entries = [e for e in scan.state.entries() if any(i in scan.read_ids for i in e.field_ids)]
    assert len(entries) == 2
    for e in entries:
        by_hand = pq.read_table(e.update_file)
        pq.write_table(by_hand, e.update_file, row_group_size=100)  # rewritten in row groups: columns come back in chunks
        assert pq.ParquetFile(e.update_file).metadata.num_row_groups > 1
        for fields in ((ice.find_field("i").field_id,), (ice.find_field("s").field_id,),
                       (ice.find_field("i").field_id, ice.find_field("s").field_id)):
            readfiles.forget_files([e.update_file])
            key = openfiles.file_key(e.update_file)
            calls = len(flat_calls)
            pos, values = scan._decode_layer(e, fields, key)  # flat: column by column
            assert len(flat_calls) == calls + 1
            flat_projection = readfiles.leaf_projection
            try:  # the same file through the table path
                readfiles.leaf_projection = lambda *a: flat_projection(*a)[:4] + (False,)
                table_pos, table_values = scan._decode_layer(e, fields, key)
                assert len(flat_calls) == calls + 1
            finally:
                readfiles.leaf_projection = flat_projection
            assert values.equals(table_values) and values.schema.equals(table_values.schema)
            assert values.to_pydict() == by_hand.select([ice.find_column_name(i) for i in fields]).to_pydict()
            pos_name = next(f.name for f in by_hand.schema if f.metadata and int(f.metadata[b"PARQUET:field_id"]) == POS_FIELD_ID)
            assert np.array_equal(pos, table_pos) and np.array_equal(pos, by_hand.column(pos_name).to_numpy())
    _check(t, oracle, ["id", "i", "s"])
