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
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from backends import both_backends
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
        ("backfill again", lambda: t.backfill(pa.table({"id": pa.array([3], pa.int64()), "x": [4.0]}))),
        ("upsert", lambda: t.upsert(pa.table({"id": pa.array([1, 200], pa.int64()), "x": [2.0, 3.0]}))),
        ("read", lambda: t.read(columns=["x"])),
        ("backfill after a read", lambda: t.backfill(pa.table({"id": pa.array([4], pa.int64()), "x": [5.0]}))),
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
    # a backfill right after this object's own backfill or read starts from the metadata it holds
    assert loads == {name: 0 if name in ("backfill again", "backfill after a read") else 1 for name, _ in ops}
    assert sorted(t.read()["id"].to_pylist()) == list(range(5, 100)) + [200] + list(range(300, 310))


@both_backends
def test_back_to_back_backfills_load_no_metadata_and_never_miss_another_writer(backend):
    """A backfill starts from the metadata its table object already holds (its last read, or what its
    own last backfill commit returned): no catalog load. When another writer has committed since (on the branch, on another branch, or
    appending the very keys being set), the commit on that metadata is refused or what it found
    there is not trusted, and it runs again on a fresh load: nothing lost, no stale error, and no
    update file of a refused attempt left behind."""
    lake = backend.lake
    t = lake.create_table("ns.bb", SCHEMA, primary_key="id")
    t.append(_rows(range(1000)))
    other = lake.table("ns.bb")  # another writer (its own table object)
    oracle = {i: 1.0 for i in range(1000)}

    def backfill(table, ids, x: float) -> dict:
        with counting_catalog_calls(lake.catalog) as calls:
            table.backfill(pa.table({"id": pa.array(list(ids), pa.int64()), "x": np.full(len(ids), x)}))
        oracle.update({i: x for i in ids})
        return dict(calls)

    assert backfill(t, range(0, 1000, 2), 2.0) == {"load_table": 1, "commit_table": 1}
    assert backfill(t, range(1, 1000, 2), 3.0) == {"commit_table": 1}  # from the last commit's answer
    ids = t.read(columns=["id"])["id"].to_pylist()  # the usual prelude: the keys to set, read from the table
    assert backfill(t, ids[:1000:3], 3.5) == {"commit_table": 1}  # from the read's metadata
    assert backfill(other, range(0, 10), 4.0)["commit_table"] == 1
    # the branch moved: the commit on the cached metadata is refused, the retry loads
    assert backfill(t, range(10, 20), 5.0) == {"commit_table": 2, "load_table": 1}
    other.create_branch("dev")
    other.append(_rows(range(5000, 5010)), branch="dev")  # another branch: a sequence number t has not seen
    on_dev = dict(oracle) | {i: 1.0 for i in range(5000, 5010)}
    assert backfill(t, range(20, 30), 6.0) == {"commit_table": 2, "load_table": 1}  # refused at once, never taken for a lost answer
    other.append(_rows(range(1000, 1100)))  # keys t's cached metadata does not know: found on a fresh load
    oracle.update({i: 1.0 for i in range(1000, 1100)})
    assert backfill(t, range(1000, 1100), 7.0) == {"commit_table": 1, "load_table": 1}  # no commit of the stale finding
    assert dict(zip(*t.read(columns=["id", "x"]).to_pydict().values())) == oracle
    assert dict(zip(*other.read(columns=["id", "x"], branch="dev").to_pydict().values())) == on_dev
    backfill(t, range(40, 50), 8.0)  # t's own commit again: the next one starts from its answer
    other.soft_delete_column("x")  # a schema change, no snapshot: the branch head stays where t saw it
    assert backfill(t, range(0, 5), 9.0) == {"commit_table": 2, "load_table": 1}  # "x" resolved on the old schema: refused
    got = dict(zip(*t.read(columns=["id", "x"]).to_pydict().values()))
    assert got == {i: 9.0 if i < 5 else None for i in oracle}  # a new column "x", as on a fresh load
    unreferenced = lake.collect_garbage(older_than=timedelta(0), dry_run=True).files
    assert not [f for f in unreferenced if "/_updates/" in str(f)], unreferenced


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
    from featurelake import updatefiles

    monkeypatch.setattr(updatefiles, "PACK_PART_BYTES", 0)  # every layer its own file (packing: one file, see below)
    t = lake.create_table("ns.t", SCHEMA, primary_key="id")
    for lo in range(0, 4000, 1000):
        t.append(_rows(range(lo, lo + 1000)))  # four data files
    active, peak, lock = [0], [0], threading.Lock()
    original = updatefiles.upload_update_file

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

    monkeypatch.setattr(updatefiles, "upload_update_file", slow_write)
    t.backfill(pa.table({"id": pa.array([5, 1005, 2005, 3005], pa.int64()), "x": [1.5, 2.5, 3.5, 4.5]}))
    assert t.last_update_report.update_files == 4
    assert peak[0] == 4
    got = t.read(filter="id in (5, 1005, 2005, 3005)").sort_by("id")
    assert got["x"].to_pylist() == [1.5, 2.5, 3.5, 4.5]


