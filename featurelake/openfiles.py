"""Local Parquet files kept open for the process: a bounded pool of idle readers.

Why: opening a local Parquet file costs an ``open``, a footer parse and the
reader's set-up (~60-100 us each), as much as decoding a small update file's
columns. A read touches every data file and update file of a snapshot, and a
training job or dashboard reads the same files again and again, so the opened
readers (file handle and parsed footer) are kept after a read and handed to the
next one.

Safety:

* A reader is used by one thread at a time: :func:`checkout` takes it out of
  the pool (or opens a new one), :func:`checkin` puts it back. Two concurrent
  reads of one file get two readers.
* Readers are keyed by (path, size, mtime_ns, inode): a file replaced or
  changed underneath (which the lake never does, invariant 11, but tests and
  other tools may) is opened again, and the readers of its older versions are
  closed.
* :func:`forget` closes the idle readers of a path and makes the ones checked
  out at that moment close on check-in: garbage collection calls it (through
  featurelake.storage's delete hook) for every file it deletes.
* At most :data:`MAX_IDLE` readers stay open (``FEATURELAKE_OPEN_READERS``;
  0 keeps none); the least recently used are closed first. A forked child
  starts with an empty pool (it must not share its parent's readers).
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

MAX_IDLE = int(os.environ.get("FEATURELAKE_OPEN_READERS", "256"))

FileKey = tuple  # (path, size, mtime_ns, inode)


class FileChangedError(OSError):
    """The file at a path is not the version the caller stat'ed (replaced in between): stat it again."""


class OpenFile:
    """One opened local Parquet file: its handle and its ``pq.ParquetFile`` (footer parsed).

    ``epoch`` is the path's forget count when it was opened: a reader opened
    before :func:`forget` is closed on check-in instead of kept.
    """

    __slots__ = ("key", "handle", "parquet", "epoch")

    def __init__(self, key: FileKey, handle: pa.NativeFile, parquet: pq.ParquetFile, epoch: tuple[int, int]) -> None:
        self.key = key
        self.handle = handle
        self.parquet = parquet
        self.epoch = epoch

    def close(self) -> None:
        try:
            self.handle.close()
        except Exception:  # pragma: no cover - closing a file never matters to a read
            pass


_IDLE: "OrderedDict[FileKey, list[OpenFile]]" = OrderedDict()
_BY_PATH: dict[str, set[FileKey]] = {}
_EPOCHS: dict[str, int] = {}
_COUNT = [0]  # idle readers in the pool
_GENERATION = [0]  # bumped by clear(): every reader checked out before it is retired
_LOCK = threading.Lock()


def file_key(path: str) -> FileKey:
    """(path, size, mtime_ns, inode) of a local file now; FileNotFoundError when it is gone."""
    st = os.stat(path)
    return (path, st.st_size, st.st_mtime_ns, st.st_ino)


def read_whole(key: FileKey) -> bytes:
    """The whole of the local file version ``key``, in one read (no handle kept).

    For small files read once (update files: their decoded layers are what is kept):
    one ``read`` and a parse from memory cost less than a kept reader's footer read
    plus a read per column chunk. FileChangedError when the path holds another version
    now (stat it again), FileNotFoundError when it is gone.
    """
    path = key[0]
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if (st.st_size, st.st_mtime_ns, st.st_ino) != key[1:]:
            raise FileChangedError(f"{path} changed while it was being opened")
        data = os.read(fd, st.st_size)
        if len(data) < st.st_size:  # a short read (a signal): the rest, in as many reads as it takes
            parts = [data]
            got = len(data)
            while got < st.st_size:
                part = os.read(fd, st.st_size - got)
                if not part:
                    raise OSError(f"{path} ended after {got} of {st.st_size} bytes")
                parts.append(part)
                got += len(part)
            data = b"".join(parts)
        return data
    finally:
        os.close(fd)


