"""Upserts and the global key index, against a dict oracle; concurrent writers in processes."""
from __future__ import annotations

import copy
import multiprocessing as mp
import tempfile
from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends import both_backends
from featurelake import Lake
from featurelake.errors import DuplicateKeyError, NullKeyError, SchemaMismatchError
from featurelake.synthetic import impressions_for_day, impressions_schema, impressions_table

KEY = "id"
SCHEMA = pa.schema(
    [
        pa.field(KEY, pa.int64(), nullable=False),
        pa.field("ts", pa.timestamp("us"), nullable=False),
        pa.field("x", pa.float64()),
        pa.field("label", pa.int32()),
    ]
)
T0 = datetime(2026, 1, 1)


def rows_of(t, **kw) -> dict:
    return {r[KEY]: r for r in t.read(**kw).to_pylist()}


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_upserts_match_oracle_and_keep_the_index_right(data):
    seed = data.draw(st.integers(0, 2**31), label="seed")
    rng = np.random.default_rng(seed)
    ops = data.draw(st.lists(st.sampled_from(["upsert", "upsert", "delete", "compact", "branch_upsert"]), min_size=2, max_size=7))
    with tempfile.TemporaryDirectory() as home:
        t = Lake(home).create_table("ml.u", SCHEMA, primary_key=KEY, partition_by=["bucket(3, id)", "day(ts)"])
        oracle: dict[int, dict] = {}
        history = []
        for op in ["upsert"] + ops:
            if op in ("upsert", "branch_upsert"):
                n = int(rng.integers(1, 30))
                ids = rng.choice(60, size=n, replace=False)
                cols = ["ts", "x", "label"] if rng.random() < 0.5 else ["ts", "label"]
                batch = {KEY: ids.tolist()}
                batch["ts"] = [T0 + timedelta(hours=int(h)) for h in rng.integers(0, 72, n)]
                batch["x"] = [None if rng.random() < 0.2 else float(v) for v in rng.normal(size=n)]
                batch["label"] = rng.integers(0, 3, n).tolist()
                tbl = pa.table({c: batch[c] for c in [KEY] + cols}, schema=pa.schema([SCHEMA.field(c) for c in [KEY] + cols]))
                if op == "branch_upsert":
                    name = f"b{len(history)}"
                    t.create_branch(name)
                    t.upsert(tbl, branch=name)
                    t.merge(name)
                else:
                    t.upsert(tbl)
                for r in tbl.to_pylist():
                    if r[KEY] in oracle:  # existing: updated in place, partition (ts) kept
                        for c in cols:
                            if c != "ts":
                                oracle[r[KEY]][c] = r[c]
                    else:
                        oracle[r[KEY]] = {KEY: r[KEY], "ts": r["ts"], "x": r.get("x"), "label": r["label"]}
            elif op == "delete":
                cut = int(rng.integers(0, 60))
                t.delete(f"{KEY} < {cut} and label = 1")
                oracle = {k: v for k, v in oracle.items() if not (k < cut and v["label"] == 1)}
            else:
                t.compact()
            assert rows_of(t) == oracle
            assert t.verify_index()["ok"]
            history.append((t.branches()["main"], copy.deepcopy(oracle)))
        for sid, then in history:
            assert rows_of(t, snapshot_id=sid) == then


@both_backends
def test_key_keeps_its_partition(lake):
    t = lake.create_table("ml.u", SCHEMA, primary_key=KEY, partition_by=["day(ts)"])
    t.append(pa.table({KEY: [1, 2], "ts": [T0, T0], "x": [0.5, 0.6], "label": [0, 0]}, schema=SCHEMA))
    files = {task.file.file_path for task in t.scan().tasks()}
    late = pa.table({KEY: [1], "ts": [T0 + timedelta(days=20)], "label": [1]}, schema=pa.schema([SCHEMA.field(c) for c in (KEY, "ts", "label")]))
    t.upsert(late)
    assert t.last_update_report.rows_updated == 1 and t.last_update_report.rows_inserted == 0
    assert {task.file.file_path for task in t.scan().tasks()} == files  # nothing appended, nothing rewritten
    assert rows_of(t)[1] == {KEY: 1, "ts": T0, "x": 0.5, "label": 1}


