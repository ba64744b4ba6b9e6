"""Lifecycle of event tables and their store builds: garbage collection of builds, branch union merges.

Oracles: which builds a retained snapshot needs is worked out here from the
table's metadata independently of featurelake.sequences.buildinfo (each
retained snapshot needs the newest build of itself, or of the snapshot a
compaction started from, and the newest build of itself in every layout);
lookups are compared with the pandas oracle of tests/test_sequences.py; a
merge with ``pandas.concat`` of both sides' events.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from backends import both_backends
from featurelake import Lake
from featurelake.errors import MergeConflictError
from featurelake.table import Table
from test_sequences import events_with_ties, make_events, oracle, random_rows

NOW = dt.timedelta(0)
COLS = ["ts", "item_id", "event_type"]


def _needed(st, builds) -> set[str]:
    """The builds each retained snapshot needs, from the metadata (the oracle of garbage collection)."""
    meta = st.refresh().metadata
    by_snap: dict[int, list] = {}
    for b in builds:  # oldest first
        by_snap.setdefault(b.snapshot_id, []).append(b)
    need = set()
    for snap in meta.snapshots:
        mine = by_snap.get(snap.snapshot_id, [])
        layouts = {}
        for b in mine:
            layouts[(b.chunk_events, json.dumps(b.column_groups))] = b.build_id
        need.update(layouts.values())
        sid = snap.snapshot_id
        while not by_snap.get(sid):
            s = meta.snapshot_by_id(sid)
            if s is None or (s.summary or {}).get("featurelake.operation") != "compact":
                break
            # expiry drops the parent pointer; the compaction's summary names the snapshot it rewrote
            sid = s.parent_snapshot_id or int(s.summary.get("featurelake.same-events-as"))
        if by_snap.get(sid):
            need.add(by_snap[sid][-1].build_id)
    return need


def _check_lookups(st, ref: dict, seed: int) -> None:
    keys, befores = random_rows(np.random.default_rng(seed), 120, 40, hi_min=4000)
    got = st.lookup(keys, before=befores, columns=COLS, max_len=5, **ref)
    sid = ref.get("snapshot_id")
    branch = ref.get("branch", "main") if "build" not in ref else "exp"
    events = st.read(snapshot_id=sid) if sid is not None else st.read(branch=branch)
    assert got.to_pylist() == oracle(events, keys, befores, COLS, 5), ref


@both_backends
def test_gc_deletes_exactly_the_builds_no_retained_snapshot_needs(lake):
    st = make_events(lake)
    st.append(events_with_ties(20, 30, seed=1))
    b0 = st.build(chunk_events=8)                      # S0: expires -> dead
    st.append(events_with_ties(20, 20, seed=2, start_min=2000, minutes=500))
    b1 = st.build()                                    # S1: expires -> dead
    st.append(events_with_ties(10, 20, seed=4, start_min=2600, minutes=300))
    b2 = st.build()                                    # S2: expires, superseded in service by b3 -> dead
    b3 = st.build(chunk_events=4, force=True)          # S2's newest: serves its compaction, the main head -> live
    st.compact()                                       # C: the main head, no build of its own
    st.create_branch("exp")                            # forks at C
    st.append(events_with_ties(6, 20, seed=3, start_min=2500, minutes=300, first_user=30), branch="exp")
    e1 = st.build(branch="exp")                        # E: superseded by e2 in the same layout -> dead
    e2 = st.build(branch="exp", incremental=False, force=True)  # E, newest with 4 events a chunk -> live
    e3 = st.build(branch="exp", chunk_events=16, force=True)    # E, newest: serves exp -> live
    st.create_tag("t1", "exp")
    builds = st.builds()
    assert [b.build_id for b in builds] == [b.build_id for b in (b0, b1, b2, b3, e1, e2, e3)]
    st.expire_snapshots(dt.datetime.now(dt.timezone.utc), retain_last=1)
    meta = st.refresh().metadata
    assert meta.snapshot_by_id(b2.snapshot_id) is None and meta.snapshot_by_id(e1.snapshot_id) is not None

    need = _needed(st, builds)
    names = {b.build_id: n for b, n in zip((b0, b1, b2, b3, e1, e2, e3), "b0 b1 b2 b3 e1 e2 e3".split())}
    assert {names[i] for i in need} == {"b3", "e2", "e3"}
    assert need == {b3.build_id, e2.build_id, e3.build_id}  # the oracle agrees with the plan above
    dead = {b.build_id for b in builds} - need

    # the default grace period keeps them all; a dry run lists exactly the dead ones and deletes nothing
    assert lake.collect_garbage().builds == {}
    dry = lake.collect_garbage(older_than=NOW, dry_run=True)
    assert set(dry.builds[st.name]) == dead
    assert {b.build_id for b in st.builds()} == {b.build_id for b in builds}
    assert all(Path(b.path).exists() for b in builds)

    report = lake.collect_garbage(older_than=NOW)
    assert set(report.builds[st.name]) == dead
    assert {b.build_id for b in st.builds()} == need
    for b in builds:
        assert Path(b.path).exists() == (b.build_id in need)
        assert any(b.build_id in f for f in report.files) == (b.build_id not in need)
    assert report.bytes > 0 and not [d for d in st.store_root.iterdir() if d.name.startswith(".")]

    # every retained snapshot still serves lookups equal to the oracle, from the build it needs
    head = st.branches()["main"]
    for i, ref in enumerate([{}, {"branch": "exp"}, {"branch": "t1"}, {"snapshot_id": head}, {"build": e2.build_id}]):
        _check_lookups(st, ref, seed=10 + i)
    assert st.build_for().build_id == b3.build_id and st.build_for("t1").build_id == e3.build_id

    # nothing more to collect; a new build on exp extends its live build
    assert lake.collect_garbage(older_than=NOW).builds == {}
    st.append(events_with_ties(5, 10, seed=6, start_min=3900, minutes=50), branch="exp")
    b7 = st.build(branch="exp")
    assert b7.incremental and b7.base_build == e3.build_id
    _check_lookups(st, {"branch": "exp"}, seed=21)
    _check_lookups(st, {}, seed=20)


def _age(grace: float) -> None:
    time.sleep(grace + 0.3)


def test_gc_keeps_builds_in_progress_and_recently_linked(lake):
    """A build being written hard-links the dead build it extends: neither goes inside the grace period."""
    st = make_events(lake)
    st.append(events_with_ties(10, 20, seed=1))
    old = st.build()
    st.append(events_with_ties(10, 20, seed=2, start_min=2100, minutes=100))
    new = st.build()
    st.expire_snapshots(dt.datetime.now(dt.timezone.utc), retain_last=1)
    grace = dt.timedelta(seconds=1.5)
    _age(grace.total_seconds())
    # an unfinished build (a crashed or running build_store) that just linked the dead build's files
    tmp = st.store_root / ".tmp-20990101T000000000000-abcdef"
    (tmp / "sst" / "L000").mkdir(parents=True)
    for p in Path(old.path, "sst").rglob("*.sst"):
        os.link(p, tmp / "sst" / "L000" / p.name)
    report = lake.collect_garbage(older_than=grace)
    assert report.builds == {} and report.kept_young > 0
    assert Path(old.path).exists() and tmp.exists()
    _age(grace.total_seconds())
    report = lake.collect_garbage(older_than=grace)
    assert report.builds[st.name] == [old.build_id]
    assert not tmp.exists() and not Path(old.path).exists() and Path(new.path).exists()
    _check_lookups(st, {}, seed=3)
    # a deletion cut short (the folder renamed out of sight, not yet removed) is finished by the next run
    cut = st.store_root / ".gc-20000101T000000000000-cafe00"
    (cut / "sst").mkdir(parents=True)
    (cut / "sst" / "part.sst").write_bytes(b"x" * 10)
    lake.collect_garbage()  # whatever the grace period: nothing reads a .gc- folder
    assert not cut.exists() and Path(new.path).exists()


def test_gc_never_deletes_another_tables_builds_and_collects_a_dropped_tables_store(lake, tmp_path):
    st = make_events(lake)
    st.append(events_with_ties(10, 20, seed=1))
    mine = st.build()
    # a build recorded for another table of the same name (another lake sharing the cache folder)
    foreign = st.store_root / "20000101T000000000000-f0f0f0"
    shutil.copytree(mine.path, foreign)
    rec = json.loads((foreign / "build.json").read_text())
    rec.update(table_uuid="00000000-0000-0000-0000-000000000000", snapshot_id=1)
    (foreign / "build.json").write_text(json.dumps(rec))
    report = lake.collect_garbage(older_than=NOW)
    assert report.builds == {} and foreign.exists()
    assert any("another table" in why for why in report.refused.values())

    # a table dropped from the embedded lake: its store root goes after the grace period
    other = make_events(lake, "ml.other")
    other.append(events_with_ties(5, 10, seed=2))
    gone = other.build()
    root = other.store_root
    lake.drop_table("ml.other")
    assert lake.collect_garbage().builds == {} and root.exists()
    report = lake.collect_garbage(older_than=NOW)
    assert report.builds[str(root)] == [gone.build_id] and not root.exists()
    assert Path(mine.path).exists()

    # a catalog lake whose cache folder is shared: a store of a table its catalog lacks is kept
    shared = Lake.from_uri(f"sqlite:///{tmp_path / 'other.db'}", str(tmp_path / "wh"), cache_dir=lake.cache_dir)
    shared.create_table("ns.t", pa.schema([pa.field("id", pa.int64(), nullable=False)]), primary_key="id")
    assert shared.collect_garbage(older_than=NOW).builds == {}
    assert Path(mine.path).exists()
    _check_lookups(st, {}, seed=4)


# ----------------------------------------------------------------- branch union merges
def _frame(t: pa.Table) -> pd.DataFrame:
    df = t.drop_columns(["event_id"]).to_pandas()
    df["tags"] = df["tags"].map(lambda v: tuple(v) if v is not None else None)
    return df.sort_values(list(df.columns)[:5], kind="stable").reset_index(drop=True)


@both_backends
def test_branches_merge_as_a_union_and_build(lake):
    st = make_events(lake)
    base = events_with_ties(20, 20, seed=1)
    st.append(base)
    b_main = st.build(chunk_events=8)
    st.create_branch("exp")
    on_exp = pa.concat_tables([events_with_ties(10, 15, seed=2, start_min=500, minutes=3000),          # late, old users
                               events_with_ties(5, 15, seed=3, start_min=2000, minutes=500, first_user=50)])
    st.append(on_exp, branch="exp")
    on_main = events_with_ties(10, 15, seed=4, start_min=2000, minutes=800)
    st.append(on_main)
    # ids are allocated table-wide: the two sides never number two events alike
    fork_ids = set(st.read(snapshot_id=b_main.snapshot_id).column("event_id").to_pylist())
    exp_new = set(st.read(branch="exp").column("event_id").to_pylist()) - fork_ids
    main_new = set(st.read().column("event_id").to_pylist()) - fork_ids
    assert len(exp_new) == on_exp.num_rows and len(main_new) == on_main.num_rows and not exp_new & main_new
    b_exp = st.build(branch="exp")
    assert b_exp.incremental and b_exp.base_build == b_main.build_id
    _check_lookups(st, {"branch": "exp"}, seed=1)

    head = st.merge("exp")
    merged = st.read()
    assert merged.num_rows == base.num_rows + on_exp.num_rows + on_main.num_rows
    assert merged.column("event_id").unique().__len__() == merged.num_rows
    expected = pd.concat([_frame(base.append_column("event_id", pa.array(np.zeros(base.num_rows, np.int64)))),
                          _frame(on_exp.append_column("event_id", pa.array(np.zeros(on_exp.num_rows, np.int64)))),
                          _frame(on_main.append_column("event_id", pa.array(np.zeros(on_main.num_rows, np.int64))))])
    cols = list(expected.columns)
    pd.testing.assert_frame_equal(_frame(merged), expected.sort_values(cols[:5], kind="stable").reset_index(drop=True))
    assert st.verify_index()["ok"]
    assert st.merge("exp") == head  # merged already: nothing new

    b = st.build()
    assert b.incremental and b.events == merged.num_rows
    _check_lookups(st, {}, seed=2)
    view = st.view("user_id", "ts", columns=COLS, max_len=5, branch="exp")
    assert view.store.info.build_id == b_exp.build_id


def test_merge_renumbers_clashing_synthetic_ids_and_keeps_backfills(lake):
    """Events appended with per-branch ids (before table-wide allocation, or racing) still merge as a union."""
    st = make_events(lake)
    st.append(events_with_ties(10, 20, seed=1))
    st.build()
    st.create_branch("exp")
    top = st._next_event_id()

    def with_ids(t: pa.Table) -> pa.Table:  # the ids a per-branch allocation gave both sides
        return t.append_column("event_id", pa.array(np.arange(top, top + t.num_rows, dtype=np.int64)))

    exp_events, main_events = events_with_ties(6, 20, seed=2, first_user=100), events_with_ties(6, 20, seed=3, first_user=200)
    Table.append(st, with_ids(exp_events), branch="exp")
    Table.append(st, with_ids(main_events))
    st.backfill(pa.table({"event_id": pa.array([top], pa.int64()), "dwell": pa.array([9.5], pa.float32())}), branch="exp")
    exp_side = st.read(branch="exp")
    st.merge("exp")
    merged = st.read()
    assert merged.num_rows == exp_side.num_rows + main_events.num_rows
    assert len(set(merged.column("event_id").to_pylist())) == merged.num_rows
    df = merged.to_pandas()
    assert df[(df.user_id >= 100) & (df.user_id < 200)].event_id.min() >= top + main_events.num_rows  # renumbered above
    pd.testing.assert_frame_equal(
        _frame(merged),
        pd.concat([_frame(exp_side), _frame(with_ids(main_events))]).pipe(
            lambda d: d.sort_values(list(d.columns)[:5], kind="stable").reset_index(drop=True)))
    assert 9.5 in merged.column("dwell").to_pylist() and st.verify_index()["ok"]
    b = st.build()
    assert b.incremental
    _check_lookups(st, {}, seed=5)


def test_merge_of_caller_event_ids_refuses_duplicates_and_writes_nothing(lake):
    schema = pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("t", pa.int64(), nullable=False),
                        pa.field("eid", pa.string(), nullable=False), pa.field("v", pa.float64())])
    st = lake.create_sequence_table("ml.own", schema, key="user", time="t", event_id="eid")

    def events(ids, users, ts):
        return pa.table({"user": users, "t": pa.array(ts, pa.int64()), "eid": ids, "v": [float(x) for x in ts]}, schema=schema)

    st.append(events(["a1", "a2"], ["u1", "u2"], [1, 2]))
    st.create_branch("exp")
    st.append(events(["e1", "dup-1", "dup-2"], ["u1", "u3", "u3"], [5, 6, 7]), branch="exp")
    st.append(events(["m1", "dup-1", "dup-2"], ["u2", "u3", "u3"], [5, 6, 7]))
    head, files = st.branches()["main"], len(st.refresh().metadata.snapshots)
    with pytest.raises(MergeConflictError, match="dup-1") as e:
        st.merge("exp")
    assert sorted(e.value.keys) == ["dup-1", "dup-2"]
    assert st.branches()["main"] == head and len(st.refresh().metadata.snapshots) == files
    # resolved on one side, the union merges
    st.delete("eid IN ('dup-1', 'dup-2')", branch="exp")
    st.merge("exp")
    got = st.read().to_pandas().sort_values("eid")["eid"].tolist()
    assert got == sorted(["a1", "a2", "e1", "m1", "dup-1", "dup-2"])
    st.build(branch="exp")
    assert st.lookup(["u1"], before=10, columns=["t", "v"], branch="exp").to_pylist()[0] == [{"t": 1, "v": 1.0}, {"t": 5, "v": 5.0}]


# ----------------------------------------------------------------- seq stats
def test_seq_stats_shows_bytes_per_event_by_component(lake):
    from typer.testing import CliRunner

    from featurelake.cli import app

    st = make_events(lake)
    st.append(events_with_ties(20, 40, seed=1))
    st.append(events_with_ties(20, 40, seed=2, start_min=2000, minutes=500))
    st.build()
    res = CliRunner().invoke(app, ["--home", str(lake.home), "--json", "seq", "stats", "ml.events"])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output)
    events = st.read()
    assert stats["events"] == events.num_rows
    # oracles: data files as the manifests list them, the build folder by an independent walk (links once)
    ice = st.refresh()
    data = sum(os.path.getsize(t.file.file_path.removeprefix("file://")) for t in ice.scan().plan_files())
    inodes = {}
    for d, _, files in os.walk(st.build_for().path):
        for f in files:
            s = os.stat(os.path.join(d, f))
            inodes[s.st_ino] = s.st_size
    index = sum(os.path.getsize(p) for p in Path(ice.location().removeprefix("file://")).rglob("*")
                if p.is_file() and "/index/" in str(p))
    assert stats["bytes"]["event_data"] == data and stats["bytes"]["store"] == sum(inodes.values())
    assert stats["bytes"]["key_index"] == index > 0 and stats["bytes"]["updates"] == 0
    assert stats["bytes"]["total"] == data + index + sum(inodes.values())
    for k, v in stats["bytes"].items():
        assert stats["bytes_per_event"][k] == round(v / events.num_rows, 2)
    res = CliRunner().invoke(app, ["--home", str(lake.home), "seq", "stats", "ml.events"])
    assert res.exit_code == 0 and "bytes_per_event" in res.output and "key_index" in res.output