def checkout(key: FileKey, opener: Callable[[pa.NativeFile], pq.ParquetFile]) -> OpenFile:
    """An opened reader of the file version ``key``, for the calling thread alone until :func:`checkin`.

    An idle one when the pool has one, else a new one: ``opener`` makes the
    ``ParquetFile`` from the open handle (with a cached footer when there is one).
    """
    path = key[0]
    with _LOCK:
        idle = _IDLE.get(key)
        if idle:
            found = idle.pop()
            _COUNT[0] -= 1
            if not idle:
                del _IDLE[key]
            return found
        epoch = _epoch(path)
    handle = pa.OSFile(path)
    try:
        st = os.fstat(handle.fileno())
        if (st.st_size, st.st_mtime_ns, st.st_ino) != key[1:]:  # replaced between the caller's stat and this open
            raise FileChangedError(f"{path} changed while it was being opened")
        parquet = opener(handle)
    except BaseException:
        handle.close()
        raise
    return OpenFile(key, handle, parquet, epoch)


def checkin(reader: OpenFile) -> None:
    """Give a reader back for later reads (closed instead when its file was forgotten or replaced, or the pool is full)."""
    path = reader.key[0]
    doomed: list[OpenFile] = [reader]
    with _LOCK:
        if MAX_IDLE > 0 and _epoch(path) == reader.epoch:
            doomed = []
            versions = _BY_PATH.setdefault(path, set())
            if reader.key not in versions:  # a new version of the file: its older versions' readers are stale
                for old in versions:
                    doomed.extend(_drop_key(old))
                versions.clear()
                versions.add(reader.key)
            _IDLE.setdefault(reader.key, []).append(reader)
            _IDLE.move_to_end(reader.key)
            _COUNT[0] += 1
            while _COUNT[0] > MAX_IDLE and _IDLE:
                key, readers = _IDLE.popitem(last=False)
                _COUNT[0] -= len(readers)
                doomed.extend(readers)
                versions = _BY_PATH.get(key[0])
                if versions is not None:
                    versions.discard(key)
                    if not versions:
                        del _BY_PATH[key[0]]
    for r in doomed:
        r.close()


def discard(reader: OpenFile) -> None:
    """Drop a checked-out reader that must not be reused (its read failed, or was abandoned half-way).

    Not closed here: a batch reader left half-read may still have reads in flight on Arrow's I/O
    threads; the handle closes when the last of them lets it go.
    """
    del reader


def _epoch(path: str) -> tuple[int, int]:
    """(pool generation, forget count of ``path``): a reader opened under another one is not put back (lock held)."""
    return (_GENERATION[0], _EPOCHS.get(path, 0))


def _drop_key(key: FileKey) -> list[OpenFile]:
    """Remove ``key``'s idle readers from the pool (lock held); the caller closes them."""
    readers = _IDLE.pop(key, [])
    _COUNT[0] -= len(readers)
    return readers


def forget(paths: "set[str]") -> None:
    """Close the idle readers of ``paths`` (local paths) and retire their checked-out ones."""
    doomed: list[OpenFile] = []
    with _LOCK:
        if len(_EPOCHS) + len(paths) > 65_536:  # bounded: a new generation retires every reader out at this moment
            _GENERATION[0] += 1
            _EPOCHS.clear()
        for path in paths:
            _EPOCHS[path] = _EPOCHS.get(path, 0) + 1
            for key in _BY_PATH.pop(path, ()):
                doomed.extend(_drop_key(key))
    for r in doomed:
        r.close()


def idle_count(path: str | None = None) -> int:
    """Idle readers in the pool (of ``path`` only, when given): for tests and reports."""
    with _LOCK:
        if path is None:
            return _COUNT[0]
        return sum(len(_IDLE.get(k, ())) for k in _BY_PATH.get(path, ()))


def clear() -> None:
    """Close every idle reader and retire the checked-out ones (tests; a process that damaged files)."""
    with _LOCK:
        doomed = [r for readers in _IDLE.values() for r in readers]
        _GENERATION[0] += 1
        _EPOCHS.clear()
        _IDLE.clear()
        _BY_PATH.clear()
        _COUNT[0] = 0
    for r in doomed:
        r.close()


def _forget_after_fork() -> None:
    """A forked child opens its own readers: the parent's handles are the parent's."""
    global _LOCK
    _LOCK = threading.Lock()
    _IDLE.clear()
    _BY_PATH.clear()
    _EPOCHS.clear()
    _COUNT[0] = 0


os.register_at_fork(after_in_child=_forget_after_fork)