def test_composite_keys_are_hashed_and_verified(lake):
    schema = impressions_schema()
    t = lake.create_table("ml.c", schema, primary_key=["user_id", "item_id"])
    data = impressions_table(2000, days=1, seed=1)
    uniq = pc.unique(pc.add(pc.multiply(data["user_id"], 1_000_000), data["item_id"]))
    first = pa.Table.from_pandas(data.to_pandas().drop_duplicates(["user_id", "item_id"]), preserve_index=False).cast(schema)
    assert first.num_rows == len(uniq)
    t.append(first)
    assert t.verify_index()["ok"]
    change = first.slice(0, 50).select(["user_id", "item_id"]).append_column("click", pa.array([7] * 50, pa.int32()))
    t.upsert(change)
    assert t.last_update_report.rows_updated == 50
    assert t.read(columns=["click"], filter="click = 7").num_rows == 50
    with pytest.raises(DuplicateKeyError):
        t.append(first.slice(10, 1))


@both_backends
def test_index_verify_after_every_kind_of_write(lake):
    """After each kind of write: the index verifies, and every branch reads what a dict model holds."""
    key = "sample_id"
    t = lake.create_table("ml.s", impressions_schema(), primary_key=key, partition_by=["day(ts)"])
    data = impressions_table(900, days=3, seed=2)
    model: dict[str, dict[int, dict]] = {"main": {}}

    def day_of(d: int, n: int, seed: int = 0) -> pa.Table:
        return pa.Table.from_batches(list(impressions_for_day(d, n, seed=seed)))

    def put(branch: str, tbl: pa.Table) -> None:  # upsert: existing keys keep their ts (partition)
        rows, empty = model[branch], dict.fromkeys(columns())  # the schema read once, not per row
        for r in tbl.to_pylist():
            if r[key] in rows:
                rows[r[key]].update({c: v for c, v in r.items() if c != "ts"})
            else:
                rows[r[key]] = {**empty, **r}

    def columns() -> list[str]:
        return t.schema.names

    def drop(branch: str, pred) -> None:
        model[branch] = {k: r for k, r in model[branch].items() if not pred(r)}

    day2 = (datetime(2026, 1, 2), datetime(2026, 1, 3))
    late, other, more = day_of(4, 30), day_of(6, 20), day_of(7, 20)
    replacement = day_of(1, 50, seed=9)
    feature = pa.table({key: data[key], "c": pc.multiply(data["f0"], 2.0)})

    def overwrite():
        t.overwrite(replacement, "ts >= '2026-01-02T00:00:00' and ts < '2026-01-03T00:00:00'")
        drop("main", lambda r: day2[0] <= r["ts"] < day2[1])
        put("main", replacement)

    def rebase():
        t.rebase("exp")
        model["exp"] = copy.deepcopy(model["main"])
        put("exp", other)

    steps = [
        ("append", lambda: (t.append(data), put("main", data))),
        ("backfill", lambda: (t.backfill(feature), [r.setdefault("c", None) for r in model["main"].values()], put("main", feature))),
        ("upsert", lambda: (t.upsert(late), put("main", late))),
        ("overwrite", overwrite),
        ("delete", lambda: (t.delete("user_id < 30"), drop("main", lambda r: r["user_id"] < 30))),
        ("branch", lambda: (t.create_branch("exp"), model.__setitem__("exp", copy.deepcopy(model["main"])))),
        ("branch upsert", lambda: (t.upsert(other, branch="exp"), put("exp", other))),
        ("append", lambda: (t.append(more), put("main", more))),
        ("rebase", rebase),
        ("merge", lambda: (t.merge("exp"), model.__setitem__("main", copy.deepcopy(model["exp"])))),
        ("compact", lambda: t.compact()),
        ("revert", lambda: revert_head()),
    ]
    at: dict[int, dict] = {}  # main's head snapshot -> the model then

    def revert_head():  # undoing the head's operation gives back its parent's rows
        head = t.snapshots()[0]
        t.revert(head["snapshot_id"])
        model["main"] = copy.deepcopy(at[head["parent_id"]])

    for i, (what, step) in enumerate(steps):
        step()
        at[t.branches()["main"]] = copy.deepcopy(model["main"])
        for b in t.branches():
            report = t.verify_index(b)
            assert report["ok"], (i, what, b, report)
            got = {r[key]: r for r in t.read(branch=b).to_pylist()}
            assert got == model[b], (i, what, b)


