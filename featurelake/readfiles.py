"""Opening Parquet files for the reader: footers parsed once, reader threads, decoded layers kept.

Data and update files are immutable (a write makes new files with new
names), so what the reader derives from a file is kept for the process:

* its footer (the parsed metadata, the Arrow schema, decoded bytes per column),
  local entries keyed by (path, size, mtime_ns, inode) so a file changed
  underneath is parsed again; on an object store a fragment keeps its footer,
  so a second read of a file costs no footer request;
* locally, the opened reader itself (handle and parsed footer), checked out by
  one read at a time (featurelake.openfiles);
* the projection of its schema onto a read's field ids (shared by files of one writer);
* its decoded update-layer values, under a byte budget (FEATURELAKE_LAYER_CACHE_MB).

:func:`forget_files` drops all of it for given files: garbage collection calls it for
the files it deletes.

Reader threads live in process-wide pools (see :func:`reader_pool`). A file's batches are
decoded here too: a row range of it (:func:`row_range`) and its columns matched to a read's
schema by field id (:func:`conform_batch`).
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyarrow._parquet import ParquetReader  # what pq.ParquetFile wraps: opening one directly saves ~10 us a file
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import _to_requested_schema, pyarrow_to_schema
from pyiceberg.schema import Schema, prune_columns

from featurelake import openfiles, storage
from featurelake.lru import LRU

# On an object store a request costs ~10-50 ms, as much as reading megabytes: the projected column
# chunks of a file are fetched as one ranged GET, gaps of unread columns included, up to these sizes.
_REMOTE_FORMAT = ds.ParquetFileFormat(
    default_fragment_scan_options=ds.ParquetFragmentScanOptions(
        pre_buffer=True, cache_options=pa.CacheOptions(hole_size_limit=8 << 20, range_size_limit=128 << 20, lazy=False)
    )
)


# Reader threads live for the process: starting threads per read costs milliseconds on a loaded
# machine (as much as a small projected read). One pool per size; a read started inside a pool
# thread (a nested read) gets its own threads, so no pool thread ever waits on its own pool.
_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOL_LOCK = threading.Lock()
_IN_POOL = threading.local()


def _mark_pool_thread() -> None:
    _IN_POOL.active = True


def reader_pool(workers: int) -> ThreadPoolExecutor | None:
    """The process-wide pool of ``workers`` reader threads; None inside a reader thread."""
    if getattr(_IN_POOL, "active", False):
        return None
    with _POOL_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            pool = _POOLS[workers] = ThreadPoolExecutor(
                max_workers=workers, thread_name_prefix="featurelake-read", initializer=_mark_pool_thread
            )
        return pool


_LAYER_POOLS: dict[int, ThreadPoolExecutor] = {}


def layer_pool(workers: int) -> ThreadPoolExecutor:
    """The process-wide pool fetching update files from an object store while their data file is fetched.

    Its tasks never submit work to a pool, so any thread (a reader thread too) may wait on them.
    """
    with _POOL_LOCK:
        pool = _LAYER_POOLS.get(workers)
        if pool is None:
            pool = _LAYER_POOLS[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="featurelake-layers")
        return pool


def _forget_pools_after_fork() -> None:
    """A forked child (data-loader workers) has none of the parent's threads: it starts its own pools."""
    global _POOL_LOCK
    _POOLS.clear()
    _LAYER_POOLS.clear()
    _POOL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_pools_after_fork)

class RemoteParquet:
    """A Parquet file on an object store, read as a dataset fragment of known size.

    The part of ``pq.ParquetFile`` the reader uses. The size known up front
    saves the HEAD request opening a file costs; the footer is one ranged GET
    and a projection one more (see ``_REMOTE_FORMAT``).
    """

    def __init__(self, fs: pafs.FileSystem, path: str, size: int) -> None:
        self.fragment = _REMOTE_FORMAT.make_fragment(path, filesystem=fs, file_size=size)
        self.metadata = self.fragment.metadata
        self.schema_arrow = self.fragment.physical_schema
        self.footer = Footer.of(self.metadata, self.schema_arrow)

    @staticmethod
    def of(fs: pafs.FileSystem, path: str, size: int, io: tuple) -> "RemoteParquet":
        """The file, its footer fetched once per process and storage view (``io``, see :func:`io_key`):
        a fragment keeps its parsed metadata and reads with it, so a second read of the same file
        costs no footer request."""
        key = (io, type(fs).__name__, path, size)
        found = _FOOTERS.get(key)
        if found is None:
            found = RemoteParquet(fs, path, size)
            _FOOTERS.put(key, found)
        return found

    def read(self, columns: list[str], use_threads: bool = True) -> pa.Table:
        return self.fragment.to_table(columns=columns, use_threads=use_threads)

    def read_row_groups(self, row_groups: list[int], columns: list[str], use_threads: bool = True) -> pa.Table:
        return self.fragment.subset(row_group_ids=row_groups).to_table(columns=columns, use_threads=use_threads)

    def iter_batches(
        self, batch_size: int, columns: list[str], use_threads: bool = True, row_groups: list[int] | None = None
    ) -> Iterator[pa.RecordBatch]:
        fragment = self.fragment if row_groups is None else self.fragment.subset(row_group_ids=row_groups)
        return fragment.to_batches(columns=columns, batch_size=batch_size, use_threads=use_threads)


