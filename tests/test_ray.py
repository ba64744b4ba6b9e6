"""featurelake.ray on a local 2-CPU Ray cluster: every distributed operation against its single-process oracle.

The oracle of a distributed write is the same write made in-process on a
sibling branch that starts at the same snapshot: both branches must read the
same, and the distributed one must add exactly one snapshot. Killed workers
(tests/ray_faults.py) must end in one commit after Ray's retry, or in no commit
and no new file once garbage collection ran.

The read (also through Ray's own Iceberg reader on the REST catalog) and the
distributed backfill/upsert also run on REST + S3 (``@both_backends``): the
workers get the table's S3 FileIO properties, never the catalog. The killed-
worker tests stay local: each death costs a cold Ray worker start (5-18 s
measured on the shared 2-core machine), and the cleanup they check goes
through the same I/O layer on both stores.
"""
from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

ray = pytest.importorskip("ray")

import ray_faults  # noqa: E402
from backends import both_backends  # noqa: E402

from featurelake import Lake  # noqa: E402
from featurelake.errors import ClusterError  # noqa: E402

SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("day", pa.int32()),
        pa.field("x", pa.float64()),
        pa.field("tag", pa.string()),
    ]
)


@pytest.fixture
def flr(ray_cluster):
    import featurelake.ray as flr

    yield flr
    ray_faults.disarm(ray_cluster)


