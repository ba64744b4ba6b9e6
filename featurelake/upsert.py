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
from featurelake.keys import ROW, check_keys, conform_keys, find
from featurelake.livefiles import remember_files, snapshot_files
from featurelake.datafiles import index_keys
from featurelake.rewrite import write_files as write_rows_files
from featurelake.schema import RESERVED_PREFIX, arrow_schema, check_column_names, conform, to_table
from featurelake.state import STATE_KEY, StateWriter
from featurelake.updates import (
    UpdateFileWriter,
    UpdateReport,
    _check_types,
    add_columns,
    fit_values,
    located_rows,
    stage_snapshot,
    stage_update_files,
)
from featurelake.threads import staged_uploads

if TYPE_CHECKING:
    from featurelake.table import Table


def upsert(table: "Table", data: Any, branch: str = refs.MAIN, *, write_files: UpdateFileWriter | None = None) -> UpdateReport:
    """Update rows whose key exists (merge-on-read) and insert the others, in one commit.

    A new key must give every required column. An existing key's null in a
    required column keeps the row's value (a null cannot be stored there),
    so a mixed upsert whose existing keys carry only labels works; a null in
    a nullable column sets the value to null. Zero input rows commit nothing
    and report the branch head (None for an empty table). ``write_files``
    writes the update files (see featurelake.updates.stage_update_files).
    """
    data = to_table(data)
    check_column_names(data.column_names)
    keys = table.primary_key
    missing = [k for k in keys if k not in data.column_names]
    if missing:
        raise SchemaMismatchError(f"upsert input needs the key column(s) {keys}; missing {missing}", missing)
    bad = [c for c in data.column_names if c.startswith(RESERVED_PREFIX)]
    if bad:
        raise SchemaMismatchError(f"column names starting with '_' are reserved: {bad}", bad)
    key_schema = arrow_schema(table._ice.schema(), field_ids=False)
    data = conform_keys(data, [key_schema.field(k) for k in keys])
    check_keys(data, keys)
    report = UpdateReport()
    written: list[str] = []

    def attempt(ice: IcebergTable) -> UpdateReport:
        delete_quietly(ice, written)
        written.clear()
        head = refs.branch_head(ice.metadata, branch)
        if data.num_rows == 0:  # nothing to do: no commit, the head stays (None on an empty table)
            report.snapshot_id = head.snapshot_id if head is not None else None
            return report
        schema = ice.schema()
        current = arrow_schema(schema, field_ids=False)
        value_columns = [c for c in data.column_names if c not in keys]
        new_columns = _check_types(current, data, value_columns, "upsert")
        values = fit_values(current, data, value_columns, new_columns, refuse_required_nulls=False)
        found = find(table, ice, head, values.select(keys)) if head is not None else None
        is_existing = np.zeros(values.num_rows, dtype=bool)
        existing = None
        if found is not None and found.num_rows:
            is_existing[found.column(ROW).to_numpy()] = True
            existing = located_rows(values, found)
        inserts = values.filter(pa.array(~is_existing))

        tx = ice.transaction()
        add_columns(tx, values, new_columns)
        new_schema = tx.table_metadata.schema()
        # new keys must fit the whole schema (required columns given, not null) before anything is written
        rows = conform(inserts, arrow_schema(new_schema), keys=keys) if inserts.num_rows else None
        writer = StateWriter(table._state(ice, head), ice.io, table._platform_dir(ice))
        root_path = writer.new_root_path()
        props = {STATE_KEY: root_path, "featurelake.operation": "upsert"}
        producer = tx.update_snapshot(snapshot_properties=props, branch=branch).fast_append()

        partition_sources = {new_schema.find_column_name(f.source_id) for f in ice.spec().fields}
        update_columns = [c for c in value_columns if c not in partition_sources]
        touched = update_files = update_bytes = 0
        with staged_uploads() as pending:
            if existing is not None and existing.num_rows and update_columns:
                for part, columns in _keep_required(existing, update_columns, current):
                    parts, files, size = stage_update_files(
                        table, ice, head, writer, producer.snapshot_id, part, columns, new_schema, written,
                        write_files=write_files, pending=pending,
                    )
                    touched, update_files, update_bytes = touched + parts, update_files + files, update_bytes + size
            data_files = []
            if rows is not None:
                new = write_rows_files(ice, rows, metadata=tx.table_metadata)
                data_files = [w.data_file for w in new]
                written.extend(f.file_path for f in data_files)
                for f in data_files:
                    producer.append_data_file(f)
                live_after = set(snapshot_files(ice, head)) | {f.file_path for f in data_files}
                known = {path: k for path, k in index_keys(new, keys) if k is not None}  # indexed from memory, not read back
                index.extend(ice, writer, [f.file_path for f in data_files], keys, live_after, known=known)
            stage_snapshot(ice, writer, root_path, props, producer, pending)
        report.snapshot_id = commit(tx, branch)
        remember_files(ice, head, report.snapshot_id, data_files)  # the next write plans no manifests
        report.rows_updated = int(is_existing.sum())
        report.rows_inserted = inserts.num_rows
        report.update_files, report.data_files_touched = update_files, touched
        report.bytes_written = update_bytes + sum(f.file_size_in_bytes for f in data_files)
        report.columns = update_columns
        report.new_columns = new_columns
        return report

    with cleanup_on_failure(table._ice, written, landed=lambda: report.snapshot_id is not None):
        return optimistic(table.refresh, attempt, f"upsert {table.name}@{branch}")


def _keep_required(rows: pa.Table, columns: list[str], current: pa.Schema) -> list[tuple[pa.Table, list[str]]]:
    """Existing rows split by which required columns they leave null, each with the columns to set.

    A required column cannot hold a null, so a null there means "keep the
    row's value": such a row's update file leaves that column out. Rows with
    every column given form one part, the common case.
    """
    required = [c for c in columns if c in current.names and not current.field(c).nullable and rows.column(c).null_count]
    if not required:
        return [(rows, columns)]
    codes = np.zeros(rows.num_rows, dtype=np.int64)
    for bit, c in enumerate(required):
        codes |= rows.column(c).is_valid().to_numpy(zero_copy_only=False).astype(np.int64) << bit
    parts = []
    for code in np.unique(codes):
        kept = {c for bit, c in enumerate(required) if not (code >> bit) & 1}
        chosen = [c for c in columns if c not in kept]
        if chosen:
            parts.append((rows.filter(pa.array(codes == code)), chosen))
    return parts