class Footer:
    """What the reader derives from a file's footer, once per file.

    ``column_bytes`` (decoded bytes per top-level column, a walk over every
    column chunk) is computed on first use: a first read of a small update
    file never asks for it, and the walk costs as much as decoding the file.
    """

    __slots__ = ("metadata", "schema", "key", "_column_bytes")

    def __init__(self, metadata: pq.FileMetaData, schema: pa.Schema, key: bytes) -> None:
        self.metadata = metadata
        self.schema = schema  # the file's Arrow schema, with field ids
        self.key = key  # the schema serialized: files written by one writer share it (and their projections)
        self._column_bytes: dict[str, int] | None = None

    @staticmethod
    def of(metadata: pq.FileMetaData, schema: pa.Schema) -> "Footer":
        return Footer(metadata, schema, schema.serialize().to_pybytes())

    @property
    def column_bytes(self) -> dict[str, int]:
        """Decoded bytes per top-level column."""
        sizes = self._column_bytes
        if sizes is None:
            sizes = {}
            metadata = self.metadata
            for i in range(metadata.num_row_groups):
                rg = metadata.row_group(i)
                for j in range(rg.num_columns):
                    col = rg.column(j)
                    top = col.path_in_schema.split(".", 1)[0]
                    sizes[top] = sizes.get(top, 0) + col.total_uncompressed_size
            self._column_bytes = sizes
        return sizes


# Data and update files are immutable (new files get new names), so a footer parsed once serves every
# later read. Local entries are keyed by (path, size, mtime_ns, inode): a file changed underneath is parsed again.
_FOOTERS = LRU(4096)


class SizedLRU:
    """An LRU of values with a byte budget; values above an eighth of the budget are not kept.

    Values put together by :meth:`put_all` (views of buffers decoded in one call: the layers of a
    shared update file) are kept and evicted together: one of them kept alone would keep the
    others' bytes alive while counting only its own.
    """

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.items: OrderedDict = OrderedDict()
        self.bytes = 0
        self.lock = threading.Lock()
        self.groups: dict = {}  # key -> the keys put with it (put_all)

    def get(self, key):
        with self.lock:
            found = self.items.get(key)
            if found is not None:
                self.items.move_to_end(key)
                return found[0]
        return None

    def put(self, key, value, nbytes: int) -> None:
        if nbytes > self.budget // 8:
            return
        with self.lock:
            if key in self.items:
                return
            self.items[key] = (value, nbytes)
            self.bytes += nbytes
            self._evict()

    def put_all(self, entries: "list[tuple[object, object, int]]") -> None:
        """Keep (key, value, nbytes) entries as one: evicted together, not kept when together they
        take over an eighth of the budget. Keys already kept stay as they are."""
        if sum(n for _, _, n in entries) > self.budget // 8:
            return
        with self.lock:
            added = tuple(key for key, _, _ in entries if key not in self.items)
            for key, value, nbytes in entries:
                if key in added and key not in self.items:
                    self.items[key] = (value, nbytes)
                    self.bytes += nbytes
                    if len(added) > 1:
                        self.groups[key] = added
            self._evict()

    def drop_if(self, condition: "Callable[[object], bool]") -> None:
        """Forget the keys that meet ``condition`` (and whatever was put together with them)."""
        with self.lock:
            for key in [k for k in self.items if condition(k)]:
                self._drop(key)

    def _drop(self, key) -> None:
        found = self.items.pop(key, None)
        if found is not None:
            self.bytes -= found[1]
        for other in self.groups.pop(key, ()):
            self.groups.pop(other, None)
            found = self.items.pop(other, None)
            if found is not None:
                self.bytes -= found[1]

    def _evict(self) -> None:
        while self.bytes > self.budget and self.items:
            self._drop(next(iter(self.items)))

    def clear(self) -> None:
        with self.lock:
            self.items.clear()
            self.groups.clear()
            self.bytes = 0


