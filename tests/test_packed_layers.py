"""Small update layers of one commit packed into shared update files, one row group each.

Checked against a pandas oracle (the table's values with every backfill applied by hand), on the
embedded lake and on S3 + REST where storage matters:

* layout: a backfill of several data files writes one shared file, one row group per layer, the
  platform state names each row group; dense and sparse layers never share a file; a large layer
  keeps a file of its own; first read == cached read == oracle, with the layer cache off too;
* GC keeps a shared file while any retained snapshot of any ref references any of its row groups
  (some layers dropped by a delete or by compacting a branch), and deletes it once none does;
* branches: a backfill on a branch merged into main reads right on both refs after GC;
* a failed upload leaves the table readable and nothing of the failed commit behind;
* mixed state: whole-file layers (the format before packing, also a state pack written by hand
  with the old columns only) under packed layers read right;
* a read decodes its layers of a shared file in one call: the layer cache keeps and evicts them
  together, and one damaged row group fails (or, under a budget, skips) only its own data file.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from backends import both_backends

from featurelake import readfiles, state, updatefiles
from featurelake.health import table_health
from featurelake.errors import StorageError

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("x", pa.float64())])
FILES, PER_FILE = 4, 500
N = FILES * PER_FILE


def _table(lake, name: str = "ns.packed"):
    """FILES data files of PER_FILE rows (ids in order) and the oracle of the table."""
    t = lake.create_table(name, SCHEMA, primary_key="id", partition_by=[])
    ids = np.arange(N, dtype=np.int64)
    x = ids * 0.5
    for f in range(FILES):
        part = slice(f * PER_FILE, (f + 1) * PER_FILE)
        t.append(pa.table({"id": ids[part], "x": x[part]}, schema=SCHEMA))
    return t, pd.DataFrame({"x": x}, index=pd.Index(ids, name="id"))


def _backfill(t, oracle: pd.DataFrame, column: str, ids: np.ndarray, values: np.ndarray, branch: str = "main") -> None:
    t.backfill(pa.table({"id": pa.array(ids, pa.int64()), column: pa.array(values)}), branch=branch)
    if column not in oracle:
        oracle[column] = np.nan
    oracle.loc[ids, column] = values


def _check(t, oracle: pd.DataFrame, branch: str = "main") -> None:
    got = t.read(branch=branch).to_pandas().set_index("id").sort_index()
    pd.testing.assert_frame_equal(got[list(oracle.columns)], oracle.sort_index(), check_dtype=False)


def _files(t, branch: str = "main") -> set[str]:
    return {e.update_file for e in t.scan(branch=branch).state.entries()}


def _gc(lake, t) -> None:
    t.expire_snapshots(datetime.now(timezone.utc) + timedelta(seconds=1), retain_last=1)
    lake.collect_garbage(older_than=timedelta(0))


@both_backends
def test_a_backfill_packs_its_small_layers_into_one_file_one_row_group_each(backend, fresh_process):
    t, oracle = _table(backend.lake)
    rng = np.random.default_rng(1)
    ids = np.sort(rng.choice(N, 600, replace=False))
    _backfill(t, oracle, "x", ids, rng.standard_normal(600))
    report = t.last_update_report
    assert report.data_files_touched == FILES and report.update_files == 1
    entries = list(t.scan().state.entries())
    (shared,) = {e.update_file for e in entries}
    stored = backend.parquet(shared)
    assert stored.metadata.num_row_groups == FILES
    assert sorted(e.row_group for e in entries) == list(range(FILES))
    for e in entries:  # each entry is exactly its row group, sized as stored
        group = stored.metadata.row_group(e.row_group)
        assert group.num_rows == e.rows and e.file_bytes == len(backend.read_bytes(shared))
        assert e.bytes == sum(group.column(j).total_compressed_size for j in range(group.num_columns))
        positions = stored.read_row_group(e.row_group).column("_pos").to_numpy()
        assert np.all(np.diff(positions) > 0) and 0 <= positions[0] and positions[-1] < PER_FILE
    assert t.stats()["update_files"] == 1 and table_health(t)["update_files"] == 1
    assert t.stats()["update_bytes"] == sum(e.bytes for e in entries)
    fresh_process()
    scan = t.scan(columns=["id", "x"])
    scan.to_table()
    assert scan.report.update_files_read == 1 and scan.report.update_layers_read == FILES
    _check(t, oracle)  # first read (a fresh process)
    _check(t, oracle)  # cached


@both_backends
def test_dense_and_sparse_layers_never_share_a_file_and_large_ones_keep_their_own(backend, monkeypatch):
    t, oracle = _table(backend.lake)
    rng = np.random.default_rng(2)
    ids = np.concatenate([np.arange(0, 2 * PER_FILE), np.arange(2 * PER_FILE, N, 3)])  # files 0, 1 whole: dense
    _backfill(t, oracle, "y", ids, rng.standard_normal(len(ids)))
    entries = list(t.scan().state.entries())
    dense = {e.update_file for e in entries if e.dense}
    sparse = {e.update_file for e in entries if not e.dense}
    assert len(dense) == len(sparse) == 1 and not dense & sparse
    assert pq.ParquetFile(pa.BufferReader(backend.read_bytes(next(iter(dense))))).schema_arrow.names == ["y"]
    assert t.last_update_report.update_files == 2
    _check(t, oracle)
    # a layer above the threshold keeps a file of its own (row group None); the small ones still share
    monkeypatch.setattr(updatefiles, "PACK_PART_BYTES", 8 * 200)
    ids = np.concatenate([np.arange(0, 400), np.arange(PER_FILE, N, 20)])  # 400 rows (6.4 KB) in file 0, 25 in the others
    _backfill(t, oracle, "x", ids, rng.standard_normal(len(ids)))
    latest = [e for e in t.scan().state.entries() if e.snapshot_id == t.last_update_report.snapshot_id]
    own = [e for e in latest if e.row_group is None]
    assert len(own) == 1 and own[0].rows == 400 and own[0].file_bytes is None
    assert len({e.update_file for e in latest if e.row_group is not None}) == 1
    readfiles.forget_files(_files(t))
    _check(t, oracle)


def test_the_layer_cache_keys_row_groups_apart_and_forget_drops_them_all(lake, monkeypatch):
    t, oracle = _table(lake)
    rng = np.random.default_rng(3)
    ids = np.sort(rng.choice(N, 400, replace=False))
    _backfill(t, oracle, "x", ids, rng.standard_normal(400))
    (shared,) = _files(t)
    readfiles.forget_files([shared])
    _check(t, oracle)
    keys = [k for k in readfiles.LAYERS.items if readfiles._names_path(k, {shared})]
    assert sorted(k[-1] for k in keys) == list(range(FILES))  # one decoded layer per row group
    readfiles.forget_files(["file://" + shared])
    assert not any(readfiles._names_path(k, {shared}) for k in readfiles.LAYERS.items)
    monkeypatch.setattr(readfiles, "LAYERS", readfiles.SizedLRU(0))  # nothing kept: every read decodes again
    _check(t, oracle)
    _check(t, oracle)
    one = t.read(filter=f"id >= {PER_FILE} and id < {2 * PER_FILE}").to_pandas().set_index("id").sort_index()
    pd.testing.assert_frame_equal(one, oracle.loc[PER_FILE:2 * PER_FILE - 1], check_dtype=False)


@both_backends
def test_gc_keeps_a_shared_file_while_any_ref_references_any_of_its_row_groups(backend):
    lake = backend.lake
    t, oracle = _table(lake)
    rng = np.random.default_rng(4)
    ids = np.sort(rng.choice(N, 800, replace=False))
    _backfill(t, oracle, "x", ids, rng.standard_normal(800))
    (shared,) = _files(t)
    name = backend.name_of(shared)
    # main drops one data file's layer (the delete rewrites that file), keeps the other three
    t.delete(f"id < {PER_FILE // 2}")
    oracle = oracle.loc[PER_FILE // 2:]
    assert _files(t) == {shared} and t.scan().state.update_layers == FILES - 1
    _gc(lake, t)
    assert name in backend.files()
    _check(t, oracle)
    # a compacted branch references none of it, main still does
    t.create_branch("c")
    t.compact(branch="c")
    assert not _files(t, "c") and _files(t) == {shared}
    _gc(lake, t)
    assert name in backend.files()
    readfiles.forget_files([shared])
    _check(t, oracle)
    _check(t, oracle, branch="c")
    # main compacted too: the fork point of main and c (kept for merges) still references three row groups
    t.compact()
    _gc(lake, t)
    assert name in backend.files()
    _check(t, oracle)
    _check(t, oracle, branch="c")
    # once no retained snapshot references any row group, GC deletes it
    t.drop_branch("c")
    _gc(lake, t)
    assert name not in backend.files()
    _check(t, oracle)


@both_backends
def test_a_packed_backfill_on_a_branch_merges_and_survives_gc(backend):
    lake = backend.lake
    t, oracle = _table(lake)
    rng = np.random.default_rng(5)
    t.create_branch("exp")
    exp = oracle.copy()
    ids = np.sort(rng.choice(N, 700, replace=False))
    _backfill(t, exp, "z", ids, rng.standard_normal(700), branch="exp")
    main_ids = np.arange(0, N, 11)
    _backfill(t, oracle, "x", main_ids, -main_ids * 1.0)  # main moves on meanwhile: a three-way merge
    (shared,) = _files(t, "exp") - _files(t)
    t.merge("exp", into="main")
    merged = oracle.copy()
    merged["z"] = exp["z"]
    _gc(lake, t)
    assert backend.name_of(shared) in backend.files()
    readfiles.forget_files(_files(t) | _files(t, "exp"))
    _check(t, merged)
    _check(t, exp, branch="exp")
    assert len([e for e in t.scan().state.entries() if e.update_file == shared]) == FILES


@both_backends
@pytest.mark.parametrize("pack", [False, True], ids=["own-files", "packed"])
def test_a_failed_upload_leaves_the_table_readable_and_nothing_referenced(backend, monkeypatch, pack):
    lake = backend.lake
    t, oracle = _table(lake)
    if not pack:
        monkeypatch.setattr(updatefiles, "PACK_PART_BYTES", 0)
    before_files = backend.files()
    before = t.refresh().current_snapshot().snapshot_id
    original = updatefiles.upload_update_file
    calls = []

    def fails(ice, path, data):
        calls.append(path)
        original(ice, path, data)  # its bytes are stored, then the store "fails"
        if path == calls[0]:  # the first upload started (they run in parallel)
            raise OSError("connection reset")
        return data.size

    monkeypatch.setattr(updatefiles, "upload_update_file", fails)
    with pytest.raises(StorageError, match="connection reset"):
        t.backfill(pa.table({"id": pa.array([5, 505, 1005, 1505], pa.int64()), "x": [1.0, 2.0, 3.0, 4.0]}))
    assert len(set(calls)) == (1 if pack else FILES), calls
    assert t.refresh().current_snapshot().snapshot_id == before
    assert backend.files() == before_files  # the failed commit's files were removed
    _check(t, oracle)


@both_backends
def test_whole_file_layers_under_packed_layers_read_right(backend, monkeypatch, fresh_process):
    t, oracle = _table(backend.lake)
    rng = np.random.default_rng(6)
    monkeypatch.setattr(updatefiles, "PACK_PART_BYTES", 0)  # the layout before packing: a file per layer
    old_ids = np.sort(rng.choice(N, 900, replace=False))
    _backfill(t, oracle, "x", old_ids, rng.standard_normal(900))
    monkeypatch.undo()
    new_ids = np.sort(rng.choice(N, 900, replace=False))  # overlapping rows: the packed layer wins
    _backfill(t, oracle, "x", new_ids, rng.standard_normal(900))
    entries = list(t.scan().state.entries())
    assert sum(e.row_group is None for e in entries) == FILES and sum(e.row_group is not None for e in entries) == FILES
    assert t.stats()["update_files"] == FILES + 1
    fresh_process()
    _check(t, oracle)
    _check(t, oracle)
    t.compact()
    _check(t, oracle)
    assert t.stats()["update_files"] == 0


def test_state_packs_without_the_row_group_columns_decode_as_whole_files():
    """A pack written before packing (the eight old columns, by hand) and one written today of whole-file
    entries have no row-group columns and decode with row_group None; packed entries round-trip."""
    whole = state.UpdateEntry("d0", "u0", 1, (2,), False, 10, 100, 7)
    rows = {f.name: [getattr(whole, f.name) if f.name != "field_ids" else [2]] for f in state._SHARD_SCHEMA}
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pydict(rows, schema=state._SHARD_SCHEMA), sink)
    by_hand = pq.read_table(pa.BufferReader(sink.getvalue()))
    assert by_hand.column_names == state._SHARD_SCHEMA.names
    assert state._entries_by_file(by_hand) == {"d0": [whole]}
    today = pq.read_table(pa.BufferReader(state._encode_entries([whole])))
    assert "row_group" not in today.column_names and state._entries_by_file(today) == {"d0": [whole]}
    parts = [state.UpdateEntry(f"d{i}", "u1", 2, (2,), True, 10, 40, 8, row_group=i, file_bytes=300) for i in range(3)]
    packed = pq.read_table(pa.BufferReader(state._encode_entries([whole, *parts])))
    assert packed.column("row_group").to_pylist() == [None, 0, 1, 2]
    decoded = state._entries_by_file(packed)
    assert decoded == {"d0": [whole, parts[0]], "d1": [parts[1]], "d2": [parts[2]]}


@both_backends
def test_shared_files_above_the_whole_read_size_are_read_by_row_group(backend, monkeypatch, fresh_process):
    """Above ``layerload.SHARED_WHOLE_BYTES`` a shared file is memory-mapped locally, or read by row
    group through a fragment of known size on an object store: the same rows as the whole-file path."""
    from featurelake import layerload

    t, oracle = _table(backend.lake)
    rng = np.random.default_rng(7)
    ids = np.sort(rng.choice(N, 700, replace=False))
    _backfill(t, oracle, "x", ids, rng.standard_normal(700))
    dense_ids = np.arange(N)
    _backfill(t, oracle, "w", dense_ids, rng.standard_normal(N))
    monkeypatch.setattr(layerload, "SHARED_WHOLE_BYTES", 0)
    fresh_process()
    _check(t, oracle)
    _check(t, oracle)
    subset = t.read(columns=["id", "w"], filter=f"id < {PER_FILE}").to_pandas().set_index("id").sort_index()
    pd.testing.assert_series_equal(subset["w"], oracle["w"].loc[: PER_FILE - 1], check_dtype=False)


def test_a_state_with_shared_files_says_format_3_and_a_newer_format_is_refused(lake, tmp_path):
    """A featurelake that predates packing would read a shared file whole as one layer; a root holding
    shared layers therefore says format 3, and every reader refuses a format newer than it knows."""
    from featurelake.errors import UnsupportedFormatError
    import json

    t, oracle = _table(lake)
    _backfill(t, oracle, "x", np.arange(0, N, 3), np.arange(0, N, 3) * 2.0)
    io = t.iceberg.io

    def root(path):
        text, entries = state._decode_root(state._root_bytes(io, path, None))
        return json.loads(text), entries

    raw, entries = root(t.scan().state.root_path)
    assert raw["format"] == state.PACKED_FORMAT == 3 and raw["shared"]
    newer = tmp_path / "root-from-the-future.parquet"
    flat = [e for es in (entries or {}).values() for e in es]
    newer.write_bytes(state._encode_entries(flat, json.dumps({**raw, "format": 99})).to_pybytes())
    with pytest.raises(UnsupportedFormatError, match="format 99"):
        state._load_root(io, str(newer))
    t.compact()  # no shared layer left: the state says the format before packing again
    raw, _ = root(t.scan().state.root_path)
    assert raw["format"] == state.FORMAT == 2 and "shared" not in raw
    _check(t, oracle)


def test_layers_decoded_together_are_cached_and_evicted_together():
    """The layers of one shared file decoded in one call are slices of the same columns: the cache
    keeps them as one (evicted together, counted at their own bytes; too big together: none kept)."""
    cache = readfiles.SizedLRU(1000)
    cache.put_all([(("f", 0), "a", 40), (("f", 1), "b", 40), (("f", 2), "c", 40)])
    cache.put(("g", None), "d", 100)
    assert cache.bytes == 220 and cache.get(("f", 1)) == "b"
    for i in range(8):  # fill up: the oldest go first; touching one of a group keeps none of it alone
        cache.put(("h", i), "e", 110)
    assert all(cache.get(("f", i)) is None for i in range(3))
    assert cache.bytes == sum(n for _, n in cache.items.values()) <= 1000 and not cache.groups
    cache.put_all([(("f", 0), "a", 40), (("f", 1), "b", 40)])
    cache.drop_if(lambda key: key == ("f", 1))  # forgetting one forgets what was decoded with it
    assert cache.get(("f", 0)) is None and cache.bytes == sum(n for _, n in cache.items.values()) and not cache.groups
    cache.put_all([(("f", 0), "a", 100), (("f", 1), "b", 100)])  # together over an eighth of the budget
    assert cache.get(("f", 0)) is None and cache.get(("f", 1)) is None


def test_a_damaged_row_group_of_a_shared_file_fails_only_its_own_data_file(lake):
    """A first read decodes all its layers of a shared file in one call; when one row group is
    damaged (positions out of order), only the data file of that layer fails (or is skipped under a
    budget), the others read right."""
    t, oracle = _table(lake)
    rng = np.random.default_rng(17)
    ids = np.sort(rng.choice(N, 600, replace=False))
    _backfill(t, oracle, "x", ids, rng.standard_normal(600))
    (shared,) = _files(t)
    path = shared.replace("file://", "")
    f = pq.ParquetFile(path)
    groups = [f.read_row_group(i) for i in range(f.num_row_groups)]
    assert len(groups) == FILES
    bad = 1
    groups[bad] = groups[bad].take(pa.array(np.arange(groups[bad].num_rows)[::-1].copy()))
    with pq.ParquetWriter(path + ".tmp", f.schema_arrow) as out:
        for g in groups:
            out.write_table(g, row_group_size=g.num_rows)
    import os

    os.replace(path + ".tmp", path)
    readfiles.forget_files([shared])
    from featurelake.errors import CorruptFileError

    with pytest.raises(CorruptFileError, match="out of order"):
        t.read()
    readfiles.forget_files([shared])
    with pytest.warns(UserWarning, match="skipping bad file"):
        got = t.read(max_bad_file_ratio=0.25).to_pandas().set_index("id").sort_index()
    assert t.last_read_report.skipped_rows == PER_FILE and len(got) == N - PER_FILE
    expected = oracle.drop(index=range(bad * PER_FILE, (bad + 1) * PER_FILE))
    pd.testing.assert_frame_equal(got[list(oracle.columns)], expected.sort_index(), check_dtype=False)


@both_backends
def test_value_columns_without_nulls_are_stored_required_and_with_nulls_optional(backend):
    """An update file stores a value column with no null in any of its layers as a required Parquet
    column (decoded without definition levels); one null anywhere makes it optional for the file.
    Either way the table reads like the oracle, first read and cached."""
    t, oracle = _table(backend.lake, "ns.required")
    rng = np.random.default_rng(29)
    ids = np.sort(rng.choice(N, 300, replace=False))
    _backfill(t, oracle, "x", ids, rng.standard_normal(300))
    with_null = pa.array(rng.standard_normal(200), mask=np.arange(200) == 150)  # one null, in one data file's layer
    more = np.sort(rng.choice(N, 200, replace=False))
    t.backfill(pa.table({"id": pa.array(more, pa.int64()), "x": with_null}))
    oracle.loc[more, "x"] = with_null.to_numpy(zero_copy_only=False)
    first, second = (sorted({e.update_file for e in t.scan().state.entries() if e.seq == seq}) for seq in (1, 2))
    assert len(first) == len(second) == 1
    schemas = [backend.parquet(f[0]).schema_arrow for f in (first, second)]
    assert not schemas[0].field("x").nullable and schemas[1].field("x").nullable
    assert backend.parquet(first[0]).metadata.num_row_groups == FILES
    for _ in range(2):
        readfiles.forget_files(first + second)
        _check(t, oracle)
        _check(t, oracle)


def test_a_shared_files_layers_are_decoded_in_runs_the_layer_cache_keeps(monkeypatch):
    """Layers decoded by one call are kept only together, so a run takes at most GROUP_BYTES stored
    bytes and a 32nd of the cache's budget: a large shared file's layers stay cached in runs."""
    from types import SimpleNamespace

    from featurelake import layerplan

    slot = SimpleNamespace(wanted=[SimpleNamespace(bytes=b) for b in (3 << 20, 3 << 20, 3 << 20, 1 << 20, 20 << 20, 1)])
    claimed = [(slot, i) for i in range(6)]
    runs = lambda: [[i for _, i in run] for run in layerplan._chunks(claimed)]  # noqa: E731
    monkeypatch.setattr(readfiles, "LAYERS", readfiles.SizedLRU(1 << 30))
    assert runs() == [[0, 1], [2, 3], [4], [5]]  # 8 MiB a run; a layer above it alone
    monkeypatch.setattr(readfiles, "LAYERS", readfiles.SizedLRU(128 << 20))
    assert runs() == [[0], [1], [2, 3], [4], [5]]  # a 32nd of 128 MiB: 4 MiB a run
    monkeypatch.setattr(readfiles, "LAYERS", readfiles.SizedLRU(0))
    assert runs() == [[0, 1], [2, 3], [4], [5]]  # nothing kept: as large as a run goes