@both_backends
def test_bad_upserts_write_nothing(backend):
    t = backend.lake.create_table("ml.u", SCHEMA, primary_key=KEY, partition_by=["day(ts)"])
    t.append(pa.table({KEY: [1, 2], "ts": [T0, T0], "x": [0.5, 0.6], "label": [0, 0]}, schema=SCHEMA))
    before = [s["snapshot_id"] for s in t.snapshots()]
    files = backend.files()
    with pytest.raises(NullKeyError):
        t.upsert(pa.table({KEY: pa.array([None], pa.int64()), "label": pa.array([1], pa.int32())}))
    with pytest.raises(DuplicateKeyError):
        t.upsert(pa.table({KEY: pa.array([1, 1], pa.int64()), "label": pa.array([1, 2], pa.int32())}))
    with pytest.raises(SchemaMismatchError):
        t.upsert(pa.table({KEY: pa.array([1], pa.int64()), "label": pa.array(["x"])}))
    with pytest.raises(SchemaMismatchError):  # a new key without the required ts
        t.upsert(pa.table({KEY: pa.array([3], pa.int64()), "label": pa.array([1], pa.int32())}))
    assert [s["snapshot_id"] for s in t.snapshots()] == before
    assert backend.files() == files


# ------------------------------------------------------------ concurrency
def _writer(home: str, worker: int, n_workers: int, rounds: int) -> None:
    t = Lake(home).table("ml.c")
    for r in range(rounds):
        shared = list(range(0, 40))  # every worker updates these, each its own column
        own = [1000 + worker * 100 + r * 10 + i for i in range(10)]  # disjoint new keys
        ids = shared + own
        t.upsert(
            pa.table(
                {
                    KEY: pa.array(ids, pa.int64()),
                    "ts": pa.array([T0] * len(ids), pa.timestamp("us")),
                    f"w{worker}": pa.array([float(r)] * len(ids)),
                }
            )
        )


@pytest.mark.slow
def test_concurrent_upserting_processes(tmp_path):
    home = str(tmp_path / "lake")
    t = Lake(home).create_table("ml.c", SCHEMA, primary_key=KEY, partition_by=["day(ts)"])
    t.append(pa.table({KEY: list(range(40)), "ts": [T0] * 40, "x": [0.0] * 40, "label": [0] * 40}, schema=SCHEMA))
    for w in range(3):  # columns exist up front so writers race on data, not on schema
        t.backfill(pa.table({KEY: pa.array([0], pa.int64()), f"w{w}": pa.array([None], pa.float64())}))
    workers, rounds = 3, 3
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(home, w, workers, rounds)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
        assert p.exitcode == 0
    final = t.read()
    assert pc.count_distinct(final[KEY]).as_py() == final.num_rows  # never a duplicate key
    assert final.num_rows == 40 + workers * rounds * 10
    by_id = {r[KEY]: r for r in final.to_pylist()}
    for w in range(workers):  # every worker's last round landed on the shared keys: no lost update
        assert all(by_id[k][f"w{w}"] == float(rounds - 1) for k in range(40))
        for r in range(rounds):
            for i in range(10):
                assert by_id[1000 + w * 100 + r * 10 + i][f"w{w}"] == float(r)
    assert t.verify_index()["ok"]


@pytest.mark.parametrize("layout", ["dense", "gaps", "clustered"])
def test_index_positions_match_binary_search(layout):
    from featurelake.index import _positions

    rng = np.random.default_rng(3)
    if layout == "dense":
        k = np.arange(10_000, 60_000, dtype=np.int64)
    elif layout == "gaps":
        k = np.unique(rng.integers(0, 10**9, 50_000)).astype(np.int64)
    else:
        k = np.unique(np.concatenate([rng.integers(0, 1000, 20_000), rng.integers(10**12, 10**12 + 5000, 4000)])).astype(np.int64)
    present = np.sort(rng.choice(k, 3000, replace=False))
    absent = np.sort(rng.integers(k[0], k[-1], 3000))
    for keys in (present, absent):
        assert np.array_equal(_positions(k, keys), np.searchsorted(k, keys)), layout


def test_lookups_in_a_table_with_sparse_keys(lake):
    t = lake.create_table("ml.sparse", SCHEMA, primary_key=KEY)
    ids = np.unique(np.random.default_rng(5).integers(0, 10**12, 5000)).astype(np.int64)
    t.append(pa.table({KEY: ids, "ts": [T0] * len(ids), "x": np.zeros(len(ids)), "label": np.zeros(len(ids), np.int32)}, schema=SCHEMA))
    pick = ids[::7]
    t.upsert(pa.table({KEY: pick, "label": pa.array(np.ones(len(pick), np.int32))}))
    assert t.last_update_report.rows_updated == len(pick) and t.last_update_report.rows_inserted == 0
    assert sorted(t.read(columns=[KEY], filter="label = 1")[KEY].to_pylist()) == sorted(pick.tolist())
    assert t.verify_index()["ok"]