# Decoded update layers, kept across reads: update files never change, sparse layers are small, and
# re-reading one snapshot (training epochs, dashboards) would otherwise open every update file again,
# which costs a layered read more than applying the layers does. FEATURELAKE_LAYER_CACHE_MB=0 turns it off.
LAYERS = SizedLRU(int(float(os.environ.get("FEATURELAKE_LAYER_CACHE_MB", "256")) * (1 << 20)))

def io_key(io: FileIO) -> tuple[tuple[str, str], ...]:
    """What identifies a FileIO's view of storage (endpoint, credentials): its properties.

    Each table load makes a new FileIO, so caches of remote files key on this,
    never on the object: a file opened under other credentials is opened again.
    """
    return tuple(sorted((str(k), str(v)) for k, v in io.properties.items()))


def open_local(path: str, key: tuple | None = None) -> openfiles.OpenFile:
    """A local Parquet file, opened for the calling thread alone: a kept-open reader when the pool
    has one (featurelake.openfiles), else a new one with the cached footer (parsed on first open).

    Give it back with :func:`release` when done (``ok=False`` after a failed read: not reused).
    ``key`` is the file's :func:`openfiles.file_key` when the caller just took it (saves a stat).
    FileNotFoundError when the file is gone.
    """
    key = key or openfiles.file_key(path)
    return openfiles.checkout(key, lambda handle: _parquet_of(key, handle))


def _parquet_of(key: tuple, handle: pa.NativeFile) -> pq.ParquetFile:
    """A ``ParquetFile`` over an open handle (an open file, not a path: a path makes pyarrow build a
    filesystem and stat the file again), its footer from the cache when this version was parsed before."""
    footer = _FOOTERS.get(key)
    if footer is None:
        pf = pq.ParquetFile(handle, pre_buffer=False)
        footer = Footer.of(pf.metadata, pf.schema_arrow)
        _FOOTERS.put(key, footer)
    else:
        pf = pq.ParquetFile(handle, metadata=footer.metadata, pre_buffer=False)
    pf.footer = footer
    return pf


def release(lease: "openfiles.OpenFile | None", ok: bool = True) -> None:
    """Give back a reader from :func:`open_local`: kept open for the next read when ``ok``; dropped
    (never reused: the file may be damaged, or an abandoned batch reader may still hold it) otherwise."""
    if lease is None:
        return
    if ok:
        openfiles.checkin(lease)
    else:
        openfiles.discard(lease)


def _fs_path(location: str) -> str:
    """A location as the filesystems name the file: no ``file:`` scheme locally, ``bucket/key`` on a store."""
    if location.startswith("file://"):
        return location[len("file://"):]
    if location.startswith("file:"):
        return location[len("file:"):]
    scheme, sep, rest = location.partition("://")
    return rest if sep and scheme.isalnum() else location


def forget_files(locations: Iterable[str]) -> None:
    """Forget everything derived from these files: footers, decoded layers, kept-open readers.

    Garbage collection calls it for the files it deletes (featurelake.storage's delete hook), so a
    deleted file's handle is closed and its memory freed; tests and the read benchmark call it to
    make a read find a file as a first read does. Takes locations or filesystem paths.
    """
    paths = {_fs_path(str(p)) for p in locations}
    if not paths:
        return
    openfiles.forget(paths)
    with _FOOTERS.lock:
        for key in [k for k in _FOOTERS.items if _names_path(k, paths)]:
            del _FOOTERS.items[key]
    LAYERS.drop_if(lambda key: _names_path(key, paths))


def forget_file(location: str) -> None:
    """:func:`forget_files` of one file."""
    forget_files([location])


def _names_path(key: tuple, paths: "set[str]") -> bool:
    """Whether a cache key (local: path first; remote: storage view, filesystem, path) names one of ``paths``."""
    return (isinstance(key[0], str) and key[0] in paths) or (len(key) > 2 and isinstance(key[2], str) and key[2] in paths)


def clear_caches() -> None:
    """Forget cached footers, kept-open readers, decoded layers and projections."""
    _FOOTERS.items.clear()
    LAYERS.clear()
    _PROJECTIONS.clear()
    _LEAF_PROJECTIONS.clear()
    _PLANS.clear()
    openfiles.clear()


storage.on_delete(forget_files)


_PROJECTIONS: dict = {}


