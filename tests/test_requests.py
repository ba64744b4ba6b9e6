"""Request-aware I/O: what one operation costs in object-store requests, catalog calls and bytes.

S3 requests are counted by SeaweedFS itself (its Prometheus counters, see
tests/seaweed.py): an independent count of what the server answered. Catalog
calls are counted on the lake's real catalog object (only calls from outside
the catalog, each one request to a REST catalog).
"""
from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest

from featurelake import index
from featurelake.errors import StorageError
from featurelake.storage import table_storage
from seaweed import counting_catalog_calls

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("x", pa.float64())])


def _rows(ids) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    return pa.table({"id": ids, "x": np.ones(len(ids))}, schema=SCHEMA)


def test_each_operation_loads_the_table_once(lake):
    """Commit metadata is read once per operation (each load is a catalog request plus a metadata.json GET)."""
    t = lake.create_table("ns.t", SCHEMA, primary_key="id")
    ops = [
        ("append", lambda: t.append(_rows(range(100)))),
        ("backfill", lambda: t.backfill(pa.table({"id": pa.array([1, 2], pa.int64()), "x": [2.0, 3.0]}))),
        ("upsert", lambda: t.upsert(pa.table({"id": pa.array([1, 200], pa.int64()), "x": [2.0, 3.0]}))),
        ("read", lambda: t.read(columns=["x"])),
        ("delete", lambda: t.delete("id < 5")),
        ("create_branch", lambda: t.create_branch("b")),
        ("append to branch", lambda: t.append(_rows(range(300, 310)), branch="b")),
        ("merge", lambda: t.merge("b")),
        ("compact", lambda: t.compact()),
        ("stats", lambda: t.stats()),
        ("expire", lambda: t.expire_snapshots(datetime.now(), retain_last=1)),
        ("drop_branch", lambda: t.drop_branch("b")),
        ("gc", lambda: lake.collect_garbage(older_than=timedelta(0))),
    ]
    loads = {}
    for name, op in ops:
        with counting_catalog_calls(lake.catalog) as calls:
            op()
        loads[name] = calls["load_table"]
    assert loads == {name: 1 for name, _ in ops}
    assert sorted(t.read()["id"].to_pylist()) == list(range(5, 100)) + [200] + list(range(300, 310))


def _probe(rng, keys: np.ndarray, n: int) -> pa.Table:
    picked = np.sort(rng.choice(keys, n, replace=False))
    return pa.table({"id": picked, "x": np.full(n, 7.0)}, schema=SCHEMA)


def _index_bytes(t) -> int:
    ice = t.refresh()
    segments = t._state(ice, ice.current_snapshot()).index_segments
    return sum(table_storage(ice).size(s["path"]) for s in segments)


@pytest.mark.slow
def test_upsert_on_s3_reads_only_the_index_buckets_it_needs_and_requests_stay_flat(s3_lake, seaweed, monkeypatch):
    """10 keys into tables of 40k and 200k rows: the same requests, a small part of the index read."""
    monkeypatch.setattr(index, "BUCKET_ROWS", 256)  # many more buckets than probed keys, in both tables
    rng = np.random.default_rng(5)
    counts, shares = {}, {}
    for rows in (40_000, 200_000):
        t = s3_lake.create_table(f"ns.flat{rows}", SCHEMA, primary_key="id")
        keys = np.unique(rng.integers(0, 2**62, rows))  # sparse keys: a large index
        t.append(_rows(keys))
        index_bytes = _index_bytes(t)
        index.clear_caches()  # a fresh process: nothing of the index is cached
        probe = _probe(rng, keys, 10)
        sent_before = seaweed.bytes_sent()
        with seaweed.counting() as requests, counting_catalog_calls(s3_lake.catalog) as calls:
            t.upsert(probe)
        shares[rows] = (seaweed.bytes_sent() - sent_before) / index_bytes
        counts[rows] = requests
        assert dict(calls) == {"load_table": 1, "commit_table": 1}
        got = t.read(filter=f"id in ({','.join(map(str, probe['id'].to_pylist()))})")
        assert got.num_rows == 10 and set(got["x"].to_pylist()) == {7.0}
    small, large = counts[40_000], counts[200_000]
    # Reads: the state root, the index footer (1-2 ranged GETs) and at most one ranged GET per probed
    # key's bucket (fewer when two keys share one); writes: one update file, state shard, root and
    # the manifests, one PUT each. Bounded by the probe, not the table: 5x the rows adds no request
    # beyond a second footer read and fewer shared buckets.
    assert large["GET_RANGE"] <= 10 + 5, large
    assert large["total"] <= small["total"] + 4, (small, large)
    assert large["total"] <= 25, large
    assert large.get("LIST", 0) == 0 and large.get("DELETE", 0) == 0
    # everything the upsert read from the store is a small part of the large table's index alone
    assert shares[200_000] < 0.25, shares


