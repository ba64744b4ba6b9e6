"""The one I/O layer: every file featurelake lists, reads, writes or deletes.

It is built from a table's pyiceberg FileIO (so from the catalog's properties:
``s3.endpoint``, credentials, path-style access...) and resolves a location
exactly as that FileIO does (``PyArrowFileIO.parse_location`` +
``fs_by_scheme``), so a listing and a delete reach the very bytes pyiceberg
wrote. There is no second configuration path: no filesystem is ever built from
a bare URI with default credentials.

Paths are compared as *canonical URIs*: ``scheme://path`` where the path is
the one the filesystem uses. ``s3://b/k``, ``s3a://b/k`` and the ``b/k`` a
pyarrow S3 listing returns are all ``s3://b/k``; ``/x``, ``file:/x`` and
``file:///x`` are ``file:///x``. Like pyiceberg, a ``file:`` URI's path is
taken literally: ``file:///a%20b`` is the folder named ``a%20b``, never
``a b``. The lake itself writes local locations as plain paths, so a home
with a space, ``#`` or non-ASCII characters keeps its files where it says.
A canonical URI is for comparison and reports; to act on a listed file use
its :class:`StoredFile`.

Files are immutable: :meth:`Storage.write_new` never replaces an existing file.

Requests: on an object store each request costs ~10-50 ms, so the S3
filesystems of a FileIO are opened with ``allow_delayed_open``: a file smaller
than one upload part is written with a single PUT instead of a multipart
upload's three requests (create, part, complete). The filesystem is rebuilt
from the FileIO's own (its ``__reduce__`` arguments), so its configuration is
the catalog's and nothing else, and pyiceberg's own writes through that FileIO
(data files, manifests) get the same saving. A larger file already in memory
(:meth:`Storage.write_bytes`: data files of up to :data:`SINGLE_PUT_BYTES`,
large update files) goes up in one signed PUT (``s3sign.put_object``) instead
of a multipart upload's create, parts and complete.
"""
from __future__ import annotations

import os
import threading
import weakref
from functools import lru_cache
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import pyarrow as pa
import pyarrow.fs as pafs
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import PyArrowFileIO

from featurelake.guard import note_created
from featurelake.lru import LRU

_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}
FOOTER_READ_BYTES = 64 << 10  # the tail Arrow's Parquet reader fetches first for the footer
SMALL_OBJECT_BYTES = 1 << 20  # a file this small is cheaper fetched whole than in two requests
MULTIPART_BYTES = 5 << 20  # from this size pyarrow's stream may upload in parts (S3's smallest part): one PUT instead
SINGLE_PUT_BYTES = 64 << 20  # data files whose rows take at most this much are encoded in memory, then stored in one PUT

# Object stores that serve an Iceberg catalog (S3 Tables, SeaweedFS) accept only
# Iceberg file types in a table's folder: Parquet/Avro/ORC under data/, Avro and
# metadata JSON directly in metadata/. Platform files are therefore Parquet files
# under data/, in a folder no partition path can take (those are ``col=value``).
PLATFORM_DIR = "data/_featurelake"


def platform_dir(table_location: str) -> str:
    """Where a table's platform files (state, index segments) live."""
    return f"{table_location.rstrip('/')}/{PLATFORM_DIR}"
_LOCAL = {"file", "local"}


@dataclass(frozen=True)
class StoredFile:
    """One listed file: its canonical URI, where its filesystem keeps it, its size and age."""

    uri: str
    path: str
    size: int
    mtime: float | None  # epoch seconds; None when the store does not say
    fs: pafs.FileSystem


