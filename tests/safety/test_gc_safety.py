"""Garbage collection never deletes what a table, a live sequence build or another lake needs.

The GC scenarios run on the embedded lake (local disk) and on a REST catalog
with an S3 warehouse (SeaweedFS). Files are listed before and after with an
independent client (os.walk, or a pyarrow S3 client configured explicitly).
"""
from __future__ import annotations

import os
import shutil
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from backends import both_backends
from featurelake import Lake
from featurelake.errors import GarbageCollectionError

NOW = timedelta(0)
SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("x", pa.float64())])


@pytest.fixture
def gc_lake(backend):
    """(lake, list_files): the lake and an independent listing of every file it stores (tests/backends.py)."""
    return backend.lake, backend.files


def _walk(root: Path) -> set[str]:
    return {str(Path(d) / f) for d, _, files in os.walk(root) for f in files}


def _plain(uri: str) -> str:
    return uri.removeprefix("file://")


def _rows(ids, x) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "x": pa.array(x, pa.float64())})


def _same(got: pa.Table, oracle: pa.Table) -> bool:
    """Equal rows (in key order), with the oracle cast to the read's schema (nullability)."""
    return got.sort_by("id").equals(oracle.cast(got.schema).sort_by("id"))


def _history(lake: Lake, name: str = "ns.t") -> tuple[pa.Table, set[str]]:
    """A table with appends, a backfill, an upsert and a compaction, snapshots expired:
    returns the pyarrow oracle of its rows and the data files compaction replaced."""
    t = lake.create_table(name, SCHEMA, primary_key="id")
    t.append(_rows(range(0, 50), [float(i) for i in range(50)]))
    t.append(_rows(range(50, 80), [float(i) for i in range(50, 80)]))
    t.backfill(pa.table({"id": pa.array([1, 2, 60], pa.int64()), "y": pa.array([0.5, 1.5, 2.5])}))
    t.upsert(_rows([3, 100], [-3.0, 100.0]))
    before_compact = {task.file.file_path for task in t.iceberg.scan().plan_files()}
    t.compact()
    t.expire_snapshots(datetime.now(timezone.utc), retain_last=1)
    ids = list(range(0, 80)) + [100]
    x = [float(i) for i in range(80)] + [100.0]
    x[3] = -3.0
    y = [None] * 81
    y[1], y[2], y[60] = 0.5, 1.5, 2.5
    oracle = pa.table({"id": pa.array(ids, pa.int64()), "x": pa.array(x), "y": pa.array(y, pa.float64())})
    return oracle, before_compact


@both_backends
def test_gc_deletes_exactly_the_unreferenced_files(gc_lake):
    """Issue 10 item 1: on S3 the old GC listed `bucket/key` against `s3://bucket/key` and deleted everything."""
    lake, listing = gc_lake
    oracle, replaced = _history(lake)
    other = lake.create_table("ns.other", SCHEMA, primary_key="id")
    other.append(_rows([7, 8], [7.0, 8.0]))
    t = lake.table("ns.t")
    ice = t.iceberg
    must_keep = {ice.metadata_location} | {task.file.file_path for task in ice.scan().plan_files()}
    must_keep |= {s.manifest_list for s in ice.metadata.snapshots}
    before = listing()

    dry = lake.collect_garbage(older_than=NOW, dry_run=True)
    doomed = set(dry.files)
    assert listing() == before  # a dry run deletes nothing
    assert doomed and doomed <= {*before} | {"file://" + p for p in before}
    assert not any(f.endswith(".metadata.json") and _plain(f) in {_plain(ice.metadata_location)} for f in doomed)
    assert not {_plain(p) for p in must_keep} & {_plain(f) for f in doomed}
    assert {_plain(p) for p in replaced} <= {_plain(f) for f in doomed}  # compacted-away data files are garbage
    assert dry.tables["ns.other"]["files"] == 0 and not dry.refused

    report = lake.collect_garbage(older_than=NOW)
    assert set(report.files) == doomed
    assert {_plain(p) for p in listing()} == {_plain(p) for p in before} - {_plain(f) for f in doomed}
    assert _same(lake.table("ns.t").read(), oracle)
    assert _same(lake.table("ns.other").read(), _rows([7, 8], [7.0, 8.0]))
    # everything left is referenced: a second collection finds nothing
    assert lake.collect_garbage(older_than=NOW, dry_run=True).files == []


