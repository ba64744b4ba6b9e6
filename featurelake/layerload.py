"""Loading a read's update layers: which update files a data file needs, decoded once, and when.

Part of the merge-on-read reader (featurelake.read: :class:`Scan` mixes this in). A layer is
(entry, row positions or None when dense, values) in the read's schema; decoded layers are kept
for the process (``readfiles.LAYERS``), keyed by the update file's identity and the columns.

When: on an object store each update file is fetched on the process-wide layer pool while the
data file is (each waits on latency). Locally, a read of several data files loads them on the
calling thread while the reader threads decode the base columns (:meth:`LayerLoading._feed_layers`):
a first read of a snapshot pays for its update files alongside the data, not before it. Every
update file is claimed once (:class:`_LayerSlot`), by the feeding thread or by the reader thread
that reached its data file first, so nobody waits for work queued behind another file.

Safety: a damaged update file is a CorruptFileError (missing, unreadable, row positions null,
negative or out of order, a dense layer of the wrong length), raised to the read of its data file,
so the bad-file budget applies to it as to any damaged file; never wrong rows.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
from pyiceberg.schema import Schema
from pyiceberg.table import FileScanTask

from featurelake import openfiles, readfiles
from featurelake.errors import CorruptFileError
from featurelake.layerplan import LayerSlot, fail_unfed, plan_layers
from featurelake.state import PlatformState, UpdateEntry
from featurelake.storage import open_remote

if TYPE_CHECKING:
    from featurelake.read import ReadReport

POS_FIELD_ID = 2147483645  # Iceberg's reserved field id of the `_pos` metadata column
THREADED_LAYER_BYTES = 1 << 20  # an update file decoded on Arrow's thread pool above this size (small ones: on one thread)
REMOTE_THREADS = 16  # files in flight on an object store, where each read waits on latency, not on a core
SMALL_LAYER_FILE_BYTES = 4 << 20  # a local update file up to this size is read in one call and parsed from memory
SHARED_WHOLE_BYTES = 8 << 20  # a shared update file up to this size is read whole once per read (locally, and in one GET)
SHARED_OPEN = 8  # shared update files one read keeps open at a time (SharedFiles)
_CHANGED_RETRIES = 3  # times a local update file replaced between its stat and its open is stat'ed again
_TRANSIENT_RETRIES = 3  # times a remote shared update file is fetched again after a transient error
_INT64 = pa.int64()

class LayerLoading:
    """The update-layer half of a scan. Needs from the scan: ``state``, ``read_ids``, ``read_schema``,
    ``report``, ``_io_key``, ``_layer_schemas``, ``_shared_files`` and the methods ``_resolve``, ``_open_leased``, ``_target``."""

    state: PlatformState
    read_ids: set[int]
    read_schema: Schema
    report: "ReadReport"
    _io_key: tuple
    _layer_schemas: dict[tuple[int, ...], Schema]
    _shared_files: "SharedFiles"

    def _wanted(self, path: str) -> list[UpdateEntry]:
        """The update files of data file ``path`` touching the projection, oldest first (counted in the report)."""
        entries = self.state.entries_for(path) if not self.state.empty else []
        wanted = [e for e in entries if any(i in self.read_ids for i in e.field_ids)]
        report = self.report
        report.update_layers_read += len(wanted)
        report.update_paths.update(e.update_file for e in wanted)
        report.update_files_read = len(report.update_paths)
        return wanted

    def _start_layers(self, path: str) -> Callable[[], list[tuple[UpdateEntry, np.ndarray | None, pa.RecordBatch]]]:
        """The update layers of data file ``path`` touching the projection, oldest first: a call that
        returns them as (entry, positions, values).

        Locally they are loaded now (decoding is CPU work: other threads would only contend;
        :meth:`to_table` loads them on the calling thread instead, see :meth:`_feed_layers`).
        On an object store each update file is fetched on the process-wide layer pool from now
        on, so that the fetches overlap each other and the caller's fetch of the data file itself
        (each waits on latency, not on a core); the call waits for them.
        """
        wanted = self._wanted(path)
        if not wanted or isinstance(self._resolve(wanted[0].update_file)[0], pafs.LocalFileSystem):
            layers = [self._load_layer(e) for e in wanted]
            return lambda: layers
        pool = readfiles.layer_pool(REMOTE_THREADS)
        futures = [pool.submit(self._load_layer, e) for e in wanted]
        return lambda: [f.result() for f in futures]

    def _plan_layers(
        self, tasks: list[FileScanTask]
    ) -> "tuple[list[LayerSlot], list[Callable[[], list]], list[Callable[[], bool] | None]]":
        """Per task, a call returning its layers and a call saying whether they are there to take
        (None: always), and the slots of the layers still to load for :meth:`_feed_layers`
        (:func:`layerplan.plan_layers`)."""
        return plan_layers(self, tasks)

    def _feed_layers(self, slots: "list[LayerSlot]") -> None:
        """Load each planned file's layers on this thread, in plan order, while the reader threads
        decode the data files (a first read: loading update files costs about as much as decoding
        the base, and this thread would otherwise only wait). A reader thread that finishes its base
        before this thread reached its file loads them itself (:meth:`_LayerSlot.get`).

        A load that fails fails that file's read (its error, under the bad-file budget); a slot left
        unloaded when this thread is interrupted fails too, so no reader thread waits forever.
        """
        try:
            for slot in slots:
                slot.load()
        finally:
            fail_unfed(slots)

    def _load_layer(self, entry: UpdateEntry) -> tuple[UpdateEntry, np.ndarray | None, pa.RecordBatch]:
        """One update layer (entry, positions or None, values): from the layer cache, else decoded and kept there."""
        ids = tuple(i for i in entry.field_ids if i in self.read_ids)
        for attempt in range(_CHANGED_RETRIES + 1):
            key, file_key = self._layer_key(entry, ids)
            found = readfiles.LAYERS.get(key)
            if found is not None:
                return entry, found[0], found[1]
            try:
                pos, batch = self._decode_layer(entry, ids, file_key)
                break
            except openfiles.FileChangedError:  # replaced between the stat and the open (tests, other tools): stat again
                self._shared_files.keys.pop(file_key[0], None)  # type: ignore[index]
                if attempt == _CHANGED_RETRIES:
                    raise CorruptFileError(f"file {entry.update_file} keeps changing while it is read", entry.update_file)
        readfiles.LAYERS.put(key, (pos, batch), batch.get_total_buffer_size() + (pos.nbytes if pos is not None else 0))
        return entry, pos, batch

    def _cached_layer(self, entry: UpdateEntry) -> tuple[UpdateEntry, np.ndarray | None, pa.RecordBatch] | None:
        """The layer of ``entry`` when the layer cache holds it (None: it has to be loaded); CorruptFileError
        when its local update file is gone."""
        key, _ = self._layer_key(entry, tuple(i for i in entry.field_ids if i in self.read_ids))
        found = readfiles.LAYERS.get(key)
        return None if found is None else (entry, found[0], found[1])

    def _layer_key(self, entry: UpdateEntry, ids: tuple[int, ...]) -> tuple[tuple, tuple | None]:
        """What identifies a decoded layer: the update file (local: its size, mtime and inode too) and
        the columns; and a local file's :func:`openfiles.file_key` (None on an object store).

        A local file is stat'ed once per read (:attr:`SharedFiles.keys`), not once per layer: a shared
        file holds a layer of every data file of its commit. A file replaced since is caught where it
        is opened (FileChangedError: :meth:`_load_layer` stats it again)."""
        fs, fs_path = self._resolve(entry.update_file)
        if isinstance(fs, pafs.LocalFileSystem):
            keys = self._shared_files.keys
            file_key = keys.get(fs_path)
            if file_key is None:
                try:
                    file_key = keys[fs_path] = openfiles.file_key(fs_path)
                except FileNotFoundError as e:
                    raise CorruptFileError(f"file {entry.update_file} is missing", entry.update_file) from e
            return file_key + (ids, entry.dense, entry.row_group), file_key
        return (self._io_key, type(fs).__name__, fs_path, entry.file_size, ids, entry.dense, entry.row_group), None

    def _decode_layer(
        self, entry: UpdateEntry, ids: tuple[int, ...], file_key: tuple | None = None
    ) -> tuple[np.ndarray | None, pa.RecordBatch]:
        """One update file's values of ``ids`` (one batch) and, unless dense, its row positions.

        Read in one go, without the batching of data-file reads; on this thread unless the
        projection is large (a dense layer of a big file): below a few MB handing column chunks
        to Arrow's pool costs more than decoding them. A small local file is read whole in one
        call and parsed from memory (:func:`_open_small`), its columns read one by one when flat
        (:func:`_decode_flat`); others through a kept-open reader.
        """
        requested, target = self._requested(ids)
        path = entry.update_file
        extra_ids = () if entry.dense else (POS_FIELD_ID,)
        if entry.row_group is not None:
            return self._decode_part(entry, frozenset(ids), extra_ids, requested, target, file_key)
        if file_key is not None and entry.bytes and entry.bytes <= SMALL_LAYER_FILE_BYTES:
            reader, (projected, columns, extra, leaves, flat) = _open_small(path, file_key, frozenset(ids), extra_ids)
            if flat:
                return _decode_flat(reader, entry, projected, columns, extra, leaves, requested, target)
            table = _read_leaves(reader, leaves, path, entry.bytes > THREADED_LAYER_BYTES)
        else:
            table, projected, columns, extra = self._read_leased(entry, frozenset(ids), extra_ids, file_key)
        try:
            batches = table.to_batches()
            if len(batches) != 1:  # several row groups (or none): one batch
                table = table.combine_chunks()
                batches = table.to_batches()
            raw = batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)
            values = readfiles.conform_batch(raw, projected, requested, target)[0] if columns else readfiles.empty_batch(target, raw.num_rows)
        except (OSError, pa.ArrowInvalid) as e:
            raise CorruptFileError(f"file {path} is corrupt: {e}", path) from e
        # both reads return the columns in the order asked for, so _pos follows the values (by index: a lookup by name costs more)
        return _checked(entry, values, raw.column(len(columns)) if extra else None)

    def _requested(self, ids: tuple[int, ...]) -> tuple[Schema, pa.Schema]:
        """The read schema's columns ``ids`` (a layer's), in Iceberg and in Arrow; worked out once per read."""
        requested = self._layer_schemas.get(ids)
        if requested is None:
            requested = self._layer_schemas[ids] = Schema(*[f for f in self.read_schema.fields if f.field_id in ids])
        return requested, self._target(requested)

    def _load_parts(self, entries: list[UpdateEntry]) -> list[tuple[UpdateEntry, np.ndarray | None, pa.RecordBatch]]:
        """The layers of several row groups of one local shared update file (one commit's layers: the
        same columns), decoded in one call and kept in the layer cache together.

        Why: a first read needs a shared file's layer for every data file, and loading them one by one
        costs a Parquet call, a check and a hand-over of the GIL each, on the thread that feeds the
        readers while they decode the data files; one call decodes them all at once. The layers are
        slices of the decoded columns, so they are kept and evicted together
        (:meth:`readfiles.SizedLRU.put_all`). Raises on any damage; the caller then loads them one by
        one (:meth:`_load_layer`), so that each data file gets its own layer's error.
        """
        first = entries[0]
        ids = tuple(i for i in first.field_ids if i in self.read_ids)
        for attempt in range(_CHANGED_RETRIES + 1):
            _, file_key = self._layer_key(first, ids)
            if file_key is None:
                raise ValueError("only local shared update files are decoded together")
            try:
                return self._decode_parts(entries, ids, file_key)
            except openfiles.FileChangedError:
                self._shared_files.keys.pop(file_key[0], None)
                if attempt == _CHANGED_RETRIES:
                    raise CorruptFileError(f"file {first.update_file} keeps changing while it is read", first.update_file)
        raise AssertionError("unreachable")

    def _decode_parts(
        self, entries: list[UpdateEntry], ids: tuple[int, ...], file_key: tuple
    ) -> list[tuple[UpdateEntry, np.ndarray | None, pa.RecordBatch]]:
        """:meth:`_load_parts` of one version of the file (``file_key``): checked, decoded, sliced, kept."""
        first = entries[0]
        path = first.update_file
        requested, target = self._requested(ids)
        extra_ids = () if first.dense else (POS_FIELD_ID,)
        shared = self._shared_files.open((path, file_key), lambda: self._open_shared(first, file_key))
        reader = shared.reader
        if isinstance(reader, readfiles.RemoteParquet):
            raise ValueError("only local shared update files are decoded together")
        rows = [e.rows for e in entries]
        try:
            with shared.lock:  # one Parquet reader: read from one thread at a time
                projected, columns, extra, leaves, _ = readfiles.leaf_projection(reader, frozenset(ids), extra_ids)
                metadata = reader.metadata
                for e in entries:  # each layer's rows where the state says: slices of the whole line up
                    _check_row_group(e, metadata.num_row_groups)
                    if metadata.row_group(e.row_group).num_rows != e.rows:
                        raise CorruptFileError(f"row group {e.row_group} of {path} does not hold its layer's {e.rows} rows", path)
                table = reader.read_row_groups([e.row_group for e in entries], column_indices=leaves, use_threads=False)
            if table.num_rows != sum(rows):
                raise CorruptFileError(f"row groups of {path} hold {table.num_rows} rows, their layers {sum(rows)}", path)
            arrays = [c.chunk(0) if c.num_chunks == 1 else c.combine_chunks() for c in table.columns]
            values = readfiles.conform_arrays(arrays[: len(columns)], table.num_rows, projected, requested, target, columns)
        except (OSError, pa.ArrowInvalid) as e:
            raise CorruptFileError(f"file {path} is corrupt: {e}", path) from e
        if first.dense:
            pos = None
        elif not extra:
            raise CorruptFileError(f"update file {path} has no row positions (_pos)", path)
        else:
            pos = _positions(arrays[len(columns)], path, rows)
        layers, kept, start = [], [], 0
        for e, n in zip(entries, rows):
            part_values = values.slice(start, n)
            part_pos = None if pos is None else pos[start : start + n]
            start += n
            layers.append((e, part_pos, part_values))
            kept.append((file_key + (ids, e.dense, e.row_group), (part_pos, part_values),
                         part_values.nbytes + (0 if part_pos is None else part_pos.nbytes)))
        readfiles.LAYERS.put_all(kept)
        return layers

    def _decode_part(
        self, entry: UpdateEntry, ids: frozenset[int], extra_ids: tuple[int, ...], requested: Schema, target: pa.Schema,
        file_key: tuple | None,
    ) -> tuple[np.ndarray | None, pa.RecordBatch]:
        """A layer that is one row group of a shared update file: only that row group decoded, the file
        opened once per read for all its layers (:class:`SharedFiles`).

        Row group by row group, not each column once for the whole file: a column read whole is one
        buffer, and a layer sliced from it would keep the other layers' rows alive in the layer cache
        (and be counted at the whole column's size); the decode costs the same per row either way.
        """
        path = entry.update_file
        shared = self._shared_files.open((path, file_key), lambda: self._open_shared(entry, file_key))
        reader = shared.reader
        try:
            if isinstance(reader, readfiles.RemoteParquet):  # a dataset fragment: safe to read from threads
                projected, columns, extra = readfiles.projection(reader, ids, extra_ids)
                _check_row_group(entry, reader.metadata.num_row_groups)
                table = reader.read_row_groups([entry.row_group], columns=columns + extra, use_threads=False)
            else:
                with shared.lock:  # one Parquet reader: read from one thread at a time
                    projected, columns, extra, leaves, _ = readfiles.leaf_projection(reader, ids, extra_ids)
                    _check_row_group(entry, reader.num_row_groups)
                    table = reader.read_row_group(entry.row_group, column_indices=leaves, use_threads=False)
            if table.num_rows != entry.rows:
                raise CorruptFileError(f"row group {entry.row_group} of {path} holds {table.num_rows} rows, its layer {entry.rows}", path)
            arrays = [c.chunk(0) if c.num_chunks == 1 else c.combine_chunks() for c in table.columns]
            values = readfiles.conform_arrays(arrays[: len(columns)], table.num_rows, projected, requested, target, columns)
        except (OSError, pa.ArrowInvalid) as e:
            raise CorruptFileError(f"file {path} is corrupt: {e}", path) from e
        return _checked(entry, values, arrays[len(columns)] if extra else None)

    def _open_shared(self, entry: UpdateEntry, file_key: tuple | None) -> "readfiles.ParquetReader | readfiles.RemoteParquet":
        """A shared update file opened for this read: up to :data:`SHARED_WHOLE_BYTES` read whole (one
        read locally, one GET on an object store) and parsed from memory; larger ones memory-mapped
        locally, or read by row group through a fragment of known size on an object store."""
        path, size = entry.update_file, entry.file_size
        fs, fs_path = self._resolve(path)
        for attempt in range(_TRANSIENT_RETRIES + 1):
            try:
                if file_key is None and size > SHARED_WHOLE_BYTES:
                    return readfiles.RemoteParquet.of(fs, fs_path, size, self._io_key)
                if file_key is None:
                    source = open_remote(fs, fs_path, size, whole_below=SHARED_WHOLE_BYTES)
                elif file_key[1] <= SHARED_WHOLE_BYTES:
                    source = pa.BufferReader(openfiles.read_whole(file_key))
                else:
                    source = pa.memory_map(fs_path)
                reader = readfiles.ParquetReader()
                reader.open(source, pre_buffer=False)
                return reader
            except FileNotFoundError as e:
                raise CorruptFileError(f"file {path} is missing", path) from e
            except openfiles.FileChangedError:
                raise
            except pa.ArrowInvalid as e:
                raise CorruptFileError(f"file {path} is corrupt: {e}", path) from e
            except OSError as e:  # an object store's transient failure: tried again, as data files are (read.py)
                if file_key is not None or attempt == _TRANSIENT_RETRIES:
                    raise CorruptFileError(f"file {path} cannot be read: {e}", path) from e
                time.sleep(0.05 * 2 ** (attempt + 1))
        raise AssertionError("unreachable")

    def _read_leased(
        self, entry: UpdateEntry, ids: frozenset[int], extra_ids: tuple[int, ...], file_key: tuple | None
    ) -> tuple[pa.Table, Schema, list[str], list[str]]:
        """An update file's columns of ``ids`` plus extras, through an opened reader (kept open locally,
        a fragment on an object store); with the file's projection (:func:`readfiles.projection`)."""
        path = entry.update_file
        pf, lease = self._open_leased(path, entry.bytes, file_key)
        ok = False
        try:
            projected, columns, extra = readfiles.projection(pf, ids, extra_ids)
            # the file's size says whether Arrow's pool pays (the footer's per-column sizes cost a walk)
            table = pf.read(columns=columns + extra, use_threads=(entry.bytes or 0) > THREADED_LAYER_BYTES)
            ok = True
        except (OSError, pa.ArrowInvalid) as e:
            raise CorruptFileError(f"file {path} is corrupt: {e}", path) from e
        finally:
            readfiles.release(lease, ok)
        return table, projected, columns, extra


