"""Backfills whose input holds whole data files' keys in row order (featurelake.wholefiles).

Such files are set without a key lookup, from the runs the key index records
(``index.key_runs``). Every case here is checked against pandas applying the
same update the obvious way, and ``last_update_report.whole_files`` says how
many files took the shortcut, so a case that must not take it (a file with a
key missing, keys in another order, a file another engine wrote) is seen not
to. Bad input (repeated, unknown, null keys) must be refused exactly as
without the shortcut, writing nothing.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from backends import both_backends
from featurelake import index
from featurelake.errors import DuplicateKeyError, NullKeyError, UnknownKeyError

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("day", pa.int32()), pa.field("x", pa.float64())])
FILES, PER_FILE = 4, 2500


def _table(lake, name: str = "ns.whole", shuffled_file: int | None = None, sort_by: tuple[str, ...] = ()):
    """FILES data files of PER_FILE ascending ids each, appended out of key order; the file
    ``shuffled_file`` holds its ids in random row order (not ascending)."""
    t = lake.create_table(name, SCHEMA, primary_key="id", sort_by=sort_by)
    rng = np.random.default_rng(11)
    for i in rng.permutation(FILES):
        ids = np.arange(i * PER_FILE, (i + 1) * PER_FILE, dtype=np.int64)
        if i == shuffled_file:
            ids = rng.permutation(ids)
        t.append(pa.table({"id": ids, "day": np.full(len(ids), i, np.int32), "x": ids * 1.0}, schema=SCHEMA))
    return t


def _scan(t, branch: str = "main") -> np.ndarray:
    return t.read(columns=["id"], branch=branch)["id"].to_numpy()


def _check(t, expected: pd.DataFrame, column: str, branch: str = "main") -> None:
    """The table's (id, column) equals ``expected`` (pandas), row for row by id."""
    got = t.read(columns=["id", column], branch=branch).to_pandas().sort_values("id").reset_index(drop=True)
    want = expected.sort_values("id").reset_index(drop=True)
    assert got["id"].tolist() == want["id"].tolist()
    np.testing.assert_array_equal(got[column].to_numpy(dtype=np.float64), want[column].to_numpy(dtype=np.float64))


def _backfilled(all_ids: np.ndarray, ids: np.ndarray, values: np.ndarray, column: str, before: pd.DataFrame | None = None) -> pd.DataFrame:
    """The oracle: ``column`` set to ``values`` at ``ids``, other rows as ``before`` (else null)."""
    base = before if before is not None else pd.DataFrame({"id": all_ids, column: np.nan})
    new = pd.DataFrame({"id": ids, "_v": values})
    out = base.merge(new, on="id", how="left")
    out[column] = out["_v"].where(out["_v"].notna(), out[column])
    return out[["id", column]]


def _ascending_files(t) -> int:
    """How many data files hold their ids in ascending row order (the files an index run can describe)."""
    located = t.read(columns=["id"], with_locator=True).to_pandas().sort_values(["_file", "_pos"])
    return int(located.groupby("_file")["id"].apply(lambda ids: bool((np.diff(ids.to_numpy()) > 0).all())).sum())


def _layout(t) -> list[tuple[int, int]]:
    """(first id, rows) of each data file in scan order."""
    located = t.read(columns=["id"], with_locator=True).to_pandas()
    groups = located.groupby("_file", sort=False)["id"]
    return [(int(g.iloc[0]), len(g)) for _, g in groups]


@both_backends
@pytest.mark.parametrize(
    "case", ["scan", "files_reordered", "one_file_reversed", "one_key_missing", "spanning_files", "one_unknown_skipped"]
)
def test_backfill_of_whole_files_matches_pandas(backend, case):
    t = _table(backend.lake)
    scan = _scan(t)
    starts = np.concatenate([[0], np.cumsum([n for _, n in _layout(t)])])
    files = [scan[a:b] for a, b in zip(starts[:-1], starts[1:])]
    ids, whole, skip = {
        "scan": (scan, FILES, False),
        "files_reordered": (np.concatenate(files[::-1]), FILES, False),
        "one_file_reversed": (np.concatenate([files[0], files[1][::-1], *files[2:]]), FILES - 1, False),
        "one_key_missing": (np.delete(scan, starts[2] + 17), FILES - 1, False),
        "spanning_files": (scan[starts[1] - 300: starts[3] + 40], 2, False),  # files 1 and 2 whole
        "one_unknown_skipped": (np.concatenate([scan[: starts[2]], [10**9], scan[starts[2]:]]), FILES, True),
    }[case]
    values = (ids * 0.5).astype(np.float32)
    t.backfill(pa.table({"id": ids, "y": values}), on_unknown="skip" if skip else "error")
    report = t.last_update_report
    assert report.whole_files == whole
    assert report.unknown_skipped == (1 if skip else 0)
    known = np.isin(ids, scan)
    assert report.rows_updated == int(known.sum())
    _check(t, _backfilled(scan, ids[known], values[known].astype(np.float64), "y"), "y")


@both_backends
def test_bad_input_in_scan_order_is_refused_as_without_the_shortcut(backend):
    t = _table(backend.lake)
    scan = _scan(t)
    before = backend.files()
    head = t.iceberg.current_snapshot().snapshot_id
    repeated = np.insert(scan, 3000, scan[10])  # a key of another (whole) file, twice
    with pytest.raises(DuplicateKeyError) as e:
        t.backfill(pa.table({"id": repeated, "y": np.ones(len(repeated))}))
    assert e.value.count == 1
    unknown = np.insert(scan, 2600, [10**9, 10**9 + 1])
    with pytest.raises(UnknownKeyError) as e:
        t.backfill(pa.table({"id": unknown, "y": np.ones(len(unknown))}))
    assert e.value.count == 2 and "1000000000" in str(e.value)
    nulls = pa.array(scan, pa.int64()).to_pylist()
    nulls[5] = None
    with pytest.raises(NullKeyError):
        t.backfill(pa.table({"id": pa.array(nulls, pa.int64()), "y": np.ones(len(scan))}))
    assert backend.files() == before
    assert t.refresh().current_snapshot().snapshot_id == head


