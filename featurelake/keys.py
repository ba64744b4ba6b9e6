"""Primary keys: validating them in input and finding where they live in a table.

Until the global key index lands, a key lookup reads the key columns of the
candidate data files only: files are pruned by the key's min/max statistics
(kept by the slim-metadata defaults) against the sorted input keys, and the
survivors are joined with the input in Arrow.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.conversions import from_bytes
from pyiceberg.expressions import And, GreaterThanOrEqual, LessThanOrEqual
from pyiceberg.table import FileScanTask

from featurelake import index, refs, sorting
from featurelake.errors import DuplicateKeyError, NullKeyError, SchemaMismatchError
from featurelake.livefiles import snapshot_files
from featurelake.schema import LOCATOR_FILE, LOCATOR_POS, arrow_schema

if TYPE_CHECKING:
    from pyiceberg.table import Table as IcebergTable
    from pyiceberg.table.snapshots import Snapshot

    from featurelake.read import Scan
    from featurelake.table import Table


def _rows(tbl: pa.Table, keys: Sequence[str], mask: pa.ChunkedArray | pa.Array, limit: int = 5) -> list:
    picked = tbl.select(list(keys)).filter(mask).slice(0, limit).to_pylist()
    return [r[keys[0]] if len(keys) == 1 else tuple(r[k] for k in keys) for r in picked]


def check_keys(tbl: pa.Table, keys: Sequence[str], what: str = "input") -> None:
    """Refuse null keys and keys repeated within ``tbl``."""
    for k in keys:
        col = tbl.column(k)
        if col.null_count:
            raise NullKeyError(
                f"{what} has {col.null_count} row(s) with a null primary key column {k!r}",
                count=col.null_count,
            )
    dups = duplicate_keys(tbl, keys)
    if dups.num_rows:
        shown = dups.slice(0, 5).to_pylist()
        examples = [r[keys[0]] if len(keys) == 1 else tuple(r[k] for k in keys) for r in shown]
        raise DuplicateKeyError(
            f"{what} repeats {dups.num_rows} primary key(s), e.g. {examples}", examples, count=dups.num_rows
        )


def conform_keys(tbl: pa.Table, key_fields: Sequence[pa.Field]) -> pa.Table:
    """``tbl`` with its key columns cast to the table's key types.

    Only lossless casts of a compatible type are made (int32 to int64, string
    to large string): a string, float or timestamp column is never turned
    into an integer key, and a value that does not fit is refused.
    """
    from featurelake.schema import _castable, cast_column

    wrong = [f"{f.name!r} is {tbl.column(f.name).type}, the key is {f.type}" for f in key_fields
             if not _castable(tbl.column(f.name).type, f.type)]
    if wrong:
        raise SchemaMismatchError("key column type does not match the table: " + "; ".join(wrong), [f.name for f in key_fields])
    for f in key_fields:
        i = tbl.column_names.index(f.name)
        tbl = tbl.set_column(i, pa.field(f.name, f.type), cast_column(tbl.column(i), f.type, f.name))
    return tbl


def duplicate_keys(tbl: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The keys occurring more than once in ``tbl``."""
    if tbl.num_rows < 2:
        return tbl.select(list(keys)).slice(0, 0)
    if len(keys) == 1 and pa.types.is_integer(tbl.column(keys[0]).type):
        values = tbl.column(keys[0]).to_numpy(zero_copy_only=False)
        if sorting.distinct_runs(values):  # keys in scan order: shown distinct in one pass, no sort
            return tbl.select(list(keys)).slice(0, 0)
        values = sorting.sort(values)
        repeated = values[1:][values[1:] == values[:-1]]
        return pa.table({keys[0]: pa.array(np.unique(repeated), tbl.column(keys[0]).type)})
    counts = tbl.select(list(keys)).group_by(list(keys)).aggregate([([], "count_all")])
    return counts.filter(pc.greater(counts["count_all"], 1)).select(list(keys))


def _key_bounds_filter(tbl: pa.Table, key: str):
    lo, hi = pc.min_max(tbl.column(key)).values()
    return And(GreaterThanOrEqual(key, lo.as_py()), LessThanOrEqual(key, hi.as_py()))