def _check_row_group(entry: UpdateEntry, row_groups: int) -> None:
    if not 0 <= entry.row_group < row_groups:  # type: ignore[operator]
        raise CorruptFileError(f"update file {entry.update_file} has {row_groups} row groups, its layer names row group {entry.row_group}", entry.update_file)


class _Shared:
    """One shared update file opened by a read: its reader (set once, under ``lock``)."""

    __slots__ = ("lock", "reader")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reader = None


class SharedFiles:
    """The shared update files one read has opened (each once, whichever thread gets there first),
    the last :data:`SHARED_OPEN` of them kept: a read meets a shared file's layers data file after
    data file, so an evicted one is rarely needed again (and is then opened again). Also the
    version (:func:`openfiles.file_key`) of each local update file the read has looked at
    (``keys``): each is stat'ed once per read.

    Pickles as empty (a read shipped to another process opens its own).
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.files: "OrderedDict[tuple, _Shared]" = OrderedDict()
        self.keys: dict[str, tuple] = {}

    def __reduce__(self):
        return (SharedFiles, ())

    def open(self, key: tuple, opener: Callable[[], object]) -> _Shared:
        """The shared file under ``key``, opened by ``opener`` on first use."""
        with self.lock:
            found = self.files.get(key)
            if found is None:
                found = self.files[key] = _Shared()
                while len(self.files) > SHARED_OPEN:
                    self.files.popitem(last=False)
            else:
                self.files.move_to_end(key)
        if found.reader is None:
            with found.lock:
                if found.reader is None:
                    found.reader = opener()
        return found


def _open_small(
    path: str, key: tuple, ids: frozenset[int], extra_ids: tuple[int, ...]
) -> "tuple[readfiles.ParquetReader, tuple[Schema, list[str], list[str], list[int], bool]]":
    """A small local update file, read in one call and opened from memory as a bare ``ParquetReader``,
    with its projection of ``ids`` plus extras (:func:`readfiles.leaf_projection`: worked out once per
    file schema; update files of one backfill share it). Nothing is kept open: the decoded layer is
    what later reads reuse. FileChangedError when the file was replaced since ``key`` was taken.
    """
    try:
        data = openfiles.read_whole(key)
    except FileNotFoundError as e:
        raise CorruptFileError(f"file {path} is missing", path) from e
    except openfiles.FileChangedError:
        raise
    except OSError as e:
        raise CorruptFileError(f"file {path} cannot be read: {e}", path) from e
    try:
        reader = readfiles.ParquetReader()
        reader.open(pa.BufferReader(data), pre_buffer=False)
        return reader, readfiles.leaf_projection(reader, ids, extra_ids)
    except (OSError, pa.ArrowInvalid) as e:
        raise CorruptFileError(f"file {path} is corrupt: {e}", path) from e


def _read_leaves(reader: "readfiles.ParquetReader", leaves: list[int], path: str, threaded: bool) -> pa.Table:
    """The leaf columns ``leaves`` of an opened small file as one table (``threaded``: on Arrow's pool)."""
    try:
        return reader.read_all(column_indices=leaves, use_threads=threaded)
    except (OSError, pa.ArrowInvalid) as e:
        raise CorruptFileError(f"file {path} is corrupt: {e}", path) from e


def _decode_flat(
    reader: "readfiles.ParquetReader", entry: UpdateEntry, projected: Schema, columns: list[str], extra: list[str],
    leaves: list[int], requested: Schema, target: pa.Schema,
) -> tuple[np.ndarray | None, pa.RecordBatch]:
    """A small update file whose columns are all flat (one leaf each, as featurelake writes numbers and
    strings): each column read on its own (``read_column``, top-level index = leaf index here), without
    the table ``read_all`` assembles and splits again into a batch (~15 us of a ~100 us file)."""
    path = entry.update_file
    try:
        arrays = []
        for leaf in leaves:
            chunked = reader.read_column(leaf)
            arrays.append(chunked.chunk(0) if chunked.num_chunks == 1 else chunked.combine_chunks())
        n = len(arrays[0]) if arrays else reader.metadata.num_rows
        if any(len(a) != n for a in arrays):
            raise pa.ArrowInvalid("columns of different lengths")
        values = readfiles.conform_arrays(arrays[: len(columns)], n, projected, requested, target, columns)
    except (OSError, pa.ArrowInvalid) as e:
        raise CorruptFileError(f"file {path} is corrupt: {e}", path) from e
    return _checked(entry, values, arrays[len(columns)] if extra else None)


def _checked(entry: UpdateEntry, values: pa.RecordBatch, pos_column: pa.Array | None) -> tuple[np.ndarray | None, pa.RecordBatch]:
    """(positions or None, values) of a decoded update file, checked: a dense layer holds its data file's
    rows, a sparse one has valid row positions (:func:`_positions`)."""
    path = entry.update_file
    if entry.dense:
        if values.num_rows != entry.rows and entry.rows:
            raise CorruptFileError(f"update file {path} holds {values.num_rows} rows, its data file {entry.rows}", path)
        return None, values
    if pos_column is None:
        raise CorruptFileError(f"update file {path} has no row positions (_pos)", path)
    return _positions(pos_column, path), values


def _positions(column: pa.Array, path: str, rows: "list[int] | None" = None) -> np.ndarray:
    """A sparse layer's row positions as int64, checked: null, negative or out-of-order ones are a
    CorruptFileError (the overlay finds a batch's rows by binary search: positions out of order would
    put values on wrong rows). ``rows``: the column holds several layers' positions one after the
    other, that many each; each layer's are checked on their own (one pass for all of them)."""
    data = column.buffers()[1] if column.type == _INT64 and not column.null_count else None
    pos = (np.frombuffer(data, dtype=np.int64, count=column.offset + len(column))[column.offset:]
           if data is not None else column.to_numpy(zero_copy_only=False))
    bad = bool(column.null_count)
    if not bad and len(pos) > 1:
        rising = pos[1:] > pos[:-1]
        if rows is not None and len(rows) > 1:
            starts = np.cumsum(rows[:-1])
            rising[starts[(starts > 0) & (starts < len(pos))] - 1] = True  # a layer starts anew after the one before it
        bad = not bool(rising.all())
    if not bad and len(pos):
        if rows is None or len(rows) < 2:
            bad = bool(pos[0] < 0)
        else:  # each layer's lowest position is its first
            bad = bool((pos[np.cumsum([0] + rows[:-1])[np.asarray(rows) > 0]] < 0).any())
    if bad:
        raise CorruptFileError(f"update file {path} has row positions that are null, negative or out of order", path)
    return pos
