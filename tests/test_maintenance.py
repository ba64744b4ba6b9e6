"""Maintenance: compaction, expiry and garbage collection, revert, soft delete, dirty data."""
from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from backends import both_backends
from featurelake import Lake
from featurelake.errors import CorruptFileError, DuplicateKeyError, FeatureLakeError, SchemaMismatchError
from featurelake.revert import RevertDependencyError
from featurelake.synthetic import impressions_for_day, impressions_schema, impressions_table

KEY = "sample_id"
FUTURE = timedelta(seconds=5)


def day(d: int, n: int = 60, seed: int = 0) -> pa.Table:
    return pa.Table.from_batches(list(impressions_for_day(d, n, seed=seed)))


def sorted_rows(t: pa.Table) -> pa.Table:
    return t.sort_by(KEY)


@pytest.fixture
def table(lake):
    return lake.create_table("ml.samples", impressions_schema(), primary_key=KEY, partition_by=["day(ts)"])


# ------------------------------------------------------------------ compaction
@both_backends
def test_compaction_bin_packs_small_files_per_partition(table):
    for i in range(4):
        for d in (0, 1):
            table.append(day(d, 50, seed=i).set_column(0, KEY, pa.array([d * 10**10 + i * 1000 + j for j in range(50)], pa.int64())))
    before = sorted_rows(table.read())
    assert table.stats()["data_files"] == 8
    report = table.compact()
    assert report.files_in == 8 and report.files_out == 2
    assert table.stats()["data_files"] == 2
    assert sorted_rows(table.read()).equals(before)
    assert sorted_rows(table.iceberg.scan().to_arrow()).equals(before)


@both_backends
def test_concurrent_append_during_compaction_survives(lake, table):
    base = impressions_table(400, days=2, seed=1)
    table.append(base)
    table.backfill(pa.table({KEY: base[KEY], "c": pc.multiply(base["f0"], 2.0)}))
    other = lake.table("ml.samples")
    late = day(9, 30, seed=3)
    fired = []

    def append_meanwhile(done, total):
        if not fired:
            fired.append(other.append(late))

    report = table.compact(progress=append_meanwhile)
    assert fired and report.attempts >= 2
    rows = table.read()
    assert rows.num_rows == 430
    assert set(late[KEY].to_pylist()) <= set(rows[KEY].to_pylist())
    assert table.stats()["update_files"] == 0


# ------------------------------------------------------------------ dirty data
def _corrupt(table, backend, where: str = "ts_day=2026-01-01") -> str:
    """Overwrite the head of a data file with garbage (its size and name unchanged)."""
    task = next(t for t in table.scan().tasks() if where in t.file.file_path)
    data = backend.read_bytes(task.file.file_path)
    backend.overwrite(task.file.file_path, b"garbage!" * 64 + data[512:])
    return task.file.file_path


@both_backends
def test_corrupt_and_missing_files_with_and_without_budget(table, backend):
    table.append(impressions_table(600, days=3, seed=2))
    table.append(day(0, 100, seed=1).set_column(0, KEY, pa.array(range(10**9, 10**9 + 100), pa.int64())))
    bad = _corrupt(table, backend)  # day 0 now has two files, one of them corrupt
    with pytest.raises(CorruptFileError) as e:
        table.read()
    assert e.value.path == bad and bad in str(e.value)
    with pytest.warns(UserWarning, match="skipping bad file"):
        out = table.read(max_bad_file_ratio=0.25)
    assert table.last_read_report.skipped_files == [bad]
    assert out.num_rows == 700 - table.last_read_report.skipped_rows
    with pytest.raises(CorruptFileError):
        table.read(max_bad_file_ratio=0.2)  # one of four files exceeds a 20% budget
    with pytest.raises(CorruptFileError):
        table.compact(small_file_bytes=10**9)
    with pytest.warns(UserWarning):
        report = table.compact(small_file_bytes=10**9, max_bad_file_ratio=0.5)
    assert report.bad_files == [bad]
    missing = [t.file.file_path for t in table.scan().tasks() if t.file.file_path != bad][0]
    backend.remove(missing)
    with pytest.raises(CorruptFileError, match="missing"):
        table.read()


