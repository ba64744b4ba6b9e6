"""The merge-on-read reader: data files plus their update files, vectorized in Arrow.

Why not pyiceberg's own scan: it knows nothing of update files. This reader
plans with pyiceberg (manifests, partition and metrics pruning), then reads
each data file itself: base columns matched by Iceberg field id, the file's
update layers applied in commit order (latest wins; featurelake.overlay),
then the residual filter on merged values. Files are opened through
featurelake.readfiles (footers, locations and decoded layers kept per file;
local files kept open, featurelake.openfiles; process-wide reader threads), and
plans are kept per snapshot and filter. The update layers are loaded by
featurelake.layerload (locally on the calling thread while the reader threads
decode the data files). Only projected columns are read, and update files that
do not touch the projection are never opened.

Pruning may only use statistics that no update can have made stale
(invariant 4): predicates on columns that have ever been updated are relaxed
to ``true`` before planning (featurelake.filters) and checked on merged values afterwards.
"""
from __future__ import annotations

import functools
import logging
import os
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyiceberg.expressions import AlwaysFalse, AlwaysTrue, BooleanExpression
from pyiceberg.expressions.visitors import rewrite_not, translate_column_names
from pyiceberg.io import FileIO
from pyiceberg.io.pyarrow import expression_to_pyarrow
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask
from pyiceberg.table.snapshots import Snapshot

from featurelake import openfiles, readfiles
from featurelake.columns import is_hidden, original_name
from featurelake.errors import CorruptFileError, FeatureLakeError, SchemaMismatchError
from featurelake.filters import bind_filter, referenced_ids, relax_stale
from featurelake.guard import manifest_errors
from featurelake.layerload import POS_FIELD_ID, REMOTE_THREADS, LayerLoading, SharedFiles
from featurelake.layerplan import fail_unfed
from featurelake.overlay import apply_layers
from featurelake.schema import LOCATOR_FILE, LOCATOR_POS, arrow_schema
from featurelake.lru import LRU
from featurelake.state import PlatformState, UpdateEntry
from featurelake.storage import SMALL_OBJECT_BYTES, open_remote, storage_of

if TYPE_CHECKING:
    from pyiceberg.table import Table as IcebergTable

    from featurelake.table import Table

log = logging.getLogger(__name__)

DEFAULT_BATCH = 65_536
_TRANSIENT_RETRIES = 3
WHOLE_FILE_BYTES = 64 << 20  # streaming reads decode a file's projection in one go below this size
THREADED_READ_BYTES = 1 << 20  # a file's projection decoded on Arrow's thread pool above this size (small update files: on one thread)


@dataclass
class ReadReport:
    """What a read did: files read and skipped under the bad-file budget."""

    files: int = 0
    rows: int = 0
    skipped_files: list[str] = field(default_factory=list)
    skipped_rows: int = 0
    update_files_read: int = 0  # distinct update files the read needed (a shared file once)
    update_layers_read: int = 0  # update layers applied (a shared file's row groups one each)
    seconds: float = 0.0
    update_paths: set[str] = field(default_factory=set, repr=False)  # the files counted in update_files_read