@both_backends
def test_whole_files_with_update_layers_branches_and_compaction(backend):
    t = _table(backend.lake, sort_by=("id",))  # compaction then writes files of ascending keys
    scan = _scan(t)
    t.backfill(pa.table({"id": scan[::7], "y": np.full(len(scan[::7]), -1.0)}))  # a sparse layer first
    expected = _backfilled(scan, scan[::7], np.full(len(scan[::7]), -1.0), "y")
    t.backfill(pa.table({"id": scan, "y": scan * 2.0}))  # every key on top: latest wins
    assert t.last_update_report.whole_files == FILES
    expected = _backfilled(scan, scan, scan * 2.0, "y", expected)
    _check(t, expected, "y")
    t.upsert(pa.table({"id": scan[100:120], "y": np.full(20, 7.0)}))  # another layer, by upsert
    expected = _backfilled(scan, scan[100:120], np.full(20, 7.0), "y", expected)
    _check(t, expected, "y")

    t.create_branch("exp")
    t.backfill(pa.table({"id": _scan(t, "exp"), "y": np.full(len(scan), 3.0)}), branch="exp")
    assert t.last_update_report.whole_files == FILES
    _check(t, expected, "y")  # main unchanged
    _check(t, _backfilled(scan, scan, np.full(len(scan), 3.0), "y", expected), "y", branch="exp")

    t.compact()
    _check(t, expected, "y")
    after = _scan(t)
    t.backfill(pa.table({"id": after, "y": after * 3.0}))
    assert t.last_update_report.whole_files == _ascending_files(t) >= 1
    _check(t, _backfilled(scan, after, after * 3.0, "y", expected), "y")


@both_backends
def test_files_whose_keys_do_not_ascend_or_interleave_take_the_lookup(backend):
    lake = backend.lake
    t = _table(lake, shuffled_file=2)
    scan = _scan(t)
    t.backfill(pa.table({"id": scan, "y": scan * 1.5}))
    assert t.last_update_report.whole_files == FILES - 1  # the shuffled file is located by key
    _check(t, _backfilled(scan, scan, scan * 1.5, "y"), "y")

    u = lake.create_table("ns.interleaved", SCHEMA, primary_key="id")
    for parity in (0, 1):  # even ids in one file, odd in the other: their key ranges interleave
        ids = np.arange(parity, 4000, 2, dtype=np.int64)
        u.append(pa.table({"id": ids, "day": np.zeros(len(ids), np.int32), "x": np.zeros(len(ids))}, schema=SCHEMA))
    seg = u._state(u.refresh(), u.refresh().current_snapshot()).index_segments
    assert len(seg) == 2  # one segment per append: each file is a run of its own segment
    u.backfill(pa.table({"id": _scan(u), "y": _scan(u) * 1.0}))
    assert u.last_update_report.whole_files == 2
    _check(u, _backfilled(_scan(u), _scan(u), _scan(u) * 1.0, "y"), "y")
    # one merged segment indexing both (as after MERGE_AT appends): interleaved, so neither is a run
    both = index.merge(u.iceberg.io, index.location_of(u.iceberg), seg, set(index.covered_files(u.iceberg.io, seg)))
    runs = index._open(u.iceberg.io, both[0]).runs
    assert all(r[0] == -1 for r in runs)


@both_backends
def test_a_file_another_engine_appended_turns_the_shortcut_off(backend):
    t = _table(backend.lake)
    scan = _scan(t)
    extra = pa.table({"id": pa.array([scan[0]], pa.int64()), "day": pa.array([9], pa.int32()), "x": pa.array([0.0])})
    t.iceberg.append(extra.cast(t.iceberg.schema().as_arrow()))  # plain pyiceberg: the same key twice, no index
    first_file = scan[:PER_FILE]
    t.backfill(pa.table({"id": first_file, "y": np.full(PER_FILE, 4.0)}))
    assert t.last_update_report.whole_files == 0
    got = t.read(columns=["id", "y"]).to_pandas()
    # as without the shortcut: the key is found in both files and both rows are set
    assert (got.loc[got["id"] == scan[0], "y"] == 4.0).sum() == 2


@pytest.mark.parametrize("seed", range(6))
def test_key_runs_match_a_brute_force_oracle(seed):
    rng = np.random.default_rng(seed)
    files = int(rng.integers(1, 6))
    k, f, p = [], [], []
    start = 0
    for i in range(files):
        n = int(rng.integers(1, 40))
        keys = np.arange(start, start + n) if rng.random() < 0.6 else rng.choice(500, n, replace=False)
        if rng.random() < 0.3:
            keys = rng.permutation(keys)
        start += n + int(rng.integers(0, 3))
        k.append(keys)
        f.append(np.full(n, i))
        p.append(np.arange(n))
    k, f, p = (np.concatenate(x).astype(np.int64) for x in (k, f, p))
    order = np.argsort(k, kind="stable")
    k, f, p = k[order], f[order], p[order]
    runs = index.key_runs(k, f.astype(np.int32), p, files)
    for i in range(files):
        where = np.flatnonzero(f == i)
        contiguous = len(where) and (np.diff(where) == 1).all()
        in_order = (p[where] == np.arange(len(where))).all()
        if contiguous and in_order:
            assert runs[i] == [int(where[0]), len(where), int(k[where[0]]), int(k[where[-1]])]
        else:
            assert runs[i][0] == -1
