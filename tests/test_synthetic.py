"""Tests for featurelake.synthetic, the deterministic impressions generator."""
from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from featurelake.synthetic import (
    BLOCK_ROWS,
    generate_impressions,
    impressions_for_day,
    impressions_schema,
    impressions_table,
)

CONTEXT_TYPE = pa.struct(
    [pa.field("slot", pa.int32()), pa.field("item_id", pa.int64()), pa.field("weight", pa.float32())]
)


@pytest.fixture(scope="module")
def big() -> pa.Table:
    """One day of 100k rows (two internal blocks), shared by the statistical tests."""
    return impressions_table(100_000)


# ---------------------------------------------------------------- schema


def test_schema_exact() -> None:
    schema = impressions_schema(3)
    expected = [
        ("sample_id", pa.int64(), False),
        ("user_id", pa.int64(), False),
        ("item_id", pa.int64(), False),
        ("ts", pa.timestamp("us"), False),
        ("f0", pa.float32(), True),
        ("f1", pa.float32(), True),
        ("f2", pa.float32(), True),
        ("clicked_items", pa.list_(pa.int64()), True),
        ("context", pa.list_(CONTEXT_TYPE), True),
        ("click", pa.int32(), True),
    ]
    assert [(f.name, f.type, f.nullable) for f in schema] == expected
    assert schema.field("ts").type.tz is None
    assert impressions_schema().names[4:12] == [f"f{i}" for i in range(8)]


def test_batches_carry_the_schema() -> None:
    for dense in (1, 8):
        schema = impressions_schema(dense)
        batches = list(impressions_for_day(0, 1000, dense_features=dense, batch_size=300))
        assert batches and all(b.schema.equals(schema) for b in batches)
        table = impressions_table(50, dense_features=dense)
        assert table.schema.equals(schema)
        table.validate(full=True)


def test_zero_rows_gives_empty_table_with_schema() -> None:
    assert list(impressions_for_day(0, 0)) == []
    table = impressions_table(0, days=3)
    assert table.num_rows == 0 and table.schema.equals(impressions_schema())


# ---------------------------------------------------------------- determinism


def test_deterministic() -> None:
    a = impressions_table(5_000, days=2, seed=7)
    b = impressions_table(5_000, days=2, seed=7)
    assert a.equals(b)


def test_different_seed_or_day_differs() -> None:
    a = impressions_table(2_000, seed=1)
    b = impressions_table(2_000, seed=2)
    for col in ("user_id", "item_id", "ts", "f0", "clicked_items"):
        assert not a[col].equals(b[col]), col
    d0 = pa.Table.from_batches(list(impressions_for_day(0, 2_000)))
    d1 = pa.Table.from_batches(list(impressions_for_day(1, 2_000)))
    assert not d0["user_id"].equals(d1["user_id"])


def test_batch_size_does_not_change_data() -> None:
    rows = BLOCK_ROWS + 1_234
    ref = pa.Table.from_batches(list(impressions_for_day(3, rows, batch_size=BLOCK_ROWS)))
    for bs in (1_000, 2 * BLOCK_ROWS, BLOCK_ROWS + 7):
        other = pa.Table.from_batches(list(impressions_for_day(3, rows, batch_size=bs)))
        assert other.equals(ref), bs


# ---------------------------------------------------------------- batching and counts


@pytest.mark.parametrize("batch_size", [1, 999, BLOCK_ROWS, BLOCK_ROWS + 7, 3 * BLOCK_ROWS])
def test_batch_sizes_bounded(batch_size: int) -> None:
    rows = 2 * BLOCK_ROWS + 10 if batch_size > 1 else 2_500
    sizes = [b.num_rows for b in impressions_for_day(0, rows, batch_size=batch_size)]
    assert sum(sizes) == rows
    assert all(0 < s <= batch_size for s in sizes)


@pytest.mark.parametrize("rows,days", [(10, 3), (7, 7), (5, 8), (100_001, 4), (0, 2)])
def test_generate_impressions_row_count_exact(rows: int, days: int) -> None:
    table = impressions_table(rows, days=days)
    assert table.num_rows == rows
    per_day = pc.value_counts(pc.divide(table["sample_id"], pa.scalar(10**10, pa.int64())))
    counts = {d["values"].as_py(): d["counts"].as_py() for d in per_day}
    base, extra = divmod(rows, days)
    expected = {d: base + (1 if d < extra else 0) for d in range(days)}
    assert counts == {d: c for d, c in expected.items() if c}


def test_generate_is_lazy_and_validates_eagerly() -> None:
    it = generate_impressions(10**9, days=10)  # nothing is generated yet
    first = next(iter(it))
    assert first.num_rows == 65_536
    with pytest.raises(ValueError):
        generate_impressions(10, days=0)
    with pytest.raises(ValueError):
        impressions_for_day(-1, 10)
    with pytest.raises(ValueError):
        impressions_for_day(0, 10, batch_size=0)
    with pytest.raises(ValueError):
        impressions_schema(0)
    with pytest.raises(ValueError):
        generate_impressions(10, days=2, users=0)


# ---------------------------------------------------------------- keys and time