@pytest.mark.parametrize("pack", [False, True], ids=["own-files", "packed"])
def test_a_failed_parallel_write_leaves_no_update_file_and_no_snapshot(lake, monkeypatch, pack):
    from featurelake import updatefiles

    if not pack:
        monkeypatch.setattr(updatefiles, "PACK_PART_BYTES", 0)  # four files, the second fails
    t = lake.create_table("ns.t", SCHEMA, primary_key="id")
    for lo in range(0, 4000, 1000):
        t.append(_rows(range(lo, lo + 1000)))
    storage = table_storage(t.refresh())
    before_files = {f.uri for f in storage.list(t.refresh().location())}
    before_snapshot = t.refresh().current_snapshot().snapshot_id
    original = updatefiles.upload_update_file
    calls = [0]

    def one_fails(ice, path, *args, **kwargs):
        size = original(ice, path, *args, **kwargs)  # its bytes are written, then the disk "fails"
        with threading.Lock():
            calls[0] += 1
            if calls[0] == (1 if pack else 2):  # packed: the one shared file
                raise OSError("No space left on device")
        return size

    monkeypatch.setattr(updatefiles, "upload_update_file", one_fails)
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
    """5 of 9 columns from 4 data files and their 4 update layers (one shared update file): each file's
    footer and its projection, one GET each (the small shared file: one GET for all its layers).

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
    assert files == 5, stats  # four layers in one shared update file (was four update files)
    columns = ["id", "c1", "c3", "c5", "c7"]
    expected = t.read(columns=columns)  # warms nothing the counted read needs: each read plans afresh
    with seaweed.counting() as requests:
        got = t.read(columns=columns)
    assert got.equals(expected)
    assert got.sort_by("id")["c1"].to_pylist()[5] == -1.0
    planning = 4  # metadata.json, manifest list, manifest, platform state root (shards: at most one more)
    assert requests["total"] <= 2 * files + planning, requests  # was 42: a HEAD and a GET per column chunk


# ------------------------------------------------- every operation against its floor
DAYS = 10
EVENTS = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("ts", pa.timestamp("us")),
                    pa.field("x", pa.float64()), pa.field("y", pa.float64()), pa.field("z", pa.float32())])


def _events(ids: np.ndarray, day_of) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    ts = np.datetime64("2026-01-01", "us") + (day_of(ids) * 86_400_000_000 + ids % 1000).astype("timedelta64[us]")
    return pa.table({"id": ids, "ts": ts, "x": ids * 1.0, "y": ids * 2.0, "z": (ids % 7).astype(np.float32)}, schema=EVENTS)


def _counted(seaweed, lake, fn):
    with seaweed.counting() as s3, counting_catalog_calls(lake.catalog) as calls:
        out = fn()
    return s3["total"] + sum(calls.values()), dict(s3), out


@pytest.mark.slow
def test_each_operation_costs_at_most_twice_its_floor_on_s3(s3_lake, seaweed):
    """Requests (S3 + catalog) of append, upsert, backfill, a projected read, compact and GC, each
    against its floor: the data and update files the operation must read or write, plus one commit.

    The floor is computed from what the operation touched (its report and the table's stats
    before and after), never hard-coded; the results are checked against a pandas oracle.
    """
    n = 20_000
    t = s3_lake.create_table("ns.ops", EVENTS, primary_key="id", partition_by=["day(ts)"])
    costs: dict[str, tuple[int, int, dict]] = {}

    first = _events(np.arange(n), lambda i: i % DAYS)  # one data file per day
    total, s3, _ = _counted(seaweed, s3_lake, lambda: t.append(first))
    files = t.stats()["data_files"]
    assert files == DAYS
    costs["append"] = (total, files + 1, s3)
    oracle = first.to_pandas().set_index("id")

    rng = np.random.default_rng(11)
    existing = np.sort(rng.choice(n, 200, replace=False))  # every data file has some
    new = np.arange(n, n + 50)
    changes = _events(np.concatenate([existing, new]), lambda i: np.where(i >= n, 0, i % DAYS)).select(["id", "ts", "x"])
    changes = changes.set_column(2, "x", pa.array(np.concatenate([existing, new]) * -1.0))
    total, s3, _ = _counted(seaweed, s3_lake, lambda: t.upsert(changes))
    report = t.last_update_report
    added = t.stats()["data_files"] - files
    assert report.data_files_touched == DAYS and report.update_files == 1 and added == 1  # DAYS layers, one shared file
    # a platform commit also writes its state root and manifest list (with one shared update file these
    # fixed costs are most of it): files + those two + the commit
    costs["upsert"] = (total, report.update_files + added + 3, s3)
    full_new = _events(new, lambda i: np.zeros_like(i)).to_pandas().set_index("id")
    full_new["x"] = -full_new.index.to_numpy() * 1.0
    full_new["y"] = np.nan  # an upsert inserting a key without a column leaves it null
    oracle.loc[existing, "x"] = -existing * 1.0
    oracle = pd.concat([oracle, full_new])

    ids = np.arange(n + 50)
    values = pa.table({"id": ids, "z": (ids % 5).astype(np.float32)})
    total, s3, _ = _counted(seaweed, s3_lake, lambda: t.backfill(values))
    report = t.last_update_report
    assert report.data_files_touched == DAYS + 1 and report.update_files == 1  # every layer in one shared file
    costs["backfill"] = (total, report.update_files + 3, s3)
    oracle["z"] = (oracle.index.to_numpy() % 5).astype(np.float32)

    stats = t.stats()
    total, s3, got = _counted(seaweed, s3_lake, lambda: t.read(columns=["id", "x", "z"]))
    costs["read 3 of 5 columns"] = (total, stats["data_files"] + stats["update_files"] + 1, s3)
    got = got.to_pandas().set_index("id").sort_index()
    pd.testing.assert_frame_equal(got, oracle[["x", "z"]].sort_index(), check_dtype=False)

    total, s3, _ = _counted(seaweed, s3_lake, lambda: t.compact())
    after = t.stats()
    assert after["update_files"] == 0
    costs["compact"] = (total, stats["data_files"] + stats["update_files"] + after["data_files"] + 1, s3)

    t.expire_snapshots(datetime.now() + timedelta(seconds=1), retain_last=1)
    total, s3, gc = _counted(seaweed, s3_lake, lambda: s3_lake.collect_garbage(older_than=timedelta(0)))
    assert len(gc.files) > 2 * DAYS
    costs["gc"] = (total, len(gc.files) + 1, s3)

    got = t.read().to_pandas().set_index("id").sort_index()
    pd.testing.assert_frame_equal(got[["x", "y", "z"]], oracle[["x", "y", "z"]].sort_index(), check_dtype=False)
    over = {op: (total, floor, s3) for op, (total, floor, s3) in costs.items() if total > 2 * floor}
    assert not over, f"requests above twice the floor: {over}"


@pytest.mark.slow
def test_a_backfill_on_s3_costs_its_update_files_the_state_root_the_manifest_list_and_one_commit(s3_lake, seaweed, fresh_process):
    """A one-column backfill of every row, counted by the server: one PUT per update file, one for
    the platform state (its root holds the shards the commit changed: no separate pack) and one for
    the manifest list, and one catalog commit (plus a load unless the table object holds current
    metadata: it read the table, or made the last backfill) -- the floor (update files + a commit)
    plus two or three. Nothing else: no HEAD before a PUT, no re-read of metadata this process has,
    so a warm backfill makes no GET at all. A fresh process adds only what it lacks, one read each: the
    manifest list, the manifest, the state root (with its shards) and the index segment."""
    n = 20_000
    t = s3_lake.create_table("ns.bf", EVENTS, primary_key="id", partition_by=["day(ts)"])
    t.append(_events(np.arange(n), lambda i: i % DAYS))  # one data file per day
    ids = np.arange(n, dtype=np.int64)
    counts = {}
    for run, value in (("first", 1.0), ("warm", 2.0), ("cold", 3.0)):
        if run == "cold":
            fresh_process()
            t = s3_lake.table("ns.bf")  # a new table object too: no metadata held
        values = pa.table({"id": ids, "z": np.full(n, value, np.float32)})
        with seaweed.counting() as s3, counting_catalog_calls(s3_lake.catalog) as calls:
            t.backfill(values)
        assert t.last_update_report.update_files == 1 and t.last_update_report.data_files_touched == DAYS  # one shared file
        counts[run] = ({k: v for k, v in s3.items() if k != "total"}, dict(calls))
        got = t.read(columns=["id", "z"]).sort_by("id")
        assert got["id"].to_pylist() == ids.tolist() and set(got["z"].to_pylist()) == {value}
    one_commit = {"load_table": 1, "commit_table": 1}
    # after the read checking the first run, the metadata that read loaded is the base: the commit is the only catalog call
    # the shared update file, the state root, the manifest list (was DAYS + 2 PUTs: one update file per data file)
    assert counts["warm"] == ({"PUT": 1 + 2}, {"commit_table": 1}), counts  # was DAYS + 3 PUTs, a GET (a pack, the manifest) and a load
    assert counts["first"] == ({"PUT": 1 + 2, "GET_RANGE": 1}, one_commit), counts  # + the index segment, not cached yet
    cold, calls = counts["cold"]
    assert calls == one_commit and cold["PUT"] == 1 + 2, counts
    assert cold.get("GET", 0) + cold.get("GET_RANGE", 0) == 4 and set(cold) <= {"PUT", "GET", "GET_RANGE"}, counts


@pytest.mark.slow
def test_gc_on_s3_deletes_in_batches_exactly_the_unreferenced_files(s3_lake, seaweed):
    """GC deletes with DeleteObjects (one POST for up to 1,000 named keys, no per-file HEAD/DELETE/PUT):
    the bucket listed before and after with an independent client differs by exactly the report."""
    fs = seaweed.filesystem()

    def listing() -> set[str]:
        infos = fs.get_file_info(pafs.FileSelector("warehouse/", recursive=True))
        return {"s3://" + i.path for i in infos if i.type == pafs.FileType.File}

    t = s3_lake.create_table("ns.g", SCHEMA, primary_key="id")
    for lo in range(0, 600, 100):
        t.append(_rows(range(lo, lo + 100)))
    t.backfill(pa.table({"id": pa.array(range(0, 600, 3), pa.int64()), "x": np.full(200, 5.0)}))
    t.compact()
    expected = t.read().sort_by("id")
    t.expire_snapshots(datetime.now() + timedelta(seconds=1), retain_last=1)
    before = listing()
    dry = set(s3_lake.collect_garbage(older_than=timedelta(0), dry_run=True).files)
    assert len(dry) > 10
    with seaweed.counting() as requests:
        report = s3_lake.collect_garbage(older_than=timedelta(0))
    assert set(report.files) == dry
    assert listing() == before - dry
    # one batch request for all of them (SeaweedFS files the POST ?delete under DELETE), where
    # pyarrow's delete_file made a HEAD, a DELETE and a folder-marker PUT per file
    assert requests.get("DELETE", 0) + requests.get("POST", 0) == 1, requests
    assert requests.get("PUT", 0) == 0, requests
    assert requests["total"] <= 5, requests  # plus the listing and the manifest list
    assert t.read().sort_by("id").equals(expected)
    assert s3_lake.collect_garbage(older_than=timedelta(0), dry_run=True).files == []


def test_a_batch_delete_the_store_refuses_deletes_nothing_and_reports_every_key(seaweed, s3_lake):
    """Signed with a wrong secret, DeleteObjects is refused: every key is handed back (the caller
    deletes them one by one, with pyarrow's own errors), nothing is gone, nothing else is touched."""
    from featurelake.s3sign import delete_objects

    fs = seaweed.filesystem()
    folder = s3_lake.create_table("ns.loose", SCHEMA, primary_key="id").iceberg.location().removeprefix("s3://") + "/data/loose"
    keys = [f"{folder}/f{i}.parquet" for i in range(3)]  # a table bucket takes Iceberg file types only
    for k in keys:
        with fs.open_output_stream(k) as out:
            out.write(b"x" * 10)
    _, (options,) = fs.__reduce__()
    wrong = pafs.S3FileSystem._reconstruct({**options, "secret_key": "not-the-secret"})
    assert sorted(delete_objects(wrong, keys)) == keys
    assert all(fs.get_file_info(k).type == pafs.FileType.File for k in keys)
    # the right secret: the named keys go (a key already gone is no error), a neighbour stays
    assert delete_objects(fs, keys[:2] + [f"{folder}/never-there.parquet"]) == []
    assert [fs.get_file_info(k).type for k in keys] == [pafs.FileType.NotFound] * 2 + [pafs.FileType.File]
    # a filesystem it cannot sign for (anonymous): handed back untouched
    anonymous = pafs.S3FileSystem(anonymous=True, endpoint_override=seaweed.s3_endpoint, scheme="http", region="us-east-1")
    assert delete_objects(anonymous, keys[2:]) == keys[2:]
    assert fs.get_file_info(keys[2]).type == pafs.FileType.File


def test_a_small_file_of_known_size_is_one_get_and_a_wrong_size_falls_back(seaweed, s3_lake):
    from featurelake.storage import open_remote

    fs = seaweed.filesystem()
    folder = s3_lake.create_table("ns.loose", SCHEMA, primary_key="id").iceberg.location().removeprefix("s3://") + "/data/loose"
    data = bytes(range(256)) * 40
    with fs.open_output_stream(f"{folder}/small.parquet") as out:
        out.write(data)
    with seaweed.counting() as requests:
        got = open_remote(fs, f"{folder}/small.parquet", len(data), whole_below=1 << 20).read()
    assert got == data
    assert requests["total"] == 1, requests
    with pytest.raises(OSError):  # recorded larger than it is: refused, never a short read passed off as whole
        open_remote(fs, f"{folder}/small.parquet", len(data) + 10, whole_below=1 << 20)
    with pytest.raises(FileNotFoundError):
        open_remote(fs, f"{folder}/absent.parquet", 100, whole_below=1 << 20)


@both_backends
@pytest.mark.parametrize("inline", [True, False], ids=["in-root", "separate-pack"])
def test_a_commit_writes_its_state_in_one_pack_and_older_packs_never_leak(backend, inline, monkeypatch):
    """Every shard a commit changes goes into one file: the state root itself (the whole state in
    one PUT), or past ``state.INLINE_ENTRIES`` entries a separate pack beside it. A shard rewritten
    later is read from its new file only (the older one still holds its stale rows), so no update
    is lost or resurrected, also when read back from storage by a fresh process."""
    from featurelake import state as state_module

    if not inline:
        monkeypatch.setattr(state_module, "INLINE_ENTRIES", 0)
    lake = backend.lake
    t = lake.create_table("ns.packs", SCHEMA, primary_key="id")
    for lo in range(0, 1200, 100):
        t.append(_rows(range(lo, lo + 100)))  # 12 data files: many shards
    state_files = lambda: {f for f in backend.files(".parquet") if "/_featurelake/" in f and "/index/" not in f}  # noqa: E731
    per_commit = 1 if inline else 2  # the root (and the pack)
    before = state_files()
    t.backfill(pa.table({"id": pa.array(range(0, 1200, 10), pa.int64()), "x": np.full(120, 2.0)}))
    first = state_files() - before
    assert len(first) == per_commit and sum("/shard-" in f for f in first) == per_commit - 1
    t.backfill(pa.table({"id": pa.array([0, 10], pa.int64()), "x": [3.0, 4.0]}))  # one data file's shard again
    assert len(state_files() - before - first) == per_commit
    state_module.clear_caches()  # what a fresh process reads from storage
    ice = t.refresh()
    state = t._state(ice, ice.current_snapshot())
    entries = state.by_data_file()
    assert len(entries) == 12 and state.update_layers == 13
    assert state.update_files == 2  # the first commit's twelve layers share one update file
    assert sorted(len(es) for es in entries.values()) == [1] * 11 + [2]
    files = {backend.name_of(p) for p in state.shards.values()}
    assert files <= first | (state_files() - before - first)  # every shard names a file the two commits wrote
    assert (backend.name_of(state.root_path) in files) == inline
    stored = {backend.name_of(f) for f in backend.files()}
    assert {backend.name_of(e.update_file) for es in entries.values() for e in es} <= stored  # each names a stored file
    got = dict(zip(*t.read(columns=["id", "x"]).to_pydict().values()))
    want = {i: (3.0 if i == 0 else 4.0 if i == 10 else 2.0 if i % 10 == 0 else 1.0) for i in range(1200)}
    assert got == want
    t.compact()
    assert t.stats()["update_files"] == 0 and dict(zip(*t.read(columns=["id", "x"]).to_pydict().values())) == want


@both_backends
@pytest.mark.parametrize("pack", [False, True], ids=["own-files", "packed"])
def test_every_update_file_is_stored_before_the_commit_names_it(backend, monkeypatch, pack):
    """Update files upload while the state and manifest list are written; the catalog commit waits for all of them."""
    from featurelake import updatefiles, updates

    if not pack:
        monkeypatch.setattr(updatefiles, "PACK_PART_BYTES", 0)
    lake = backend.lake
    t = lake.create_table("ns.t", SCHEMA, primary_key="id")
    for lo in range(0, 3000, 1000):
        t.append(_rows(range(lo, lo + 1000)))
    original_upload, original_commit = updatefiles.upload_update_file, updates.commit
    done: list[str] = []
    at_commit: list[list[str]] = []

    def slow_upload(ice, path, data):
        time.sleep(0.3)  # slower than writing the state and the manifest list
        size = original_upload(ice, path, data)
        done.append(path)
        return size

    def checked_commit(tx, branch):
        at_commit.append(list(done))
        return original_commit(tx, branch)

    monkeypatch.setattr(updatefiles, "upload_update_file", slow_upload)
    monkeypatch.setattr(updates, "commit", checked_commit)
    t.backfill(pa.table({"id": pa.array([5, 1005, 2005], pa.int64()), "x": [1.5, 2.5, 3.5]}))
    assert len(at_commit) == 1 and sorted(at_commit[0]) == sorted(done) and len(done) == (1 if pack else 3)
    got = t.read(filter="id in (5, 1005, 2005)").sort_by("id")
    assert got["x"].to_pylist() == [1.5, 2.5, 3.5]


def test_a_manifest_list_not_cached_is_read_in_one_get(s3_lake, seaweed):
    """pyiceberg opens a manifest list with a HEAD and then reads it; its size is recorded nowhere, so one plain GET."""
    from featurelake import manifest_cache

    t = s3_lake.create_table("ns.t", SCHEMA, primary_key="id")
    for lo in range(0, 300, 100):
        t.append(_rows(range(lo, lo + 100)))
    ice = t.refresh()
    snapshot = ice.current_snapshot()
    cached = [m.manifest_path for m in snapshot.manifests(ice.io)]
    manifest_cache.clear()
    with seaweed.counting() as requests:
        fresh = [m.manifest_path for m in snapshot.manifests(ice.io)]
    assert fresh == cached and len(fresh) == 3
    assert requests["total"] == 1 and requests["GET"] == 1, requests
    manifest_cache.clear()
    assert sorted(t.read()["id"].to_pylist()) == list(range(300))


LARGE = pa.schema([pa.field("id", pa.int64(), nullable=False)] + [pa.field(f"v{i}", pa.float64()) for i in range(3)])


def _wide_rows(lo: int, n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)  # random floats do not compress: the file is about as large as the rows
    return pa.table({"id": np.arange(lo, lo + n, dtype=np.int64), **{f"v{i}": rng.random(n) for i in range(3)}}, schema=LARGE)


def test_a_file_larger_than_one_upload_part_is_stored_in_one_put_and_a_larger_one_streams(s3_lake, seaweed, monkeypatch):
    """A data file (~12 MB, more than one part of pyarrow's multipart upload) and a backfill's update
    file (~12 MB) are each one PUT: no CreateMultipartUpload/Complete (POSTs). Rows past
    ``SINGLE_PUT_BYTES`` stream through pyarrow's multipart upload as before. Read back equal."""
    from featurelake import datafiles

    t = s3_lake.create_table("ns.large", LARGE, primary_key="id")
    first = _wide_rows(0, 500_000, 1)
    _, s3, _ = _counted(seaweed, s3_lake, lambda: t.append(first))
    assert t.stats()["data_files"] == 1 and t.stats()["data_bytes"] > 11 << 20
    assert s3.get("POST", 0) == 0, s3
    assert s3["PUT"] == 5, s3  # the data file, its index segment, the state, a manifest, the manifest list
    values = pa.table({"id": first["id"], **{f"w{i}": pa.array(np.random.default_rng(i).random(first.num_rows)) for i in range(3)}})
    _, s3, _ = _counted(seaweed, s3_lake, lambda: t.backfill(values))
    assert t.last_update_report.bytes_written > 10 << 20
    assert s3.get("POST", 0) == 0 and s3["PUT"] == 3, s3  # the update file, the state, the manifest list

    monkeypatch.setattr(datafiles, "SINGLE_PUT_BYTES", 1 << 20)
    second = _wide_rows(500_000, 500_000, 2)
    _, s3, _ = _counted(seaweed, s3_lake, lambda: t.append(second))
    assert s3.get("POST", 0) >= 2, s3  # streamed: a multipart upload, created and completed
    got = t.read().sort_by("id")
    want = pa.concat_tables([first, second]).sort_by("id")
    assert got.select(LARGE.names).equals(want)
    for i in range(3):
        np.testing.assert_array_equal(got[f"w{i}"].to_numpy()[:500_000], values[f"w{i}"].to_numpy())
        assert got[f"w{i}"].slice(500_000).null_count == 500_000