class Storage:
    """Files of one catalog's FileIO (see the module docstring)."""

    def __init__(self, io: FileIO) -> None:
        # Another FileIO implementation (fsspec) carries the same properties: resolve
        # through pyarrow with exactly those, never through defaults.
        self.io = io if isinstance(io, PyArrowFileIO) else PyArrowFileIO(dict(io.properties))
        self.origin = io
        _delay_s3_opens(self.io)

    # ----------------------------------------------------------- locations
    def resolve(self, location: str) -> tuple[str, pafs.FileSystem, str]:
        """(canonical scheme, filesystem, filesystem path) of ``location``, as the FileIO sees it."""
        scheme, netloc, path = PyArrowFileIO.parse_location(location, self.io.properties)
        fs = self.io.fs_by_scheme(scheme, netloc)
        scheme = _SCHEME_ALIASES.get(scheme, scheme)
        if scheme in ("hdfs", "viewfs"):
            return scheme, fs, path
        return ("file" if scheme in _LOCAL else scheme), fs, path

    def canonical(self, location: str) -> str:
        """The canonical URI of ``location`` (for comparisons and reports)."""
        scheme, _, path = self.resolve(location)
        return _uri(scheme, path)

    def is_local(self, location: str) -> bool:
        return self.resolve(location)[0] == "file"

    def local_path(self, location: str) -> str | None:
        """The local filesystem path of ``location``, or None on an object store."""
        scheme, _, path = self.resolve(location)
        return path if scheme == "file" else None

    # -------------------------------------------------------------- reading
    def list(self, prefix: str) -> list[StoredFile]:
        """Every file under the folder ``prefix`` (recursively); empty when there is none."""
        scheme, fs, root = self.resolve(prefix)
        root = root.rstrip("/")
        try:
            infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
        except FileNotFoundError:
            return []
        out = []
        for info in infos:
            if info.type != pafs.FileType.File:
                continue
            mtime = info.mtime.timestamp() if info.mtime is not None else None
            out.append(StoredFile(_uri(scheme, info.path), info.path, info.size or 0, mtime, fs))
        return out

    def exists(self, location: str) -> bool:
        _, fs, path = self.resolve(location)
        return fs.get_file_info(path).type == pafs.FileType.File

    def size(self, location: str) -> int:
        _, fs, path = self.resolve(location)
        info = fs.get_file_info(path)
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(location)
        return int(info.size or 0)

    def open(self, location: str, size: int | None = None, whole_below: int = FOOTER_READ_BYTES) -> pa.NativeFile:
        """A random-access reader of the file.

        On an object store, ``size`` (when the caller knows it: from a
        manifest, the platform state) saves the HEAD request opening a file
        costs, and a file of at most ``whole_below`` bytes is fetched whole in
        one GET: by default files no larger than the tail a Parquet reader
        fetches for its footer anyway, so the footer read and the column reads
        after it are one request, never more bytes.
        """
        scheme, fs, path = self.resolve(location)
        if scheme == "file" or isinstance(fs, pafs.LocalFileSystem):
            return fs.open_input_file(path)
        if size is None:
            info = fs.get_file_info(path)  # the HEAD opening the file would make anyway
            if info.type != pafs.FileType.File:
                raise FileNotFoundError(location)
            size = int(info.size or 0)
        return open_remote(fs, path, size, whole_below)

    def read(self, location: str) -> bytes:
        with self.open(location) as f:
            return f.read()

    def map(self, location: str) -> pa.Buffer:
        """The file's bytes, memory-mapped when it is local (safe: files are never rewritten)."""
        local = self.local_path(location)
        if local is not None:
            return pa.memory_map(local, "r").read_buffer()  # the buffer keeps the mapping alive
        with self.open(location) as f:
            return f.read_buffer()

    # -------------------------------------------------------------- writing
    @contextmanager
    def write_new(self, location: str) -> Iterator[pa.NativeFile]:
        """An output stream for a new file; FileExistsError if it exists.

        Locally the check is free. On an object store the names written are
        fresh (a uuid each), and a HEAD of a missing key can be refused
        (SeaweedFS answers ACCESS_DENIED under a table's folder), so no HEAD
        is made there.
        """
        scheme, fs, path = self.resolve(location)
        note_created(self.origin, location)  # named before the bytes exist: a failed write still leaves a named file
        if scheme == "file":
            if fs.get_file_info(path).type != pafs.FileType.NotFound:
                raise FileExistsError(f"{location} exists: files in the lake are never rewritten")
            parent = path.rsplit("/", 1)[0]
            if parent:
                fs.create_dir(parent, recursive=True)
        with fs.open_output_stream(path) as out:
            yield out

    def write_bytes(self, location: str, data: "bytes | pa.Buffer") -> int:
        """Store ``data`` as the new file ``location``; returns its size.

        On S3 a file larger than one upload part is stored with a single
        signed PUT (``s3sign.put_object``), not a multipart upload; where that
        cannot be done, and everywhere else, through :meth:`write_new`.
        """
        size = len(data) if isinstance(data, (bytes, bytearray, memoryview)) else data.size
        if size >= MULTIPART_BYTES and self.is_object_store(location):
            from featurelake.s3sign import put_object

            _, fs, path = self.resolve(location)
            note_created(self.origin, location)  # named before the bytes exist
            if put_object(fs, path, data):
                return size
        with self.write_new(location) as out:
            out.write(data)
        return size

    def is_object_store(self, location: str) -> bool:
        """Whether ``location`` is on an S3 store (where :meth:`write_bytes` can save a multipart upload)."""
        return isinstance(self.resolve(location)[1], pafs.S3FileSystem)

    def delete_many(self, files: "list[StoredFile]") -> None:
        """Delete listed files, batched on S3 (see :func:`delete_stored`)."""
        delete_stored(files)

    def delete(self, target: "str | StoredFile") -> None:
        """Delete one file (a location or a listed StoredFile); what readers keep of it is forgotten."""
        if isinstance(target, StoredFile):
            fs, path = target.fs, target.path
        else:
            _, fs, path = self.resolve(target)
        try:
            fs.delete_file(path)
        finally:
            _deleted([path])


