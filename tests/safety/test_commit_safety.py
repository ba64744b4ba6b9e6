"""Commit safety: ambiguous commits, history kept for revert and merge, no duplicate keys from
merges, immutable index segments, and concurrency (refs, compaction under load, a locked catalog).

Faults are injected around the REAL catalog: its commit runs, then the "connection drops".
Every scenario ends with an oracle check (pyarrow/dicts computed the obvious way).
"""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import sqlalchemy.exc

from featurelake import Lake
from featurelake.errors import CommitStateUnknownError, FeatureLakeError, MergeConflictError
from featurelake.merge import snapshot_files

KEY = "id"
SCHEMA = pa.schema([pa.field(KEY, pa.int64(), nullable=False), pa.field("x", pa.float64()), pa.field("label", pa.int64())])


def rows(t, **kw) -> dict[int, tuple]:
    got = t.read(**kw)
    assert len(set(got.column(KEY).to_pylist())) == got.num_rows, "a key appears twice"
    return {r[KEY]: (r["x"], r["label"]) for r in got.to_pylist()}


def batch(ids, x=None, label=None) -> pa.Table:
    ids = list(ids)
    cols = {KEY: pa.array(ids, pa.int64())}
    if x is not None:
        cols["x"] = pa.array([float(x + i) for i in ids], pa.float64())
    if label is not None:
        cols["label"] = pa.array([label] * len(ids), pa.int64())
    return pa.table(cols)


def seeded(lake, name="ml.s", parts=3, per=20):
    """A table of ``parts`` appends of ``per`` rows and a backfill of labels; returns (table, oracle)."""
    t = lake.create_table(name, SCHEMA, primary_key=KEY)
    oracle = {}
    for p in range(parts):
        ids = range(p * per, (p + 1) * per)
        t.append(batch(ids, x=0.0, label=0))
        oracle.update({i: (float(i), 0) for i in ids})
    t.backfill(batch(range(0, parts * per, 3), label=7))
    oracle.update({i: (oracle[i][0], 7) for i in range(0, parts * per, 3)})
    return t, oracle


def files_of_main(t) -> set[str]:
    """Every file main's head needs: data, update, state and index files."""
    ice = t.refresh()
    head = ice.metadata.snapshot_by_id(ice.metadata.refs["main"].snapshot_id)
    state = t._state(ice, head)
    out = set(snapshot_files(ice, head))
    out.update(e.update_file for e in state.entries())
    out.update(state.shards.values())
    out.update(seg["path"] for seg in state.index_segments)
    if state.root_path:
        out.add(state.root_path)
    return out


def assert_main_intact(t, oracle) -> None:
    ice = t.refresh()
    missing = [p for p in files_of_main(t) if not ice.io.new_input(p).exists()]
    assert missing == []
    assert rows(t) == oracle
    assert t.verify_index()["ok"]


def lake_files(lake, t) -> set[str]:
    root = t.refresh().location().removeprefix("file://")
    return {str(p) for p in Path(root).rglob("*") if p.is_file()}


def dropped_connection(lake) -> Exception:
    """The error a driver raises when the connection drops during COMMIT."""
    if lake.catalog.engine.url.get_backend_name() == "sqlite":
        orig: Exception = sqlite3.OperationalError("disk I/O error")
    else:
        import psycopg2

        orig = psycopg2.OperationalError("server closed the connection unexpectedly")
    return sqlalchemy.exc.OperationalError("COMMIT", {}, orig)


class Faults:
    """Wraps the lake's real catalog: the next ``after`` commits land and then their acknowledgement
    is lost; ``before`` commits fail before reaching the catalog; ``unreadable`` makes loads fail,
    and ``then_unreachable`` sets it once a commit has landed (the catalog stays unreachable)."""

    def __init__(self, lake, monkeypatch) -> None:
        self.lake, self.after, self.before, self.landed = lake, 0, 0, 0
        self.unreadable = self.then_unreachable = False
        catalog = lake.catalog
        real_commit, real_load = catalog.commit_table, catalog.load_table

        def commit_table(table, requirements, updates):
            if self.before:
                self.before -= 1
                raise ConnectionError("connection reset before COMMIT")
            response = real_commit(table, requirements, updates)
            if self.after:
                self.after -= 1
                self.landed += 1
                self.unreadable = self.then_unreachable
                raise dropped_connection(lake)
            return response

        def load_table(identifier):
            if self.unreadable:
                raise dropped_connection(lake)
            return real_load(identifier)

        monkeypatch.setattr(catalog, "commit_table", commit_table)
        monkeypatch.setattr(catalog, "load_table", load_table)


