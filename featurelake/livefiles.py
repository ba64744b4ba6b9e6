"""The live data files of a snapshot, by path: planned once per snapshot and remembered after our own commits.

Snapshots are immutable, so the cache never goes stale; writers record what they committed
(:func:`remember_files`) so the next write on that head plans no manifests.
"""
from __future__ import annotations

from pyiceberg.manifest import DataFile
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import Snapshot

from featurelake.guard import manifest_errors

_FILES_CACHE: dict[tuple[str, int], dict[str, DataFile]] = {}


def snapshot_files(ice: IcebergTable, snapshot: Snapshot | None) -> dict[str, DataFile]:
    """Live data files of a snapshot by path (cached: snapshots are immutable)."""
    if snapshot is None:
        return {}
    key = (str(ice.metadata.table_uuid), snapshot.snapshot_id)
    if key not in _FILES_CACHE:
        if len(_FILES_CACHE) > 256:
            _FILES_CACHE.clear()
        with manifest_errors(ice.io, snapshot):
            _FILES_CACHE[key] = {t.file.file_path: t.file for t in ice.scan(snapshot_id=snapshot.snapshot_id).plan_files()}
    return _FILES_CACHE[key]


def remember_files(ice: IcebergTable, parent: Snapshot | None, snapshot_id: int | None, added: list[DataFile], removed: list[DataFile] = ()) -> None:
    """Record the live files of a snapshot this process just committed on ``parent``
    (parent's files, less ``removed``, plus ``added``), so the next write plans no manifests."""
    if snapshot_id is None:
        return
    base = _FILES_CACHE.get((str(ice.metadata.table_uuid), parent.snapshot_id)) if parent is not None else {}
    if base is None:
        return
    files = dict(base)
    for f in removed:
        files.pop(f.file_path, None)
    files.update((f.file_path, f) for f in added)
    if len(_FILES_CACHE) > 256:
        _FILES_CACHE.clear()
    _FILES_CACHE[(str(ice.metadata.table_uuid), snapshot_id)] = files
