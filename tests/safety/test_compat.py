"""featurelake/_compat.py patches pyiceberg process-wide: plain pyiceberg reads must stay right.

The oracle is the original data (pyarrow): a plain ``t.iceberg.scan()`` of nested columns
(list, list<struct>, nested lists, structs holding lists; null lists and null elements) must
return exactly it, across many files, many row groups and row groups larger than pyarrow's
scanner batch (which arrive as sliced arrays), before and after ``compact``.
"""
from __future__ import annotations

import random

import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import _to_requested_schema, schema_to_pyarrow

import featurelake  # noqa: F401  (installs the patch, as any featurelake user does)

POINT = pa.struct([("a", pa.int64()), ("b", pa.string())])
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("xs", pa.list_(pa.int64())),
        pa.field("big", pa.large_list(pa.int32())),
        pa.field("ev", pa.list_(POINT)),
        pa.field("nested", pa.list_(pa.list_(pa.int64()))),
        pa.field("nested_ev", pa.list_(pa.list_(POINT))),
        pa.field("holder", pa.struct([("tags", pa.list_(pa.string())), ("pts", pa.list_(POINT))])),
    ]
)


def _maybe(rng: random.Random, value, p: float = 0.2):
    return None if rng.random() < p else value


def _point(rng: random.Random, i: int):
    return _maybe(rng, {"a": i, "b": _maybe(rng, str(i))})


def _rows(n: int, seed: int = 0, start: int = 0) -> pa.Table:
    """``n`` rows with every nested shape, nulls at each level; ids start at ``start``."""
    rng = random.Random(seed)

    def short(make):
        return [make() for _ in range(rng.randint(0, 3))]

    rows = []
    for i in range(start, start + n):
        rows.append(
            {
                "id": i,
                "xs": _maybe(rng, short(lambda: _maybe(rng, rng.randint(-5, 5), 0.1))),
                "big": _maybe(rng, short(lambda: rng.randint(0, 9))),
                "ev": _maybe(rng, short(lambda: _point(rng, i))),
                "nested": _maybe(rng, short(lambda: _maybe(rng, short(lambda: rng.randint(0, 9))))),
                "nested_ev": _maybe(rng, short(lambda: _maybe(rng, short(lambda: _point(rng, i))))),
                "holder": _maybe(rng, {"tags": _maybe(rng, short(lambda: "t")), "pts": _maybe(rng, short(lambda: _point(rng, i)))}),
            }
        )
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def _by_id(table: pa.Table) -> list[dict]:
    return table.sort_by("id").to_pylist()


def _assert_same(got: pa.Table, oracle: pa.Table) -> None:
    assert got.num_rows == oracle.num_rows
    assert got.column_names == oracle.column_names
    assert _by_id(got) == _by_id(oracle)


@pytest.fixture(scope="module")
def nested_table(tmp_path_factory):
    """Several files of small row groups: 6 appends of 2,000 rows, 500 rows per row group."""
    from featurelake import Lake

    lake = Lake(tmp_path_factory.mktemp("compat") / "lake")
    t = lake.create_table(
        "ns.nested", schema=SCHEMA, primary_key="id", properties={"write.parquet.row-group-limit": "500"}
    )
    parts = [_rows(2000, seed=k, start=k * 2000) for k in range(6)]
    for part in parts:
        t.append(part)
    return t, pa.concat_tables(parts)


def test_plain_pyiceberg_scan_of_many_files_and_row_groups(nested_table):
    t, oracle = nested_table
    assert len(list(t.iceberg.scan().plan_files())) == 6
    _assert_same(t.iceberg.scan().to_arrow(), oracle)
    batches = list(t.iceberg.scan().to_arrow_batch_reader())
    assert len(batches) >= 24  # one per row group at least
    _assert_same(pa.Table.from_batches(batches), oracle)
    # a pushed-down filter on the key (pyarrow filters each batch) and a projection
    got = t.iceberg.scan(row_filter="id >= 1234 and id < 9876", selected_fields=("id", "ev", "nested_ev")).to_arrow()
    want = oracle.filter(pa.compute.and_(pa.compute.greater_equal(oracle["id"], 1234), pa.compute.less(oracle["id"], 9876)))
    _assert_same(got, want.select(["id", "ev", "nested_ev"]))
    # featurelake's own reader agrees
    _assert_same(t.read(), oracle)


def test_plain_pyiceberg_scan_after_compact_reads_sliced_batches():
    """A compacted file holds one row group bigger than pyarrow's 131,072-row scan batch, so pyiceberg
    projects sliced arrays; the old patch raised "Null bitmap with offsets slice not supported"."""
    import tempfile

    from featurelake import Lake

    with tempfile.TemporaryDirectory() as home:
        lake = Lake(home)
        schema = pa.schema([SCHEMA.field("id"), SCHEMA.field("xs"), SCHEMA.field("ev")])
        t = lake.create_table("ns.wide", schema=schema, primary_key="id")
        n = 140_000
        xs = pa.array([None if i % 7 == 0 else [i, None] for i in range(n)], pa.list_(pa.int64()))
        ev = pa.array([None if i % 5 == 0 else [{"a": i, "b": None}, None] for i in range(n)], pa.list_(POINT))
        oracle = pa.table({"id": pa.array(range(n), pa.int64()), "xs": xs, "ev": ev}, schema=schema)
        for k in range(0, n, 35_000):
            t.append(oracle.slice(k, 35_000))
        t.compact()
        assert len(list(t.iceberg.scan().plan_files())) == 1
        batches = list(t.iceberg.scan().to_arrow_batch_reader())
        assert len(batches) >= 2
        got = pa.Table.from_batches(batches)
        assert got.num_rows == n
        # null lists stay null (not empty), null elements stay null, in every batch
        assert got["ev"].null_count == oracle["ev"].null_count
        assert got["xs"].null_count == oracle["xs"].null_count
        assert got.sort_by("id").to_pylist() == oracle.to_pylist()


@pytest.mark.parametrize("column", ["xs", "big", "ev", "nested", "nested_ev", "holder"])
def test_projection_of_every_slice(nested_table, column):
    """pyiceberg's projection (the patched visitor) over slices at every offset and length."""
    t, _ = nested_table
    schema = t.iceberg.schema()
    requested = schema.select("id", column)
    data = _rows(60, seed=99).select(["id", column])
    as_written = schema_to_pyarrow(requested)  # large lists, as pyiceberg reads its Parquet files
    for batch in (data.combine_chunks().to_batches()[0], data.cast(as_written).combine_chunks().to_batches()[0]):
        _check_every_slice(requested, batch, column)


def _check_every_slice(requested, batch: pa.RecordBatch, column: str) -> None:
    for offset in range(0, 60, 3):
        for length in (0, 1, 7, 60 - offset):
            length = min(length, 60 - offset)
            piece = batch.slice(offset, length)
            got = _to_requested_schema(requested, requested, piece)
            assert got.num_rows == length
            assert got.to_pylist() == piece.to_pylist(), (column, offset, length)