def candidate_tasks(scan: "Scan", tbl: pa.Table, key: str) -> list[FileScanTask]:
    """Data files whose key range holds at least one of the input keys."""
    field = scan.schema.find_field(key)
    col_type = tbl.column(key).type
    comparable = pa.types.is_integer(col_type) or pa.types.is_string(col_type) or pa.types.is_large_string(col_type)
    sorted_keys = np.sort(tbl.column(key).to_numpy(zero_copy_only=False)) if comparable else None
    out = []
    for task in scan.tasks():
        lower = (task.file.lower_bounds or {}).get(field.field_id)
        upper = (task.file.upper_bounds or {}).get(field.field_id)
        if lower is None or upper is None or sorted_keys is None:
            out.append(task)
            continue
        lo = from_bytes(field.field_type, lower)
        hi = from_bytes(field.field_type, upper)
        a, b = np.searchsorted(sorted_keys, [lo, hi], side="left")
        if b < len(sorted_keys) and sorted_keys[b] == hi:
            b += 1
        if b > a:
            out.append(task)
    return out


def locate(make_scan, tbl: pa.Table, keys: Sequence[str], only_files: set[str] | None = None) -> pa.Table:
    """The rows of the table holding ``tbl``'s keys, by scanning key columns: keys, ``_file``, ``_pos``.

    ``make_scan(columns, filter, with_locator)`` builds a snapshot-consistent
    scan; ``only_files`` limits it to those data files.
    """
    scan = make_scan(list(keys), _key_bounds_filter(tbl, keys[0]) if tbl.num_rows else None, True)
    if tbl.num_rows == 0:
        return scan.output_schema.empty_table()
    tasks = candidate_tasks(scan, tbl, keys[0])
    if only_files is not None:
        tasks = [t for t in tasks if t.file.file_path in only_files]
    probe = tbl.select(list(keys))
    parts = []
    for task in tasks:
        for batch in scan.read_file(task):
            found = pa.Table.from_batches([batch])
            if len(keys) == 1:
                mask = pc.is_in(found.column(keys[0]), value_set=probe.column(keys[0]).combine_chunks())
                hit = found.filter(mask)
            else:
                hit = found.join(probe, keys=list(keys), join_type="left semi")
            if hit.num_rows:
                parts.append(hit)
    if not parts:
        return scan.output_schema.empty_table()
    return pa.concat_tables(parts)


ROW = "__row"


def find(table: "Table", ice: "IcebergTable", snapshot: "Snapshot | None", key_table: pa.Table) -> pa.Table:
    """Where ``key_table``'s keys live at ``snapshot``: ``__row`` (row of ``key_table``), ``_file``, ``_pos``.

    Uses the global key index (cost grows with the batch); data files no
    index segment covers (another engine's writes) are scanned instead, and
    hashed (non-integer or composite) keys are verified against the data.
    ``_file`` is dictionary-encoded: one string per file, not per row.
    """
    keys = table.primary_key
    out_schema = pa.schema(
        [pa.field(ROW, pa.int64()), pa.field(LOCATOR_FILE, pa.dictionary(pa.int32(), pa.string())), pa.field(LOCATOR_POS, pa.int64())]
    )
    if snapshot is None or key_table.num_rows == 0:
        return out_schema.empty_table()
    schema = ice.metadata.schema()
    target = pa.schema([arrow_schema(schema, field_ids=False).field(k) for k in keys])
    key_table = pa.Table.from_arrays([key_table.column(k).cast(target.field(k).type) for k in keys], schema=target)
    live = set(snapshot_files(ice, snapshot))
    segments = table._state(ice, snapshot).index_segments
    parts = []
    if segments:
        rows, file_ids, names, pos = index.lookup(ice.io, segments, index.encode(key_table), live)
        if len(rows):
            files = pa.DictionaryArray.from_arrays(pa.array(file_ids, pa.int32()), pa.array(names, pa.string()))
            hits = pa.Table.from_arrays([pa.array(rows), files, pa.array(pos)], schema=out_schema)
            if not index.key_is_exact(schema, keys):
                hits = _verify(ice, hits, key_table, keys)
            parts.append(hits)
    uncovered = live - index.covered_files(ice.io, segments) if segments else live
    if uncovered:

        def make_scan(columns, filter, with_locator):
            return table.scan(columns, filter, branch=str(snapshot.snapshot_id), with_locator=with_locator, ice=ice)

        scanned = locate(make_scan, key_table, keys, only_files=uncovered)
        if scanned.num_rows:
            probe = key_table.append_column(ROW, pa.array(np.arange(key_table.num_rows)))
            scanned = scanned.cast(pa.schema([target.field(k) for k in keys] + list(scanned.schema)[len(keys):]))
            joined = probe.join(scanned, keys=list(keys), join_type="inner")
            parts.append(
                pa.Table.from_arrays(
                    [joined.column(ROW), joined.column(LOCATOR_FILE).combine_chunks().dictionary_encode(), joined.column(LOCATOR_POS)],
                    schema=out_schema,
                )
            )
    if not parts:
        return out_schema.empty_table()
    return pa.concat_tables(parts).unify_dictionaries() if len(parts) > 1 else parts[0]


