"""``verify_index`` against real corrupted indexes: each kind of damage is reported, rebuild repairs it.

The index is damaged through the engine's own file formats (tests/index_corruption.py):
new segment files and a new platform-state root, committed on the branch.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from featurelake.synthetic import impressions_table

from index_corruption import Seg, drop_entries, read_segments, rewrite_index

KEY = "sample_id"
CLEAN = {"uncovered_files": 0, "missing": 0, "wrong": 0, "duplicate_keys": 0, "duplicate_entries": 0}


@pytest.fixture
def samples(lake):
    data = impressions_table(300, days=3, seed=2)
    t = lake.create_table("ml.s", data.schema, primary_key=KEY, partition_by=["day(ts)"])
    t.append(data)
    assert {k: t.verify_index()[k] for k in CLEAN} == CLEAN and t.verify_index()["ok"]
    return t


def where(seg: Seg, key: int) -> int:
    [i] = np.flatnonzero(seg.k == key)
    return int(i)


def wrong_position(segs):
    s = segs[0]
    i, j = where(s, 10), where(s, 11)  # same file (day 0), neighbouring rows
    assert s.f[i] == s.f[j]
    s.p[i] = s.p[j]
    return segs


def duplicate_behind_the_right_entry(segs):
    s = segs[0]
    i, j = where(s, 10), where(s, 11)
    # a second entry for key 10 at key 11's row, sorted after the right one: lookups never see it
    return [Seg(s.files, np.insert(s.k, i + 1, 10), np.insert(s.f, i + 1, s.f[j]), np.insert(s.p, i + 1, s.p[j]))] + segs[1:]


def duplicate_in_another_segment(segs):
    s = segs[0]
    j = where(s, 11)
    return segs + [Seg(s.files, np.array([10], np.int64), s.f[j : j + 1], s.p[j : j + 1])]


@pytest.mark.parametrize(
    "backend, change, expected",
    [
        ("local", drop_entries(1), {"missing": 1}),
        ("local", wrong_position, {"missing": 1, "wrong": 1}),
        ("local", duplicate_behind_the_right_entry, {"duplicate_entries": 1}),
        ("local", duplicate_in_another_segment, {"wrong": 1, "duplicate_entries": 1}),
        pytest.param("s3", duplicate_in_another_segment, {"wrong": 1, "duplicate_entries": 1}, marks=pytest.mark.s3),
    ],
    ids=["dropped-entry", "wrong-position", "duplicate-entry-hidden", "duplicate-entry-other-segment", "s3"],
    indirect=["backend"],
)
def test_each_corruption_is_reported_and_rebuild_repairs_it(samples, change, expected):
    t = samples
    rows = t.read().sort_by(KEY)
    rewrite_index(t, change)
    report = t.verify_index()
    assert {k: report[k] for k in CLEAN} == {**CLEAN, **expected}
    assert report["ok"] is False and report["rows"] == 300
    assert t.read().sort_by(KEY).equals(rows)  # the data itself is intact
    t.rebuild_index()
    report = t.verify_index()
    assert {k: report[k] for k in CLEAN} == CLEAN and report["ok"] is True


def test_a_duplicate_entry_would_make_an_upsert_change_another_row(samples):
    """Why the duplicate-entry checks matter: the index decides which rows an upsert touches."""
    t = samples
    rewrite_index(t, duplicate_in_another_segment)
    t.upsert(pa.table({KEY: pa.array([10], pa.int64()), "click": pa.array([7], pa.int32())}))
    assert sorted(t.read(columns=[KEY], filter="click = 7")[KEY].to_pylist()) == [10, 11]


def test_entries_pointing_at_a_file_no_longer_live(samples):
    t = samples
    before = {task.file.file_path for task in t.scan().tasks()}
    t.delete(f"{KEY} = 5")  # rewrites day 0's file
    after = {task.file.file_path for task in t.scan().tasks()}
    [dead], [live] = before - after, after - before
    live_rows = t.read(filter="ts < '2026-01-02T00:00:00'").num_rows
    assert live_rows == 99

    def to_dead_file(segs):
        for s in segs:
            if live in s.files:  # the live file stays listed, its entries name the dead one
                s.files = s.files + [dead]
                s.f[s.f == s.files.index(live)] = len(s.files) - 1
        return segs

    rewrite_index(t, to_dead_file)
    report = t.verify_index()
    assert {k: report[k] for k in CLEAN} == {**CLEAN, "missing": live_rows} and not report["ok"]


def test_an_index_of_dead_files_only_is_reported_and_lookups_scan_instead(samples):
    t = samples
    old = read_segments(t)  # covers the three original files
    t.delete(f"{KEY} = 5")
    rewrite_index(t, lambda segs: old)  # the rewritten file has no segment any more
    report = t.verify_index()
    # reported as an uncovered file; lookups scan uncovered files, so no key is missing or wrong
    assert {k: report[k] for k in CLEAN} == {**CLEAN, "uncovered_files": 1} and report["ok"]
    t.upsert(pa.table({KEY: pa.array([6], pa.int64()), "click": pa.array([7], pa.int32())}))
    assert t.read(columns=[KEY], filter="click = 7")[KEY].to_pylist() == [6]
    assert t.stats()["rows"] == 299


def test_a_key_stored_twice_in_the_data_is_reported(samples):
    t = samples
    twin = t.read(filter=f"{KEY} = 42")
    ice = t.iceberg
    ice.append(twin.cast(ice.schema().as_arrow()))  # another engine appends an existing key
    report = t.verify_index()
    assert report["duplicate_keys"] == 1 and report["uncovered_files"] == 1 and not report["ok"]
