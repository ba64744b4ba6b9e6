"""Merge-on-read backfills against an oracle that applies the same changes the obvious way."""
from __future__ import annotations

import copy
import hashlib
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
from featurelake.errors import (
    BranchNotFoundError,
    DuplicateKeyError,
    NullKeyError,
    SchemaMismatchError,
    UnknownKeyError,
)
from featurelake.synthetic import impressions_schema, impressions_table

KEY = "id"
BASE = pa.schema(
    [
        pa.field(KEY, pa.int64(), nullable=False),
        pa.field("ts", pa.timestamp("us"), nullable=False),
        pa.field("a", pa.float64()),
        pa.field("tags", pa.list_(pa.int64())),
    ]
)
NEW_TYPES = {
    "n_float": pa.float64(),
    "n_list": pa.list_(pa.int64()),
    "n_struct": pa.struct([("x", pa.int32()), ("y", pa.string())]),
    "n_ls": pa.list_(pa.struct([("k", pa.int64()), ("w", pa.float32())])),
    "n_str": pa.string(),
}
T0 = datetime(2026, 1, 1)


def _value(rng: np.random.Generator, name: str, typ: pa.DataType):
    if rng.random() < 0.15:
        return None
    if name in ("a", "n_float"):
        return float(np.round(rng.normal(), 3))
    if name in ("tags", "n_list"):
        return [int(v) for v in rng.integers(0, 50, rng.integers(0, 4))]
    if name == "n_struct":
        return {"x": int(rng.integers(0, 100)), "y": str(rng.integers(0, 5))}
    if name == "n_ls":
        return [{"k": int(rng.integers(0, 9)), "w": float(np.float32(rng.random()))} for _ in range(rng.integers(0, 3))]
    return "s" + str(rng.integers(0, 1000))


class Oracle:
    """The table as a dict of rows, changed the obvious way."""

    def __init__(self) -> None:
        self.rows: dict[int, dict] = {}
        self.columns: list[str] = list(BASE.names)
        self.types: dict[str, pa.DataType] = {f.name: f.type for f in BASE}

    def append(self, rows: list[dict]) -> None:
        for r in rows:
            self.rows[r[KEY]] = {c: r.get(c) for c in self.columns}

    def backfill(self, column: str, values: dict[int, object]) -> None:
        if column not in self.columns:
            self.columns.append(column)
            self.types[column] = NEW_TYPES[column]
            for r in self.rows.values():
                r[column] = None
        for k, v in values.items():
            self.rows[k][column] = v

    def table(self, columns=None) -> pa.Table:
        columns = columns or self.columns
        ordered = [self.rows[k] for k in sorted(self.rows)]
        return pa.table({c: pa.array([r[c] for r in ordered], self.types[c]) for c in columns})


def _rows_equal(actual: pa.Table, expected: pa.Table) -> None:
    actual = actual.sort_by(KEY).select(expected.column_names).cast(expected.schema)
    assert actual.to_pylist() == expected.to_pylist()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_appends_and_backfills_match_oracle(data):
    seed = data.draw(st.integers(0, 2**31), label="seed")
    rng = np.random.default_rng(seed)
    ops = data.draw(
        st.lists(st.sampled_from(["append", "backfill", "backfill", "backfill_dense", "compact"]), min_size=2, max_size=8),
        label="ops",
    )
    with tempfile.TemporaryDirectory() as home:
        lake = Lake(home)
        t = lake.create_table("ml.t", BASE, primary_key=KEY, partition_by=["bucket(3, id)"])
        oracle = Oracle()
        history: list[tuple[int, Oracle]] = []
        next_id = 0
        for op in ["append"] + ops:
            if op == "append":
                n = int(rng.integers(1, 40))
                rows = [
                    {KEY: next_id + i, "ts": T0 + timedelta(hours=int(rng.integers(0, 48))), "a": _value(rng, "a", None), "tags": _value(rng, "tags", None)}
                    for i in range(n)
                ]
                next_id += n
                batch = pa.Table.from_pylist(rows, schema=BASE)
                for c in oracle.columns[len(BASE):]:
                    batch = batch.append_column(c, pa.nulls(n, oracle.types[c]))
                sid = t.append(batch)
                oracle.append(rows)
            elif op.startswith("backfill"):
                column = data.draw(st.sampled_from(["a", "tags", *NEW_TYPES]), label="column")
                keys = sorted(oracle.rows)
                if op == "backfill_dense":
                    chosen = keys
                else:
                    k = int(rng.integers(1, len(keys) + 1))
                    chosen = sorted(rng.choice(keys, size=k, replace=False).tolist())
                typ = NEW_TYPES.get(column) or oracle.types[column]
                values = {k: _value(rng, column, typ) for k in chosen}
                sid = t.backfill(pa.table({KEY: pa.array(chosen, pa.int64()), column: pa.array(list(values.values()), typ)}))
                oracle.backfill(column, values)
            else:
                sid = t.compact().snapshot_id
            history.append((sid, copy.deepcopy(oracle)))

            _rows_equal(t.read(), oracle.table())

        # projections, and filters on updated columns see merged values
        final = oracle.table()
        for cols in ([KEY, "a"], [KEY] + oracle.columns[-1:]):
            _rows_equal(t.read(columns=cols), final.select(cols))
        got = t.read(columns=[KEY, "a"], filter="a > 0.2")
        want = final.filter(pc.fill_null(pc.greater(final["a"], 0.2), False)).select([KEY, "a"])
        _rows_equal(got, want)
        got = t.read(columns=[KEY], filter="a is null")
        _rows_equal(got, final.filter(pc.is_null(final["a"])).select([KEY]))
        streamed = pa.Table.from_batches(list(t.batches(batch_size=7)))
        _rows_equal(streamed, final)
        # time travel: each snapshot reads as the oracle did then
        for sid, then in history:
            _rows_equal(t.read(snapshot_id=sid), then.table())