class Scan(LayerLoading):
    """One snapshot-consistent read of a table: plan once, then read files."""

    def __init__(
        self,
        table: "Table",
        snapshot: Snapshot | None,
        schema: Schema,
        state: PlatformState,
        columns: Sequence[str] | None = None,
        filter: str | BooleanExpression | None = None,
        with_locator: bool = False,
        max_bad_file_ratio: float = 0.0,
        batch_size: int = DEFAULT_BATCH,
        include_hidden: bool = False,
        ice: "IcebergTable | None" = None,
    ) -> None:
        if not 0.0 <= max_bad_file_ratio <= 1.0:
            raise ValueError("max_bad_file_ratio must be between 0 and 1")
        self.table = table
        self.ice = ice if ice is not None else table.iceberg
        self.io: FileIO = self.ice.io
        self.snapshot = snapshot
        self.schema = schema
        self.state = state
        self.with_locator = with_locator
        self.max_bad_file_ratio = max_bad_file_ratio
        self.batch_size = batch_size
        self.report = ReadReport()

        visible = [f.name for f in schema.fields if include_hidden or not is_hidden(f.name)]
        names = list(columns) if columns is not None else visible
        reserved = [c for c in names if c in (LOCATOR_FILE, LOCATOR_POS)]
        if reserved:
            raise SchemaMismatchError(f"{reserved} are locator columns: ask with with_locator=True", reserved)
        missing = [c for c in names if c not in visible]
        if missing:
            deleted = [c for c in missing if any(is_hidden(f.name) and original_name(f.name) == c for f in schema.fields)]
            hint = f" ({deleted} soft-deleted: restore_column brings them back)" if deleted else ""
            raise SchemaMismatchError(f"unknown column(s) {missing}{hint}; table has {visible}", missing)
        self.columns = names
        self.bound_filter = bind_filter(schema, filter)
        filter_ids = referenced_ids(self.bound_filter)
        filter_names = [schema.find_column_name(i) for i in filter_ids]
        needed = list(dict.fromkeys(names + [n for n in filter_names if n not in names]))
        self.read_schema, self.output_schema = _schemas(self.ice, schema, needed, names)
        self.read_ids = {f.field_id for f in self.read_schema.fields}
        if with_locator:
            self.output_schema = self.output_schema.append(pa.field(LOCATOR_FILE, pa.string(), nullable=False))
            self.output_schema = self.output_schema.append(pa.field(LOCATOR_POS, pa.int64(), nullable=False))
        self.arrow_filter = (
            None
            if self.bound_filter == AlwaysTrue()
            else expression_to_pyarrow(self.bound_filter, self.read_schema)
        )
        self._tasks: list[FileScanTask] | None = None
        self._targets: dict[tuple[int, ...], pa.Schema] = {}
        self._io_key = readfiles.io_key(self.io)
        self._layer_schemas: dict[tuple[int, ...], Schema] = {}
        self._shared_files = SharedFiles()
        self._where: dict[str, tuple[pafs.FileSystem, str]] = {}
        self._plain_local: pafs.FileSystem | None = None

    def _resolve(self, path: str) -> tuple[pafs.FileSystem, str]:
        """(filesystem, path in it) of a data or update file, resolved once per scan (each costs a URL parse).

        Once a plain absolute path resolved to the local filesystem (the FileIO's default scheme is
        ``file``), every other one resolves the same way (pyiceberg: ``os.path.abspath`` of it): no parse.
        """
        found = self._where.get(path)
        if found is None:
            if self._plain_local is not None and path.startswith("/"):
                found = (self._plain_local, os.path.abspath(path))
            else:
                _, fs, fs_path = storage_of(self.io).resolve(path)
                found = (fs, fs_path)
                if path.startswith("/") and isinstance(fs, pafs.LocalFileSystem) and fs_path == os.path.abspath(path):
                    self._plain_local = fs
            self._where[path] = found
        return found

    # ------------------------------------------------------------- planning
    def tasks(self) -> list[FileScanTask]:
        if self._tasks is not None:
            return self._tasks
        if self.snapshot is None or self.bound_filter == AlwaysFalse():
            self._tasks = []
            return self._tasks
        relaxed = relax_stale(rewrite_not(self.bound_filter), self.state.updated_field_ids)
        current = self.ice.metadata.schema()
        # A snapshot's files never change: its plan for one filter is kept (keyed by table and schema too,
        # as the filter is translated through the current schema).
        key = (str(self.ice.metadata.table_uuid), self.ice.metadata.location, self.snapshot.snapshot_id, current.schema_id, repr(relaxed))
        cached = _PLANS.get(key)
        if cached is not None:
            self._tasks = list(cached)
            return self._tasks
        with manifest_errors(self.ice.io, self.snapshot):
            try:
                plan_filter = translate_column_names(relaxed, current, case_sensitive=True)
                tasks = list(self.ice.scan(row_filter=plan_filter, snapshot_id=self.snapshot.snapshot_id).plan_files())
            except ValueError:
                # A predicate on a column the current schema no longer has: plan without pruning.
                tasks = list(self.ice.scan(snapshot_id=self.snapshot.snapshot_id).plan_files())
        for t in tasks:
            if t.delete_files:
                raise FeatureLakeError(
                    f"data file {t.file.file_path} has positional delete files written by another engine; "
                    "compact the table with that engine first"
                )
        if len(tasks) <= _PLAN_CACHE_MAX_FILES:
            _PLANS.put(key, tuple(tasks))
        self._tasks = tasks
        return tasks

    # --------------------------------------------------------------- reading
    def _open(self, path: str, size: int | None = None) -> "pq.ParquetFile | readfiles.RemoteParquet":
        """An open data or update file for the caller to keep (footers, row-group counts): a local
        one is a reader of its own, never handed to another read (see :meth:`_open_leased`)."""
        return self._open_leased(path, size)[0]

    def _open_leased(
        self, path: str, size: int | None = None, key: tuple | None = None
    ) -> "tuple[pq.ParquetFile | readfiles.RemoteParquet, openfiles.OpenFile | None]":
        """An open data or update file and, for a local file, the lease to give back with
        :func:`readfiles.release` (its reader is kept open for the next read: featurelake.openfiles).

        The footer is parsed once per process (:func:`readfiles.open_local`, :meth:`readfiles.RemoteParquet.of`);
        ``key`` is a local file's :func:`openfiles.file_key` when the caller just took it.
        """
        attempt = 0
        while True:
            try:
                fs, fs_path = self._resolve(path)
                if isinstance(fs, pafs.LocalFileSystem):
                    lease = readfiles.open_local(fs_path, key)
                    return lease.parquet, lease
                if size and size <= SMALL_OBJECT_BYTES:  # footer and columns in one GET, not two
                    pf = pq.ParquetFile(open_remote(fs, fs_path, size, SMALL_OBJECT_BYTES))
                elif size:
                    return readfiles.RemoteParquet.of(fs, fs_path, size, self._io_key), None
                else:  # pre-buffering coalesces reads on object storage
                    pf = pq.ParquetFile(self.io.new_input(path).open(), pre_buffer=True)
                pf.footer = readfiles.Footer.of(pf.metadata, pf.schema_arrow)
                return pf, None
            except FileNotFoundError as e:
                raise CorruptFileError(f"file {path} is missing", path) from e
            except (pa.ArrowInvalid, OSError) as e:
                key = None
                if size:  # missing, or a size recorded wrong: open it the plain way, which tells which
                    size = None
                    continue
                if isinstance(e, pa.ArrowInvalid):
                    raise CorruptFileError(f"file {path} is corrupt: {e}", path) from e
                attempt += 1
                if attempt > _TRANSIENT_RETRIES:
                    raise CorruptFileError(f"file {path} cannot be read: {e}", path) from e
                time.sleep(0.05 * 2**attempt)

    def _read_columns(
        self, path: str, requested: Schema, extra_ids: Sequence[int] = (), batch_size: int | None = None,
        rows: tuple[int, int] | None = None, size: int | None = None,
    ) -> Iterator[tuple[pa.RecordBatch, pa.RecordBatch | None, frozenset[str]]]:
        """Batches of ``requested`` (by field id, in current names), plus extra columns raw, plus the
        names of the columns decoded for this read alone (see :func:`readfiles.conform_batch`).

        ``batch_size`` 0 reads the whole file in one go (for whole-table reads).
        ``rows`` = (start, stop) reads only that row range, decoding only the row
        groups that overlap it. ``size`` (bytes, from the plan or the platform
        state) saves an object store the request asking for it.
        """
        pf, lease = self._open_leased(path, size)
        ok = False
        try:
            projected, columns, extra = readfiles.projection(pf, frozenset(f.field_id for f in requested.fields), tuple(extra_ids))
            target = self._target(requested)
            if not columns and not extra:
                lo, hi = rows if rows is not None else (0, pf.metadata.num_rows)
                readfiles.release(lease)
                lease = None
                step = batch_size or (hi - lo) or 1
                for start in range(lo, hi, step):
                    yield readfiles.empty_batch(target, min(step, hi - start)), None, frozenset()
                return
            try:
                if rows is not None:
                    batches = readfiles.row_range(pf, rows, batch_size or self.batch_size, columns + extra)
                elif batch_size == 0 or (batch_size is None and readfiles.projected_bytes(pf, columns + extra) <= WHOLE_FILE_BYTES):
                    # the whole file at once: Arrow decodes its column chunks in parallel, and one
                    # read of a small projection is twice as fast as iterating it batch by batch.
                    # Below a few MB, handing column chunks to Arrow's pool costs more than decoding them.
                    threaded = readfiles.projected_bytes(pf, columns + extra) > THREADED_READ_BYTES
                    table = pf.read(columns=columns + extra, use_threads=threaded)
                    readfiles.release(lease)  # decoded: the file's reader is free for the next read
                    lease = None
                    batches = table.to_batches()
                else:
                    batches = pf.iter_batches(batch_size=batch_size or self.batch_size, columns=columns + extra, use_threads=True)
                for batch in batches:
                    converted, owned = readfiles.conform_batch(batch, projected, requested, target) if columns else (readfiles.empty_batch(target, batch.num_rows), frozenset())
                    yield converted, batch.select(extra) if extra else None, owned
            except (OSError, pa.ArrowInvalid) as e:
                raise CorruptFileError(f"file {path} is corrupt: {e}", path) from e
            ok = True
        finally:
            # a failed or abandoned read drops its reader (the file may be damaged; a batch reader
            # left half-read may still hold it); a finished one gives it back
            readfiles.release(lease, ok)

    def _target(self, requested: Schema) -> pa.Schema:
        """The Arrow schema (no field ids) of ``requested``, a part of this scan's read schema; converted once."""
        key = tuple(f.field_id for f in requested.fields)
        found = self._targets.get(key)
        if found is None:
            found = self._targets[key] = arrow_schema(requested, field_ids=False)
        return found

    @property
    def _local(self) -> bool:
        """Whether the table lives on a local disk (planning side: needs the table)."""
        return storage_of(self.io).is_local(self.ice.location())

    def layers_for(self, path: str) -> list[tuple[UpdateEntry, np.ndarray | None, pa.RecordBatch]]:
        """The update layers of one data file that touch the projection (loaded now)."""
        return self._start_layers(path)()

    def read_range(
        self, task: FileScanTask, start: int, stop: int, layers: list | None = None, batch_size: int | None = None
    ) -> Iterator[tuple[pa.RecordBatch, np.ndarray, int]]:
        """Merged, filtered, projected batches of rows [start, stop) of one data file.

        Yields ``(batch, positions, end)``: the rows of source rows [.., end)
        that passed the filter, and their row positions in the file. Streaming
        readers that resume at an exact row (training reads) need both.
        ``layers`` (from :meth:`layers_for`) saves reloading them per range.
        """
        path = task.file.file_path
        pending = self._start_layers(path) if layers is None else None
        pos = start
        for base, _, owned in self._read_columns(
            path, self.read_schema, batch_size=batch_size, rows=(start, stop), size=task.file.file_size_in_bytes
        ):
            if pending is not None:  # fetched while the data file was
                layers, pending = pending(), None
            n = base.num_rows
            merged = apply_layers(base, layers, pos, owned) if layers else base
            merged = _with_locator(merged, path, pos) if self.with_locator else merged.append_column(
                LOCATOR_POS, pa.array(np.arange(pos, pos + n, dtype=np.int64)))
            pos += n
            if self.arrow_filter is not None:
                merged = merged.filter(self.arrow_filter)
            positions = merged.column(LOCATOR_POS).to_numpy()
            yield self._output(merged), positions, pos

    def _output(self, merged: pa.RecordBatch) -> pa.RecordBatch:
        out = merged.select(self.columns + ([LOCATOR_FILE, LOCATOR_POS] if self.with_locator else []))
        return out.cast(self.output_schema) if not out.schema.equals(self.output_schema) else out

    def read_file(
        self, task: FileScanTask, whole: bool = False, pending: "Callable[[], list] | None" = None
    ) -> Iterator[pa.RecordBatch]:
        """Merged, filtered, projected batches of one data file (``whole``: read it in one go).

        ``pending`` returns the file's layers once loaded elsewhere (:meth:`_feed_layers`); without it
        they are loaded here (:meth:`_start_layers`).
        """
        path = task.file.file_path
        pending, layers = pending or self._start_layers(path), None
        start = 0
        for base, _, owned in self._read_columns(
            path, self.read_schema, batch_size=0 if whole else None, size=task.file.file_size_in_bytes
        ):
            if layers is None:  # fetched (object store) or loaded (calling thread) while the data file was
                layers = pending()
            yield self._merged(path, base, layers, start, owned)
            start += base.num_rows

    def _merged(self, path: str, base: pa.RecordBatch, layers: list, start: int, owned: frozenset[str]) -> pa.RecordBatch:
        """Rows [start, start + n) of data file ``path`` (``base``) with its layers applied, filtered, projected."""
        merged = apply_layers(base, layers, start, owned) if layers else base
        if self.with_locator:
            merged = _with_locator(merged, path, start)
        if self.arrow_filter is not None:
            merged = merged.filter(self.arrow_filter)
        return self._output(merged)

    def _guarded(
        self, task: FileScanTask, budget: int, whole: bool = False, pending: "Callable[[], list] | None" = None,
        ready: "Callable[[], bool] | None" = None,
    ) -> "list[pa.RecordBatch] | Callable[[], list[pa.RecordBatch] | None] | None":
        """Read a whole file; None when it is bad and the budget allows skipping it.

        With ``ready`` (a planned read's :meth:`layerplan.LayerSlot.ready`): when the file's base is decoded
        before another thread has finished loading its layers, this thread does not wait for them:
        it returns a call that merges them later (the caller, once it has fed the layers), and goes
        on to its next data file.
        """
        try:
            if ready is None:
                return list(self.read_file(task, whole, pending))
            path = task.file.file_path
            bases = list(self._read_columns(path, self.read_schema, batch_size=0, size=task.file.file_size_in_bytes))
            if not ready():
                return functools.partial(self._finish, task, budget, bases, pending)
            return self._merged_all(path, bases, pending())  # type: ignore[misc]
        except CorruptFileError as e:
            return self._skip(task, budget, e)

    def _finish(self, task: FileScanTask, budget: int, bases: list, pending: "Callable[[], list]") -> list[pa.RecordBatch] | None:
        """A deferred file of :meth:`_guarded`: its layers (loaded by now) applied to its decoded bases."""
        try:
            return self._merged_all(task.file.file_path, bases, pending())
        except CorruptFileError as e:
            return self._skip(task, budget, e)

    def _merged_all(self, path: str, bases: list, layers: list) -> list[pa.RecordBatch]:
        """:meth:`_merged` of each of a data file's decoded batches (``bases``: :meth:`_read_columns`'), in order."""
        out, start = [], 0
        for base, _, owned in bases:
            out.append(self._merged(path, base, layers, start, owned))
            start += base.num_rows
        return out

    def _skip(self, task: FileScanTask, budget: int, error: CorruptFileError) -> None:
        """Skip a bad file when the budget allows it (None), else raise ``error``."""
        if len(self.report.skipped_files) < budget:
            self.report.skipped_files.append(task.file.file_path)
            self.report.skipped_rows += task.file.record_count
            warnings.warn(f"skipping bad file ({len(self.report.skipped_files)}/{budget} allowed): {error}", stacklevel=4)
            return None
        raise error

    def _budget(self, tasks: list[FileScanTask]) -> int:
        return int(self.max_bad_file_ratio * len(tasks) + 1e-9)

    def to_table(self, threads: int | None = None) -> pa.Table:
        """The whole result, files read in parallel, in plan order.

        Locally one file per core at a time: Arrow already decodes each file's
        column chunks on its own thread pool, and more files in flight only
        thrash. On an object store more files are in flight: each waits on latency.
        """
        t0 = time.perf_counter()
        tasks = self.tasks()
        budget = self._budget(tasks)
        local = self._local
        shared = readfiles.reader_pool(max(2, os.cpu_count() or 2) if local else REMOTE_THREADS) if threads is None else None
        if len(tasks) <= 1:
            results = [self._guarded(t, budget, whole=True) for t in tasks]
        else:
            # Locally, the update layers are loaded on this thread while the reader threads decode the
            # data files (see _feed_layers); on an object store each reader fetches its own, in parallel.
            fed, pendings, readies = self._plan_layers(tasks) if local else ([], [None] * len(tasks), [None] * len(tasks))
            own = None if shared is not None else ThreadPoolExecutor(max_workers=min(threads or 2, len(tasks)))
            try:
                jobs = [(shared or own).submit(self._guarded, t, budget, True, p, r) for t, p, r in zip(tasks, pendings, readies)]
                self._feed_layers(fed)
                results = []
                for j in jobs:  # a file whose layers were still loading when its base was decoded is merged here
                    r = j.result()
                    results.append(r() if callable(r) else r)
            finally:
                fail_unfed(fed)  # an interrupted read: no reader thread waits forever
                if own is not None:
                    own.shutdown(wait=True)
        batches = [b for r in results if r for b in r if b.num_rows]
        self.report.files = len(tasks) - len(self.report.skipped_files)
        result = pa.Table.from_batches(batches, schema=self.output_schema)
        self.report.rows = result.num_rows
        self.report.seconds = time.perf_counter() - t0
        return result

    def to_batches(
        self, shuffle: bool = False, seed: int = 0, sample: float | None = None, prefetch: int = 2
    ) -> Iterator[pa.RecordBatch]:
        """Stream batches of at most ``batch_size`` rows, one file ahead per prefetch slot.

        ``shuffle`` permutes the file order and the rows inside each batch;
        ``sample`` keeps that fraction of rows (Bernoulli, deterministic by seed).
        """
        if sample is not None and not 0.0 < sample <= 1.0:
            raise ValueError("sample must be a fraction in (0, 1]")
        tasks = list(self.tasks())
        rng = np.random.default_rng(seed)
        if shuffle:
            tasks = [tasks[i] for i in rng.permutation(len(tasks))]
        budget = self._budget(tasks)
        prefetch = max(1, prefetch)
        shared = readfiles.reader_pool(prefetch)
        pool = shared or ThreadPoolExecutor(max_workers=prefetch)
        futures = [pool.submit(self._guarded, t, budget) for t in tasks[:prefetch]]
        next_task = len(futures)
        try:
            while futures:
                batches = futures.pop(0).result()
                if next_task < len(tasks):
                    futures.append(pool.submit(self._guarded, tasks[next_task], budget))
                    next_task += 1
                for batch in batches or []:
                    if sample is not None and sample < 1.0:
                        batch = batch.filter(pa.array(rng.random(batch.num_rows) < sample))
                    if shuffle and batch.num_rows > 1:
                        batch = batch.take(pa.array(rng.permutation(batch.num_rows)))
                    for offset in range(0, batch.num_rows, self.batch_size):
                        piece = batch.slice(offset, self.batch_size)
                        self.report.rows += piece.num_rows
                        yield piece
        finally:
            for f in futures:  # the consumer stopped early: files not yet started are not read
                f.cancel()
            if shared is None:
                pool.shutdown(wait=True)
        self.report.files = len(tasks) - len(self.report.skipped_files)


