"""Rewriting data files: removing rows, and folding update files into new files.

A data file that has update files cannot be handed to pyiceberg's
copy-on-write delete: the rewritten file would lose its updates. Here a file
is always rewritten from its *merged* rows, and its update entries leave the
platform state in the same commit.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import BooleanExpression
from pyiceberg.io.pyarrow import _dataframe_to_data_files
from pyiceberg.manifest import DataFile
from pyiceberg.table import FileScanTask
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from featurelake.datafiles import WrittenFile, _stats_field_ids, schema_facts, write_rows
from featurelake.schema import LOCATOR_POS
from featurelake.state import StateWriter

if TYPE_CHECKING:
    from featurelake.table import Table


@dataclass
class Removal:
    """Data files to remove and their rewritten replacements."""

    removed: list[DataFile] = field(default_factory=list)
    added: list[DataFile] = field(default_factory=list)
    rows_removed: int = 0

    @property
    def empty(self) -> bool:
        return not self.removed and not self.added


def rewrite_scan(table: "Table", ice: IcebergTable, head: Snapshot, with_locator: bool = False):
    """A scan of every column (hidden ones too) of ``head`` in the current schema, for rewriting files."""
    # By id as a ref, not as snapshot_id=: the current schema, so rewritten files carry every column.
    return table.scan(branch=str(head.snapshot_id), with_locator=with_locator, ice=ice, include_hidden=True)


def merged_rows(scan, task: FileScanTask) -> pa.Table:
    """Every row of one data file, update files merged (``scan`` from ``rewrite_scan``)."""
    return pa.Table.from_batches(list(scan.read_file(task)), schema=scan.output_schema)


def write_data_files(
    ice: IcebergTable, rows: pa.Table, write_uuid=None, counter=None, *, metadata=None, target_file_bytes: int | None = None,
    column_order: list[str] | None = None,
) -> list[DataFile]:
    """Write rows (in the table's current schema) as data files; the one writer every write uses.

    See :func:`write_files`; this returns only the DataFiles.
    """
    return [w.data_file for w in write_files(ice, rows, write_uuid, counter, metadata=metadata,
                                             target_file_bytes=target_file_bytes, column_order=column_order)]


def write_files(
    ice: IcebergTable, rows: pa.Table, write_uuid=None, counter=None, *, metadata=None, target_file_bytes: int | None = None,
    column_order: list[str] | None = None,
) -> list[WrittenFile]:
    """Write rows (in the table's current schema) as data files, keeping each file's rows at hand.

    ``column_order`` (column names) is the physical order of the files' columns
    (column placement); readers match columns by field id, so only I/O changes.
    ``metadata`` is the table metadata to write under (a transaction's, when
    the schema changes in the same commit). Column sizes and counts are kept
    only for the columns that keep statistics (key and partition sources):
    pyiceberg records them for every column even with metrics off, and on a
    table with thousands of columns they dominate the manifests. The Parquet
    encoding itself is featurelake.datafiles'.
    """
    if rows.num_rows == 0:
        return []
    meta = metadata or ice.metadata
    if target_file_bytes is not None:
        props = dict(meta.properties, **{"write.target-file-size-bytes": str(target_file_bytes)})
        meta = meta.model_copy(update={"properties": props})
    if column_order is not None:
        meta = _reordered(meta, column_order)
    facts = schema_facts(meta)
    target = facts.arrow
    by_name = dict(zip(rows.column_names, rows.columns))
    rows = pa.Table.from_arrays([_as(by_name, rows.num_rows, f) for f in target], schema=target)
    rows = sort_rows(meta, rows)
    if not facts.plain_names:  # names Parquet cannot hold as they are: pyiceberg's writer renames them
        files = list(_dataframe_to_data_files(meta, rows, ice.io, write_uuid=write_uuid, counter=counter or itertools.count(0)))
        for f in files:
            f.spec_id = meta.default_spec_id  # as a manifest read sets it (merge, revert use it)
        written = [WrittenFile(f, None) for f in files]
    else:
        written = write_rows(meta, ice.io, rows, write_uuid, counter)
    keep = _stats_field_ids(meta)
    if keep is not None:
        for w in written:
            f = w.data_file
            for attr, pos in _COUNT_FIELDS.items():
                values = getattr(f, attr, None)
                if values and f[pos] is values:  # DataFile is a positional record without setters
                    f[pos] = {k: v for k, v in values.items() if k in keep}
    return written


def _as(columns: dict, num_rows: int, f: pa.Field) -> pa.ChunkedArray | pa.Array:
    """Column ``f`` of ``columns`` (name -> column) in ``f``'s type (nulls when absent)."""
    col = columns.get(f.name)
    if col is None:
        return pa.nulls(num_rows, f.type)
    return col if col.type.equals(f.type) else col.cast(f.type)


def _reordered(meta, order: list[str]):
    """``meta`` with its current schema's top-level fields in ``order`` (same ids, same schema id)."""
    from pyiceberg.schema import Schema

    schema = meta.schema()
    names = [f.name for f in schema.fields]
    placed = [n for n in order if n in names]
    fields = [schema.find_field(n) for n in placed + [n for n in names if n not in set(placed)]]
    moved = Schema(*fields, schema_id=schema.schema_id, identifier_field_ids=schema.identifier_field_ids)
    schemas = [moved if s.schema_id == schema.schema_id else s for s in meta.schemas]
    return meta.model_copy(update={"schemas": schemas})


_COUNT_FIELDS = {"column_sizes": 6, "value_counts": 7, "null_value_counts": 8, "nan_value_counts": 9}


def sort_rows(meta, rows: pa.Table) -> pa.Table:
    """Rows in the table's declared sort order (identity fields), so similar rows sit together.

    Every writer goes through here, so appends, upserts, rewrites and
    compaction all keep the order (Meta's row reordering: grouping a user's
    rows makes them compress better).
    """
    from pyiceberg.transforms import IdentityTransform

    order = meta.sort_order()
    keys = []
    for sort_field in order.fields:
        if not isinstance(sort_field.transform, IdentityTransform):
            continue
        name = meta.schema().find_column_name(sort_field.source_id)
        if name in rows.column_names:
            direction = "descending" if sort_field.direction.value == "desc" else "ascending"
            keys.append((name, direction, "at_start" if sort_field.null_order.value == "nulls-first" else "at_end"))
    if not keys or rows.num_rows < 2:
        return rows
    return rows.take(pc.sort_indices(rows, sort_keys=keys))


def plan_removal(
    table: "Table", ice: IcebergTable, head: Snapshot, filter: BooleanExpression, write_uuid, counter, writer: StateWriter
) -> Removal:
    """Which files to drop or rewrite so that no row matching ``filter`` remains at ``head``.

    Rewritten files' update entries leave ``writer``'s state.
    """
    probe = table.scan([], filter, branch=str(head.snapshot_id), with_locator=True, ice=ice)
    full = rewrite_scan(table, ice, head, with_locator=True)
    removal = Removal()
    for task in probe.tasks():
        matched = [b.column(LOCATOR_POS) for b in probe.read_file(task)]
        hits = sum(len(m) for m in matched)
        if hits == 0:
            continue
        removal.removed.append(task.file)
        removal.rows_removed += hits
        writer.drop_data_file(task.file.file_path)
        if hits == task.file.record_count:
            continue
        rows = merged_rows(full, task)
        gone = pa.chunked_array(matched).combine_chunks()
        keep = rows.filter(pc.invert(pc.is_in(rows.column(LOCATOR_POS), value_set=gone)))
        removal.added.extend(write_data_files(ice, keep, write_uuid, counter))
    return removal
