"""lake.sql: DuckDB over the merge-on-read reader, checked against t.read + pandas on an un-compacted table.

The merged-read and branch/snapshot tests also run on REST + S3 (``@both_backends``).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from backends import both_backends

from featurelake.errors import BranchNotFoundError, InvalidArgumentError
from featurelake.sql import plan
from featurelake.synthetic import impressions_table

KEY = "sample_id"


@pytest.fixture
def samples(lake):
    """An un-compacted table: backfilled and upserted columns live in update files only."""
    data = impressions_table(300, days=2)
    t = lake.create_table("ml.samples", data.schema, primary_key=KEY, partition_by=["day(ts)"])
    t.append(data)
    keys = data[KEY]
    t.backfill(pa.table({KEY: keys.slice(0, 150), "f0": pa.array(np.arange(150, dtype=np.float32) + 100)}))
    t.upsert(pa.table({KEY: keys.slice(100, 100), "click": pa.array([1] * 50 + [0] * 50, pa.int32())}))
    t.backfill(pa.table({KEY: keys.slice(0, 300, ), "score": pa.array(np.arange(300) % 7, pa.int64())}))  # a new column
    return t


@both_backends
def test_sql_matches_merged_read_and_not_the_stale_one(lake, samples):
    query = (
        "select user_id, count(*) as n, sum(f0) as f0, sum(score) as score from ml.samples "
        "where click = 1 and user_id < 400 group by user_id order by user_id"
    )
    got = lake.sql(query).to_pandas()
    df = samples.read(columns=["user_id", "f0", "score", "click"]).to_pandas()
    df = df[(df.click == 1) & (df.user_id < 400)]
    expected = (
        df.groupby("user_id").agg(n=("f0", "size"), f0=("f0", "sum"), score=("score", "sum")).reset_index()
    )
    assert len(got) == len(expected) > 0
    assert got["user_id"].tolist() == expected["user_id"].tolist()
    assert got["n"].tolist() == expected["n"].tolist() and got["score"].tolist() == expected["score"].tolist()
    np.testing.assert_allclose(got["f0"].to_numpy(), expected["f0"].to_numpy(), rtol=1e-6)
    # a reader of the Iceberg files alone would answer differently (stale clicks, a null score column)
    plain = samples.iceberg.scan().to_arrow().to_pandas()
    assert plain.score.isna().all() and (plain.click == 1).sum() != (samples.read().to_pandas().click == 1).sum()


def test_projection_and_filter_pushdown(lake, samples):
    scans = plan(lake, "select user_id, sum(f0) from ml.samples where click = 1 and user_id in (1, 2) and f1 is not null group by 1")
    assert len(scans) == 1
    scan = scans[0]
    assert sorted(scan.columns) == ["click", "f0", "f1", "user_id"]
    pushed = repr(scan.filter)
    assert "click" in pushed and "user_id" in pushed and "f1" in pushed
    # a condition that does not translate exactly stays with DuckDB only
    (scan,) = plan(lake, "select count(*) from ml.samples where f0 > 0.5 or click = 1")
    assert scan.filter is None and sorted(scan.columns) == ["click", "f0"]
    (scan,) = plan(lake, "select count(*) from ml.samples")
    assert scan.columns == [KEY]
    assert lake.sql("select count(*) as n from ml.samples").column("n").to_pylist() == [300]


def test_pushed_filter_sees_merged_values(lake, samples):
    expected = samples.read(columns=[KEY], filter="click = 1")[KEY].to_pylist()
    got = lake.sql(f"select {KEY} from ml.samples where click = 1 order by {KEY}")[KEY].to_pylist()
    assert got == sorted(expected)


@both_backends
def test_branches_and_snapshots_are_addressable(lake, samples):
    before = samples.branches()["main"]
    samples.create_branch("research/ctr")
    keys = samples.read(columns=[KEY])[KEY].slice(0, 30)
    samples.backfill(pa.table({KEY: keys, "f3": pa.array([-1.0] * 30, pa.float32())}), branch="research/ctr")
    query = 'select count(*) as n from "ml.samples@research/ctr" where f3 = -1'
    assert lake.sql(query)["n"].to_pylist() == [30]
    assert lake.sql('select count(*) as n from ml."samples@research/ctr" where f3 = -1')["n"].to_pylist() == [30]
    assert lake.sql("select count(*) as n from ml.samples where f3 = -1")["n"].to_pylist() == [0]
    assert lake.sql("select count(*) as n from ml.samples where f3 = -1", branch="research/ctr")["n"].to_pylist() == [30]
    old = lake.sql(f'select sum(score) as s from "ml.samples@{before}"')["s"].to_pylist()
    assert old == [pc.sum(samples.read(columns=["score"], snapshot_id=before).column(0)).as_py()]
    # a self-join reads the table twice: materialized, still merged
    joined = lake.sql(
        'select count(*) as n from ml.samples a join "ml.samples@research/ctr" b using (sample_id) where a.f0 = b.f0'
    )
    merged = samples.read(columns=["f0"]).column(0).to_pandas()
    assert joined["n"].to_pylist() == [int(merged.notna().sum())]


def test_sql_errors_are_featurelake_errors(lake, samples):
    with pytest.raises(InvalidArgumentError) as e:
        lake.sql("selec * from ml.samples")
    assert "SQL error" in str(e.value)
    with pytest.raises(InvalidArgumentError):
        lake.sql("select nope from ml.samples")
    with pytest.raises(BranchNotFoundError):
        lake.sql('select * from "ml.samples@nope"')
    with pytest.raises(InvalidArgumentError):
        lake.sql("  ")


def test_sql_result_is_arrow_and_pandas_friendly(lake, samples):
    out = lake.sql("select sample_id, ts, clicked_items from ml.samples order by sample_id limit 3")
    assert isinstance(out, pa.Table) and out.num_rows == 3
    expected = samples.read(columns=["sample_id", "ts", "clicked_items"]).sort_by("sample_id").slice(0, 3)
    assert out.to_pylist() == expected.to_pylist()
    assert isinstance(out.to_pandas(), pd.DataFrame)