def _table(lake: Lake, files: int = 4, rows: int = 150):
    t = lake.create_table("ml.samples", schema=SCHEMA, primary_key="id")
    rng = np.random.default_rng(7)
    for i in range(files):
        ids = np.arange(i * rows, (i + 1) * rows, dtype=np.int64)
        t.append(pa.table({
            "id": ids,
            "day": pa.array(np.full(rows, i, np.int32)),
            "x": rng.random(rows),
            "tag": pa.array(rng.choice(["a", "b", "c"], rows).tolist()),
        }, schema=SCHEMA))
    t.backfill(pa.table({"id": pa.array(np.arange(0, files * rows, 5), pa.int64()), "x": np.full(files * rows // 5, -1.0)}))
    return t


def _labels(n: int, step: int = 3, seed: int = 1) -> pa.Table:
    ids = np.arange(0, n, step, dtype=np.int64)
    return pa.table({"id": ids, "label": np.random.default_rng(seed).integers(0, 2, len(ids))})


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by("id")


def _snapshots(t) -> set[int]:
    return {s.snapshot_id for s in t.refresh().metadata.snapshots}


def _catalog_kwargs(lake: Lake) -> dict:
    """The lake's catalog as ``pyiceberg.catalog.load_catalog`` arguments (for Ray's own reader)."""
    from pyiceberg.catalog.sql import SqlCatalog

    kind = "sql" if isinstance(lake.catalog, SqlCatalog) else "rest"
    return {"name": lake.catalog.name, "type": kind, **lake.catalog.properties}


# ------------------------------------------------------------------- reads
RAY_S3 = pytest.mark.xdist_group("ray-s3")  # `-m s3 -n 2`: one worker starts Ray for both S3 cases, not two


@RAY_S3
@both_backends
def test_read_ray_matches_read_and_ray_read_iceberg_misses_update_files(lake, flr):
    t = _table(lake)
    expected = t.read()
    ds = flr.read_ray(t)
    got = pa.concat_tables(ray.get(ds.to_arrow_refs()))
    assert _sorted(got).equals(_sorted(expected))
    # one read task per data file (with its update layers), planned on the driver
    source = flr.FeatureLakeDatasource(t.scan())
    assert len(source.get_read_tasks(1)) == len(t.scan().tasks()) == 4

    # projection + a filter on an updated column sees merged values
    f = "x < 0 and day >= 1"
    part = pa.concat_tables(ray.get(flr.read_ray(t, columns=["id", "x"], filter=f).to_arrow_refs()))
    assert _sorted(part).equals(_sorted(t.read(columns=["id", "x"], filter=f)))
    assert part.num_rows == 90

    # Ray's own Iceberg reader reads the data files only: the backfilled x = -1 is missing
    plain = ray.data.read_iceberg(table_identifier="ml.samples", catalog_kwargs=_catalog_kwargs(lake)).to_arrow_refs()
    plain = _sorted(pa.concat_tables(ray.get(plain)).select(expected.column_names))
    assert plain.num_rows == expected.num_rows
    assert pc.count_distinct(expected.filter(pc.equal(expected["x"], -1.0))["id"]).as_py() == 120
    assert plain.filter(pc.equal(plain["x"], -1.0)).num_rows == 0


def test_read_ray_streaming_split_and_torch_batches(lake, flr):
    t = _table(lake)
    ds = flr.read_ray(t, columns=["id", "x"])
    a, b = ds.streaming_split(2, equal=False)
    seen = []
    import threading

    def drain(it):
        for batch in it.iter_batches(batch_size=64, batch_format="pyarrow"):
            seen.append(batch)

    threads = [threading.Thread(target=drain, args=(it,)) for it in (a, b)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    ids = pa.concat_tables(seen).column("id").to_numpy()
    assert sorted(ids.tolist()) == list(range(600))  # every row exactly once across the two splits
    torch = pytest.importorskip("torch")
    total = 0.0
    for batch in ds.iter_torch_batches(batch_size=128):
        assert isinstance(batch["x"], torch.Tensor)
        total += float(batch["x"].sum())
    assert total == pytest.approx(pc.sum(t.read(columns=["x"]).column("x")).as_py())


# ------------------------------------------------------- backfill / upsert
@RAY_S3
@both_backends
def test_backfill_and_upsert_equal_single_process(lake, flr):
    t = _table(lake)
    t.create_branch("here")
    t.create_branch("ray")
    labels = _labels(600)
    before = _snapshots(t)
    report = flr.backfill(t, labels, branch="ray", tasks=2)
    t.backfill(labels, branch="here")
    assert report.tasks == 2 and report.update_files == 4
    assert len(_snapshots(t) - before) == 2  # one commit each
    assert _sorted(t.read(branch="ray")).equals(_sorted(t.read(branch="here")))

    # by locator, on a subset of files
    loc = t.read(columns=["id"], branch="ray", with_locator=True, filter="day < 2")
    by_loc = loc.select(["_file", "_pos"]).append_column("score", pa.array(np.arange(loc.num_rows, dtype=np.float64)))
    flr.backfill(t, by_loc, branch="ray")
    t.backfill(by_loc, branch="here")  # zero-copy branches share the data files, so the locators fit both
    assert _sorted(t.read(branch="ray")).equals(_sorted(t.read(branch="here")))

    # upsert: existing keys updated in place, new keys inserted
    ups = pa.table({"id": pa.array([1, 2, 599, 5000, 5001], pa.int64()), "label": [7, 7, 7, 7, 7], "day": pa.array([9] * 5, pa.int32())})
    rep = flr.upsert(t, ups, branch="ray")
    t.upsert(ups, branch="here")
    assert rep.rows_updated == 3 and rep.rows_inserted == 2 and rep.tasks >= 1
    assert _sorted(t.read(branch="ray")).equals(_sorted(t.read(branch="here")))
    assert t.read(branch="main").num_rows == 600  # main untouched


def test_backfill_killed_worker_retries_and_commits_once(lake, flr, ray_cluster):
    t = _table(lake)
    t.create_branch("here")
    labels = _labels(600)
    ray_faults.arm(ray_cluster, "backfill")
    before = _snapshots(t)
    report = flr.backfill(t, labels, tasks=2, retries=2)
    assert ray_faults.fired(ray_cluster, "backfill")  # a worker did die after writing its files
    assert len(_snapshots(t) - before) == 1
    t.backfill(labels, branch="here")
    assert _sorted(t.read()).equals(_sorted(t.read(branch="here")))
    # no second copy of the killed task's files: every update file on disk is live in some branch
    live = {e.update_file for b in ("main", "here") for e in t._state(t.refresh(), t.refresh().snapshot_by_name(b)).entries()}
    on_disk = {str(p) for p in Path(lake.home).rglob("_updates/*.parquet")}
    assert {os.path.normpath(p.removeprefix("file://")) for p in live} == on_disk
    assert report.update_files == 4


def test_backfill_worker_lost_for_good_commits_nothing_and_leaves_no_file(backend, flr, ray_cluster):
    t = _table(backend.lake)
    before_snaps, before_files = _snapshots(t), backend.files()
    ray_faults.arm(ray_cluster, "backfill", always=True)
    with pytest.raises(ClusterError):
        flr.backfill(t, _labels(600), tasks=2, retries=0)
    assert _snapshots(t) == before_snaps
    assert backend.files() == before_files  # the update files it named are deleted, even the killed task's
    assert "label" not in t.schema.names


# -------------------------------------------------------------- compaction
def test_compact_equals_single_process_and_survives_a_killed_worker(lake, flr, ray_cluster):
    t = _table(lake, files=6, rows=100)
    t.backfill(_labels(600, step=2))
    t.create_branch("here")
    expected = _sorted(t.read())
    ray_faults.arm(ray_cluster, "compact")
    before = _snapshots(t)
    report = flr.compact(t, target_file_bytes=4096, retries=2)
    assert ray_faults.fired(ray_cluster, "compact")
    assert len(_snapshots(t) - before) == 1 and report.tasks >= 2
    here = t.compact(branch="here", target_file_bytes=4096)
    assert (report.files_in, report.rows, report.update_files_folded) == (here.files_in, here.rows, here.update_files_folded)
    assert _sorted(t.read()).equals(expected) and _sorted(t.read(branch="here")).equals(expected)
    assert t.stats()["update_files"] == 0
    # plain Iceberg now sees the merged values (invariant 8)
    assert _sorted(t.iceberg.scan().to_arrow().select(expected.column_names)).equals(expected)
    # the killed attempt's files are unreferenced leftovers: GC removes them, and then every
    # data file on disk is referenced
    lake.collect_garbage(older_than=timedelta(0))
    ice = t.refresh()
    referenced = {
        os.path.normpath(task.file.file_path.removeprefix("file://"))
        for s in ice.metadata.snapshots
        for task in ice.scan(snapshot_id=s.snapshot_id).plan_files()
    }
    on_disk = {str(p) for p in Path(lake.home).rglob("*.parquet") if "/_" not in str(p.relative_to(lake.home))}
    assert on_disk == referenced


def test_compact_worker_lost_for_good_commits_nothing_and_gc_leaves_no_orphan(backend, flr, ray_cluster):
    lake = backend.lake
    t = _table(lake, files=3, rows=100)
    lake.collect_garbage(older_than=timedelta(0))
    before_snaps, before_files = _snapshots(t), backend.files()
    ray_faults.arm(ray_cluster, "compact", always=True)
    with pytest.raises(ClusterError):
        flr.compact(t, target_file_bytes=4096, retries=0)
    assert _snapshots(t) == before_snaps
    lake.collect_garbage(older_than=timedelta(0))
    assert backend.files() == before_files


# --------------------------------------------------------- sequence store
def test_build_sequences_equals_single_process_build(tmp_path, flr):
    from featurelake.synthetic import user_events_schema
    from test_sequences import events_with_ties, random_rows

    results = []
    for where in ("ray", "here"):
        lake = Lake(tmp_path / where)
        st = lake.create_sequence_table("ml.events", user_events_schema(), key="user_id", time="ts")
        for part in range(3):
            st.append(events_with_ties(40, 60, seed=part, first_user=part * 13))
        info = flr.build_sequences(st, tasks=2, bucket_rows=500) if where == "ray" else st.build()
        keys, befores = random_rows(np.random.default_rng(3), 200, 70)
        results.append((info, st.lookup(keys, before=befores, max_len=50)))
    (ray_info, ray_seq), (info, seq) = results
    assert ray_info.tasks > 0 and info.tasks == 0
    assert (ray_info.users, ray_info.events, ray_info.chunks) == (info.users, info.events, info.chunks)
    assert len(ray_info.layers[0]) > 1  # several sorted files, bulk-loaded together
    assert ray_seq.equals(seq)


def test_cluster_address_comes_from_the_environment(monkeypatch):
    from featurelake.ray import cluster_address

    monkeypatch.delenv("FEATURELAKE_RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cluster_address() is None  # a local cluster
    monkeypatch.setenv("RAY_ADDRESS", "ray://head:10001")
    assert cluster_address() == "ray://head:10001"
    monkeypatch.setenv("FEATURELAKE_RAY_ADDRESS", "10.0.0.1:6379")
    assert cluster_address() == "10.0.0.1:6379"
    assert cluster_address("auto") == "auto"