def found_keys(found: pa.Table, key_table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The key values of ``find``'s hits."""
    return key_table.select(list(keys)).take(found.column(ROW))


def _verify(ice: "IcebergTable", hits: pa.Table, key_table: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Drop hash collisions: keep hits whose data row really holds the key."""
    keep = np.zeros(hits.num_rows, dtype=bool)
    files = hits.column(LOCATOR_FILE).combine_chunks()
    file_idx = files.indices.to_numpy(zero_copy_only=False)
    positions = hits.column(LOCATOR_POS).to_numpy()
    probe_rows = hits.column(ROW).to_numpy()
    for i, path in enumerate(files.dictionary.to_pylist()):
        rows = np.flatnonzero(file_idx == i)
        if not len(rows):
            continue
        actual = index.read_key_columns(ice, path, keys).take(pa.array(positions[rows]))
        wanted = key_table.take(pa.array(probe_rows[rows]))
        same = np.ones(len(rows), dtype=bool)
        for k in keys:
            same &= pc.fill_null(pc.equal(actual.column(k), wanted.column(k)), False).to_numpy(zero_copy_only=False)
        keep[rows[same]] = True
    return hits.filter(pa.array(keep))


def verify_index(table: "Table", branch: str = "main", snapshot_id: int | None = None) -> dict:
    """Check the index against the data: every live row found at its own place, no key twice."""
    ice = table.refresh()
    snap = refs.resolve(ice.metadata, branch, snapshot_id)
    keys = table.primary_key
    state = table._state(ice, snap)
    live = set(snapshot_files(ice, snap))
    truth = table.scan(keys, branch=str(snap.snapshot_id) if snap else branch, with_locator=True, ice=ice).to_table()
    found = find(table, ice, snap, truth.select(keys))
    # (key, file, row) triples: a hit at another key's row is wrong even though that row exists
    codes = index.encode(truth.select(keys))
    expected = set(zip(codes.tolist(), truth.column(LOCATOR_FILE).to_pylist(), truth.column(LOCATOR_POS).to_pylist()))
    got = set(
        zip(
            codes[found.column(ROW).to_numpy()].tolist(),
            found.column(LOCATOR_FILE).cast(pa.string()).to_pylist(),
            found.column(LOCATOR_POS).to_pylist(),
        )
    )
    covered = index.covered_files(ice.io, state.index_segments) if state.index_segments else set()
    dups = duplicate_keys(truth, keys)
    exact = index.key_is_exact(ice.schema(), keys)
    report = {
        "branch": branch,
        "rows": truth.num_rows,
        "segments": len(state.index_segments),
        "uncovered_files": len(live - covered),
        "missing": len(expected - got),
        "wrong": len(got - expected),
        "duplicate_keys": dups.num_rows,
        "duplicate_entries": index.duplicate_entries(ice.io, state.index_segments, live) if exact else 0,
    }
    report["ok"] = report["missing"] == report["wrong"] == report["duplicate_keys"] == report["duplicate_entries"] == 0
    return report


__all__ = ["check_keys", "conform_keys", "duplicate_keys", "locate", "find", "found_keys", "verify_index", "ROW", "LOCATOR_FILE", "LOCATOR_POS"]
