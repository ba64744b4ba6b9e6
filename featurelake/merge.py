"""Merging, rebasing and diffing branches, at (data file, column) granularity.

A branch's changes since its fork point are a *change set*: data files added
and removed, update files added and removed, columns touched. Merge replays the
source's change set onto the target head in one new snapshot that references
the existing files (never re-appending a file the target already has, which
pyiceberg would silently accept and duplicate rows). When the target has not
moved since the fork the merge is a fast-forward of the ref, after checking
ancestry (pyiceberg's ref move does not).

Conflicts are detected before anything is written and reported by file and
column: both sides updated the same column of the same data file; one side
removed or rewrote a data file the other updated; both rewrote the same file;
or a column the source wrote no longer exists with the same id and type.
Both sides inserting the same primary key is a conflict too, reported with the
keys: a merge never makes a key appear twice.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import DataFile
from pyiceberg.schema import Schema
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from featurelake import refs
from featurelake.commit import commit, commit_refs, optimistic
from featurelake.errors import BranchNotFoundError, FeatureLakeError, MergeConflictError
from featurelake.livefiles import _FILES_CACHE, remember_files, snapshot_files  # noqa: F401  (public here as before)
from featurelake.state import PlatformState, StateWriter, UpdateEntry, distinct_files, summary_props

if TYPE_CHECKING:
    from featurelake.table import Table

MERGED_FROM = "featurelake.merged-from"


def history(meta, head: Snapshot) -> list[Snapshot]:
    """Ancestors including merged sources (a merge snapshot's second parent), nearest first."""
    out, seen, frontier = [], set(), [head]
    while frontier:
        nxt = []
        for snap in frontier:
            if snap is None or snap.snapshot_id in seen:
                continue
            seen.add(snap.snapshot_id)
            out.append(snap)
            if snap.parent_snapshot_id is not None:
                nxt.append(meta.snapshot_by_id(snap.parent_snapshot_id))
            merged = snap.summary.get(MERGED_FROM) if snap.summary else None
            if merged:
                nxt.append(meta.snapshot_by_id(int(merged)))
        frontier = nxt
    return out


def fork_point(meta, a: Snapshot, b: Snapshot) -> Snapshot | None:
    """The nearest common ancestor of two snapshots, following merges."""
    seen = {s.snapshot_id for s in history(meta, b)}
    for s in history(meta, a):
        if s.snapshot_id in seen:
            return s
    return None


def _entries(state: PlatformState) -> dict[tuple[str, str, int | None], UpdateEntry]:
    """A state's entries by (data file, update file, row group): layers of one shared file are distinct."""
    return {(e.data_file, *e.part): e for e in state.entries()}


@dataclass
class ChangeSet:
    """What one side did between the fork point and its head."""

    added_files: dict[str, DataFile] = field(default_factory=dict)
    removed_files: dict[str, DataFile] = field(default_factory=dict)
    added_updates: list[UpdateEntry] = field(default_factory=list)
    removed_updates: list[UpdateEntry] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added_files or self.removed_files or self.added_updates or self.removed_updates)

    def updated(self) -> dict[str, set[int]]:
        """Data file -> field ids this side wrote updates for."""
        out: dict[str, set[int]] = {}
        for e in self.added_updates:
            out.setdefault(e.data_file, set()).update(e.field_ids)
        return out


def change_set(table: "Table", ice: IcebergTable, base: Snapshot | None, head: Snapshot) -> ChangeSet:
    base_files, head_files = snapshot_files(ice, base), snapshot_files(ice, head)
    base_updates = _entries(table._state(ice, base))
    head_updates = _entries(table._state(ice, head))
    return ChangeSet(
        added_files={p: f for p, f in head_files.items() if p not in base_files},
        removed_files={p: f for p, f in base_files.items() if p not in head_files},
        added_updates=sorted((e for u, e in head_updates.items() if u not in base_updates), key=lambda e: e.seq),
        removed_updates=[e for u, e in base_updates.items() if u not in head_updates],
    )


def _column_name(schema: Schema, field_id: int) -> str:
    try:
        return schema.find_column_name(field_id) or f"<field {field_id}>"
    except ValueError:
        return f"<field {field_id}>"


