"""Python API input friction: pandas default dtypes, polars and Arrow-stream objects, to_pandas/to_polars.

Input is converted in memory before any I/O, so these run on the embedded lake; one lossy
cast is also refused on REST + S3, with the bucket listed before and after.
"""
from __future__ import annotations

import datetime as dt
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from featurelake.errors import SchemaMismatchError

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int32(), nullable=False),
        pa.field("score", pa.float32()),
        pa.field("count", pa.int64()),
        pa.field("ts", pa.timestamp("us")),
        pa.field("tsz", pa.timestamp("us", tz="UTC")),
        pa.field("name", pa.string()),
    ]
)


@pytest.fixture
def table(lake):
    return lake.create_table("ml.t", SCHEMA, primary_key="id")


def _frame(n: int = 5, start: int = 0) -> pd.DataFrame:
    """A frame with pandas' default dtypes: int64, float64, datetime64[ns], datetime64[ns, tz]."""
    return pd.DataFrame(
        {
            "id": np.arange(start, start + n),  # int64 into int32
            "score": np.linspace(0.0, 1.0, n),  # float64 into float32
            "count": np.arange(n) * 10,
            "ts": pd.date_range("2024-01-01", periods=n, freq="h"),  # naive ns into us
            "tsz": pd.date_range("2024-01-01", periods=n, freq="h", tz="Europe/Paris"),  # aware ns into UTC us
            "name": [f"n{i}" for i in range(n)],
        }
    )


def test_pandas_default_dtypes_are_cast_safely(table):
    df = _frame()
    table.append(df)
    got = table.read().sort_by("id")
    assert got.schema.field("id").type == pa.int32() and got.schema.field("score").type == pa.float32()
    assert got["id"].to_pylist() == df["id"].tolist()
    np.testing.assert_array_equal(got["score"].to_numpy(), df["score"].to_numpy().astype(np.float32))
    assert got["ts"].to_pylist() == [t.to_pydatetime() for t in df["ts"]]
    # the same instants, in UTC
    assert [v.timestamp() for v in got["tsz"].to_pylist()] == [t.timestamp() for t in df["tsz"]]


def test_aware_timestamps_into_a_naive_column_are_utc(table):
    df = _frame(2)
    df["ts"] = pd.to_datetime(["2024-01-01 12:00+02:00", "2024-01-01 04:00+02:00"])
    table.append(df)
    got = table.read(columns=["id", "ts"]).sort_by("id")["ts"].to_pylist()
    assert got == [dt.datetime(2024, 1, 1, 10, 0), dt.datetime(2024, 1, 1, 2, 0)]


NANOS = pd.to_datetime(["2024-01-01 00:00:00.000000001", "2024-01-01 00:00:00.000000000"])


@pytest.mark.parametrize(
    "backend, column, values, words",
    [
        ("local", "id", np.array([1, 2**40]), "int32"),  # out of int32's range
        ("local", "score", np.array([1.0, 1e300]), "out of its range"),  # overflows float32
        ("local", "count", np.array([1.5, 2.0]), "int64"),  # a fraction into an integer column
        ("local", "ts", NANOS, "timestamp"),  # nanoseconds
        pytest.param("s3", "ts", NANOS, "timestamp", marks=pytest.mark.s3),
    ],
    ids=["id", "score", "count", "ts", "ts-s3"],
    indirect=["backend"],
)
def test_lossy_casts_are_refused_naming_the_column(backend, table, column, values, words):
    table.append(_frame(2, start=100))
    before_files, before_snaps = backend.files(), table.snapshots()
    df = _frame(2)
    df[column] = values
    with pytest.raises(SchemaMismatchError) as e:
        table.append(df)
    assert column in e.value.fields and repr(column) in str(e.value) and words in str(e.value)
    assert backend.files() == before_files and table.snapshots() == before_snaps


def test_backfill_and_upsert_take_pandas_defaults(table):
    table.append(_frame(4))
    table.backfill(pd.DataFrame({"id": [0, 1], "score": [0.5, 0.25]}))  # int64 keys, float64 values
    table.upsert(pd.DataFrame({"id": [3, 9], "count": [7, 8]}))
    got = {r["id"]: r for r in table.read().to_pylist()}
    assert got[0]["score"] == 0.5 and got[1]["score"] == 0.25 and got[3]["count"] == 7 and got[9]["count"] == 8


def test_upsert_type_error_says_upsert(table):
    table.append(_frame(2))
    with pytest.raises(SchemaMismatchError) as e:
        table.upsert(pa.table({"id": pa.array([0], pa.int32()), "count": ["x"]}))
    assert str(e.value).startswith("upsert input does not fit") and "backfill" not in str(e.value)
    assert e.value.fields == ["count"]


class _StreamOnly:
    """Not a pyarrow, pandas or polars object: only the Arrow PyCapsule stream protocol."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table

    def __arrow_c_stream__(self, requested_schema=None):
        return self._table.__arrow_c_stream__(requested_schema)


def test_any_arrow_stream_object_is_accepted(table):
    data = pa.Table.from_pandas(_frame(6), preserve_index=False)
    table.append(_StreamOnly(data))
    table.backfill(_StreamOnly(pa.table({"id": pa.array([2], pa.int64()), "name": ["two"]})))
    got = table.read().sort_by("id")
    assert got["id"].to_pylist() == list(range(6))
    assert got["name"].to_pylist() == ["n0", "n1", "two", "n3", "n4", "n5"]


def test_polars_frames_in_and_out(table):
    pl = pytest.importorskip("polars")
    frame = pl.DataFrame({"id": [1, 2, 3], "score": [0.5, 1.5, 2.5], "name": ["a", "b", None]})
    table.append(frame)
    table.upsert(pl.DataFrame({"id": [2, 4], "name": ["B", "d"]}))
    out = table.to_polars(columns=["id", "score", "name"], filter="id >= 2").sort("id")
    assert isinstance(out, pl.DataFrame)
    assert out.to_dicts() == [
        {"id": 2, "score": 1.5, "name": "B"},
        {"id": 3, "score": 2.5, "name": None},
        {"id": 4, "score": None, "name": "d"},
    ]


def test_to_pandas_matches_read(table):
    table.append(_frame(8))
    table.backfill(pa.table({"id": pa.array([1, 2], pa.int32()), "count": pa.array([-1, -2], pa.int64())}))
    expected = table.read(columns=["id", "count"], filter="id < 4").to_pandas()
    got = table.to_pandas(columns=["id", "count"], filter="id < 4")
    assert isinstance(got, pd.DataFrame)
    pd.testing.assert_frame_equal(got.sort_values("id").reset_index(drop=True), expected.sort_values("id").reset_index(drop=True))
    assert dict(zip(got["id"], got["count"])) == {0: 0, 1: -1, 2: -2, 3: 30}


def test_engine_accepts_streams_without_importing_polars(tmp_path):
    """featurelake itself never imports polars (only to_polars does)."""
    import subprocess
    import sys

    code = (
        "import sys, pyarrow as pa; from featurelake import Lake; "
        f"l = Lake({str(tmp_path / 'h')!r}); "
        "t = l.create_table('a.b', pa.schema([pa.field('k', pa.int64(), nullable=False)]), primary_key='k'); "
        "t.append(pa.table({'k': [1]})); t.read(); print('polars' in sys.modules)"
    )
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "False"