def open_remote(fs: pafs.FileSystem, path: str, size: int, whole_below: int = FOOTER_READ_BYTES) -> pa.NativeFile:
    """A reader of an object-store file of known ``size``.

    A file of at most ``whole_below`` bytes is fetched whole: on S3 with one
    signed GET and no HEAD (featurelake.s3sign), elsewhere (or when that GET
    cannot be made) through pyarrow. A larger file is opened with pyarrow as
    usual (the Parquet reader uses a dataset fragment of known size instead:
    read.py). A size recorded wrong surfaces as an error reading the file (the
    callers that take a size from metadata retry without it).
    """
    if 0 < size <= whole_below and isinstance(fs, pafs.S3FileSystem):
        from featurelake.s3sign import get_object

        data = get_object(fs, path, size)  # one signed GET (pyarrow would HEAD first)
        if data is not None:
            return pa.BufferReader(data)
    f = fs.open_input_file(path)
    if size > whole_below:
        return f
    with f:
        data = f.read_at(size, 0) if size else b""
    if len(data) != size:
        raise OSError(f"{path}: read {len(data)} bytes, its recorded size is {size}")
    return pa.BufferReader(data)


def delete_stored(files: "list[StoredFile]") -> None:
    """Delete listed files; on S3 in DeleteObjects batches of explicitly named keys.

    A batch costs one request for up to 1,000 files where pyarrow's
    ``delete_file`` costs three per file (HEAD, DELETE and a PUT recreating the
    folder marker; see featurelake.s3sign). Files a batch could not delete are
    deleted one by one, so errors are those of :meth:`Storage.delete`; a file
    already gone is no error (another collector got there first).
    """
    from featurelake.s3sign import delete_objects

    try:
        _delete_stored(files, delete_objects)
    finally:
        _deleted([f.path for f in files])


_DELETE_HOOKS: "list[Callable[[list[str]], None]]" = []


