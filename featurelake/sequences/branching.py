"""Merging branches of an event table: an append-only union of the events both sides added.

Why its own merge: events have no natural primary key. A sequence table keys
its rows by an event id -- assigned by ``append`` (synthetic) or supplied by the
caller (a dedupe key). The generic merge (:mod:`featurelake.merge`) refuses any
key both sides inserted, which is right for a caller's ids (the same event
twice) but wrong for synthetic ids: they only number events, and two branches
that appended since they forked may have numbered different events alike
(events appended before ids were allocated table-wide, or two appends on two
branches racing). Here:

* ids both sides hold are found from the files' id ranges (manifest
  statistics) first, and only overlapping files are read -- no key index;
* with the caller's ids a duplicate is a :class:`MergeConflictError` naming
  the ids, and nothing is written;
* with synthetic ids the source's clashing files are rewritten with fresh ids
  above every id in the table (their rows, update files merged, in order), and
  the merge commits the union;
* everything else (column updates, removed files, schema checks, the merge
  record that lets a second merge find nothing new) is the generic merge's.
"""
from __future__ import annotations

import itertools
import uuid
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.conversions import from_bytes
from pyiceberg.manifest import DataFile
from pyiceberg.table import Table as IcebergTable

from featurelake import refs
from featurelake.commit import cleanup_on_failure, optimistic
from featurelake.errors import MergeConflictError
from featurelake.merge import ChangeSet, _replay, snapshot_files, start_merge

if TYPE_CHECKING:
    from featurelake.sequences.table import SequenceTable


def _id_range(ice: IcebergTable, f: DataFile, field: Any) -> tuple[Any, Any] | None:
    lo = (f.lower_bounds or {}).get(field.field_id)
    hi = (f.upper_bounds or {}).get(field.field_id)
    if lo is None or hi is None:
        return None
    return from_bytes(field.field_type, lo), from_bytes(field.field_type, hi)


def _overlaps(a: tuple | None, b: tuple | None) -> bool:
    return a is None or b is None or (a[0] <= b[1] and b[0] <= a[1])


def _ids_of(ice: IcebergTable, path: str, column: str) -> pa.Array:
    from featurelake.index import read_key_columns

    return read_key_columns(ice, path, [column]).column(0).combine_chunks()


def duplicate_event_ids(
    st: "SequenceTable", ice: IcebergTable, target_files: dict[str, DataFile], added: dict[str, DataFile]
) -> dict[str, pa.Array]:
    """Source file -> the event ids in it that a target file also holds (files compared by id range first)."""
    field = ice.schema().find_field(st.event_id)
    ranges = {p: _id_range(ice, f, field) for p, f in target_files.items()}
    out: dict[str, pa.Array] = {}
    target_ids: dict[str, pa.Array] = {}
    for path, f in added.items():
        mine = _id_range(ice, f, field)
        near = [p for p, r in ranges.items() if _overlaps(mine, r)]
        if not near:
            continue
        ids = _ids_of(ice, path, st.event_id)
        for p in near:
            if p not in target_ids:
                target_ids[p] = _ids_of(ice, p, st.event_id)
            hit = ids.filter(pc.is_in(ids, value_set=target_ids[p]))
            if len(hit):
                out[path] = pa.concat_arrays([out[path], hit]) if path in out else hit
    return out


def _renumbered(st: "SequenceTable", ice: IcebergTable, src, changes: ChangeSet, clashing: set[str]):
    """The source's clashing files rewritten with fresh ids; (written files, their keys, changes without them)."""
    from featurelake.rewrite import merged_rows, rewrite_scan, write_files

    scan = rewrite_scan(st, ice, src)
    tasks = [t for t in scan.tasks() if t.file.file_path in clashing]
    parts = [merged_rows(scan, t) for t in tasks]
    rows = pa.concat_tables(parts)
    eid = st.event_id
    order = np.argsort(rows.column(eid).to_numpy(), kind="stable")  # ids keep their relative order
    rows = rows.take(pa.array(order))
    base = st._next_event_id(ice=ice)  # above every id of every branch and tag
    rows = rows.set_column(rows.schema.get_field_index(eid), eid,
                           pa.array(np.arange(base, base + rows.num_rows, dtype=np.int64)))
    written = write_files(ice, rows, uuid.uuid4(), itertools.count(0))
    keys = {w.data_file.file_path: (w.rows.select([eid]) if w.rows is not None else None) for w in written}
    keep = ChangeSet(
        added_files={p: f for p, f in changes.added_files.items() if p not in clashing},
        removed_files=dict(changes.removed_files),
        added_updates=[e for e in changes.added_updates if e.data_file not in clashing],  # folded into the rows
        removed_updates=list(changes.removed_updates),
    )
    for w in written:
        keep.added_files[w.data_file.file_path] = w.data_file
    return written, keys, keep


def merge_events(st: "SequenceTable", source: str | int, into: str = refs.MAIN) -> int:
    """Merge branch (or tag or snapshot) ``source`` of an event table into branch ``into``: the union of both sides' events.

    Returns the new head of ``into``. Raises MergeConflictError naming the ids
    when the table's event ids are the caller's and both sides added the same
    id (nothing written), or when both sides changed the same column of the
    same data file (as the generic merge does).
    """
    written_paths: list[str] = []
    landed: list[int] = []

    def attempt(ice: IcebergTable) -> int:
        start = start_merge(st, ice, source, into)
        if start.head is not None:
            return start.head
        src, tgt, src_changes = start.src, start.tgt, start.changes
        target_files = snapshot_files(ice, tgt)
        target_files = {p: f for p, f in target_files.items() if p not in src_changes.removed_files}
        added = {p: f for p, f in src_changes.added_files.items() if p not in target_files}
        dupes = duplicate_event_ids(st, ice, target_files, added)
        index_new = None
        if dupes:
            if not st.synthetic_event_id:
                ids = pa.concat_arrays(list(dupes.values()))
                examples = ids.slice(0, 5).to_pylist()
                raise MergeConflictError(
                    f"cannot merge {source!r} into {into!r}: both sides added {len(ids)} event(s) with the same "
                    f"{st.event_id!r} since they forked, e.g. {examples}; delete them on one side first",
                    [(p, st.event_id, f"both sides added event id {i!r}") for p, a in dupes.items() for i in a.slice(0, 5).to_pylist()],
                    keys=examples,
                )
            written, index_new, src_changes = _renumbered(st, ice, src, src_changes, set(dupes))
            written_paths.extend(w.data_file.file_path for w in written)
        sid = _replay(st, ice, tgt, src_changes, into, f"merge {source}", merged_from=src.snapshot_id,
                      index_from=src, index_new=index_new)
        landed.append(sid)
        return sid

    ice0 = st.refresh()
    with cleanup_on_failure(ice0, written_paths, landed=lambda: bool(landed)):
        return optimistic(st.refresh, attempt, f"merge {source} into {st.name}@{into}")