def projection(pf: "pq.ParquetFile | RemoteParquet", ids: frozenset[int], extra_ids: tuple[int, ...]) -> tuple[Schema, list[str], list[str]]:
    """A file's Iceberg schema pruned to ``ids``, the column names to read, and the extra columns.

    Files written by one writer share a schema, so the conversion (a few ms for
    a wide table, paid per file and per update file otherwise) is cached.
    """
    footer: Footer = pf.footer
    key = (footer.key, ids, extra_ids)  # bytes: Schema equality ignores field ids
    found = _PROJECTIONS.get(key)
    if found is None:
        found = _remember(key, _project(footer.schema, ids, extra_ids))
    return found


def leaf_projection(
    reader: ParquetReader, ids: frozenset[int], extra_ids: tuple[int, ...]
) -> tuple[Schema, list[str], list[str], list[int], bool]:
    """:func:`projection` of a file opened as a bare ``ParquetReader`` (no ``ParquetFile``, no
    :class:`Footer`), plus the leaf column indices that read those columns, as ``ParquetFile.read``
    would pick them, and whether the file is flat (every top-level column one leaf: its leaf indices
    are its top-level indices, which ``read_column`` takes).

    Kept per Parquet schema, compared with ``ParquetSchema.equals`` (names, types, repetition and
    field ids of every node): it fixes the leaves and, by field id, the columns and their Iceberg
    types. Comparing it costs a few us; converting to Arrow and serializing, as :func:`projection`
    keys on, costs ~30 us, as much as a small update file's own Python. Update files of one
    backfill share one schema, so each (ids, extras) holds one or a few.
    """
    schema = reader.metadata.schema
    known = _LEAF_PROJECTIONS.setdefault((ids, extra_ids), [])
    for candidate, found in known:
        if candidate.equals(schema):
            return found
    projected, columns, extra = _project(reader.schema_arrow, ids, extra_ids)
    paths = reader.column_paths
    found = (projected, columns, extra, leaf_indices(reader, columns + extra), all(len(path) == 1 for path in paths))
    if len(known) >= 8:
        del known[0]
    if len(_LEAF_PROJECTIONS) > 1024:
        _LEAF_PROJECTIONS.clear()
        known = _LEAF_PROJECTIONS.setdefault((ids, extra_ids), [])
    known.append((schema, found))
    return found


def leaf_indices(reader: ParquetReader, names: list[str]) -> list[int]:
    """The leaf column indices of top-level columns ``names``, in that order (``ParquetFile.read``'s pick)."""
    paths = reader.column_paths
    return [i for name in names for i, path in enumerate(paths) if path[0] == name]


def _project(schema: pa.Schema, ids: frozenset[int], extra_ids: tuple[int, ...]) -> tuple[Schema, list[str], list[str]]:
    """A file's Iceberg schema pruned to ``ids``, the column names to read, and the extra columns present."""
    file_schema = pyarrow_to_schema(schema, downcast_ns_timestamp_to_us=True)
    projected = prune_columns(file_schema, set(ids), select_full_types=True)
    extra = []
    for fid in extra_ids:
        try:
            extra.append(file_schema.find_column_name(fid))
        except ValueError:
            pass
    return projected, [c.name for c in projected.columns], extra


_LEAF_PROJECTIONS: "dict[tuple[frozenset[int], tuple[int, ...]], list[tuple[pq.ParquetSchema, tuple]]]" = {}


def _remember(key: tuple, value: tuple) -> tuple:
    if len(_PROJECTIONS) > 1024:
        _PROJECTIONS.clear()
    _PROJECTIONS[key] = value
    return value


def projected_bytes(pf: "pq.ParquetFile | RemoteParquet", columns: list[str]) -> int:
    """Decoded size of ``columns`` (top-level names) in a Parquet file, from its footer."""
    sizes = pf.footer.column_bytes
    return sum(sizes.get(c, 0) for c in columns)


# ------------------------------------------------------- decoding a file's batches
def row_range(pf: pq.ParquetFile, rows: tuple[int, int], batch_size: int, columns: list[str]) -> Iterator[pa.RecordBatch]:
    """Batches of rows [start, stop) of a Parquet file: only the overlapping row groups are decoded.

    When those groups hold at most ``batch_size`` rows they are read in one call (decoded
    faster than the same rows through ``iter_batches``: no streaming reader), else streamed.
    """
    start, stop = rows
    groups, first, end = [], 0, 0
    for i in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(i).num_rows
        if end < stop and end + n > start:
            if not groups:
                first = end
            groups.append(i)
        end += n
        if end >= stop:
            break
    if not groups:
        return
    if end - first <= batch_size:
        batches: Iterable[pa.RecordBatch] = pf.read_row_groups(groups, columns=columns, use_threads=True).to_batches()
    else:
        batches = pf.iter_batches(batch_size=batch_size, row_groups=groups, columns=columns, use_threads=True)
    pos = first
    for batch in batches:
        lo, hi = max(start, pos), min(stop, pos + batch.num_rows)
        if hi > lo:
            yield batch.slice(lo - pos, hi - lo)
        pos += batch.num_rows
        if pos >= stop:
            return