OPS = {
    "append": lambda t, o: (t.append(batch(range(1000, 1010), x=0.0, label=1)), o.update({i: (float(i), 1) for i in range(1000, 1010)})),
    "backfill": lambda t, o: (t.backfill(batch(range(0, 60, 2), label=5)), o.update({i: (o[i][0], 5) for i in range(0, 60, 2)})),
    "upsert": lambda t, o: (
        t.upsert(batch(list(range(50, 70)), x=100.0, label=9)),
        o.update({i: (100.0 + i, 9) for i in range(50, 70)}),
    ),
    "compact": lambda t, o: (t.compact(), None),
}


# ------------------------------------------------------------------ item 2: ambiguous commits
@pytest.mark.parametrize("op", sorted(OPS))
def test_a_commit_whose_acknowledgement_is_lost_keeps_its_files_and_succeeds(any_lake, monkeypatch, op):
    t, oracle = seeded(any_lake)
    faults = Faults(any_lake, monkeypatch)
    faults.after = 1
    before_head = t.branches()["main"]
    result = OPS[op](t, oracle)[0]
    assert faults.landed == 1
    head = t.branches()["main"]
    assert head != before_head
    assert (result if isinstance(result, int) else result.snapshot_id) == head  # reported as the success it was
    assert_main_intact(t, oracle)
    assert rows(any_lake.table("ml.s")) == oracle


@pytest.mark.parametrize("op", ["append", "upsert", "compact"])
def test_an_unknown_commit_outcome_raises_and_deletes_nothing(any_lake, monkeypatch, op):
    t, oracle = seeded(any_lake)
    faults = Faults(any_lake, monkeypatch)
    faults.after, faults.then_unreachable = 1, True
    before = lake_files(any_lake, t)
    landed = dict(oracle)
    with pytest.raises(CommitStateUnknownError) as raised:
        OPS[op](t, landed)
    assert faults.landed == 1
    faults.unreadable = False
    after = lake_files(any_lake, t)
    assert before <= after  # nothing deleted
    head = t.branches()["main"]
    assert raised.value.snapshot_id == head  # the error names the snapshot that (in fact) landed
    if op == "append":
        landed.update({i: (float(i), 1) for i in range(1000, 1010)})
    elif op == "upsert":
        landed.update({i: (100.0 + i, 9) for i in range(50, 70)})
    assert_main_intact(t, landed)  # it did land: every file main needs is there


def test_a_commit_that_did_not_land_is_retried_once_the_connection_is_back(any_lake, monkeypatch):
    t, oracle = seeded(any_lake)
    faults = Faults(any_lake, monkeypatch)
    faults.before = 2
    OPS["upsert"](t, oracle)
    assert faults.before == 0
    assert_main_intact(t, oracle)


# ------------------------------------------------------------------ concurrency
def run_writers(lake, name: str, n: int, work, stop: threading.Event) -> tuple[list[threading.Thread], list[BaseException]]:
    """Start ``n`` threads calling ``work(table, writer, i)`` until ``stop``; errors are collected."""
    errors: list[BaseException] = []

    def loop(w: int) -> None:
        t = lake.table(name)
        i = 0
        try:
            while not stop.is_set():
                work(t, w, i)
                i += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=loop, args=(w,), daemon=True) for w in range(n)]
    for th in threads:
        th.start()
    return threads, errors


