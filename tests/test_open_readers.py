"""Local Parquet readers kept open across reads (featurelake.openfiles), against pq.read_table.

* a reader is reused by the next read of the same file, and what it returns
  equals ``pq.read_table`` of the file;
* a file replaced underneath (same path: rewritten in place, or a new file
  renamed over it) is opened again, never read through the old reader;
* ``forget_file`` and garbage collection (through storage's delete hook)
  close a deleted file's readers and drop its footer and decoded layers;
* concurrent reads never share one reader (check out / check in), and many
  threads reading a layered table at once all get the oracle's rows, on the
  embedded lake and on S3 + REST;
* the pool is bounded (FEATURELAKE_OPEN_READERS).
"""
from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from backends import both_backends

from featurelake import openfiles, readfiles


@pytest.fixture(autouse=True)
def _empty_pool():
    openfiles.clear()
    yield
    openfiles.clear()


def _write(path, n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    table = pa.table({"id": np.arange(n, dtype=np.int64), "x": rng.standard_normal(n), "s": [f"v{seed}-{i}" for i in range(n)]})
    pq.write_table(table, path, row_group_size=max(1, n // 3))
    return table


def _read(path: str, columns=None) -> pa.Table:
    lease = readfiles.open_local(path)
    try:
        return lease.parquet.read(columns=columns, use_threads=False)
    finally:
        readfiles.release(lease)


def test_a_reader_is_reused_and_reads_what_pq_read_table_reads(tmp_path):
    path = str(tmp_path / "a.parquet")
    expected = _write(path, 1000, 1)
    first = readfiles.open_local(path)
    readfiles.release(first)
    assert openfiles.idle_count(path) == 1
    again = readfiles.open_local(path)
    assert again is first  # the kept-open reader, its footer parsed once
    assert openfiles.idle_count(path) == 0  # checked out: nobody else gets it
    other = readfiles.open_local(path)  # a second reader at the same time is a new one
    assert other is not again
    assert again.parquet.read().equals(pq.read_table(path))
    readfiles.release(again)
    readfiles.release(other)
    assert openfiles.idle_count(path) == 2
    for columns in (None, ["x"], ["s", "id"]):
        assert _read(path, columns).equals(pq.read_table(path, columns=columns))
    assert _read(path).equals(expected)


def test_a_failed_read_drops_its_reader(tmp_path):
    path = str(tmp_path / "a.parquet")
    _write(path, 100, 1)
    lease = readfiles.open_local(path)
    readfiles.release(lease, ok=False)
    assert openfiles.idle_count(path) == 0
    assert readfiles.open_local(path) is not lease


@pytest.mark.parametrize("how", ["in place", "renamed over"])
def test_a_replaced_file_is_opened_again(tmp_path, how):
    path = str(tmp_path / "a.parquet")
    _write(path, 500, 1)
    assert _read(path).column("s")[0].as_py() == "v1-0"
    old = readfiles.open_local(path)
    readfiles.release(old)
    if how == "in place":
        time.sleep(0.01)  # a new mtime even on coarse clocks
        replaced = _write(path, 800, 2)
    else:
        other = str(tmp_path / "b.parquet")
        replaced = _write(other, 800, 2)
        os.replace(other, path)
    lease = readfiles.open_local(path)
    assert lease is not old
    assert lease.parquet.read().equals(replaced)
    readfiles.release(lease)
    assert openfiles.idle_count(path) == 1  # the old version's reader was closed, not kept
    assert _read(path).equals(pq.read_table(path))


def test_forget_file_closes_idle_readers_and_retires_checked_out_ones(tmp_path):
    path = str(tmp_path / "a.parquet")
    _write(path, 100, 1)
    idle = readfiles.open_local(path)
    out = readfiles.open_local(path)
    readfiles.release(idle)
    readfiles.forget_file(path)
    assert openfiles.idle_count(path) == 0
    assert idle.handle.closed
    readfiles.release(out)  # checked out before the forget: closed on check-in, not kept
    assert out.handle.closed and openfiles.idle_count(path) == 0
    assert not any(k[0] == path for k in readfiles._FOOTERS.items)


def test_the_pool_is_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(openfiles, "MAX_IDLE", 3)
    paths = [str(tmp_path / f"{i}.parquet") for i in range(6)]
    leases = []
    for i, p in enumerate(paths):
        _write(p, 50, i)
        leases.append(readfiles.open_local(p))
    for lease in leases:
        readfiles.release(lease)
    assert openfiles.idle_count() == 3
    assert [openfiles.idle_count(p) for p in paths] == [0, 0, 0, 1, 1, 1]  # the least recently used were closed
    assert all(lease.handle.closed for lease in leases[:3])
    monkeypatch.setattr(openfiles, "MAX_IDLE", 0)
    lease = readfiles.open_local(paths[0])
    readfiles.release(lease)
    assert lease.handle.closed  # 0 keeps none


def test_concurrent_checkouts_never_share_a_reader(tmp_path):
    path = str(tmp_path / "a.parquet")
    expected = _write(path, 3000, 4)
    holders: set[int] = set()
    lock = threading.Lock()
    errors: list[str] = []

    def work(i: int) -> None:
        for _ in range(40):
            lease = readfiles.open_local(path)
            with lock:
                if id(lease) in holders:
                    errors.append("one reader handed to two threads")
                holders.add(id(lease))
            got = lease.parquet.read(columns=["x"], use_threads=False)
            if not got.column("x").equals(expected.column("x")):
                errors.append("wrong rows")
            with lock:
                holders.discard(id(lease))
            readfiles.release(lease)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    assert not errors
    assert 1 <= openfiles.idle_count(path) <= 8


def _layered(lake, rng, files: int = 5, per_file: int = 400):
    n = files * per_file
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("a", pa.float64()), pa.field("b", pa.int32())])
    t = lake.create_table("ns.open", schema, primary_key="id", partition_by=[])
    a = rng.standard_normal(n)
    b = rng.integers(0, 100, n).astype(np.int32)
    for f in range(files):
        sl = slice(f * per_file, (f + 1) * per_file)
        t.append(pa.table({"id": np.arange(n)[sl], "a": a[sl], "b": b[sl]}, schema=schema))
    for _ in range(3):
        keys = rng.choice(n, size=n // 7, replace=False)
        vals = rng.standard_normal(len(keys))
        t.backfill(pa.table({"id": pa.array(keys, pa.int64()), "a": vals}))
        a[keys] = vals
    keys = rng.choice(n, size=n // 3, replace=False)
    vals = rng.integers(100, 200, len(keys)).astype(np.int32)
    t.backfill(pa.table({"id": pa.array(keys, pa.int64()), "b": vals}))
    b[keys] = vals
    return t, pa.table({"id": np.arange(n), "a": a, "b": b}, schema=schema)


@both_backends
def test_concurrent_layered_reads_equal_the_oracle(lake):
    t, expected = _layered(lake, np.random.default_rng(2))
    update_files = sorted({e.update_file for e in t.scan().state.entries()})

    def read(i: int) -> bool:
        if i % 4 == 0:  # some of them as first reads, racing the others
            readfiles.forget_files(update_files)
        got = t.read(columns=["id", "a", "b"]).sort_by("id")
        return got.equals(expected.cast(got.schema))

    with ThreadPoolExecutor(6) as pool:
        assert all(pool.map(read, range(24)))
    streamed = pa.Table.from_batches(list(t.batches(columns=["id", "a", "b"], batch_size=97))).sort_by("id")
    assert streamed.equals(expected.cast(streamed.schema))


def test_garbage_collection_forgets_the_files_it_deletes(lake):
    t, expected = _layered(lake, np.random.default_rng(3))
    t.read()  # data and update files opened, their readers kept
    before = {task.file.file_path for task in t.scan().tasks()} | {e.update_file for e in t.scan().state.entries()}
    assert any(openfiles.idle_count(p) for p in before)
    t.compact()
    t.expire_snapshots(older_than=datetime.now(timezone.utc) + timedelta(seconds=1), retain_last=1)
    report = lake.collect_garbage(older_than=timedelta(0))
    gone = [p for p in before if not os.path.exists(p)]
    assert gone, report
    for p in gone:
        assert openfiles.idle_count(p) == 0
        assert not any(readfiles._names_path(k, {p}) for k in readfiles._FOOTERS.items)
        assert not any(readfiles._names_path(k, {p}) for k in readfiles.LAYERS.items)
    got = t.read().sort_by("id")
    assert got.equals(expected.cast(got.schema))


def test_a_deleted_file_through_storage_is_forgotten(tmp_path, lake):
    from featurelake.storage import storage_of

    t, _ = _layered(lake, np.random.default_rng(4), files=2)
    t.read()
    victim = t.scan().tasks()[0].file.file_path  # a data file: kept open (small update files are read whole)
    layer = next(e.update_file for e in t.scan().state.entries())  # its decoded layer is kept
    assert openfiles.idle_count(victim) == 1
    assert any(readfiles._names_path(k, {layer}) for k in readfiles.LAYERS.items)
    storage_of(t.iceberg.io).delete(victim)
    storage_of(t.iceberg.io).delete(layer)
    assert openfiles.idle_count(victim) == 0
    assert not any(readfiles._names_path(k, {layer}) for k in readfiles.LAYERS.items)


def test_a_file_replaced_between_stat_and_open_is_never_read_under_the_old_key(tmp_path):
    path = str(tmp_path / "a.parquet")
    _write(path, 100, 1)
    stale = openfiles.file_key(path)
    other = str(tmp_path / "b.parquet")
    replaced = _write(other, 300, 2)
    os.replace(other, path)
    with pytest.raises(openfiles.FileChangedError):
        readfiles.open_local(path, stale)
    assert openfiles.idle_count(path) == 0
    assert _read(path).equals(replaced)  # a fresh stat opens the new version
