"""Joining sequences onto reads: ``Table.read/batches(sequences={name: view})`` appends one list column per view.

A :class:`SequenceView` (from ``SequenceTable.view()``) pairs a store build with lookup settings and an
output layout: ``list`` (each row's events copied out) or ``list_view`` (offsets and sizes into one shared
pool of events, optionally a cross-batch history cache: :mod:`featurelake.sequences.listview`).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence

import pyarrow as pa

from featurelake.errors import FeatureLakeError, SchemaMismatchError
from featurelake.sequences.heads import HeadCache
from featurelake.sequences.historycache import HistoryCache
from featurelake.sequences.listview import LAYOUTS, lookup_view, view_type
from featurelake.sequences.arguments import as_array, window_int
from featurelake.sequences.lookup import SequenceStore

JOIN_SLICE_ROWS = 65_536
JOIN_WORKERS = 2   # batches joined at once in the background (lookups release the GIL in RocksDB and numpy)
INLINE_JOIN_S = 0.001  # joins faster than this (a warm history cache) run in the consumer's thread


class SequenceView:
    """What ``Table.read/batches(sequences={name: view})`` joins: a store plus lookup settings."""

    def __init__(self, store: SequenceStore, key: str, time: str, columns: list[str], max_len: int | None,
                 window: Any, threads: int, batch_keys: int, layout: str = "list",
                 cache_bytes: int | None = None) -> None:
        if layout not in LAYOUTS:
            raise FeatureLakeError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if cache_bytes is not None and layout != "list_view":
            raise FeatureLakeError("cache_bytes needs layout='list_view' (cached histories are shared, not copied)")
        self.store = store
        store.head_cache = HeadCache()  # an epoch reads each user's head once (the store is this view's own)
        self.key = key
        self.time = time
        self.columns = columns
        self.max_len = max_len
        self.window = window
        self.threads = threads
        self.batch_keys = batch_keys
        self.layout = layout
        self.cache_bytes = cache_bytes
        self.cache = None if cache_bytes is None else HistoryCache(store, columns, cache_bytes)
        self.type = store.output_type(columns) if layout == "list" else view_type(store, columns)
        window_int(window, store.time_type)  # fail now, not at the first batch
        self.stats: dict[str, int] = {}
        self.last_join_s = float("inf")  # how long the latest join took: where the next epoch starts (see pipelined)
        self._stats_lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"SequenceView({self.store.info.table}@{self.store.info.snapshot_id}, key={self.key!r}, "
                f"time={self.time!r}, columns={self.columns}, max_len={self.max_len}, layout={self.layout!r})")

    def join(self, keys: pa.Array, times: pa.Array) -> pa.ListArray | pa.ListViewArray:
        """The list (or list-view) column for one batch of training rows."""
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        if isinstance(times, pa.ChunkedArray):
            times = times.combine_chunks()
        keys = as_array(keys, self.store.key_type)
        t0 = time.perf_counter()
        if self.cache is not None:
            out, stats = self.cache.join(keys, times, self.max_len, self.window, self.threads, self.batch_keys)
        elif self.layout == "list_view":
            out, stats = lookup_view(self.store, keys, times, self.columns, self.max_len, self.window, self.threads,
                                     self.batch_keys)
        else:
            out, stats = self.store.lookup_stats(keys, times, self.columns, self.max_len, self.window, self.threads,
                                                 self.batch_keys)
        self.last_join_s = time.perf_counter() - t0
        with self._stats_lock:  # the background join workers share the view
            for k, v in stats.items():
                self.stats[k] = self.stats.get(k, 0) + v
        return out


def _check_views(sequences: dict[str, Any], names: Sequence[str]) -> None:
    for name, view in sequences.items():
        if not isinstance(view, SequenceView):
            raise FeatureLakeError(f"sequences[{name!r}] must be a view from SequenceTable.view(), not {type(view).__name__}")
        if name in names:
            raise SchemaMismatchError(f"sequence column {name!r} clashes with a column of the read", [name])
        missing = [c for c in (view.key, view.time) if c not in names]
        if missing:
            raise SchemaMismatchError(f"the read has no column(s) {missing} for sequence {name!r}", missing)


def columns_for_join(columns: Sequence[str] | None, sequences: dict[str, Any]) -> tuple[list[str] | None, list[str]]:
    """The columns a read must fetch for its joins, and those to drop afterwards."""
    if columns is None:
        return None, []
    cols = list(columns)
    extra = []
    for view in sequences.values():
        for c in (getattr(view, "key", None), getattr(view, "time", None)):
            if c is not None and c not in cols and c not in extra:
                extra.append(c)
    return cols + extra, extra


def _join_one(data: pa.Table | pa.RecordBatch, sequences: dict[str, Any]):
    for name, view in sequences.items():
        col = view.join(data.column(view.key), data.column(view.time))
        data = data.append_column(pa.field(name, view.type), col)
    return data


def join_sequences(result: pa.Table, sequences: dict[str, Any], drop: Sequence[str] = ()) -> pa.Table:
    """Append one list<struct> column per view to ``result`` (row order kept), slice by slice."""
    _check_views(sequences, result.column_names)
    parts = [_join_one(pa.Table.from_batches([b]), sequences) for b in _slices(result)]
    if parts:
        out = pa.concat_tables(parts)
    else:
        empty = result.schema
        for name, view in sequences.items():
            empty = empty.append(pa.field(name, view.type))
        out = empty.empty_table()
    return out.drop_columns(list(drop)) if drop else out


def _slices(result: pa.Table) -> Iterator[pa.RecordBatch]:
    for batch in result.to_batches(max_chunksize=JOIN_SLICE_ROWS):
        if batch.num_rows:
            yield batch


def join_sequences_batches(stream: Iterator[pa.RecordBatch], sequences: dict[str, Any], drop: Sequence[str] = (),
                           prefetch: int | None = None) -> Iterator[pa.RecordBatch]:
    """Join each batch of ``stream``, in order; the next batches are joined in the background while one is consumed.

    ``JOIN_WORKERS`` batches are joined at once (``prefetch`` ahead, by
    default as many): while batch N is consumed, the lookups of N+1... run.
    Joins cheaper than ``INLINE_JOIN_S`` (a warm history cache) run in the
    consumer's thread instead (see :func:`pipelined`).
    """
    workers = max(1, JOIN_WORKERS)
    prefetch = workers if prefetch is None else max(1, prefetch)

    def checked(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for n, batch in enumerate(batches):
            if n == 0:
                _check_views(sequences, batch.schema.names)
            yield batch

    # a view whose last join was cheap (a warm cache, e.g. the previous epoch's) starts in the consumer's thread
    first = max((getattr(v, "last_join_s", float("inf")) for v in sequences.values()), default=float("inf"))
    yield from pipelined(checked(stream), lambda b: _join_one(b, sequences), drop, prefetch, workers, "featurelake-join",
                         inline_below_s=INLINE_JOIN_S, first_cost_s=first)


def pipelined(stream: Iterator[Any], fn: Callable[[Any], Any], drop: Sequence[str] = (), prefetch: int = 1,
              workers: int = 1, name: str = "featurelake-pipeline", inline_below_s: float = 0.0,
              first_cost_s: float = float("inf")) -> Iterator[Any]:
    """``fn`` over ``stream`` in ``workers`` background threads, ``prefetch`` items ahead, order kept.

    Each result loses the ``drop`` columns. The pool is shut down (pending
    work cancelled) when the consumer stops early. While the last call of
    ``fn`` took less than ``inline_below_s`` seconds, items are done in the
    calling thread (after the pending ones): handing a sub-millisecond item
    to a worker and back costs more than it overlaps (measured on warm
    history-cache joins: 18.3 ms an epoch pipelined, 16.1 ms inline). What
    decides is the cheaper of the last two calls: two slow calls in a row
    send the next items to the workers again, a single one does not (on a
    shared machine one call in a few hundred is descheduled past the bound,
    and each switch starts handing items over). ``first_cost_s`` stands for
    the cost of the calls before the first (a caller's estimate); the worker
    threads start only when an item goes to them.
    """
    pending: list = []
    pool: ThreadPoolExecutor | None = None
    recent = [(first_cost_s, first_cost_s)]  # seconds the last two finished calls took (whichever thread ran them)

    def timed(item: Any) -> Any:
        t0 = time.perf_counter()
        out = fn(item)
        recent[0] = (recent[0][1], time.perf_counter() - t0)  # one store of a new pair: readers see either
        return out

    def finish(out):
        return out.drop_columns(list(drop)) if drop else out

    try:
        for item in stream:
            if min(recent[0]) < inline_below_s:
                while pending:
                    yield finish(pending.pop(0).result())
                yield finish(timed(item))
                continue
            if pool is None:
                pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
            pending.append(pool.submit(timed, item))
            if len(pending) > prefetch:
                yield finish(pending.pop(0).result())
        while pending:
            yield finish(pending.pop(0).result())
    finally:
        for fut in pending:
            fut.cancel()
        if pool is not None:
            pool.shutdown(wait=True)