def test_ref_operations_during_concurrent_writes_retry_and_succeed(any_lake):
    t = any_lake.create_table("ml.r", SCHEMA, primary_key=KEY)
    t.append(batch(range(10), x=0.0, label=0))
    appended: dict[int, list[int]] = {}

    def append(table, w, i):
        ids = range(100_000 * (w + 1) + 10 * i, 100_000 * (w + 1) + 10 * i + 10)
        table.append(batch(ids, x=0.0, label=w))
        appended.setdefault(w, []).extend(ids)

    stop = threading.Event()
    threads, errors = run_writers(any_lake, "ml.r", 3, append, stop)
    try:
        for i in range(6):
            tagged = t.create_tag(f"tag{i}")
            t.create_branch(f"br{i}", from_ref=f"tag{i}")
            assert t.tags()[f"tag{i}"] == tagged == t.branches()[f"br{i}"]
            t.drop_tag(f"tag{i}")
            t.drop_branch(f"br{i}")
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    assert errors == []
    assert sorted(t.refresh().metadata.refs) == ["main"]
    expected = set(range(10)) | {k for ids in appended.values() for k in ids}
    assert set(rows(t)) == expected


def test_a_catalog_locked_by_another_process_for_over_5s_is_waited_for(tmp_path):
    lake = Lake(tmp_path / "lake")
    t = lake.create_table("ml.l", SCHEMA, primary_key=KEY)
    t.append(batch(range(10), x=0.0, label=0))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sqlite3, sys, time
                c = sqlite3.connect({str(tmp_path / "lake" / "catalog.db")!r}, isolation_level=None)
                c.execute("BEGIN EXCLUSIVE")
                print("locked", flush=True)
                time.sleep(6.5)
                c.execute("COMMIT")
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        t.append(batch(range(10, 20), x=0.0, label=1))
        assert time.monotonic() - t0 > 5  # it really waited for the lock
        assert rows(Lake(tmp_path / "lake").table("ml.l")) == {
            **{i: (float(i), 0) for i in range(10)},
            **{i: (float(i), 1) for i in range(10, 20)},
        }
    finally:
        holder.wait(30)
    assert holder.returncode == 0


# ------------------------------------------------------------------ item 4: no duplicate keys from merges
@pytest.mark.parametrize("how", ["merge", "rebase"])
@pytest.mark.parametrize("write", ["append", "upsert"])
def test_both_sides_inserting_the_same_key_is_a_conflict_not_a_duplicate(lake, how, write):
    t = lake.create_table("ml.m", SCHEMA, primary_key=KEY)
    t.append(batch(range(1000), x=0.0, label=0))
    t.create_branch("b")
    getattr(t, write)(batch([1000], x=1.0, label=1))  # main inserts 1000
    getattr(t, write)(batch([1000, 1001], x=2.0, label=2), branch="b")  # so does the branch, and 1001
    before = {ref: rows(t, branch=ref) for ref in ("main", "b")}
    heads = (t.branches(), t.tags())
    with pytest.raises(MergeConflictError) as raised:
        t.merge("b") if how == "merge" else t.rebase("b")
    assert raised.value.keys == [1000]
    assert "1000" in str(raised.value)
    assert (t.branches(), t.tags()) == heads  # nothing committed
    assert {ref: rows(t, branch=ref) for ref in ("main", "b")} == before
    for ref in ("main", "b"):
        got = t.read(branch=ref)
        assert len(set(got.column(KEY).to_pylist())) == got.num_rows
        assert t.verify_index(ref)["ok"]


def test_merge_and_rebase_of_distinct_inserts_still_work(lake):
    t = lake.create_table("ml.m", SCHEMA, primary_key=KEY)
    t.append(batch(range(100), x=0.0, label=0))
    t.create_branch("b")
    t.create_branch("c")
    t.append(batch([100], x=1.0, label=1))
    t.upsert(batch([5, 200], x=3.0, label=3), branch="b")
    t.append(batch([300], x=4.0, label=4), branch="c")
    expected = {i: (float(i), 0) for i in range(100)}
    expected.update({100: (101.0, 1), 5: (8.0, 3), 200: (203.0, 3), 300: (304.0, 4)})
    t.merge("b")
    t.rebase("c")
    t.merge("c")
    assert rows(t) == expected
    assert t.verify_index()["ok"]