def find_conflicts(ice: IcebergTable, source: ChangeSet, target: ChangeSet, source_schema: Schema) -> list[tuple[str, str, str]]:
    """(data file, column, reason) for every change that cannot be combined."""
    schema = ice.metadata.schema()
    conflicts: list[tuple[str, str, str]] = []
    src_updated, tgt_updated = source.updated(), target.updated()
    for path, ids in src_updated.items():
        both = ids & tgt_updated.get(path, set())
        for fid in sorted(both):
            conflicts.append((path, _column_name(schema, fid), "both sides updated this column of this data file"))
        if path in target.removed_files:
            for fid in sorted(ids):
                conflicts.append((path, _column_name(schema, fid), "updated on the source, removed or rewritten on the target"))
    for path, ids in tgt_updated.items():
        if path in source.removed_files:
            for fid in sorted(ids):
                conflicts.append((path, _column_name(schema, fid), "removed or rewritten on the source, updated on the target"))
    for path in sorted(source.removed_files.keys() & target.removed_files.keys()):
        conflicts.append((path, "*", "both sides removed or rewrote this data file"))
    current_ids = {f.field_id: f for f in schema.fields}
    for fid in sorted({f for ids in src_updated.values() for f in ids}):
        src_field = source_schema.find_field(fid) if fid in {f.field_id for f in source_schema.fields} else None
        cur = current_ids.get(fid)
        if src_field is None:
            continue
        if cur is None:
            other = next((f for f in schema.fields if f.name == src_field.name), None)
            reason = (
                f"column exists on the target with type {other.field_type}, source wrote {src_field.field_type}"
                if other is not None
                else "column was dropped on the target"
            )
            conflicts.append(("*", src_field.name, reason))
        elif cur.field_type != src_field.field_type:
            conflicts.append(("*", src_field.name, f"type changed from {src_field.field_type} to {cur.field_type}"))
    return conflicts


def _raise_conflicts(source: str, into: str, conflicts: list[tuple[str, str, str]]) -> None:
    shown = "; ".join(f"{c} of {f.rsplit('/', 1)[-1]}: {why}" for f, c, why in conflicts[:5])
    more = f" (and {len(conflicts) - 5} more)" if len(conflicts) > 5 else ""
    raise MergeConflictError(f"cannot merge {source!r} into {into!r}: {shown}{more}", conflicts)


def _refuse_duplicate_keys(table: "Table", ice: IcebergTable, target_head: Snapshot, changes: ChangeSet, source: str, into: str) -> None:
    """Raise MergeConflictError if ``changes`` would add rows whose keys are live at ``target_head``.

    Rows of files the change set removes do not count (they go away). Both
    sides of a merge are duplicate-free, so this finds every key the result
    would hold twice.
    """
    from featurelake.index import read_key_columns
    from featurelake.keys import find, found_keys
    from featurelake.schema import LOCATOR_FILE

    target_files = snapshot_files(ice, target_head)
    added = [p for p in changes.added_files if p not in target_files]
    if not added:
        return
    keys = table.primary_key
    key_table = pa.concat_tables([read_key_columns(ice, p, keys) for p in added])
    hits = find(table, ice, target_head, key_table)
    if changes.removed_files:
        going = pa.array(list(changes.removed_files), pa.string())
        hits = hits.filter(pc.invert(pc.is_in(hits.column(LOCATOR_FILE).cast(pa.string()), value_set=going)))
    if not hits.num_rows:
        return
    found = found_keys(hits, key_table, keys).slice(0, 5).to_pylist()
    examples = [r[keys[0]] if len(keys) == 1 else tuple(r[k] for k in keys) for r in found]
    files = hits.column(LOCATOR_FILE).cast(pa.string()).to_pylist()
    conflicts = [(f, ",".join(keys), f"both sides inserted key {k!r}") for f, k in zip(files, examples)]
    raise MergeConflictError(
        f"cannot merge {source!r} into {into!r}: both sides inserted {hits.num_rows} primary key(s) "
        f"since they forked, e.g. {examples}; update or delete them on one side first",
        conflicts,
        keys=examples,
    )