def test_update_files_of_one_commit_are_written_in_parallel(lake, monkeypatch):
    from featurelake import updates

    t = lake.create_table("ns.t", SCHEMA, primary_key="id")
    for lo in range(0, 4000, 1000):
        t.append(_rows(range(lo, lo + 1000)))  # four data files
    active, peak, lock = [0], [0], threading.Lock()
    original = updates.write_update_file

    def slow_write(*args, **kwargs):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            time.sleep(0.2)  # an object store's latency
            return original(*args, **kwargs)
        finally:
            with lock:
                active[0] -= 1

    monkeypatch.setattr(updates, "write_update_file", slow_write)
    t.backfill(pa.table({"id": pa.array([5, 1005, 2005, 3005], pa.int64()), "x": [1.5, 2.5, 3.5, 4.5]}))
    assert t.last_update_report.update_files == 4
    assert peak[0] == 4
    got = t.read(filter="id in (5, 1005, 2005, 3005)").sort_by("id")
    assert got["x"].to_pylist() == [1.5, 2.5, 3.5, 4.5]


def test_a_failed_parallel_write_leaves_no_update_file_and_no_snapshot(lake, monkeypatch):
    from featurelake import updates

    t = lake.create_table("ns.t", SCHEMA, primary_key="id")
    for lo in range(0, 4000, 1000):
        t.append(_rows(range(lo, lo + 1000)))
    storage = table_storage(t.refresh())
    before_files = {f.uri for f in storage.list(t.refresh().location())}
    before_snapshot = t.refresh().current_snapshot().snapshot_id
    original = updates.write_update_file
    calls = [0]

    def one_fails(ice, path, *args, **kwargs):
        size = original(ice, path, *args, **kwargs)  # its bytes are written, then the disk "fails"
        with threading.Lock():
            calls[0] += 1
            if calls[0] == 2:
                raise OSError("No space left on device")
        return size

    monkeypatch.setattr(updates, "write_update_file", one_fails)
    with pytest.raises(StorageError):
        t.backfill(pa.table({"id": pa.array([5, 1005, 2005, 3005], pa.int64()), "x": [1.5, 2.5, 3.5, 4.5]}))
    assert {f.uri for f in storage.list(t.refresh().location())} == before_files
    assert t.refresh().current_snapshot().snapshot_id == before_snapshot


def test_index_is_a_small_share_of_the_data(lake):
    """Sorted, delta-encoded buckets: a narrow table's index costs a few percent of its data at most."""
    schema = SCHEMA.append(pa.field("y", pa.float32()))
    t = lake.create_table("ns.narrow", schema, primary_key="id")
    rng = np.random.default_rng(1)
    n = 200_000
    t.append(pa.table({"id": np.arange(n), "x": rng.random(n), "y": rng.random(n, dtype=np.float32)}, schema=schema))
    assert _index_bytes(t) < 0.02 * t.stats()["data_bytes"]
    assert t.verify_index()["ok"]


WIDE = pa.schema([pa.field("id", pa.int64(), nullable=False)] + [pa.field(f"c{i}", pa.float64()) for i in range(8)])


def test_a_projected_read_on_s3_costs_at_most_two_requests_per_file(s3_lake, seaweed):
    """5 of 9 columns from 4 data files and 4 update files: each file's footer and its projection, one GET each.

    The projected column chunks are coalesced into one ranged GET per file (the gaps of
    unread columns are cheaper than a request), and no HEAD is made: the sizes come from
    the plan (data files) and the platform state (update files).
    """
    t = s3_lake.create_table("ns.wide", WIDE, primary_key="id")
    rng = np.random.default_rng(3)
    for lo in range(0, 8000, 2000):
        ids = np.arange(lo, lo + 2000, dtype=np.int64)
        t.append(pa.table({"id": ids, **{f"c{i}": rng.random(2000) for i in range(8)}}, schema=WIDE))
    t.backfill(pa.table({"id": pa.array([5, 2005, 4005, 6005], pa.int64()), "c1": [-1.0, -2.0, -3.0, -4.0]}))
    stats = t.stats()
    files = stats["data_files"] + stats["update_files"]
    assert files == 8, stats
    columns = ["id", "c1", "c3", "c5", "c7"]
    expected = t.read(columns=columns)  # warms nothing the counted read needs: each read plans afresh
    with seaweed.counting() as requests:
        got = t.read(columns=columns)
    assert got.equals(expected)
    assert got.sort_by("id")["c1"].to_pylist()[5] == -1.0
    planning = 4  # metadata.json, manifest list, manifest, platform state root (shards: at most one more)
    assert requests["total"] <= 2 * files + planning, requests  # was 42: a HEAD and a GET per column chunk
