"""The platform state's files: a commit's root holds the shards it changed; format-1 tables stay readable.

The oracle is a pandas frame applying the same changes the obvious way. Files are
read and rewritten with the backend's own client (tests/backends.py), never through
featurelake's I/O layer, and every in-process cache is cleared before a check, so
what is checked is what a fresh process reads from storage.
"""
from __future__ import annotations

import json
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from backends import both_backends
from featurelake import state

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("x", pa.float64())])


def _rows(lo: int, hi: int) -> pa.Table:
    ids = np.arange(lo, hi, dtype=np.int64)
    return pa.table({"id": ids, "x": ids * 1.0}, schema=SCHEMA)


def _frame(t, **kwargs) -> pd.DataFrame:
    return t.read(**kwargs).to_pandas().set_index("id").sort_index()


def _equal(got: pd.DataFrame, want: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(got[sorted(want.columns)], want[sorted(want.columns)].sort_index(), check_dtype=False)


def _roots(backend) -> set[str]:
    return {f for f in backend.files(".parquet") if "/_featurelake/state-" in f}


def _root_format(backend, path: str) -> int:
    f = pq.ParquetFile(pa.BufferReader(backend.read_bytes(path)))
    meta = f.metadata.metadata or {}
    if b"featurelake.state" in meta:
        return json.loads(meta[b"featurelake.state"])["format"]
    return json.loads(f.read().column("state")[0].as_py())["format"]


def _as_format_1(backend, path: str) -> None:
    """Rewrite a root with no shard rows of its own as format 1 wrote it: the JSON in a one-cell ``state`` column."""
    f = pq.ParquetFile(pa.BufferReader(backend.read_bytes(path)))
    assert f.metadata.num_rows == 0  # its shards are in separate packs, as in format 1
    root = json.loads(f.metadata.metadata[b"featurelake.state"])
    root["format"] = 1
    for info in root["shards"].values():
        info.pop("layers", None)  # the oldest format-1 roots did not record it
    sink = pa.BufferOutputStream()
    pq.write_table(pa.table({"state": [json.dumps(root)]}), sink)
    backend.overwrite(path, sink.getvalue().to_pybytes())


def test_tables_written_in_format_1_stay_readable_and_writable(backend, monkeypatch, fresh_process):
    """A table whose every state root is format 1 reads, time-travels, takes new commits (current-format
    roots naming format-1 packs), compacts and collects garbage exactly as the oracle says."""
    monkeypatch.setattr(state, "INLINE_ENTRIES", -1)  # packs beside the roots, as format 1 wrote them
    t = backend.lake.create_table("ns.old", SCHEMA, primary_key="id")
    for lo in range(0, 3000, 1000):
        t.append(_rows(lo, lo + 1000))
    oracle = _rows(0, 3000).to_pandas().set_index("id")
    t.backfill(pa.table({"id": pa.array(range(0, 3000, 7), pa.int64()), "x": np.full(429, -1.0)}))
    oracle.loc[range(0, 3000, 7), "x"] = -1.0
    after_first = t.refresh().current_snapshot().snapshot_id
    at_first = oracle.copy()
    ids = np.arange(0, 3000, 3, dtype=np.int64)
    t.backfill(pa.table({"id": ids, "y": ids * 2.0}))  # a new column
    oracle["y"] = np.nan
    oracle.loc[ids, "y"] = ids * 2.0
    t.upsert(pa.table({"id": pa.array([5, 3000], pa.int64()), "x": [55.0, 30.0]}))
    oracle.loc[5, "x"] = 55.0
    oracle.loc[3000] = [30.0, np.nan]
    roots = _roots(backend)
    assert len(roots) == 6  # one per platform commit: three appends (their index segments) and three updates
    for root in roots:
        _as_format_1(backend, root)
    monkeypatch.undo()
    fresh_process()
    assert {_root_format(backend, r) for r in roots} == {1}

    _equal(_frame(t), oracle)
    _equal(_frame(t, snapshot_id=after_first), at_first)
    # layers: x on 3 files, y on 3, the upsert's x on 1; each commit's small layers share one update file
    assert t.scan().state.update_layers == 3 + 3 + 1
    assert t.stats()["update_files"] == 3
    assert t.verify_index()["ok"]

    t.backfill(pa.table({"id": pa.array([1, 2000], pa.int64()), "x": [7.0, 8.0]}))  # one shard touched, the rest inherited
    oracle.loc[[1, 2000], "x"] = [7.0, 8.0]
    (new_root,) = _roots(backend) - roots
    assert _root_format(backend, new_root) == state.PACKED_FORMAT  # it lists the earlier commits' shared update files
    fresh_process()
    _equal(_frame(t), oracle)
    ice = t.refresh()
    inherited = set(t._state(ice, ice.current_snapshot()).shards.values())
    assert any("/shard-" in p for p in inherited) and any(p.endswith(new_root.rsplit("/", 1)[1]) for p in inherited)

    t.compact()
    t.expire_snapshots(datetime.now() + timedelta(seconds=1), retain_last=1)
    backend.lake.collect_garbage(older_than=timedelta(0))
    fresh_process()
    _equal(_frame(t), oracle)
    assert t.stats()["update_files"] == 0 and t.verify_index()["ok"]


@both_backends
def test_a_root_holds_its_commits_shards_and_a_fresh_process_reads_them_from_it(backend, fresh_process):
    """A commit's changed shards are rows of its root; a reader with nothing cached gets the root and
    those rows from that one file, and a later commit's root names the older root for shards it kept."""
    t = backend.lake.create_table("ns.inline", SCHEMA, primary_key="id")
    for lo in range(0, 4000, 1000):
        t.append(_rows(lo, lo + 1000))  # four data files
    t.backfill(pa.table({"id": pa.array([1, 1001, 2001, 3001], pa.int64()), "x": [-1.0, -2.0, -3.0, -4.0]}))
    first = t.refresh().current_snapshot().summary["featurelake.state"]
    rows = pq.read_table(pa.BufferReader(backend.read_bytes(first)))
    assert rows.num_rows == 4 and rows["rows"].to_pylist() == [1] * 4  # one entry per update file, each of one row
    t.backfill(pa.table({"id": pa.array([2], pa.int64()), "x": [-9.0]}))
    fresh_process()
    ice = t.refresh()
    current = t._state(ice, ice.current_snapshot())
    kept = {p for p in current.shards.values() if p != current.root_path}
    assert kept == {first}  # the three data files not touched again: still read from the first root
    assert sorted(len(es) for es in current.by_data_file().values()) == [1, 1, 1, 2]
    got = dict(zip(*t.read(columns=["id", "x"]).to_pydict().values()))
    want = {i: float(i) for i in range(4000)} | {1: -1.0, 1001: -2.0, 2001: -3.0, 3001: -4.0, 2: -9.0}
    assert got == want