# ---------------------------------------------------------------------- revert
@both_backends
def test_revert_each_kind_of_operation(table):
    base = impressions_table(500, days=2, seed=3)
    table.append(base)
    s_append = table.append(day(5))
    s_fill = table.backfill(pa.table({KEY: base[KEY], "c": pc.multiply(base["f0"], 2.0)}))
    s_late = table.append(day(6))  # a later good write that must survive
    table.revert(s_append)
    assert table.read().num_rows == 560
    assert not set(day(5)[KEY].to_pylist()) & set(table.read()[KEY].to_pylist())
    table.revert(s_fill)
    assert table.read(columns=["c"])["c"].null_count == 560
    assert table.snapshots()[0]["operation"].startswith("revert")
    n = table.read().num_rows
    s_del = table.delete("user_id < 500")
    assert table.read().num_rows < n
    table.revert(s_del)
    assert table.read().num_rows == n
    table.backfill(pa.table({KEY: base[KEY].slice(0, 50), "click": pa.array([1] * 50, pa.int32())}))
    merged = sorted_rows(table.read())
    report = table.compact()
    assert not report.skipped and report.update_files_folded == 1
    s_compact = report.snapshot_id
    table.revert(s_compact)
    assert sorted_rows(table.read()).equals(merged)
    assert s_late in {s["snapshot_id"] for s in table.snapshots()}


def test_revert_refuses_when_a_later_snapshot_depends_on_it(table):
    table.append(impressions_table(300, days=1, seed=4))
    s_new = table.append(day(3))
    s_dep = table.backfill(pa.table({KEY: day(3)[KEY].slice(0, 2), "click": pa.array([1, 1], pa.int32())}))
    with pytest.raises(RevertDependencyError) as e:
        table.revert(s_new)
    assert e.value.snapshot_id == s_dep and str(s_dep) in str(e.value)
    table.revert(s_dep)
    table.revert(s_new)
    assert table.read().num_rows == 300


def test_revert_of_delete_refuses_keys_written_again(table):
    data = impressions_table(200, days=1, seed=5)
    table.append(data)
    s_del = table.delete(f"{KEY} < 10")
    table.append(data.slice(0, 10))
    with pytest.raises(DuplicateKeyError):
        table.revert(s_del)


# ---------------------------------------------------------------- soft delete
@both_backends
def test_soft_delete_restore_and_purge(table):
    data = impressions_table(200, days=1, seed=6)
    table.append(data)
    table.backfill(pa.table({KEY: data[KEY], "f7": pa.array([1.5] * 200, pa.float32())}))
    table.soft_delete_column("f7")
    assert "f7" not in table.read().column_names
    with pytest.raises(SchemaMismatchError, match="soft-deleted"):
        table.read(columns=["f7"])
    table.compact()  # hidden data survives compaction
    table.restore_column("f7")
    assert table.read(columns=["f7"])["f7"].to_pylist() == [1.5] * 200
    with pytest.raises(SchemaMismatchError):
        table.soft_delete_column(KEY)
    table.soft_delete_column("f6")
    with pytest.raises(FeatureLakeError, match="purged after"):
        table.purge_column("f6")
    table.purge_column("f6", grace=timedelta(0))
    assert not any("f6" in f.name for f in table.iceberg.schema().fields)


