"""Reverting one snapshot's operation while keeping every later snapshot.

Rolling back moves a branch to an old snapshot and drops the good writes made
since; reverting makes a *new* snapshot that applies the inverse of one
snapshot's change set (an append's files removed, a backfill's update files
dropped, a delete's files restored with their updates, a compaction undone).
If a later snapshot built on what is being undone (updated rows the append
added, compacted the update files being dropped, re-added a restored key) the
revert is refused with an error naming that snapshot.

When the parent of the snapshot was expired, its change set cannot be taken
as a difference of two snapshots. An append, backfill or upsert only adds, so
what it added is still known from the snapshot alone (manifest entries it
added, update files it wrote); any other operation is refused with
HistoryExpiredError rather than guessed.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.manifest import ManifestEntryStatus
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from featurelake import refs
from featurelake.commit import optimistic
from featurelake.errors import BranchNotFoundError, DuplicateKeyError, FeatureLakeError, HistoryExpiredError
from featurelake.keys import find, found_keys
from featurelake.schema import LOCATOR_FILE
from featurelake.merge import ChangeSet, _replay, change_set

if TYPE_CHECKING:
    from featurelake.table import Table


class RevertDependencyError(FeatureLakeError):
    """A later snapshot depends on the one to revert; ``snapshot_id`` names it."""

    def __init__(self, message: str, snapshot_id: int) -> None:
        self.snapshot_id = snapshot_id
        super().__init__(message)


def _inverse(changes: ChangeSet) -> ChangeSet:
    return ChangeSet(
        added_files=dict(changes.removed_files),
        removed_files=dict(changes.added_files),
        added_updates=list(changes.removed_updates),
        removed_updates=list(changes.added_updates),
    )


def _depends(undo: ChangeSet, later: ChangeSet) -> str | None:
    """Why ``later`` cannot survive undoing ``undo`` (None when it can)."""
    mine = set(undo.removed_files)  # files the reverted snapshot added
    for e in later.added_updates:
        if e.data_file in mine:
            return f"it updated rows of {e.data_file.rsplit('/', 1)[-1]} that the reverted snapshot added"
    for path in later.removed_files:
        if path in mine:
            return f"it removed or rewrote {path.rsplit('/', 1)[-1]}, which the reverted snapshot added"
    dropped_targets = {e.data_file for e in undo.removed_updates}
    for path in later.removed_files:
        if path in dropped_targets:
            return f"it rewrote {path.rsplit('/', 1)[-1]}, folding in updates the reverted snapshot wrote"
    restored = set(undo.added_files)
    for path in later.added_files:
        if path in restored:
            return "it re-added a file the revert would restore"
    return None


ADDITIVE_OPERATIONS = ("append", "backfill", "upsert")


def _own_changes(table: "Table", ice: IcebergTable, target: Snapshot) -> ChangeSet:
    """What an additive snapshot added, read from the snapshot alone (its parent is gone)."""
    summary = target.summary.additional_properties if target.summary else {}
    operation = summary.get("featurelake.operation")
    if operation not in ADDITIVE_OPERATIONS:
        raise HistoryExpiredError(
            f"cannot revert {target.snapshot_id} ({operation or 'a foreign commit'}): its parent snapshot "
            f"{target.parent_snapshot_id} was expired, and only an {', '.join(ADDITIVE_OPERATIONS)} can be "
            "reverted without it"
        )
    added = {}
    for manifest in target.manifests(ice.io):
        for entry in manifest.fetch_manifest_entry(ice.io, discard_deleted=False):
            if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == target.snapshot_id:
                added[entry.data_file.file_path] = entry.data_file
    updates = sorted((e for e in table._state(ice, target).entries() if e.snapshot_id == target.snapshot_id), key=lambda e: e.seq)
    return ChangeSet(added_files=added, added_updates=updates)


def _had_parent(snapshot: Snapshot) -> bool:
    """Whether the snapshot had a parent (expiry may have removed it and, in pyiceberg, its id).

    Only a table's very first snapshot has sequence number 1; featurelake never
    makes another parentless snapshot.
    """
    return snapshot.parent_snapshot_id is not None or (snapshot.sequence_number or 0) > 1


def revert(table: "Table", snapshot_id: int, branch: str = refs.MAIN) -> int:
    """Undo snapshot ``snapshot_id``'s operation on ``branch`` in a new snapshot."""

    def attempt(ice: IcebergTable) -> int:
        meta = ice.metadata
        head = refs.branch_head(meta, branch)
        target = meta.snapshot_by_id(int(snapshot_id))
        if target is None or head is None:
            raise BranchNotFoundError(f"no snapshot {snapshot_id} in {table.name}")
        chain = list(refs.ancestors(meta, head))
        if target.snapshot_id not in {s.snapshot_id for s in chain}:
            raise BranchNotFoundError(f"snapshot {snapshot_id} is not in the history of {branch!r}")
        parent = meta.snapshot_by_id(target.parent_snapshot_id) if target.parent_snapshot_id is not None else None
        if parent is None and _had_parent(target):  # expired
            undo = _inverse(_own_changes(table, ice, target))
        else:
            undo = _inverse(change_set(table, ice, parent, target))
        if undo.empty:
            raise FeatureLakeError(f"snapshot {snapshot_id} changed no data or update file: nothing to revert")
        # What later snapshots did, net (a later write already reverted does not count),
        # must not build on what is undone; the error names the snapshot that did it.
        why = _depends(undo, change_set(table, ice, target, head))
        if why:
            later = chain[: [s.snapshot_id for s in chain].index(target.snapshot_id)]
            culprit = next(
                (s for s in reversed(later) if _depends(undo, change_set(table, ice, meta.snapshot_by_id(s.parent_snapshot_id), s))),
                head,
            )
            raise RevertDependencyError(
                f"cannot revert {snapshot_id}: later snapshot {culprit.snapshot_id} depends on it ({why}); "
                f"revert {culprit.snapshot_id} first",
                culprit.snapshot_id,
            )
        if undo.added_files:
            _refuse_restored_duplicates(table, ice, head, parent, undo)
        return _replay(table, ice, head, undo, branch, f"revert {snapshot_id}", index_from=parent)

    return optimistic(table.refresh, attempt, f"revert {snapshot_id} on {table.name}@{branch}")


def _refuse_restored_duplicates(table: "Table", ice: IcebergTable, head, parent, undo: ChangeSet) -> None:
    """Restoring deleted rows must not bring back a key that was written again since."""
    keys = table.primary_key
    scan = table.scan(keys, branch=str(parent.snapshot_id), ice=ice)
    restored = [
        pa.Table.from_batches(list(scan.read_file(t)), schema=scan.output_schema)
        for t in scan.tasks()
        if t.file.file_path in undo.added_files
    ]
    if not restored:
        return
    restored_keys = pa.concat_tables(restored)
    hits = find(table, ice, head, restored_keys)
    # Rows in files the revert removes (a delete's rewritten files) are going away.
    going = pa.array(list(undo.removed_files), pa.string())
    hits = hits.filter(pc.invert(pc.is_in(hits.column(LOCATOR_FILE).cast(pa.string()), value_set=going)))
    found = found_keys(hits, restored_keys, keys)
    if found.num_rows:
        examples = found.slice(0, 5).to_pylist()
        raise DuplicateKeyError(
            f"reverting would restore {found.num_rows} key(s) written again since, e.g. {examples}",
            examples,
            count=found.num_rows,
        )
