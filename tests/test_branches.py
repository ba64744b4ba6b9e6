"""Branches: zero-copy create, merge (fast-forward, three-way, conflicts), rebase, diff, drop, tags."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from backends import both_backends
from featurelake.errors import BranchNotFoundError, InvalidNameError, MergeConflictError
from featurelake.synthetic import impressions_for_day, impressions_schema, impressions_table

KEY = "sample_id"


@pytest.fixture
def samples(lake):
    t = lake.create_table("ml.samples", impressions_schema(), primary_key=KEY, partition_by=["day(ts)"])
    data = impressions_table(1500, days=3, seed=21)
    t.append(data)
    return t, data


def heads(t) -> dict:
    return dict(t.branches())


def col(data, name, fn):
    return pa.table({KEY: data[KEY], name: fn(data)})


def day_rows(day: int, n: int = 100) -> pa.Table:
    return pa.Table.from_batches(list(impressions_for_day(day, n, seed=77)))


@both_backends
def test_create_branch_copies_nothing(samples, backend):
    t, data = samples
    files = backend.files(".parquet")  # data, update, state and index files (metadata.json is new)
    start = t.create_branch("research/ctr-v2")
    assert start == t.branches()["main"] == t.branches()["research/ctr-v2"]
    assert backend.files(".parquet") == files
    assert t.read(branch="research/ctr-v2").num_rows == data.num_rows
    s = t.stats("research/ctr-v2")
    assert s["exclusive_bytes"] == 0 and s["shared_bytes"] == s["bytes"]


@pytest.mark.parametrize("bad", ["", "-x", "a..b", "a b", "x" * 129, "ends/", "main", "exp"])
def test_branch_names_are_checked(samples, bad):
    t, _ = samples
    t.create_branch("exp")
    with pytest.raises(InvalidNameError):
        t.create_branch(bad)


def test_unknown_refs_raise(samples):
    t, data = samples
    for op in (
        lambda: t.merge("nope"),
        lambda: t.rebase("nope"),
        lambda: t.drop_branch("nope"),
        lambda: t.diff("nope"),
        lambda: t.create_branch("x", from_ref="nope"),
        lambda: t.backfill(col(data, "c", lambda d: d["f0"]), branch="nope"),
        lambda: t.merge("main", into="nope"),
    ):
        with pytest.raises(BranchNotFoundError):
            op()


def test_fast_forward_merge(samples):
    t, data = samples
    t.create_branch("exp")
    t.backfill(col(data, "cand", lambda d: pc.multiply(d["f0"], 2.0)), branch="exp")
    exp_head = t.branches()["exp"]
    assert t.merge("exp") == exp_head
    assert t.branches()["main"] == exp_head
    assert t.read(columns=["cand"])["cand"].null_count == data["f0"].null_count


@both_backends
def test_three_way_merge_of_different_columns_and_files(samples):
    t, data = samples
    t.create_branch("exp")
    t.backfill(col(data, "cand", lambda d: pc.multiply(d["f0"], 2.0)), branch="exp")
    t.append(day_rows(5), branch="exp")
    t.backfill(pa.table({KEY: data[KEY].slice(0, 20), "click": pa.array([3] * 20, pa.int32())}))
    t.append(day_rows(6))
    main_before = t.read().num_rows
    snapshots_before, head_before = len(t.iceberg.metadata.snapshots), t.branches()["main"]
    t.merge("exp")
    ice = t.iceberg  # the merge is one commit: one new snapshot, on top of main's head
    assert len(ice.metadata.snapshots) == snapshots_before + 1
    assert ice.metadata.snapshot_by_id(t.branches()["main"]).parent_snapshot_id == head_before
    merged = t.read(columns=[KEY, "cand", "click", "f0"])
    assert merged.num_rows == main_before + 100  # the branch's new day, once
    assert pc.count_distinct(merged[KEY]).as_py() == merged.num_rows
    orig = merged.filter(pc.is_in(merged[KEY], value_set=data[KEY].combine_chunks()))
    assert orig["cand"].to_pylist() == pc.multiply(orig["f0"], 2.0).to_pylist()
    assert pc.sum(pc.equal(merged["click"], 3)).as_py() == 20
    # merging again changes nothing
    head = t.branches()["main"]
    assert t.merge("exp") == head


@both_backends
def test_same_column_same_file_conflicts_and_writes_nothing(samples):
    t, data = samples
    t.create_branch("a")
    t.create_branch("b")
    ids = data[KEY].slice(0, 5)
    t.backfill(pa.table({KEY: ids, "click": pa.array([6] * 5, pa.int32())}), branch="a")
    t.backfill(pa.table({KEY: ids, "click": pa.array([7] * 5, pa.int32())}), branch="b")
    t.merge("a")
    before = heads(t)
    with pytest.raises(MergeConflictError) as e:
        t.merge("b")
    assert any(c == "click" for _, c, _ in e.value.conflicts)
    assert "click" in str(e.value) and ".parquet" in str(e.value)
    assert heads(t) == before
    assert t.read(columns=["click"], filter="click = 6").num_rows == 5


def test_updated_file_rewritten_on_other_side_conflicts(samples):
    t, data = samples
    t.create_branch("exp")
    t.backfill(pa.table({KEY: data[KEY].slice(0, 5), "cand": pa.array([1.0] * 5)}), branch="exp")
    t.delete(f"{KEY} = {data[KEY][1].as_py()}")  # main rewrites that day's file
    with pytest.raises(MergeConflictError) as e:
        t.merge("exp")
    assert any("removed or rewritten on the target" in why for _, _, why in e.value.conflicts)
    # and the other direction
    t.create_branch("exp2")
    t.delete(f"{KEY} = {data[KEY][2].as_py()}", branch="exp2")
    t.backfill(pa.table({KEY: data[KEY].slice(3, 2), "click": pa.array([1, 1], pa.int32())}))
    with pytest.raises(MergeConflictError) as e:
        t.merge("exp2")
    assert any("removed or rewritten on the source" in why for _, _, why in e.value.conflicts)


def test_both_rewrote_the_same_file_conflicts(samples):
    t, data = samples
    t.create_branch("exp")
    t.delete(f"{KEY} = {data[KEY][0].as_py()}", branch="exp")
    t.delete(f"{KEY} = {data[KEY][1].as_py()}")
    with pytest.raises(MergeConflictError) as e:
        t.merge("exp")
    assert any("both sides" in why for _, _, why in e.value.conflicts)


def test_same_column_name_different_type_conflicts(samples):
    t, data = samples
    t.create_branch("exp")
    t.backfill(col(data, "score", lambda d: d["f0"]), branch="exp")
    with t.iceberg.update_schema() as us:  # main drops the column and re-adds it as a string
        us.delete_column("score")
    t.backfill(pa.table({KEY: data[KEY], "score": pa.array(["x"] * data.num_rows)}))
    with pytest.raises(MergeConflictError) as e:
        t.merge("exp")
    assert any(c == "score" and "type" in why for _, c, why in e.value.conflicts)


@both_backends
def test_rebase_replays_branch_on_new_main(samples):
    t, data = samples
    t.create_branch("exp")
    t.backfill(col(data, "cand", lambda d: pc.multiply(d["f0"], 2.0)), branch="exp")
    t.append(day_rows(7))
    main_head = t.branches()["main"]
    new_head = t.rebase("exp")
    assert t.iceberg.metadata.snapshot_by_id(new_head).parent_snapshot_id == main_head
    assert t.read(branch="exp").num_rows == data.num_rows + 100
    assert t.diff("exp")["behind"] == 0
    assert t.merge("exp") == new_head  # now a fast-forward
    got = t.read(columns=["cand", "f0"], filter=f"{KEY} < 1000000")
    assert got["cand"].to_pylist() == pc.multiply(got["f0"], 2.0).to_pylist()


@both_backends
def test_diff_and_storage_accounting(samples):
    t, data = samples
    t.create_branch("exp")
    t.backfill(col(data, "cand", lambda d: d["f1"]), branch="exp")
    t.backfill(pa.table({KEY: data[KEY].slice(0, 3), "click": pa.array([1, 1, 1], pa.int32())}), branch="exp")
    t.append(day_rows(4), branch="exp")
    d = t.diff("exp")
    assert d["rows_added"] == 100 and d["columns_added"] == ["cand"] and d["columns_updated"] == ["click"]
    # four layers (cand on three day files, click on one): each backfill's small layers share one file
    assert d["data_files_added"] == 1 and d["update_files_added"] == 2
    s = t.stats("exp")
    assert s["exclusive_bytes"] == d["bytes_added"]
    assert s["shared_bytes"] == t.stats("main")["bytes"]


@both_backends
def test_drop_branch_and_tags(samples):
    t, data = samples
    t.create_branch("exp")
    tag_id = t.create_tag("train-2026-01")
    t.append(day_rows(8))
    assert t.read(branch="train-2026-01").num_rows == data.num_rows
    assert t.tags() == {"train-2026-01": tag_id}
    with pytest.raises(BranchNotFoundError):
        t.append(day_rows(9), branch="train-2026-01")  # tags are read-only
    with pytest.raises(InvalidNameError):
        t.create_tag("exp")
    t.drop_branch("exp")
    assert "exp" not in t.branches()
    with pytest.raises(InvalidNameError):
        t.drop_branch("main")
    t.drop_tag("train-2026-01")
    assert t.tags() == {}