# --------------------------------------------------------------- focused cases
@pytest.fixture
def samples(lake):
    t = lake.create_table("ml.samples", impressions_schema(), primary_key="sample_id", partition_by=["day(ts)"])
    data = impressions_table(3000, days=3, seed=11)
    t.append(data)
    return t, data


def _file_digests(t, backend) -> dict[str, str]:
    return {
        task.file.file_path: hashlib.sha256(backend.read_bytes(task.file.file_path)).hexdigest()
        for task in t.iceberg.scan().plan_files()
    }


@both_backends
def test_backfill_rewrites_no_data_file(samples, backend):
    t, data = samples
    before = _file_digests(t, backend)
    data_bytes = t.stats()["data_bytes"]
    t.backfill(pa.table({"sample_id": data["sample_id"], "ctr": pc.multiply(data["f0"], 0.1)}))
    report = t.last_update_report
    assert _file_digests(t, backend) == before  # same files, same bytes
    assert report.rows_updated == data.num_rows and report.new_columns == ["ctr"]
    assert report.bytes_written < data_bytes / 10
    got = t.read(columns=["sample_id", "ctr"]).sort_by("sample_id")
    assert got["ctr"].to_pylist() == pc.multiply(data.sort_by("sample_id")["f0"], 0.1).to_pylist()
    # one commit, one snapshot
    assert t.snapshots()[0]["operation"] == "backfill"


def test_projection_does_not_open_unrelated_update_files(samples):
    t, data = samples
    t.backfill(pa.table({"sample_id": data["sample_id"], "ctr": pc.multiply(data["f0"], 0.1)}))
    scan = t.scan(columns=["sample_id", "click"])
    scan.to_table()
    assert scan.report.update_files_read == 0
    scan = t.scan(columns=["ctr"])
    scan.to_table()
    assert scan.report.update_files_read == t.stats()["update_files"] > 0


def test_nested_backfill_and_overwrite_of_existing_nested_column(samples):
    t, data = samples
    ids = data["sample_id"].slice(0, 10)
    ctx = pa.array([[{"slot": 9, "item_id": int(i), "weight": 0.5}] for i in range(10)], data.schema.field("context").type)
    t.backfill(pa.table({"sample_id": ids, "context": ctx}))
    got = t.read(columns=["sample_id", "context"], filter="sample_id < 10").sort_by("sample_id")
    assert got["context"].to_pylist() == ctx.to_pylist()
    other = t.read(columns=["sample_id", "context"]).sort_by("sample_id").slice(10)
    assert other["context"].to_pylist() == data.sort_by("sample_id").slice(10)["context"].to_pylist()
    m = pa.array([[("a", 1.0)]] * 10, pa.map_(pa.string(), pa.float64()))
    t.backfill(pa.table({"sample_id": ids, "weights": m}))
    got = t.read(columns=["sample_id", "weights"], filter="sample_id < 10")
    assert got["weights"].to_pylist() == [[("a", 1.0)]] * 10