def empty_batch(target: pa.Schema, rows: int) -> pa.RecordBatch:
    """``rows`` rows of nulls in ``target`` (zero columns when the schema is empty)."""
    if len(target):
        return pa.RecordBatch.from_arrays([pa.nulls(rows, f.type) for f in target], schema=target)
    return pa.record_batch([pa.nulls(rows)], names=["_"]).select([])


def conform_batch(
    batch: pa.RecordBatch, file_schema: Schema, requested: Schema, target: pa.Schema
) -> tuple[pa.RecordBatch, frozenset[str]]:
    """A file's batch in the requested schema: columns matched by field id, renamed, cast.

    ``batch`` holds ``file_schema``'s columns first, in its order (read with the names
    :func:`projection` returns, extras after them): columns are taken by position, which costs
    a fraction of a lookup by name. Top-level columns are matched and cast directly (pyiceberg's
    general conversion loses nulls of list<struct> values); nested schema evolution falls back
    to pyiceberg's conversion. ``target`` is ``requested`` in Arrow.
    Also returns the names of the columns decoded from the file (cast or not):
    their buffers belong to this read alone (columns of nulls may share one).
    """
    plan, owned = _conform_plan(file_schema, requested, target)
    if batch.num_columns < len(file_schema.fields):
        raise pa.ArrowInvalid(f"a batch of {batch.num_columns} columns for a file projection of {len(file_schema.fields)}")
    columns = []
    try:
        for index, arrow_field in plan:
            if index is None:
                columns.append(pa.nulls(batch.num_rows, arrow_field.type))
                continue
            col = batch.column(index)
            columns.append(col if col.type.equals(arrow_field.type) else col.cast(arrow_field.type))
        return pa.RecordBatch.from_arrays(columns, schema=target), owned
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        names = [f.name for f in file_schema.fields]
        return _to_requested_schema(requested, file_schema, batch.select(names), downcast_ns_timestamp_to_us=True), frozenset()


def conform_arrays(
    arrays: list[pa.Array], rows: int, file_schema: Schema, requested: Schema, target: pa.Schema, names: list[str]
) -> pa.RecordBatch:
    """:func:`conform_batch` of a file's columns read one by one (``arrays``: ``file_schema``'s columns, in
    its order, named ``names``), without first assembling them into a batch: the same columns matched,
    renamed and cast; the same fallback when a direct cast does not apply."""
    if not arrays:
        return empty_batch(target, rows)
    plan, _ = _conform_plan(file_schema, requested, target)
    if len(arrays) < len(file_schema.fields):
        raise pa.ArrowInvalid(f"{len(arrays)} columns for a file projection of {len(file_schema.fields)}")
    columns = []
    try:
        for index, arrow_field in plan:
            if index is None:
                columns.append(pa.nulls(rows, arrow_field.type))
                continue
            col = arrays[index]
            columns.append(col if col.type.equals(arrow_field.type) else col.cast(arrow_field.type))
        return pa.RecordBatch.from_arrays(columns, schema=target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        return conform_batch(pa.RecordBatch.from_arrays(arrays, names=names), file_schema, requested, target)[0]


_PLANS: dict = {}


def _conform_plan(file_schema: Schema, requested: Schema, target: pa.Schema) -> "tuple[list[tuple[int | None, pa.Field]], frozenset[str]]":
    """Per requested column, the position in ``file_schema`` of the column holding its field id (None:
    not in the file) and the target field; and the names decoded from the file. Worked out once per (file schema, request):
    both are cached objects (projections are shared by every file of one writer, requests by a scan),
    kept alive by the entry, so their ids cannot be reused while it stands."""
    key = (id(file_schema), id(requested), id(target))
    found = _PLANS.get(key)
    if found is not None and found[0] is file_schema and found[1] is requested and found[2] is target:
        return found[3], found[4]
    by_id = {f.field_id: i for i, f in enumerate(file_schema.fields)}
    plan = [(by_id.get(field.field_id), arrow_field) for field, arrow_field in zip(requested.fields, target)]
    owned = frozenset(arrow_field.name for index, arrow_field in plan if index is not None)
    if len(_PLANS) > 4096:
        _PLANS.clear()
    _PLANS[key] = (file_schema, requested, target, plan, owned)
    return plan, owned