@both_backends
def test_negative_grace_period_is_refused_and_deletes_nothing(gc_lake):
    lake, listing = gc_lake
    _history(lake)
    before, snaps = listing(), {s.snapshot_id for s in lake.table("ns.t").iceberg.metadata.snapshots}
    with pytest.raises(GarbageCollectionError, match="grace period"):
        lake.collect_garbage(older_than=timedelta(days=-1))
    assert listing() == before
    assert {s.snapshot_id for s in lake.table("ns.t").iceberg.metadata.snapshots} == snaps


@both_backends
def test_drop_table_purge_deletes_its_files_and_keeps_the_others(gc_lake):
    lake, listing = gc_lake
    lake.create_table("ns.keep", SCHEMA, primary_key="id").append(_rows([1], [1.0]))
    kept = listing()
    t = lake.create_table("ns.gone", SCHEMA, primary_key="id")
    t.append(_rows([1, 2], [1.0, 2.0]))
    location = t.iceberg.location()
    assert any(_plain(location) in f for f in listing())
    lake.drop_table("ns.gone", purge=True)
    assert not lake.table_exists("ns.gone")
    assert listing() == kept
    assert lake.table("ns.keep").read().num_rows == 1


def test_drop_table_purge_keeps_the_files_and_says_why_when_another_table_cannot_be_loaded(tmp_path):
    lake = Lake(tmp_path / "lake")
    other = lake.create_table("ns.other", SCHEMA, primary_key="id")
    other.append(_rows([1], [1.0]))
    t = lake.create_table("ns.gone", SCHEMA, primary_key="id")
    t.append(_rows([1, 2], [1.0, 2.0]))
    gone = Path(_plain(t.iceberg.location()))
    files_before = _walk(gone)
    Path(_plain(other.iceberg.metadata_location)).unlink()  # ns.other's current metadata is gone: it cannot load
    lake = Lake(tmp_path / "lake")  # a new process's view: nothing of ns.other cached
    with pytest.warns(UserWarning, match=r"kept the table's files: table 'ns.other' could not be loaded"):
        assert lake.drop_table("ns.gone", purge=True) == 0
    assert not lake.table_exists("ns.gone")
    assert _walk(gone) == files_before and any(f.endswith(".parquet") for f in files_before)


def test_gc_collects_dropped_and_crash_orphaned_table_folders_after_the_grace_period(tmp_path):
    """Uncollected leftovers: a table dropped with purge=False and a metadata.json a crash
    left before the catalog insert are collected once old; young ones are kept."""
    lake = Lake(tmp_path / "lake")
    root = Path(lake.warehouse)
    keep = lake.create_table("ns.keep", SCHEMA, primary_key="id")
    keep.append(_rows([1], [1.0]))
    gone = lake.create_table("ns.gone", SCHEMA, primary_key="id")
    gone.append(_rows([1, 2], [1.0, 2.0]))
    gone_dir = Path(_plain(gone.iceberg.location()))
    lake.drop_table("ns.gone")  # purge=False: the files stay for GC
    assert _walk(gone_dir)
    ghost = root / "ns.db" / "ghost" / "metadata"
    ghost.mkdir(parents=True)
    shutil.copy(_plain(keep.iceberg.metadata_location), ghost / "00000-0d1e.metadata.json")
    stray = root / "ns.db" / "stray.parquet"  # under no table folder: never deleted
    stray.write_bytes(b"PAR1")
    kept_files = _walk(Path(_plain(keep.iceberg.location())))

    young = lake.collect_garbage()  # default grace: everything is too young
    assert young.files == [] and _walk(gone_dir) and (ghost / "00000-0d1e.metadata.json").exists()

    report = lake.collect_garbage(older_than=NOW)
    assert not _walk(gone_dir)
    assert not (ghost / "00000-0d1e.metadata.json").exists()
    assert stray.exists() and any("no table folder" in why for why in report.refused.values())
    assert _walk(Path(_plain(keep.iceberg.location()))) == kept_files
    assert lake.table("ns.keep").read().num_rows == 1


