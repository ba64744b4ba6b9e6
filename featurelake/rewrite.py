"""Rewriting data files: removing rows, and folding update files into new files.

A data file that has update files cannot be handed to pyiceberg's
copy-on-write delete: the rewritten file would lose its updates. Here a file
is always rewritten from its *merged* rows, and its update entries leave the
platform state in the same commit.
"""
from __future__ import annotations

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

from featurelake.schema import LOCATOR_POS, arrow_schema
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


def merged_rows(table: "Table", ice: IcebergTable, head: Snapshot, task: FileScanTask, with_locator: bool = False) -> pa.Table:
    """Every row of one data file at ``head``, update files merged, in the current schema."""
    # By id as a ref, not as snapshot_id=: the current schema, so rewritten files carry every column.
    scan = table.scan(branch=str(head.snapshot_id), with_locator=with_locator, ice=ice, include_hidden=True)
    batches = list(scan.read_file(task))
    return pa.Table.from_batches(batches, schema=scan.output_schema)


def write_data_files(ice: IcebergTable, rows: pa.Table, write_uuid, counter) -> list[DataFile]:
    if rows.num_rows == 0:
        return []
    target = arrow_schema(ice.schema())
    rows = pa.Table.from_arrays([rows.column(f.name).cast(f.type) for f in target], schema=target)
    return list(_dataframe_to_data_files(ice.metadata, rows, ice.io, write_uuid=write_uuid, counter=counter))


def plan_removal(
    table: "Table", ice: IcebergTable, head: Snapshot, filter: BooleanExpression, write_uuid, counter, writer: StateWriter
) -> Removal:
    """Which files to drop or rewrite so that no row matching ``filter`` remains at ``head``.

    Rewritten files' update entries leave ``writer``'s state.
    """
    probe = table.scan([], filter, branch=str(head.snapshot_id), with_locator=True, ice=ice)
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
        rows = merged_rows(table, ice, head, task, with_locator=True)
        gone = pa.chunked_array(matched).combine_chunks()
        keep = rows.filter(pc.invert(pc.is_in(rows.column(LOCATOR_POS), value_set=gone)))
        removal.added.extend(write_data_files(ice, keep, write_uuid, counter))
    return removal