def _replay(
    table: "Table",
    ice: IcebergTable,
    target_head: Snapshot,
    changes: ChangeSet,
    branch: str,
    operation: str,
    tx=None,
    merged_from: int | None = None,
    index_from: Snapshot | None = None,
    index_new: dict[str, pa.Table | None] | None = None,
) -> int:
    """Commit ``changes`` on top of ``target_head`` as one snapshot on ``branch``.

    The key index becomes the union of the target's segments and those of
    ``index_from`` (which covers the files ``changes`` adds); entries of
    files not live afterwards are ignored by lookups and dropped by merges.
    ``index_new`` maps files ``changes`` adds that ``index_from`` does not
    cover (just written) to their key columns (None: read back) for indexing.
    """
    target_files = snapshot_files(ice, target_head)
    state = table._state(ice, target_head)
    writer = StateWriter(state, ice.io, table._platform_dir(ice))
    if index_from is not None:
        writer.add_index_segments(table._state(ice, index_from).index_segments)
    if index_new:
        from featurelake import index

        live_after = (set(target_files) - set(changes.removed_files)) | set(changes.added_files)
        known = {p: k for p, k in index_new.items() if k is not None}
        index.extend(ice, writer, list(index_new), table.primary_key, live_after, known=known)
    dropped = {e.part for e in changes.removed_updates}
    for e in changes.removed_updates:
        writer.drop_where(e.data_file, lambda x, u=e.part: x.part == u)
    for path in changes.removed_files:
        writer.drop_data_file(path)
    seq_map: dict[int, int] = {}
    for e in changes.added_updates:
        if e.part in dropped:
            continue
        if e.seq not in seq_map:
            seq_map[e.seq] = writer.take_seq()
        writer.add(replace(e, seq=seq_map[e.seq]))
    root = writer.write() if writer.changed else state.root_path
    props = {"featurelake.operation": operation}
    if merged_from is not None:
        props[MERGED_FROM] = str(merged_from)
    props.update(summary_props(ice.io, root))
    tx = tx or ice.transaction()
    removed = [f for p, f in changes.removed_files.items() if p in target_files]
    added = [f for p, f in changes.added_files.items() if p not in target_files]
    producer = tx.update_snapshot(snapshot_properties=props, branch=branch)
    with (producer.overwrite() if removed else producer.fast_append()) as op:
        for f in removed:
            op.delete_data_file(f)
        for f in added:
            op.append_data_file(f)
    return commit(tx, branch)


def _heads(ice: IcebergTable, source: str | int, into: str) -> tuple[Snapshot, Snapshot, Snapshot]:
    src = refs.resolve(ice.metadata, source)
    tgt = refs.branch_head(ice.metadata, into)
    if src is None or tgt is None:
        raise BranchNotFoundError(f"nothing to merge: {source!r} or {into!r} has no snapshot")
    base = fork_point(ice.metadata, src, tgt)
    if base is None:
        raise FeatureLakeError(f"{source!r} and {into!r} share no history")
    return src, tgt, base


@dataclass
class MergeStart:
    """Where a merge stands after the steps every merge shares (:func:`start_merge`)."""

    head: int | None  # the target's head when nothing is left to replay (already merged, or fast-forwarded)
    src: Any = None   # the source's head snapshot
    tgt: Any = None   # the target's head snapshot
    changes: ChangeSet | None = None  # what the source changed since the fork


def start_merge(table: "Table", ice: IcebergTable, source: str | int, into: str) -> MergeStart:
    """The steps every merge shares: find the fork, fast-forward or stop when there is nothing to
    replay, and refuse (MergeConflictError, nothing written) when both sides changed the same thing."""
    src, tgt, base = _heads(ice, source, into)
    if base.snapshot_id == src.snapshot_id:
        return MergeStart(tgt.snapshot_id)  # already merged
    if base.snapshot_id == tgt.snapshot_id:
        commit_refs(ice, lambda ms: ms.create_branch(src.snapshot_id, into))  # fast-forward
        return MergeStart(src.snapshot_id)
    src_changes = change_set(table, ice, base, src)
    tgt_changes = change_set(table, ice, base, tgt)
    src_schema = ice.metadata.schema_by_id(src.schema_id) if src.schema_id is not None else ice.metadata.schema()
    conflicts = find_conflicts(ice, src_changes, tgt_changes, src_schema or ice.metadata.schema())
    if conflicts:
        _raise_conflicts(str(source), into, conflicts)
    return MergeStart(None, src, tgt, src_changes)


def merge(table: "Table", source: str | int, into: str = refs.MAIN) -> int:
    """Merge ``source`` into branch ``into``; returns the target's new head snapshot id."""

    def attempt(ice: IcebergTable) -> int:
        start = start_merge(table, ice, source, into)
        if start.head is not None:
            return start.head
        src, tgt = start.src, start.tgt
        _refuse_duplicate_keys(table, ice, tgt, start.changes, str(source), into)
        return _replay(table, ice, tgt, start.changes, into, f"merge {source}", merged_from=src.snapshot_id, index_from=src)

    return optimistic(table.refresh, attempt, f"merge {source} into {table.name}@{into}")


