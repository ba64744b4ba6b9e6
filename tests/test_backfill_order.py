"""Backfill inputs in every order the fast paths look for: sorted, scan order (a few runs), reversed, random.

The key lookup and the grouping per data file take shortcuts for input that
is already (nearly) in order (featurelake.sorting, updates._locator_order,
updates._gather); the result must be the same as for any other order, checked
against pandas doing the update the obvious way.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from backends import both_backends

from featurelake import sorting
from featurelake.updates import _gather, _locator_order

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("day", pa.int32()), pa.field("x", pa.float64())])


def _table(lake, files: int = 5, per_file: int = 3000):
    t = lake.create_table("ns.ordered", SCHEMA, primary_key="id")
    rng = np.random.default_rng(7)
    for i in rng.permutation(files):  # data files written out of key order
        ids = np.arange(i * per_file, (i + 1) * per_file, dtype=np.int64)
        t.append(pa.table({"id": ids, "day": np.full(len(ids), i, np.int32), "x": np.zeros(len(ids))}, schema=SCHEMA))
    return t


@both_backends
@pytest.mark.parametrize("order", ["scan", "sorted", "reversed", "random", "runs_subset"])
def test_backfill_in_any_input_order_matches_pandas(backend, order):
    lake = backend.lake
    t = _table(lake)
    scan = t.read(columns=["id"])["id"].to_numpy()
    rng = np.random.default_rng(3)
    ids = {
        "scan": scan,
        "sorted": np.sort(scan),
        "reversed": np.sort(scan)[::-1].copy(),
        "random": rng.permutation(scan),
        "runs_subset": np.concatenate([scan[5000:9000], scan[:1000], scan[12000:12500]]),
    }[order]
    values = pa.table({"id": ids, "y": (ids * 0.25).astype(np.float32)})
    t.backfill(values)
    oracle = pd.DataFrame({"id": scan}).merge(pd.DataFrame({"id": ids, "y": ids * 0.25}), on="id", how="left")
    got = t.read(columns=["id", "y"]).to_pandas().sort_values("id").reset_index(drop=True)
    want = oracle.sort_values("id").reset_index(drop=True)
    assert got["id"].tolist() == want["id"].tolist()
    np.testing.assert_array_equal(got["y"].to_numpy(dtype=np.float64), want["y"].to_numpy(dtype=np.float64))
    report = t.last_update_report
    assert report.rows_updated == len(ids)
    # then a second column by locator, in reversed scan order: the same shortcut, other input
    located = t.read(columns=["id"], with_locator=True)
    back = located.take(pa.array(np.arange(located.num_rows)[::-1].copy()))
    t.backfill(pa.table({"_file": back["_file"], "_pos": back["_pos"], "z": pc_neg(back["id"])}))
    got = t.read(columns=["id", "z"]).to_pandas()
    assert (got["z"] == -got["id"]).all()


def pc_neg(col):
    import pyarrow.compute as pc

    return pc.negate(col)


@pytest.mark.parametrize("shape", ["sorted", "runs", "random", "dups"])
def test_sorting_helpers_match_numpy(shape):
    rng = np.random.default_rng(1)
    base = np.arange(20_000, dtype=np.int64)
    v = {
        "sorted": base,
        "runs": np.concatenate([base[12_000:], base[:5_000], base[5_000:12_000]]),
        "random": rng.permutation(base),
        "dups": rng.integers(0, 50, 20_000),
    }[shape]
    order = sorting.argsort(v)
    got = v if order is None else v[order]
    np.testing.assert_array_equal(got, np.sort(v))
    np.testing.assert_array_equal(sorting.sort(v), np.sort(v))
    assert sorting.is_sorted(v) == (shape == "sorted")
    assert (order is None) == (shape == "sorted")


@pytest.mark.parametrize("shape", ["sorted", "runs", "random", "negative"])
def test_locator_order_and_gather_match_lexsort_and_take(shape):
    rng = np.random.default_rng(2)
    files = np.repeat(np.arange(4), 500)
    pos = np.tile(np.arange(500, dtype=np.int64), 4)
    if shape == "runs":
        idx = np.concatenate([np.arange(1000, 2000), np.arange(0, 1000), np.arange(2000, 2000)])
        files, pos = files[idx], pos[idx]
    elif shape == "random":
        idx = rng.permutation(len(files))
        files, pos = files[idx], pos[idx]
    elif shape == "negative":
        pos = pos - 3
    names = pa.array([f"f{i}" for i in files]).dictionary_encode()
    order = _locator_order(names, pos)
    want = np.lexsort((pos, names.indices.to_numpy()))
    got = np.arange(len(pos)) if order is None else order
    np.testing.assert_array_equal(names.indices.to_numpy()[got], names.indices.to_numpy()[want])
    np.testing.assert_array_equal(pos[got], pos[want])
    data = pa.table({"a": np.arange(len(pos)), "b": np.arange(len(pos)) * 2.0})
    for rows in (got, np.arange(len(pos)), np.concatenate([np.arange(30, 60), np.arange(0, 30)]), rng.permutation(len(pos)), np.array([], np.int64)):
        assert _gather(data, rows).to_pydict() == data.take(pa.array(rows, pa.int64())).to_pydict()


@pytest.mark.parametrize("shape", ["sorted", "disjoint_runs", "overlapping_runs", "repeat_in_run", "repeat_across_runs", "random", "tiny",
                                   "runs_and_shuffled_tail", "tail_repeats_a_run_key", "tail_repeats_itself", "tail_too_long"])
def test_distinct_runs_never_calls_repeated_keys_distinct(shape):
    rng = np.random.default_rng(5)
    base = np.arange(10_000, dtype=np.int64)
    v = {
        "sorted": base,
        "disjoint_runs": np.concatenate([base[6000:], base[:2000], base[2000:6000]]),
        "overlapping_runs": np.concatenate([base[::2], base[1::2]]),
        "repeat_in_run": np.concatenate([base[:500], base[499:1000]]),
        "repeat_across_runs": np.concatenate([base[5000:], base[:5001]]),
        "random": rng.permutation(base),
        "tiny": np.array([3], np.int64),
        # scan order after an upsert inserted keys: long runs, then a file of keys in no order
        "runs_and_shuffled_tail": np.concatenate([base[6000:9000], base[:6000], rng.permutation(base[9000:9300])]),
        "tail_repeats_a_run_key": np.concatenate([base[6000:9000], base[:6000], rng.permutation(np.append(base[9000:9300], 4321))]),
        "tail_repeats_itself": np.concatenate([base[:9000], rng.permutation(np.append(base[9000:9300], 9100))]),
        "tail_too_long": np.concatenate([base[:5000], rng.permutation(base[5000:])]),
    }[shape]
    distinct = len(np.unique(v)) == len(v)
    assert sorting.distinct_runs(v) == (shape in ("sorted", "disjoint_runs", "tiny", "runs_and_shuffled_tail"))
    assert not sorting.distinct_runs(v) or distinct  # never a false "distinct"
    with_nan = np.array([1, 2, np.nan, 2, 3])  # an integer key column with nulls arrives as floats
    assert not sorting.distinct_runs(with_nan)


@pytest.mark.parametrize("seed", range(40))
def test_distinct_runs_is_never_wrong_on_random_run_layouts(seed):
    """Runs of random lengths, some shuffled, some repeating a value of another run, near the int64 limits too."""
    rng = np.random.default_rng(seed)
    base = np.iinfo(np.int64).max - 10**6 if seed % 4 == 0 else (np.iinfo(np.int64).min if seed % 4 == 1 else 0)
    parts, at = [], base
    for _ in range(int(rng.integers(1, 12))):
        shuffled = rng.random() < 0.25
        n = int(rng.integers(1, 200 if shuffled else 3000))  # a shuffled file is small (rows an upsert inserted)
        step = int(rng.integers(1, 4))
        part = at + np.arange(n, dtype=np.int64) * step if at >= 0 or base < 0 else np.arange(n, dtype=np.int64) + at
        at = int(part[-1]) + int(rng.integers(1, 5000)) if int(part[-1]) < np.iinfo(np.int64).max - 10**5 else base
        parts.append(rng.permutation(part) if shuffled else part)
    order = rng.permutation(len(parts))
    v = np.concatenate([parts[i] for i in order])
    if seed % 2 and len(v) > 1:  # a repeated value somewhere
        v = np.insert(v, int(rng.integers(0, len(v))), v[int(rng.integers(0, len(v)))])
    assert not sorting.distinct_runs(v) or len(np.unique(v)) == len(v)
