"""Manifest entries cached by manifest file: a written manifest never changes.

pyiceberg reads every manifest of the parent snapshot again for each commit
that removes files (compaction, delete, merge) and for each scan plan. When a
compaction loses a commit race it recomputes its commit on the new head; those
manifest reads (about 0.5 s for a hundred manifests) kept its commit window
wider than the gaps between concurrent writers' commits, so it starved. With
the cache a rebased commit reads only the manifests that are new.

The cache key holds everything pyiceberg's inheritance takes from the manifest
list (added snapshot id, sequence number, spec id), so entries read before a
manifest was committed are never reused for the committed one. Callers get a
new list of the (shared, read-only) entries. The patch is process-wide and
keeps pyiceberg's behaviour; only repeated reads are saved.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

from pyiceberg.io import FileIO
from pyiceberg.manifest import ManifestEntry, ManifestFile

MAX_ENTRIES = 500_000  # bounds memory: about 1-2 KB per entry

_original = ManifestFile.fetch_manifest_entry
_cache: OrderedDict[tuple, list[ManifestEntry]] = OrderedDict()
_size = 0
_lock = threading.Lock()


def _fetch_manifest_entry(self: ManifestFile, io: FileIO, discard_deleted: bool = True) -> list[ManifestEntry]:
    global _size
    key = (self.manifest_path, discard_deleted, self.added_snapshot_id, self.sequence_number, self.partition_spec_id)
    with _lock:
        hit = _cache.get(key)
        if hit is not None:
            _cache.move_to_end(key)
            return list(hit)
    entries = _original(self, io, discard_deleted=discard_deleted)
    with _lock:
        if key not in _cache:
            _cache[key] = entries
            _size += len(entries)
            while _size > MAX_ENTRIES and len(_cache) > 1:
                _, dropped = _cache.popitem(last=False)
                _size -= len(dropped)
    return list(entries)


def install() -> None:
    """Route pyiceberg's manifest reads through the cache (idempotent)."""
    ManifestFile.fetch_manifest_entry = _fetch_manifest_entry  # type: ignore[method-assign]