def test_sample_id_unique_across_days() -> None:
    table = impressions_table(30_000, days=5)
    ids = table["sample_id"].to_numpy()
    assert np.unique(ids).size == ids.size
    day = ids // 10**10
    assert set(day.tolist()) == set(range(5))
    assert (ids % 10**10 < 6_000).all()
    assert table["sample_id"].null_count == 0


def test_ts_inside_the_right_day() -> None:
    start = dt.date(2025, 12, 30)  # crosses a year boundary
    table = impressions_table(7_000, days=4, start=start)
    day = table["sample_id"].to_numpy() // 10**10
    ts = table["ts"].to_numpy().astype("datetime64[us]")
    day_start = np.datetime64(start, "us") + day.astype("timedelta64[D]")
    assert (ts >= day_start).all()
    assert (ts < day_start + np.timedelta64(1, "D")).all()
    # and spread over the whole day, not bunched
    seconds = (ts - day_start) / np.timedelta64(1, "s")
    assert seconds.min() < 600 and seconds.max() > 86_400 - 600


def test_ids_within_bounds(big: pa.Table) -> None:
    users = big["user_id"].to_numpy()
    items = big["item_id"].to_numpy()
    assert users.min() >= 0 and users.max() < 10_000
    assert items.min() >= 0 and items.max() < 100_000
    small = impressions_table(2_000, users=3, items=5)
    assert set(small["user_id"].to_numpy().tolist()) <= {0, 1, 2}
    assert set(small["item_id"].to_numpy().tolist()) <= set(range(5))


# ---------------------------------------------------------------- distributions


def test_user_activity_is_zipf_skewed(big: pa.Table) -> None:
    counts = np.sort(np.bincount(big["user_id"].to_numpy(), minlength=10_000))[::-1]
    top_share = counts[:100].sum() / counts.sum()  # top 1% of users
    assert top_share > 0.10, top_share
    # heavy users are scattered over the id space, not just the lowest ids
    heaviest = np.argsort(np.bincount(big["user_id"].to_numpy(), minlength=10_000))[::-1][:10]
    assert heaviest.max() > 1_000


def test_item_popularity_is_skewed(big: pa.Table) -> None:
    counts = np.sort(np.bincount(big["item_id"].to_numpy(), minlength=100_000))[::-1]
    assert counts[:1_000].sum() / counts.sum() > 0.10


def test_click_rate_and_signal(big: pa.Table) -> None:
    click = big["click"].to_numpy()
    assert set(np.unique(click).tolist()) == {0, 1}
    assert big["click"].null_count == 0
    rate = click.mean()
    assert 0.03 < rate < 0.08, rate
    f0 = big["f0"].to_numpy(zero_copy_only=False)
    hi, lo = click[f0 > 1].mean(), click[f0 < -1].mean()
    assert hi > 3 * lo, (hi, lo)


def test_dense_features_look_normal_with_few_nulls(big: pa.Table) -> None:
    for i in range(8):
        col = big[f"f{i}"]
        assert 0 < col.null_count < 0.03 * big.num_rows
        values = col.drop_null().to_numpy()
        assert abs(values.mean()) < 0.05 and 0.9 < values.std() < 1.1
    no_nulls = impressions_table(1_000, null_rate=0.0)
    assert all(no_nulls[f"f{i}"].null_count == 0 for i in range(8))


# ---------------------------------------------------------------- nested columns


def test_clicked_items_valid(big: pa.Table) -> None:
    col = big["clicked_items"].combine_chunks()
    assert col.null_count == 0
    lengths = pc.list_value_length(col).to_numpy()
    assert lengths.min() == 0 and lengths.max() == 20
    assert 8 < lengths.mean() < 12
    flat = pc.list_flatten(col)
    assert flat.null_count == 0
    values = flat.to_numpy()
    assert values.min() >= 0 and values.max() < 100_000


def test_context_valid(big: pa.Table) -> None:
    col = big["context"].combine_chunks()
    assert col.null_count == 0
    lengths = pc.list_value_length(col).to_numpy()
    assert lengths.min() == 0 and lengths.max() == 5
    flat = pc.list_flatten(col)
    assert flat.null_count == 0
    slot = flat.field("slot").to_numpy()
    item = flat.field("item_id").to_numpy()
    weight = flat.field("weight").to_numpy()
    assert all(flat.field(name).null_count == 0 for name in ("slot", "item_id", "weight"))
    # slot is the position inside each row's list
    expected_slot = np.concatenate([np.arange(n) for n in lengths[:2_000]])
    assert np.array_equal(slot[: expected_slot.size], expected_slot)
    assert slot.max() == 4 and slot.min() == 0
    assert item.min() >= 0 and item.max() < 100_000
    assert weight.min() >= 0 and weight.max() < 1


def test_sliced_small_batches_round_trip_through_python() -> None:
    batches = list(impressions_for_day(0, 300, batch_size=100))
    rows = [r for b in batches for r in b.to_pylist()]
    assert [r["sample_id"] for r in rows] == list(range(300))
    whole = impressions_table(300).to_pylist()
    assert rows == whole