def rebase(table: "Table", branch: str, onto: str = refs.MAIN) -> int:
    """Replay ``branch``'s changes on ``onto``'s head and move ``branch`` there; returns its new head."""
    from pyiceberg.table.update.snapshot import ManageSnapshots

    def attempt(ice: IcebergTable) -> int:
        head = refs.branch_head(ice.metadata, branch)
        src, tgt, base = _heads(ice, onto, branch)  # "source" here is onto
        if head is None:
            raise BranchNotFoundError(f"no branch {branch!r}")
        if base.snapshot_id == src.snapshot_id:
            return head.snapshot_id  # onto has nothing new
        if base.snapshot_id == head.snapshot_id:
            commit_refs(ice, lambda ms: ms.create_branch(src.snapshot_id, branch))  # fast-forward
            return src.snapshot_id
        mine = change_set(table, ice, base, head)
        theirs = change_set(table, ice, base, src)
        head_schema = ice.metadata.schema_by_id(head.schema_id) if head.schema_id is not None else ice.metadata.schema()
        conflicts = find_conflicts(ice, mine, theirs, head_schema or ice.metadata.schema())
        if conflicts:
            _raise_conflicts(branch, str(onto), conflicts)
        _refuse_duplicate_keys(table, ice, src, mine, branch, str(onto))
        tx = ice.transaction()
        ManageSnapshots(tx).create_branch(src.snapshot_id, branch).commit()
        return _replay(table, ice, src, mine, branch, f"rebase onto {onto}", tx=tx, index_from=head)

    return optimistic(table.refresh, attempt, f"rebase {table.name}@{branch} onto {onto}")


def diff(table: "Table", branch: str, against: str = refs.MAIN) -> dict[str, Any]:
    """What ``branch`` changed since it forked from ``against``."""
    ice = table.refresh()
    src, tgt, base = _heads(ice, branch, against)
    changes = change_set(table, ice, base, src)
    schema = ice.metadata.schema()
    base_schema = ice.metadata.schema_by_id(base.schema_id) if base.schema_id is not None else schema
    base_ids = {f.field_id for f in (base_schema or schema).fields}
    touched = sorted({f for e in changes.added_updates for f in e.field_ids})
    return {
        "branch": branch,
        "against": against,
        "fork_snapshot_id": base.snapshot_id,
        "behind": sum(1 for _ in refs.ancestors(ice.metadata, tgt)) - sum(1 for _ in refs.ancestors(ice.metadata, base)),
        "rows_added": sum(f.record_count for f in changes.added_files.values())
        - sum(f.record_count for f in changes.removed_files.values()),
        "columns_added": [_column_name(schema, f) for f in touched if f not in base_ids],
        "columns_updated": [_column_name(schema, f) for f in touched if f in base_ids],
        "data_files_added": len(changes.added_files),
        "data_files_removed": len(changes.removed_files),
        "update_files_added": distinct_files(changes.added_updates),  # a shared file once, whatever its layers
        "bytes_added": sum(f.file_size_in_bytes for f in changes.added_files.values())
        + sum({e.update_file: e.file_size for e in changes.added_updates}.values()),  # a shared file whole, once
    }


def storage(table: "Table", branch: str, ice: IcebergTable | None = None) -> dict[str, int]:
    """Bytes ``branch`` references alone (what dropping it frees) versus shared with other refs.

    ``ice``: the table as the caller already loaded it (one catalog load per operation).
    """
    ice = ice or table.refresh()
    meta = ice.metadata

    def referenced(snap: Snapshot | None) -> dict[str, int]:
        files = {p: f.file_size_in_bytes for p, f in snapshot_files(ice, snap).items()}
        files.update({e.update_file: e.file_size for e in table._state(ice, snap).entries()})  # a shared file: whole
        return files

    mine = referenced(refs.resolve(meta, branch))
    others: set[str] = set()
    for name, ref in meta.refs.items():
        if name != branch:
            others.update(referenced(meta.snapshot_by_id(ref.snapshot_id)))
    exclusive = sum(size for p, size in mine.items() if p not in others)
    return {"exclusive_bytes": exclusive, "shared_bytes": sum(mine.values()) - exclusive}
