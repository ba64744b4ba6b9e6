"""Column placement: training reads record their projections; compact(placement=True) makes them contiguous.

Oracle: the table read before compaction (pyarrow) equals the table after;
I/O is counted on the Parquet file itself (every read call reaching the file).
"""
from __future__ import annotations

import numpy as np
import pytest
import pyarrow as pa
import pyarrow.parquet as pq

from featurelake import placement
from featurelake.training import TrainingReader

COLUMNS = 120
PROJ = [f"c{i:03d}" for i in range(3, COLUMNS, 12)]  # 10 columns spread over the file


class _Counting:
    """A raw file that counts the read calls reaching it."""

    def __init__(self, path: str) -> None:
        self.f = open(path, "rb")
        self.calls = 0
        self.bytes = 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.calls += 1
        self.bytes += len(data)
        return data

    def __getattr__(self, name):
        return getattr(self.f, name)


def io_of_projection(path: str, columns: list[str]) -> tuple[int, int, pa.Table]:
    raw = _Counting(path)
    with pa.PythonFile(raw, mode="r") as f:
        pf = pq.ParquetFile(f, pre_buffer=True)
        raw.calls = raw.bytes = 0  # the footer is read alike in both layouts
        table = pf.read(columns=columns)
    raw.f.close()
    return raw.calls, raw.bytes, table


def data_files(t) -> list[str]:
    return [task.file.file_path.removeprefix("file://") for task in t.iceberg.scan().plan_files()]


def test_compact_with_placement_coalesces_projection_io(lake, monkeypatch):
    rng = np.random.default_rng(0)
    n = 3000
    data = {"id": pa.array(np.arange(n, dtype=np.int64))}
    for i in range(COLUMNS):
        data[f"c{i:03d}"] = pa.array(rng.standard_normal(n))
    t = lake.create_table("ml.wide", pa.table(data).schema, primary_key="id")
    t.append(pa.table(data))
    before = t.read().sort_by("id")

    monkeypatch.setattr(placement, "FLUSH_SECONDS", 0.0)
    for _ in range(3):
        TrainingReader(t, columns=PROJ, batch_size=500)
    TrainingReader(t, columns=["c000", "c001"], batch_size=500)
    placement.flush()
    counts = placement.recorded(t.iceberg)
    assert counts[tuple(PROJ)] == 3 and counts[("c000", "c001")] == 1

    [old] = data_files(t)
    calls_before, bytes_before, _ = io_of_projection(old, PROJ)
    report = t.compact(placement=True)
    assert report.column_order[: len(PROJ)] == PROJ
    [new] = data_files(t)
    assert pq.ParquetFile(new).schema_arrow.names[: len(PROJ)] == PROJ
    calls_after, bytes_after, got = io_of_projection(new, PROJ)
    assert got.equals(before.select(PROJ))
    assert calls_after < calls_before
    assert t.read().sort_by("id").equals(before)                  # the table reads the same, columns in schema order
    assert t.iceberg.scan().to_arrow().sort_by("id").equals(before)  # and so does plain pyiceberg


def test_recording_is_optional_and_failure_safe(lake, monkeypatch):
    t = lake.create_table("ml.small", pa.schema([("id", pa.int64()), ("x", pa.float64())]), primary_key="id")
    t.append(pa.table({"id": [1, 2], "x": [0.5, 1.5]}))
    monkeypatch.setenv("FEATURELAKE_RECORD_PROJECTIONS", "0")
    TrainingReader(t, columns=["x"], batch_size=1)
    assert placement.recorded(t.iceberg) == {}
    monkeypatch.delenv("FEATURELAKE_RECORD_PROJECTIONS")
    monkeypatch.setattr(placement, "storage_of", lambda io: (_ for _ in ()).throw(OSError("store down")))
    monkeypatch.setattr(placement, "FLUSH_SECONDS", 0.0)
    TrainingReader(t, columns=["x"], batch_size=1)   # the failed flush does not fail the read
    assert placement.flush() == 0


@pytest.mark.s3
def test_placement_on_s3_reads_only_the_projection(s3_lake, seaweed, monkeypatch):
    """On an object store the projected read bridges the holes between scattered column chunks (fewer
    requests, but it downloads the holes); placed side by side, it downloads about the projection alone."""
    rng = np.random.default_rng(1)
    n = 2000
    data = {"id": pa.array(np.arange(n, dtype=np.int64))}
    for i in range(COLUMNS):
        data[f"c{i:03d}"] = pa.array(rng.standard_normal(n))
    t = s3_lake.create_table("ns.wide_placed", pa.table(data).schema, primary_key="id")
    t.append(pa.table(data))
    monkeypatch.setattr(placement, "FLUSH_SECONDS", 0.0)
    TrainingReader(t, columns=PROJ, batch_size=500)
    placement.flush()
    projection_bytes = len(PROJ) * n * 8

    def downloaded() -> tuple[int, pa.Table]:
        scan = t.scan(columns=PROJ)
        scan.tasks()  # planned first: only the data reads are measured
        sent = seaweed.bytes_sent()
        with seaweed.counting():  # waits until the server's counters settle
            got = scan.to_table()
        return seaweed.bytes_sent() - sent, got

    before, got_before = downloaded()
    t.compact(placement=True)
    after, got_after = downloaded()
    assert got_after.equals(got_before) and got_before.equals(pa.table(data).select(PROJ))
    assert before > 5 * projection_bytes   # the holes between the scattered chunks came along
    assert after < 1.5 * projection_bytes  # the placed projection: its own chunks (and a footer)