def test_filter_on_updated_column_is_not_pruned_by_stale_statistics(lake):
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("score", pa.float64())])
    t = lake.create_table("ml.s", schema, primary_key="id", properties={"write.metadata.metrics.column.score": "full"})
    t.append(pa.table({"id": pa.array(range(100), pa.int64()), "score": pa.array(np.linspace(0, 1, 100))}))
    # the file's max(score) statistic says 1.0; after the update two rows hold 5.0
    t.backfill(pa.table({"id": pa.array([3, 7], pa.int64()), "score": pa.array([5.0, 5.0])}))
    assert sorted(t.read(filter="score > 2")["id"].to_pylist()) == [3, 7]
    assert 3 not in t.read(filter="score < 0.5")["id"].to_pylist()


def test_rename_keeps_updates(samples):
    t, data = samples
    t.backfill(pa.table({"sample_id": data["sample_id"], "ctr": pc.multiply(data["f0"], 0.1)}))
    with t.iceberg.update_schema() as us:
        us.rename_column("ctr", "ctr_v1")
    got = t.read(columns=["sample_id", "ctr_v1"]).sort_by("sample_id")
    assert got["ctr_v1"].to_pylist() == pc.multiply(data.sort_by("sample_id")["f0"], 0.1).to_pylist()


@both_backends
def test_bad_backfills_commit_nothing(samples, backend):
    t, data = samples
    files_before = backend.files()
    before = [s["snapshot_id"] for s in t.snapshots()]
    schema_before = t.iceberg.schema()
    ids = data["sample_id"].slice(0, 5)
    with pytest.raises(UnknownKeyError) as e:
        t.backfill(pa.table({"sample_id": pa.array([10**15, 10**15 + 1], pa.int64()), "new_col": pa.array([1.0, 2.0])}))
    assert 10**15 in e.value.keys
    with pytest.raises(DuplicateKeyError):
        t.backfill(pa.table({"sample_id": pa.concat_arrays([ids.combine_chunks(), ids.combine_chunks()]), "x": pa.array([1.0] * 10)}))
    with pytest.raises(NullKeyError):
        t.backfill(pa.table({"sample_id": pa.array([None, 1], pa.int64()), "x": pa.array([1.0, 2.0])}))
    with pytest.raises(SchemaMismatchError):
        t.backfill(pa.table({"sample_id": ids, "click": pa.array(["not an int"] * 5)}))
    with pytest.raises(SchemaMismatchError):
        t.backfill(pa.table({"sample_id": ids, "ts": pa.array([datetime(2026, 1, 1)] * 5)}))  # partition source
    with pytest.raises(SchemaMismatchError):
        t.backfill(pa.table({"click": pa.array([1] * 5, pa.int32())}))  # no key, no locator
    with pytest.raises(BranchNotFoundError):
        t.backfill(pa.table({"sample_id": ids, "x": pa.array([1.0] * 5)}), branch="nope")
    with pytest.raises(UnknownKeyError):
        t.backfill(pa.table({"_file": pa.array(["file:///nope.parquet"]), "_pos": pa.array([0], pa.int64()), "x": pa.array([1.0])}))
    assert [s["snapshot_id"] for s in t.snapshots()] == before
    assert t.iceberg.schema() == schema_before
    assert backend.files() == files_before


def test_unknown_keys_can_be_skipped(samples):
    t, data = samples
    ids = pa.concat_arrays([data["sample_id"].slice(0, 3).combine_chunks(), pa.array([10**15], pa.int64())])
    t.backfill(pa.table({"sample_id": ids, "x": pa.array([1.0, 2.0, 3.0, 4.0])}), on_unknown="skip")
    assert t.last_update_report.unknown_skipped == 1
    assert t.last_update_report.rows_updated == 3
    assert sorted(t.read(columns=["x"], filter="x > 0")["x"].to_pylist()) == [1.0, 2.0, 3.0]