# ------------------------------------------------------------------ item 3: history kept for revert, merge, diff
def expire_all(t) -> list[int]:
    """What the nightly job does: expire everything it may, keeping one snapshot per branch."""
    return t.expire_snapshots(datetime.now(timezone.utc) + timedelta(seconds=5), retain_last=1)


def test_reverting_an_append_whose_parent_was_expired_removes_only_that_append(lake):
    t = lake.create_table("ml.e", SCHEMA, primary_key=KEY)
    oracle = {}
    for p in range(4):
        t.append(batch(range(p * 500, (p + 1) * 500), x=0.0, label=0))
        oracle.update({i: (float(i), 0) for i in range(p * 500, (p + 1) * 500)})
    extra = t.append(batch(range(5000, 5010), x=0.0, label=1))
    assert expire_all(t)
    assert t.refresh().metadata.snapshot_by_id(t.refresh().metadata.snapshot_by_id(extra).parent_snapshot_id) is None
    t.revert(extra)
    assert rows(t) == oracle
    assert t.verify_index()["ok"]


def test_reverting_a_backfill_whose_parent_was_expired_restores_the_old_values(lake):
    t = lake.create_table("ml.e", SCHEMA, primary_key=KEY)
    t.append(batch(range(1000), x=0.0, label=0))
    t.backfill(batch(range(0, 1000, 2), label=3))
    oracle = {i: (float(i), 3 if i % 2 == 0 else 0) for i in range(1000)}
    fill = t.backfill(batch(range(0, 1000, 5), label=8))
    assert expire_all(t)
    t.revert(fill)
    assert rows(t) == oracle


def test_reverting_a_compaction_whose_parent_was_expired_is_refused_and_changes_nothing(lake):
    t, oracle = seeded(lake)
    compacted = t.compact().snapshot_id
    assert expire_all(t)
    heads = t.branches()
    with pytest.raises(FeatureLakeError, match="expired") as raised:
        t.revert(compacted)
    assert type(raised.value).__name__ == "HistoryExpiredError"
    assert t.branches() == heads
    assert rows(t) == oracle


def test_a_branch_stays_mergeable_after_its_fork_point_would_have_expired(lake):
    t = lake.create_table("ml.e", SCHEMA, primary_key=KEY)
    t.append(batch(range(100), x=0.0, label=0))
    t.append(batch(range(100, 200), x=0.0, label=0))
    t.create_branch("research")
    t.backfill(batch(range(0, 200, 4), label=6), branch="research")
    t.append(batch(range(200, 300), x=0.0, label=0))  # main moves on
    t.backfill(batch(range(1, 200, 4), x=50.0))  # another column: no conflict
    t.create_tag("v1", "research")
    for _ in range(3):
        t.upsert(batch(range(300, 310), x=5.0, label=1))
    expected = {i: (float(i), 0) for i in range(300)}
    expected.update({i: (expected[i][0], 6) for i in range(0, 200, 4)})
    expected.update({i: (50.0 + i, 0) for i in range(1, 200, 4)})
    expected.update({i: (5.0 + i, 1) for i in range(300, 310)})
    assert expire_all(t)  # something was expired, but not the walks to the fork point
    assert t.diff("research")["columns_updated"] == ["label"]
    t.merge("research")
    assert rows(t) == expected
    assert t.verify_index()["ok"]