_SCHEMAS = LRU(256)


def _schemas(ice: "IcebergTable", schema: Schema, needed: list[str], names: list[str]) -> tuple[Schema, pa.Schema]:
    """(``schema`` pruned to ``needed``, the Arrow output schema of ``names``), derived once per table schema.

    A table's schema ids never change meaning, so (table, schema id, columns) is a safe key; pruning a
    wide schema costs milliseconds, as much as reading a small projection.
    """
    key = (str(ice.metadata.table_uuid), schema.schema_id, len(schema.fields), schema.highest_field_id, tuple(needed), tuple(names))
    found = _SCHEMAS.get(key)
    if found is None:
        read_schema = schema.select(*needed) if needed else Schema()
        selected = arrow_schema(schema.select(*names), field_ids=False) if names else pa.schema([])
        found = (read_schema, pa.schema([selected.field(n) for n in names]))
        _SCHEMAS.put(key, found)
    return found


_PLANS = LRU(32)  # (table, location, snapshot, current schema, filter) -> planned tasks
_PLAN_CACHE_MAX_FILES = 20_000  # larger plans are planned each time (a task holds a DataFile: ~1-2 KB)


def clear_caches() -> None:
    """Forget cached plans, pruned schemas, footers, decoded layers and projections (tests that damage files underneath)."""
    _PLANS.items.clear()
    _SCHEMAS.items.clear()
    readfiles.clear_caches()


def _with_locator(batch: pa.RecordBatch, path: str, start: int) -> pa.RecordBatch:
    n = batch.num_rows
    files = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([path])).cast(pa.string())
    pos = pa.array(np.arange(start, start + n, dtype=np.int64))
    return batch.append_column(LOCATOR_FILE, files).append_column(LOCATOR_POS, pos)