def test_gc_keeps_live_sequence_builds_and_collects_dead_ones(tmp_path):
    """Issue 10 item 6: a lake without a home keeps its sequence store under the table folder."""
    lake = Lake.from_uri(f"sqlite:///{tmp_path / 'catalog.db'}", str(tmp_path / "warehouse"))
    events = pa.schema([pa.field("user_id", pa.int64(), nullable=False), pa.field("ts", pa.int64(), nullable=False), pa.field("v", pa.float64())])
    st = lake.create_sequence_table("ns.events", events, key="user_id", time="ts")
    st.append(pa.table({"user_id": pa.array([1, 1, 2], pa.int64()), "ts": pa.array([1, 2, 3], pa.int64()), "v": [0.1, 0.2, 0.3]}))
    first = st.build()
    st.append(pa.table({"user_id": pa.array([1, 3], pa.int64()), "ts": pa.array([5, 6], pa.int64()), "v": [0.5, 0.6]}))
    second = st.build()
    assert Path(first.path).is_relative_to(Path(_plain(st.iceberg.location())))
    st.expire_snapshots(datetime.now(timezone.utc), retain_last=1)  # first build's snapshot is gone

    report = lake.collect_garbage(older_than=NOW)
    assert not _walk(Path(first.path)) and any(first.build_id in f for f in report.files)
    assert not any(second.build_id in f for f in report.files)
    st = lake.sequence_table("ns.events")
    assert [b.build_id for b in st.builds()] == [second.build_id]
    got = st.lookup(pa.array([1, 2, 3], pa.int64()))
    oracle = [[1, 2, 5], [3], [6]]
    assert [[e["ts"] for e in row] for row in got.to_pylist()] == oracle


def _table_files_with_odd_home(home: Path) -> tuple[Lake, pa.Table]:
    lake = Lake(home)
    t = lake.create_table("ns.t", SCHEMA, primary_key="id")
    t.append(_rows([1, 2], [1.0, 2.0]))
    t.upsert(_rows([2, 3], [20.0, 3.0]))
    t.compact()
    t.expire_snapshots(datetime.now(timezone.utc))
    return lake, _rows([1, 2, 3], [1.0, 20.0, 3.0])


def test_home_with_space_hash_and_non_ascii_keeps_files_inside(tmp_path):
    """Issue 10 item 7: a home `a b#é` wrote its files to a sibling folder `a%20b%23%C3%A9`."""
    home = tmp_path / "a b#é"
    lake, oracle = _table_files_with_odd_home(home)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a b#é"]
    data = [f for f in _walk(home) if f.endswith(".parquet")]
    assert data and all(f.startswith(str(home / "warehouse")) for f in data)
    lake.collect_garbage(older_than=NOW)
    assert _same(Lake(home).table("ns.t").read(), oracle)


def test_two_lakes_at_escaped_and_unescaped_names_never_touch_each_other(tmp_path):
    """Issue 10 item 7: GC of the lake at `a%20b` deleted live files of the lake at `a b`."""
    plain, oracle_plain = _table_files_with_odd_home(tmp_path / "a b")
    escaped, oracle_escaped = _table_files_with_odd_home(tmp_path / "a%20b")
    plain_files = _walk(tmp_path / "a b")
    escaped.collect_garbage(older_than=NOW)
    assert _walk(tmp_path / "a b") == plain_files
    plain.collect_garbage(older_than=NOW)
    assert _same(Lake(tmp_path / "a b").table("ns.t").read(), oracle_plain)
    assert _same(Lake(tmp_path / "a%20b").table("ns.t").read(), oracle_escaped)


@pytest.mark.s3
def test_lake_from_env_opens_a_pyiceberg_catalog_by_name(seaweed, s3_lake, monkeypatch):
    """Issue 11 item 2: FEATURELAKE_CATALOG names a catalog configured the pyiceberg way."""
    monkeypatch.setenv("FEATURELAKE_CATALOG", "research")
    monkeypatch.setenv("PYICEBERG_CATALOG__RESEARCH__URI", seaweed.catalog_uri)
    monkeypatch.setenv("PYICEBERG_CATALOG__RESEARCH__WAREHOUSE", seaweed.warehouse)
    for key, value in seaweed.catalog_properties().items():
        monkeypatch.setenv("PYICEBERG_CATALOG__RESEARCH__" + key.replace(".", "__").replace("-", "_").upper(), value)
    lake = Lake.from_env()
    assert lake.home is None and lake.warehouse == seaweed.warehouse
    t = lake.create_table("ns.by_name", SCHEMA, primary_key="id")
    t.append(_rows([5, 6], [5.0, 6.0]))
    assert _same(s3_lake.table("ns.by_name").read(), _rows([5, 6], [5.0, 6.0]))
    assert pc.sum(lake.table("ns.by_name").read().column("x")).as_py() == 11.0
