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

from featurelake.errors import DuplicateKeyError, NullKeyError
from featurelake.schema import LOCATOR_FILE, LOCATOR_POS

if TYPE_CHECKING:
    from featurelake.read import Scan


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


def duplicate_keys(tbl: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The keys occurring more than once in ``tbl``."""
    if tbl.num_rows < 2:
        return tbl.select(list(keys)).slice(0, 0)
    if len(keys) == 1:
        col = tbl.column(keys[0])
        if pc.count_distinct(col).as_py() == tbl.num_rows:
            return tbl.select(list(keys)).slice(0, 0)
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


def locate(make_scan, tbl: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The rows of the table holding ``tbl``'s keys: key columns plus ``_file`` and ``_pos``.

    ``make_scan(columns, filter, with_locator)`` builds a snapshot-consistent scan.
    """
    if tbl.num_rows == 0:
        return pa.table({})
    scan = make_scan(list(keys), _key_bounds_filter(tbl, keys[0]), True)
    tasks = candidate_tasks(scan, tbl, keys[0])
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


def existing_keys(make_scan, tbl: pa.Table, keys: Sequence[str]) -> pa.Table:
    return locate(make_scan, tbl, keys).select(list(keys)) if tbl.num_rows else tbl.select(list(keys))


__all__ = ["check_keys", "duplicate_keys", "locate", "existing_keys", "LOCATOR_FILE", "LOCATOR_POS"]
