"""Resolving branch, tag and snapshot references to snapshots.

pyiceberg silently creates an empty, parentless branch when asked to append to
an unknown one (LIBRARY-NOTES.md); every featurelake operation resolves its
reference here first, so an unknown name is a BranchNotFoundError instead.
"""
from __future__ import annotations

import re
from typing import Iterator

from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.refs import MAIN_BRANCH, SnapshotRefType
from pyiceberg.table.snapshots import Snapshot

from featurelake.errors import BranchNotFoundError, InvalidNameError

MAIN = MAIN_BRANCH
REF_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")


def check_ref_name(name: str) -> str:
    """Refuse names that are not ``[A-Za-z0-9][A-Za-z0-9._/-]{0,127}`` or contain ``..``."""
    if not isinstance(name, str) or not REF_NAME.fullmatch(name) or ".." in name or name.endswith("/"):
        raise InvalidNameError(
            f"invalid branch or tag name {name!r}: use letters, digits, '.', '_', '/', '-' "
            "(starting with a letter or digit, at most 128 characters, no '..')"
        )
    return name


def branch_head(meta: TableMetadata, branch: str) -> Snapshot | None:
    """The head snapshot of a branch to write to; None for ``main`` of an empty table."""
    ref = meta.refs.get(branch)
    if ref is None:
        if branch == MAIN and not meta.snapshots:
            return None
        raise BranchNotFoundError(f"no branch {branch!r}; branches: {branches(meta)}")
    if ref.snapshot_ref_type != SnapshotRefType.BRANCH:
        raise BranchNotFoundError(f"{branch!r} is a tag, not a branch: tags cannot be written to")
    return meta.snapshot_by_id(ref.snapshot_id)


def resolve(meta: TableMetadata, ref: str | int | None = MAIN, snapshot_id: int | None = None) -> Snapshot | None:
    """The snapshot a read sees: ``snapshot_id`` if given, else the branch or tag head.

    ``ref`` may also be a snapshot id (int or digits). Returns None for an
    empty table's ``main``.
    """
    if snapshot_id is not None:
        snap = meta.snapshot_by_id(int(snapshot_id))
        if snap is None:
            raise BranchNotFoundError(f"no snapshot {snapshot_id}")
        return snap
    if ref is None:
        ref = MAIN
    if isinstance(ref, int) or (isinstance(ref, str) and ref.isdigit() and ref not in meta.refs):
        return resolve(meta, snapshot_id=int(ref))
    found = meta.refs.get(ref)
    if found is None:
        if ref == MAIN and not meta.snapshots:
            return None
        raise BranchNotFoundError(f"no branch or tag {ref!r}; refs: {sorted(meta.refs)}")
    return meta.snapshot_by_id(found.snapshot_id)


def branches(meta: TableMetadata) -> list[str]:
    return sorted(n for n, r in meta.refs.items() if r.snapshot_ref_type == SnapshotRefType.BRANCH)


def ancestors(meta: TableMetadata, snapshot: Snapshot | None) -> Iterator[Snapshot]:
    """The snapshot and its ancestors, newest first."""
    while snapshot is not None:
        yield snapshot
        if snapshot.parent_snapshot_id is None:
            return
        snapshot = meta.snapshot_by_id(snapshot.parent_snapshot_id)


SAME_EVENTS_AS = "featurelake.same-events-as"
CONTENT_PRESERVING = frozenset({"compact", "index rebuild"})


def same_events_props(head: Snapshot | None) -> dict[str, str]:
    """Summary properties for a commit on ``head`` that rewrites files but not rows (compaction, index rebuild).

    Names the snapshot whose rows it holds unchanged -- ``head``, or the one
    ``head`` itself named -- so a sequence store build of that snapshot keeps
    serving after snapshot expiry forgets the parent (expiry drops the parent
    pointer of a snapshot whose parent it removes).
    """
    if head is None:
        return {}
    summary = head.summary
    if summary is not None and summary.get("featurelake.operation") in CONTENT_PRESERVING and summary.get(SAME_EVENTS_AS):
        return {SAME_EVENTS_AS: summary.get(SAME_EVENTS_AS)}
    return {SAME_EVENTS_AS: str(head.snapshot_id)}
