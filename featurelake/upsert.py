"""Upserts by primary key: existing rows updated in place, new keys inserted, one commit.

pyiceberg's own upsert is copy-on-write (every file holding a matched key is
rewritten) and breaks down with composite keys (LIBRARY-NOTES.md). Here the
global key index finds each existing key's row; its new values become update
files (merge-on-read, no data file rewritten) and unknown keys are appended as
new rows, all in one atomic commit together with any new columns.

A key keeps the partition it was first written to: for existing rows the
partition source columns of the input are ignored (the index says where the
row lives), so a label arriving weeks later never moves or duplicates a row.

Concurrent upserts are optimistic: a commit that loses the race is redone on
the refreshed head (keys located again, so a key inserted meanwhile becomes an
update). Writers of the same key and column serialize in commit order: the
later commit's values win, neither is lost, no key is duplicated.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from pyiceberg.table import Table as IcebergTable

from featurelake import index, refs
from featurelake.commit import cleanup_on_failure, commit, delete_quietly, optimistic
from featurelake.errors import SchemaMismatchError
from featurelake.keys import ROW, check_keys, find
from featurelake.merge import snapshot_files
from featurelake.rewrite import write_data_files
from featurelake.schema import RESERVED_PREFIX, arrow_schema, conform, to_table
from featurelake.state import STATE_KEY, StateWriter
from featurelake.updates import UpdateReport, _check_types, add_columns, located_rows, stage_update_files

if TYPE_CHECKING:
    from featurelake.table import Table


def upsert(table: "Table", data: Any, branch: str = refs.MAIN) -> UpdateReport:
    """Update rows whose key exists (merge-on-read) and insert the others, in one commit."""
    data = to_table(data)
    keys = table.primary_key
    missing = [k for k in keys if k not in data.column_names]
    if missing:
        raise SchemaMismatchError(f"upsert input needs the key column(s) {keys}; missing {missing}", missing)
    bad = [c for c in data.column_names if c.startswith(RESERVED_PREFIX)]
    if bad:
        raise SchemaMismatchError(f"column names starting with '_' are reserved: {bad}", bad)
    check_keys(data, keys)
    report = UpdateReport()
    written: list[str] = []

    def attempt(ice: IcebergTable) -> UpdateReport:
        delete_quietly(ice, written)
        written.clear()
        head = refs.branch_head(ice.metadata, branch)
        schema = ice.schema()
        current = arrow_schema(schema, field_ids=False)
        value_columns = [c for c in data.column_names if c not in keys]
        new_columns = _check_types(current, data, value_columns)
        found = find(table, ice, head, data.select(keys)) if head is not None else None
        is_existing = np.zeros(data.num_rows, dtype=bool)
        existing = None
        if found is not None and found.num_rows:
            is_existing[found.column(ROW).to_numpy()] = True
            existing = located_rows(data, found)
        inserts = data.filter(pa.array(~is_existing))

        tx = ice.transaction()
        add_columns(tx, data, new_columns)
        new_schema = tx.table_metadata.schema()
        writer = StateWriter(table._state(ice, head), ice.io, table._platform_dir(ice))
        root_path = writer.new_root_path()
        props = {STATE_KEY: root_path, "featurelake.operation": "upsert"}
        producer = tx.update_snapshot(snapshot_properties=props, branch=branch).fast_append()

        partition_sources = {new_schema.find_column_name(f.source_id) for f in ice.spec().fields}
        update_columns = [c for c in value_columns if c not in partition_sources]
        update_files = update_bytes = 0
        if existing is not None and existing.num_rows and update_columns:
            update_files, update_bytes = stage_update_files(
                table, ice, head, writer, producer.snapshot_id, existing, update_columns, new_schema, written
            )
        data_files = []
        if inserts.num_rows:
            rows = conform(inserts, arrow_schema(new_schema))
            data_files = write_data_files(ice, rows, metadata=tx.table_metadata)
            written.extend(f.file_path for f in data_files)
            for f in data_files:
                producer.append_data_file(f)
            live_after = set(snapshot_files(ice, head)) | {f.file_path for f in data_files}
            index.extend(ice, writer, [f.file_path for f in data_files], keys, live_after)
        writer.write(root_path)
        producer.commit()
        report.snapshot_id = commit(tx, branch)
        report.rows_updated = int(is_existing.sum())
        report.rows_inserted = inserts.num_rows
        report.update_files = report.data_files_touched = update_files
        report.bytes_written = update_bytes + sum(f.file_size_in_bytes for f in data_files)
        report.columns = update_columns
        report.new_columns = new_columns
        return report

    with cleanup_on_failure(table._ice, written, landed=lambda: report.snapshot_id is not None):
        return optimistic(table.refresh, attempt, f"upsert {table.name}@{branch}")
