"""Branches and tags: zero-copy refs for feature research and training targets.

Creating a branch or tag only adds a ref to table metadata: no data file is
copied. Names are checked and existing names refused, because pyiceberg's
``create_branch`` silently moves an existing ref (LIBRARY-NOTES.md). Ref
changes commit optimistically like data commits: a concurrent write makes
them check and commit again on the new metadata.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from pyiceberg.table.refs import SnapshotRefType

from featurelake import refs
from featurelake.commit import commit_refs, optimistic
from featurelake.errors import BranchNotFoundError, FeatureLakeError, InvalidNameError

if TYPE_CHECKING:
    from featurelake.table import Table


def _check_new_name(table: "Table", meta, name: str) -> None:
    refs.check_ref_name(name)
    if name == refs.MAIN:
        raise InvalidNameError("'main' is reserved")
    if name in meta.refs:
        raise InvalidNameError(f"{table.name} already has a branch or tag named {name!r}")


def _create_ref(table: "Table", name: str, ref: str | int, kind: SnapshotRefType) -> int:
    def attempt(ice) -> int:
        _check_new_name(table, ice.metadata, name)
        snapshot = refs.resolve(ice.metadata, ref)
        if snapshot is None:
            raise FeatureLakeError(f"{table.name}@{ref} has no snapshot yet: append data before creating a {kind.value}")
        sid = snapshot.snapshot_id
        commit_refs(ice, lambda ms: ms.create_branch(sid, name) if kind == SnapshotRefType.BRANCH else ms.create_tag(sid, name))
        table._ice = ice  # the commit updated it: no second load
        return sid

    return optimistic(table.refresh, attempt, f"create {kind.value} {name} of {table.name}")


def create_branch(table: "Table", name: str, from_ref: str | int = refs.MAIN) -> int:
    """Create branch ``name`` at ``from_ref`` (branch, tag or snapshot id); returns its snapshot id."""
    return _create_ref(table, name, from_ref, SnapshotRefType.BRANCH)


def create_tag(table: "Table", name: str, ref: str | int = refs.MAIN) -> int:
    """Tag the snapshot ``ref`` points at (an immutable name for a training set)."""
    return _create_ref(table, name, ref, SnapshotRefType.TAG)


def list_branches(table: "Table") -> dict[str, int]:
    """Branch name -> head snapshot id."""
    meta = table.refresh().metadata
    return {n: r.snapshot_id for n, r in sorted(meta.refs.items()) if r.snapshot_ref_type == SnapshotRefType.BRANCH}


def list_tags(table: "Table") -> dict[str, int]:
    meta = table.refresh().metadata
    return {n: r.snapshot_id for n, r in sorted(meta.refs.items()) if r.snapshot_ref_type == SnapshotRefType.TAG}


def drop_ref(table: "Table", name: str, kind: SnapshotRefType = SnapshotRefType.BRANCH) -> None:
    """Remove a branch or tag (its files are reclaimed by garbage collection)."""
    if name == refs.MAIN:
        raise InvalidNameError("'main' cannot be dropped")

    def attempt(ice) -> None:
        ref = ice.metadata.refs.get(name)
        if ref is None or ref.snapshot_ref_type != kind:
            raise BranchNotFoundError(f"{table.name} has no {kind.value} {name!r}")
        commit_refs(ice, lambda ms: ms.remove_branch(name) if kind == SnapshotRefType.BRANCH else ms.remove_tag(name))
        table._ice = ice  # the commit updated it: no second load

    optimistic(table.refresh, attempt, f"drop {kind.value} {name} of {table.name}")
