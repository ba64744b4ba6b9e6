"""Writes of whole rows: append, overwrite of the rows a filter matches, delete.

Input is streamed in chunks of about ``CHUNK_ROWS`` rows, conformed to the
table schema and checked for null and repeated keys; data files are written
before the commit, indexed from memory, and a key already live on the branch
is refused. Each call is one optimistic Iceberg commit.
"""
from __future__ import annotations

import itertools
import uuid
from typing import TYPE_CHECKING, Any, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.expressions import BooleanExpression
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from featurelake import index, refs
from featurelake.commit import cleanup_on_failure, commit, optimistic, reuse_first
from featurelake.datafiles import index_keys, schema_facts
from featurelake.errors import DuplicateKeyError, SchemaMismatchError
from featurelake.guard import track
from featurelake.index import read_key_columns
from featurelake.keys import check_keys, find, found_keys
from featurelake.livefiles import remember_files, snapshot_files
from featurelake.rewrite import Removal, plan_removal, write_files
from featurelake.schema import LOCATOR_FILE, conform, is_arrow_stream, to_table
from featurelake.state import StateWriter
from featurelake.threads import staged_uploads

if TYPE_CHECKING:
    from featurelake.table import Table

CHUNK_ROWS = 1_000_000


def write_rows(table: "Table", data: Any, branch: str, replace_filter: BooleanExpression | None) -> int | None:
    """Append ``data`` to ``branch``, first removing the rows ``replace_filter`` matches (one commit).

    Data files are written before the commit and indexed from memory; the
    commit is retried on conflicts, and every file written is deleted if it
    never lands.
    """
    ice = table.refresh()
    refs.branch_head(ice.metadata, branch)  # unknown branch: fail before writing anything
    keys = table.primary_key
    write_uuid, counter = uuid.uuid4(), itertools.count(0)
    files: list = []
    written: list[str] = []  # every file this call wrote, for cleanup if it never lands
    landed: list[int | None] = []
    key_parts: list[pa.Table] = []
    known_keys: dict[str, pa.Table] = {}  # files written here -> their keys in row order (indexed from memory)

    def attempt(ice: IcebergTable) -> int | None:
        head = refs.branch_head(ice.metadata, branch)
        state = table._state(ice, head)
        writer = StateWriter(state, ice.io, table._platform_dir(ice))
        removal = Removal()
        if replace_filter is not None and head is not None:
            removal = plan_removal(table, ice, head, replace_filter, write_uuid, counter, writer)
            written.extend(f.file_path for f in removal.added)
        if all_keys is not None and all_keys.num_rows and head is not None:
            refuse_existing(table, ice, head, all_keys, removal)
        if not files and removal.empty:
            return head.snapshot_id if head else None
        added = [f.file_path for f in files + removal.added]
        live_after = (set(snapshot_files(ice, head)) - {f.file_path for f in removal.removed}) | set(added)
        index.extend(ice, writer, added, keys, live_after, known=known_keys)
        tx = ice.transaction()
        with staged_uploads() as pending:  # the state uploads while the manifests are written
            root = state.root_path
            if writer.changed:
                root, uploading = writer.start()
                pending.append(uploading)
            props = table._state_props(ice, head, root)
            props["featurelake.operation"] = "append" if replace_filter is None else ("overwrite" if files else "delete")
            if removal.empty:
                with tx.update_snapshot(snapshot_properties=props, branch=branch).fast_append() as op:
                    for f in files:
                        op.append_data_file(f)
            else:
                with tx.update_snapshot(snapshot_properties=props, branch=branch).overwrite() as op:
                    for f in removal.removed:
                        op.delete_data_file(f)
                    for f in removal.added + files:
                        op.append_data_file(f)
        snapshot_id = commit(tx, branch)
        landed.append(snapshot_id)
        remember_files(ice, head, snapshot_id, files + removal.added, removal.removed)
        return snapshot_id

    with cleanup_on_failure(ice, written, landed=lambda: bool(landed)):
        track(ice.io)  # loaded by this call above: record the data files written through it
        if data is not None:
            for chunk in prepare_rows(table, data, ice):
                key_parts.append(chunk.select(keys))
                new = write_files(ice, chunk, write_uuid, counter)
                files.extend(w.data_file for w in new)
                written.extend(w.data_file.file_path for w in new)
                known_keys.update((path, k) for path, k in index_keys(new, keys) if k is not None)
        all_keys = pa.concat_tables(key_parts) if key_parts else None
        if len(key_parts) > 1:
            check_keys(all_keys, keys)
        return optimistic(reuse_first(ice, table.refresh), attempt, f"write to {table.name}@{branch}")


def refuse_existing(table: "Table", ice: IcebergTable, head: Snapshot, key_table: pa.Table, removal: "Removal | None" = None) -> None:
    """Raise DuplicateKeyError for keys already live at ``head`` (after ``removal``, if any)."""
    keys = table.primary_key
    hits = find(table, ice, head, key_table)
    if removal is not None and not removal.empty:
        gone = pa.array([f.file_path for f in removal.removed], pa.string())
        hits = hits.filter(pc.invert(pc.is_in(hits.column(LOCATOR_FILE).cast(pa.string()), value_set=gone)))
    found = found_keys(hits, key_table, keys)
    if removal is not None and removal.added:
        survivors = pa.concat_tables([read_key_columns(ice, f.file_path, keys) for f in removal.added])
        probe = key_table.select(keys).cast(survivors.schema)
        found = pa.concat_tables([found.cast(survivors.schema), probe.join(survivors, keys=keys, join_type="left semi")])
    if found.num_rows:
        shown = found.select(keys).slice(0, 5).to_pylist()
        examples = [r[keys[0]] if len(keys) == 1 else tuple(r[k] for k in keys) for r in shown]
        raise DuplicateKeyError(
            f"{found.num_rows} key(s) already exist in {table.name}, e.g. {examples}; use upsert or backfill",
            examples,
            count=found.num_rows,
        )


def prepare_rows(table: "Table", data: Any, ice: IcebergTable) -> Iterator[pa.Table]:
    """Input chunks, each conformed to the table schema and free of null or repeated keys."""
    target = schema_facts(ice.metadata).arrow
    for chunk in input_chunks(data):
        chunk = conform(chunk, target, keys=table.primary_key)
        check_keys(chunk, table.primary_key)
        yield chunk


def input_chunks(data: Any, rows: int = CHUNK_ROWS) -> Iterator[pa.Table]:
    """Input as tables of at most about ``rows`` rows."""
    if isinstance(data, pa.RecordBatchReader):
        data = iter(data)
    elif is_arrow_stream(data):  # DuckDB results, Arrow streams of other libraries: streamed
        data = iter(pa.RecordBatchReader.from_stream(data))
    if isinstance(data, (pa.Table, pa.RecordBatch)) or type(data).__name__ == "DataFrame":
        yield to_table(data)
        return
    if not isinstance(data, Iterable):
        raise SchemaMismatchError(f"cannot append {type(data).__name__}: give a pyarrow Table, RecordBatch or DataFrame")
    pending: list[pa.Table] = []
    count = 0
    for item in data:
        t = to_table(item)
        pending.append(t)
        count += t.num_rows
        if count >= rows:
            yield pa.concat_tables(pending, promote_options="permissive")
            pending, count = [], 0
    if pending:
        yield pa.concat_tables(pending, promote_options="permissive")
