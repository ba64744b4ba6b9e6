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

Two more requests per commit are saved on an object store the same way:

* manifest *lists* are immutable too, and pyiceberg re-reads the parent's for
  every plan and commit step (a HEAD and a GET each time): cached by path, and
  a list this process writes is cached as written (the next commit or read of
  that snapshot reads nothing); one not cached is read on S3 in one plain GET
  (its size is recorded nowhere, and it is read whole anyway), not a HEAD and a GET;
* after writing a manifest pyiceberg asks the store for its length (a HEAD):
  an Avro file written through a PyArrowFile remembers how many bytes it wrote;
* reading a manifest, pyiceberg asks for its length first (a HEAD) although
  the manifest list records it: the recorded length is used (one GET), and a
  read that fails that way is retried exactly as pyiceberg reads.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import pyiceberg.table.snapshots as _snapshots
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFile
from pyiceberg.manifest import ManifestEntry, ManifestFile, ManifestListWriter, read_manifest_list
from pyiceberg.manifest import _manifest_cache as _ice_manifest_cache

from featurelake.lru import LRU

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
    entries = None
    if self.manifest_length and self.manifest_length > 0:
        try:  # the list records the manifest's length: one GET, no HEAD first
            entries = _original(self, _SizedIO(io, self.manifest_length), discard_deleted=discard_deleted)
        except Exception:  # noqa: BLE001 - a length recorded wrong, a store refusing: read it as pyiceberg does
            entries = None
    if entries is None:
        entries = _original(self, io, discard_deleted=discard_deleted)
    with _lock:
        if key not in _cache:
            _cache[key] = entries
            _size += len(entries)
            while _size > MAX_ENTRIES and len(_cache) > 1:
                _, dropped = _cache.popitem(last=False)
                _size -= len(dropped)
    return list(entries)


class _SizedIO:
    """A FileIO stand-in for one manifest whose length the manifest list records (opened without a HEAD)."""

    def __init__(self, io: FileIO, length: int) -> None:
        self._io, self._length = io, length

    def new_input(self, location: str) -> "_SizedInput":
        return _SizedInput(location, self._io, self._length)


class _SizedInput:
    """An input file of known length, fetched whole in one request (pyiceberg reads a manifest whole anyway)."""

    def __init__(self, location: str, io: FileIO, length: int) -> None:
        self.location, self._io, self._length = location, io, length

    def __len__(self) -> int:
        return self._length

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True) -> Any:
        from featurelake.storage import storage_of

        return storage_of(self._io).open(self.location, size=self._length, whole_below=self._length)


MAX_LISTS = 256
_original_lists = _snapshots._manifests
_lists = LRU(MAX_LISTS)  # manifest list path -> its manifests


def _manifests(io: FileIO, manifest_list: str) -> tuple[ManifestFile, ...]:
    hit = _lists.get(manifest_list)
    if hit is not None:
        return hit
    found = _read_list(io, manifest_list)
    _lists.put(manifest_list, found)
    return found


def _read_list(io: FileIO, manifest_list: str) -> tuple[ManifestFile, ...]:
    """A manifest list read as pyiceberg does, but on S3 in one plain GET (pyiceberg: a HEAD, then a GET).

    The list's size is recorded nowhere, and it is read whole anyway. Where
    that GET cannot be made (no signable S3 filesystem, the store refuses),
    pyiceberg reads it as it always does.
    """
    data = _whole_object(io, manifest_list)
    if data is None:
        return tuple(_original_lists(io, manifest_list))
    files = list(read_manifest_list(_BytesInput(manifest_list, data)))
    return tuple(_ice_manifest_cache.get_or_cache(m) for m in files)


def _whole_object(io: FileIO, location: str) -> bytes | None:
    import pyarrow.fs as pafs

    from featurelake.s3sign import get_object
    from featurelake.storage import storage_of

    try:
        scheme, fs, path = storage_of(io).resolve(location)
    except Exception:  # noqa: BLE001 - a FileIO featurelake cannot resolve: pyiceberg reads it
        return None
    if not isinstance(fs, pafs.S3FileSystem):
        return None
    return get_object(fs, path, None)


class _BytesInput:
    """An input file whose bytes are already here."""

    def __init__(self, location: str, data: bytes) -> None:
        self.location, self._data = location, data

    def __len__(self) -> int:
        return len(self._data)

    def exists(self) -> bool:
        return True

    def open(self, seekable: bool = True) -> Any:
        import pyarrow as pa

        return pa.BufferReader(self._data)


_original_add = ManifestListWriter.add_manifests


def _add_manifests(self: ManifestListWriter, manifest_files: list[ManifestFile]) -> ManifestListWriter:
    """Write the list as pyiceberg does, and remember exactly what was written under its path."""
    prepared = [self.prepare_manifest(m) for m in manifest_files]  # what the writer stores (sequence numbers set)
    self._writer.write_block(prepared)
    _lists.put(self._output_file.location, tuple(prepared))
    return self


class _Counted:
    """An output stream that remembers how many bytes went through it (for ``len()`` after writing)."""

    def __init__(self, stream: Any, owner: PyArrowFile) -> None:
        self._stream, self._owner, self._n = stream, owner, 0

    def write(self, data: Any) -> int:
        self._n += len(data)
        return self._stream.write(data)

    def close(self) -> None:
        self._stream.close()
        self._owner._featurelake_written = self._n  # type: ignore[attr-defined]

    def __enter__(self) -> "_Counted":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


_original_create = PyArrowFile.create
_original_len = PyArrowFile.__len__


def _create(self: PyArrowFile, overwrite: bool = False) -> Any:
    stream = _original_create(self, overwrite=overwrite)
    return _Counted(stream, self) if self.location.endswith(".avro") else stream


def _len(self: PyArrowFile) -> int:
    written = getattr(self, "_featurelake_written", None)
    return written if written is not None else _original_len(self)


def clear() -> None:
    """Forget every cached manifest and manifest list (as a fresh process would start)."""
    global _size
    with _lock:
        _cache.clear()
        _lists.clear()
        _size = 0


def install() -> None:
    """Route pyiceberg's manifest reads through the cache (idempotent)."""
    ManifestFile.fetch_manifest_entry = _fetch_manifest_entry  # type: ignore[method-assign]
    _snapshots._manifests = _manifests  # type: ignore[attr-defined]
    ManifestListWriter.add_manifests = _add_manifests  # type: ignore[method-assign]
    PyArrowFile.create = _create  # type: ignore[method-assign]
    PyArrowFile.__len__ = _len  # type: ignore[method-assign]