# ------------------------------------------------------------ expiry and GC
@both_backends
def test_gc_keeps_referenced_and_young_files_and_reclaims_dropped_branches(backend, table):
    lake = backend.lake
    data = impressions_table(600, days=2, seed=7)
    table.append(data)
    table.backfill(pa.table({KEY: data[KEY].slice(0, 5), "click": pa.array([1] * 5, pa.int32())}))
    table.compact()  # what it replaced is garbage once expired (main's history since exp forked is kept)
    table.create_branch("exp")
    table.backfill(pa.table({KEY: data[KEY], "cand": pc.multiply(data["f0"], 3.0)}), branch="exp")
    main_rows, exp_rows = sorted_rows(table.read()), sorted_rows(table.read(branch="exp"))
    table.expire_snapshots(datetime.now(timezone.utc) + FUTURE)
    young = lake.collect_garbage()  # default grace: 3 days, everything is young
    assert young.files == [] and young.kept_young > 0
    dry = lake.collect_garbage(older_than=timedelta(0), dry_run=True)
    stored = backend.files()
    assert dry.files and {backend.name_of(p) for p in dry.files} <= stored  # a dry run deletes nothing
    done = lake.collect_garbage(older_than=timedelta(0))
    assert sorted(done.files) == sorted(dry.files) and done.bytes == dry.bytes
    assert backend.files() == stored - {backend.name_of(p) for p in dry.files}  # exactly those went
    assert sorted_rows(table.read()).equals(main_rows)
    assert sorted_rows(table.read(branch="exp")).equals(exp_rows)
    exclusive = table.stats("exp")["exclusive_bytes"]
    table.drop_branch("exp")
    table.expire_snapshots(datetime.now(timezone.utc) + FUTURE)
    freed = lake.collect_garbage(older_than=timedelta(0))
    assert freed.bytes >= exclusive > 0
    assert sorted_rows(table.read()).equals(main_rows)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_operations_never_lose_a_retained_snapshot(tmp_path, seed):
    rng = random.Random(seed)
    lake = Lake(tmp_path / "lake")
    t = lake.create_table("ml.s", impressions_schema(), primary_key=KEY, partition_by=["day(ts)"])
    t.append(impressions_table(300, days=2, seed=seed))
    next_day = [10]
    expected: dict[int, pa.Table] = {}

    def remember():
        """Record a snapshot's rows once, when it first appears as a branch head: never refreshed,
        so an operation that changes what an older snapshot reads fails the check below."""
        for sid in t.branches().values():
            if sid not in expected:
                expected[sid] = sorted_rows(t.read(snapshot_id=sid))

    remember()

    for _ in range(14):
        branches = list(t.branches())
        b = rng.choice(branches)
        op = rng.choice(["append", "backfill", "branch", "merge", "drop", "compact", "expire", "gc", "delete"])
        try:
            if op == "append":
                t.append(day(next_day[0], 40, seed=seed), branch=b)
                next_day[0] += 1
            elif op == "backfill":
                keys = t.read(columns=[KEY], branch=b)[KEY]
                t.backfill(pa.table({KEY: keys, f"c{rng.randint(0, 2)}": pa.array([rng.random()] * len(keys))}), branch=b)
            elif op == "branch":
                t.create_branch(f"b{rng.randint(0, 10**6)}", from_ref=b)
            elif op == "merge" and b != "main":
                t.merge(b, into="main")
            elif op == "drop" and b != "main":
                t.drop_branch(b)
            elif op == "compact":
                t.compact(b)
            elif op == "delete":
                t.delete(f"user_id < {rng.randint(0, 50)}", branch=b)
            elif op == "expire":
                t.expire_snapshots(datetime.now(timezone.utc) + FUTURE, retain_last=rng.randint(1, 3))
            elif op == "gc":
                lake.collect_garbage(older_than=timedelta(0))
        except (FeatureLakeError,) as e:  # conflicts and type clashes are refused cleanly
            assert "conflict" in type(e).__name__.lower() or isinstance(e, SchemaMismatchError), e
        remember()
        lake.collect_garbage(older_than=timedelta(0))
        meta = t.iceberg.metadata
        for sid, rows in expected.items():
            if meta.snapshot_by_id(sid) is not None:  # retained: must read exactly as before
                assert sorted_rows(t.read(snapshot_id=sid)).equals(rows), (op, sid)


@both_backends
def test_declared_sort_order_is_kept_by_writes_and_compaction(backend):
    import pyarrow.parquet as pq

    lake = backend.lake
    t = lake.create_table("ml.sorted", impressions_schema(), primary_key=KEY, partition_by=["day(ts)"], sort_by=["user_id", "-ts"])
    for seed in range(3):
        t.append(day(0, 200, seed=seed).set_column(0, KEY, pa.array(range(seed * 1000, seed * 1000 + 200), pa.int64())))
    t.backfill(pa.table({KEY: pa.array([0, 1000], pa.int64()), "click": pa.array([1, 1], pa.int32())}))
    expected = sorted_rows(t.read())
    report = t.compact()
    assert report.files_in == 3 and report.files_out == 1
    stored = pa.BufferReader(backend.read_bytes(t.scan().tasks()[0].file.file_path))
    written = pq.read_table(stored, columns=["user_id", "ts"]).to_pylist()
    assert written == sorted(written, key=lambda r: (r["user_id"], -r["ts"].timestamp()))
    assert sorted_rows(t.read()).equals(expected)
    assert t.verify_index()["ok"]