@both_backends
def test_locator_backfill_needs_no_key(samples):
    t, data = samples
    located = t.read(columns=["f0"], with_locator=True, filter="click = 1")
    assert set(located.column_names) == {"f0", "_file", "_pos"}
    t.backfill(located.select(["_file", "_pos"]).append_column("pos_weight", pc.add(located["f0"], 100.0)))
    got = t.read(columns=["sample_id", "pos_weight", "click", "f0"])
    clicked = got.filter(pc.equal(got["click"], 1))
    assert clicked["pos_weight"].to_pylist() == pc.add(clicked["f0"], 100.0).to_pylist()
    assert got.filter(pc.equal(got["click"], 0))["pos_weight"].null_count == got.filter(pc.equal(got["click"], 0)).num_rows


@both_backends
def test_branch_reads_see_only_their_updates(samples):
    t, data = samples
    t.create_branch("exp")
    t.backfill(pa.table({"sample_id": data["sample_id"], "cand": pc.multiply(data["f1"], 3.0)}), branch="exp")
    got = t.read(columns=["sample_id", "cand"], branch="exp").sort_by("sample_id")
    oracle = pa.table({"sample_id": data["sample_id"], "cand": pc.multiply(data["f1"], 3.0)}).sort_by("sample_id")
    assert got["sample_id"].equals(oracle["sample_id"])
    assert got["cand"].to_pylist() == oracle["cand"].cast(got["cand"].type).to_pylist()
    assert t.read(columns=["cand"])["cand"].null_count == data.num_rows  # main: the column exists, unset
    t.backfill(pa.table({"sample_id": data["sample_id"].slice(0, 5), "click": pa.array([9] * 5, pa.int32())}))
    assert t.read(columns=["click"], filter="click = 9").num_rows == 5
    assert t.read(columns=["click"], filter="click = 9", branch="exp").num_rows == 0


@both_backends
def test_compaction_equals_plain_pyiceberg(samples):
    t, data = samples
    t.backfill(pa.table({"sample_id": data["sample_id"], "ctr": pc.multiply(data["f0"], 0.1)}))
    t.backfill(pa.table({"sample_id": data["sample_id"].slice(0, 100), "click": pa.array([1] * 100, pa.int32())}))
    t.append(impressions_table(50, days=1, seed=3).set_column(0, "sample_id", pa.array(range(10**12, 10**12 + 50), pa.int64())))
    merged = t.read().sort_by("sample_id")
    live = t.stats()["update_files"]
    layers = t.scan().state.update_layers
    report = t.compact()
    assert layers == 4  # three day files from the dense backfill, one from the sparse one
    assert live == 2  # each backfill's small layers share one update file
    assert report.update_files_folded == live and report.files_in >= 3
    assert t.stats()["update_files"] == 0
    assert t.read().sort_by("sample_id").equals(merged)
    plain = t.iceberg.scan().to_arrow().sort_by("sample_id")
    assert plain.equals(merged)
    assert t.compact().skipped  # nothing left to do


@both_backends
def test_snapshot_by_another_engine_inherits_state(samples):
    t, data = samples
    t.backfill(pa.table({"sample_id": data["sample_id"], "ctr": pc.multiply(data["f0"], 0.1)}))
    merged = t.read(columns=["sample_id", "ctr"]).sort_by("sample_id")
    # plain pyiceberg appends a day: its snapshot carries no featurelake state of its own
    extra = impressions_table(40, days=1, seed=8).set_column(0, "sample_id", pa.array(range(10**12, 10**12 + 40), pa.int64()))
    ice = t.iceberg
    full = extra.append_column("ctr", pa.nulls(40, pa.float32()))
    ice.append(full.cast(ice.schema().as_arrow()))
    assert "featurelake.state" not in t.iceberg.current_snapshot().summary.additional_properties
    got = t.read(columns=["sample_id", "ctr"]).sort_by("sample_id")
    assert got.num_rows == merged.num_rows + 40
    assert got.slice(0, merged.num_rows).equals(merged)  # the updates are still merged
    # keys of the other engine's file are found although no index segment covers it
    with pytest.raises(DuplicateKeyError):
        t.append(extra.slice(0, 1))
    t.backfill(pa.table({"sample_id": extra["sample_id"].slice(0, 3), "ctr": pa.array([1.0, 2.0, 3.0], pa.float32())}))
    assert t.read(columns=["ctr"], filter="sample_id >= 1000000000000 and ctr > 0")["ctr"].to_pylist() == [1.0, 2.0, 3.0]
    assert t.verify_index()["uncovered_files"] == 1 and t.verify_index()["ok"]