def on_delete(hook: "Callable[[list[str]], None]") -> None:
    """Call ``hook(paths)`` after files are deleted (filesystem paths: local paths, ``bucket/key``).

    The reader registers one (featurelake.readfiles.forget_files): it closes kept-open readers of a
    deleted file and drops its footer and decoded layers. The hook lives here because the reader
    imports this module, not the other way round.
    """
    if hook not in _DELETE_HOOKS:
        _DELETE_HOOKS.append(hook)


def _deleted(paths: list[str]) -> None:
    for hook in list(_DELETE_HOOKS):
        hook(paths)


def _delete_stored(files: "list[StoredFile]", delete_objects) -> None:
    groups: dict[int, tuple[pafs.FileSystem, list[StoredFile]]] = {}
    for f in files:
        groups.setdefault(id(f.fs), (f.fs, []))[1].append(f)
    for fs, group in groups.values():
        left = set(delete_objects(fs, [f.path for f in group])) if isinstance(fs, pafs.S3FileSystem) else None
        for f in group:
            if left is None or f.path in left:
                try:
                    fs.delete_file(f.path)
                except FileNotFoundError:
                    pass


_FILESYSTEMS = LRU(32)  # (scheme, netloc, FileIO properties) -> filesystem


def _forget_filesystems() -> None:  # a forked child builds its own clients (the parent's SDK threads are not there)
    global _FILESYSTEMS
    _FILESYSTEMS = LRU(32)


os.register_at_fork(after_in_child=_forget_filesystems)


def _delay_s3_opens(io: PyArrowFileIO) -> None:
    """Make ``io`` build its S3 filesystems with ``allow_delayed_open`` (see the module docstring).

    Only the instance's ``fs_by_scheme`` cache is replaced: pickling a FileIO drops it and
    an unpickled copy builds plain filesystems again (correct, with multipart uploads).
    """
    if getattr(io.fs_by_scheme, "_featurelake_delayed", False):
        return
    initialize = io._initialize_fs

    def delayed(scheme: str, netloc: str | None = None) -> pafs.FileSystem:
        # Every table load brings a new FileIO; building an S3 client costs ~10 ms, so a
        # filesystem is shared by FileIOs of exactly the same properties (new credentials: a new one).
        key = (scheme, netloc, tuple(sorted((str(k), str(v)) for k, v in io.properties.items())))
        fs = _FILESYSTEMS.get(key)
        if fs is not None:
            return fs
        fs = initialize(scheme, netloc)
        if isinstance(fs, pafs.S3FileSystem):
            rebuild, (options,) = fs.__reduce__()
            if not options.get("allow_delayed_open"):
                fs = rebuild({**options, "allow_delayed_open": True})
        return _FILESYSTEMS.put_first(key, fs)

    cached = lru_cache(delayed)
    cached._featurelake_delayed = True  # type: ignore[attr-defined]
    try:
        io.fs_by_scheme = cached
    except (AttributeError, TypeError):  # a FileIO that refuses attributes keeps its multipart uploads
        pass


def _uri(scheme: str, path: str) -> str:
    if scheme == "file":
        return "file://" + ("/" + path.lstrip("/"))
    return f"{scheme}://{path}"


def is_under(uri: str, folder: str) -> bool:
    """Whether canonical ``uri`` is ``folder`` or inside it (both canonical)."""
    folder = folder.rstrip("/")
    return uri == folder or uri.startswith(folder + "/")


_CACHE: "weakref.WeakKeyDictionary[FileIO, Storage]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def storage_of(io: FileIO) -> Storage:
    """The Storage of a FileIO (one per FileIO, so filesystems are built once)."""
    with _LOCK:
        found = _CACHE.get(io)
        if found is None:
            found = _CACHE[io] = Storage(io)
        return found


def table_storage(ice) -> Storage:
    """The Storage of a pyiceberg table (its FileIO, from the catalog's properties)."""
    return storage_of(ice.io)


__all__ = ["FOOTER_READ_BYTES", "PLATFORM_DIR", "SMALL_OBJECT_BYTES", "open_remote", "Storage", "StoredFile", "delete_stored", "is_under", "platform_dir", "storage_of", "table_storage"]