# ------------------------------------------------------------------ item 10: a segment rewritten in place
SEGMENT_REWRITE = """
import json, sys
import pyarrow as pa
from featurelake import Lake
from featurelake.errors import CorruptFileError

home, how = sys.argv[1], sys.argv[2]
t = Lake(home).create_table("ml.s", pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("x", pa.float64())]), primary_key="id")
t.append(pa.table({"id": pa.array(range(20_000), pa.int64()), "x": pa.array([0.0] * 20_000)}))
t.upsert(pa.table({"id": pa.array([1, 2], pa.int64()), "x": pa.array([1.0, 2.0])}))  # maps the segment
ice = t.refresh()
seg = t._state(ice, ice.metadata.current_snapshot()).index_segments[0]["path"].removeprefix("file://")
data = open(seg, "rb").read()
with open(seg, "wb") as f:  # rewritten in place: same inode
    f.write(data[: len(data) // 4] if how == "truncated" else data)
out = {}
try:
    t.upsert(pa.table({"id": pa.array([10_000, 19_999], pa.int64()), "x": pa.array([3.0, 4.0])}))
    out["upsert"] = "ok"
except CorruptFileError as e:
    out["upsert"] = "CorruptFileError"
    out["path"] = e.path
    t.rebuild_index()
    t.upsert(pa.table({"id": pa.array([10_000, 19_999], pa.int64()), "x": pa.array([3.0, 4.0])}))
got = t.read()
out["rows"] = got.num_rows
out["distinct"] = len(set(got.column("id").to_pylist()))
out["x"] = dict(zip(*[got.column(c).to_pylist() for c in ("id", "x")]))
out["x"] = {k: out["x"][k] for k in (0, 1, 2, 10_000, 19_999)}
out["segment"] = seg
print(json.dumps(out))
"""


@pytest.mark.parametrize("how", ["truncated", "same_bytes"])
def test_a_mapped_index_segment_rewritten_in_place_never_kills_the_process(tmp_path, how):
    import json

    proc = subprocess.run(
        [sys.executable, "-c", SEGMENT_REWRITE, str(tmp_path / "lake"), how],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert proc.returncode == 0, f"exit {proc.returncode} (SIGBUS is -7): {proc.stderr[-2000:]}"
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if how == "truncated":
        assert out["upsert"] == "CorruptFileError" and out["path"].endswith(Path(out["segment"]).name)
    else:
        assert out["upsert"] == "ok"
    assert out["rows"] == out["distinct"] == 20_000
    assert out["x"] == {"0": 0.0, "1": 1.0, "2": 2.0, "10000": 3.0, "19999": 4.0}


# ------------------------------------------------------------------ compaction under steady writes
def test_compaction_finishes_while_writers_upsert_and_loses_nothing(lake):
    t = lake.create_table("ml.c", SCHEMA, primary_key=KEY)
    oracle: dict[int, tuple] = {}
    for p in range(24):  # many small files, some with update layers
        ids = range(p * 50, (p + 1) * 50)
        t.append(batch(ids, x=0.0, label=0))
        oracle.update({i: (float(i), 0) for i in ids})
    t.backfill(batch(range(0, 1200, 7), label=1))
    oracle.update({i: (oracle[i][0], 1) for i in range(0, 1200, 7)})
    writes: dict[int, list[pa.Table]] = {w: [] for w in range(4)}
    rng = np.random.default_rng(5)
    # writers update old keys of the first 12 files only: the compaction's bins over the other 12 stay untouched
    # however long it runs on a loaded machine, so it always has bins to commit after rebasing
    picks = {w: rng.permutation([i for i in range(600) if i % 4 == w]) for w in range(4)}

    def upsert(table, w, i):  # each writer owns its keys: updates two old ones, inserts three new
        old = picks[w][(2 * i) % len(picks[w]) : (2 * i) % len(picks[w]) + 2].tolist()
        new = [10_000 * (w + 1) + 3 * i + j for j in range(3)]
        data = batch(old + new, x=float(1000 * w + i), label=w + 2)
        table.upsert(data)
        writes[w].append(data)
        time.sleep(0.05)

    stop = threading.Event()
    threads, errors = run_writers(lake, "ml.c", 4, upsert, stop)
    try:
        time.sleep(0.5)  # writers under way
        started = sum(len(v) for v in writes.values())
        report = lake.table("ml.c").compact(target_file_bytes=4096)
        done_during_compaction = sum(len(v) for v in writes.values()) - started
        time.sleep(0.3)
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    assert errors == []
    assert report.snapshot_id is not None and report.files_in > 1
    assert done_during_compaction >= 1 and report.attempts >= 2  # it really ran against concurrent commits
    for w in range(4):
        for data in writes[w]:
            oracle.update({r[KEY]: (r["x"], r["label"]) for r in data.to_pylist()})
    assert rows(t) == oracle  # no update lost, no row duplicated
    assert t.verify_index()["ok"]
