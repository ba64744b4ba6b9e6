"""The order a training reader reads and emits rows in: units, shards, shuffle windows, and its quality.

Why: a shuffle that trains well mixes rows of many files into every batch, yet
a reader must stream (bounded memory), shard exactly over workers, and resume
at an exact row. Everything here is a function of metadata and
``(seed, epoch, worker, window)``, so the position in the stream is a pair of
ints (see ``featurelake.training``).

* :func:`shard` cuts the permuted units (row groups) of a snapshot into equal
  contiguous shares, one per global worker.
* :func:`windows` groups a worker's share into shuffle windows: ``interleave``
  units open at once, one slice of each per window.
* :class:`WindowReader` reads the windows in order, one slice of every open
  unit, and hands back each window's kept rows permuted, as one contiguous
  batch (one gather per window, no per-row Python).
* :func:`shuffle_quality` measures a stream against a full random permutation.
"""
from __future__ import annotations

import functools
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from threading import Lock
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from featurelake.errors import FeatureLakeError
from featurelake.sampling import keep_rows
from featurelake.schema import LOCATOR_FILE
from featurelake.workpool import PriorityPool

if TYPE_CHECKING:
    from featurelake.training import TrainingReader

# Rows decoded per read of an open unit: large reads decode far cheaper per row than small ones.
DECODE_ROWS = 65_536
DECODE, PERMUTE = 0, 1  # the kinds of work on the reader's pool (see ``featurelake.workpool``)
# Chunks decoding ahead at least, on an object store: each waits on a request first (measured, unshuffled
# 1M x 20 on SeaweedFS: 197 ms an epoch with 1, 155 with 4; on local disk 1 is fastest, 40 ms against 90 with 4).
REMOTE_AHEAD = 4


@dataclass(frozen=True)
class Unit:
    """Rows [start, stop) of one data file (``task`` indexes the reader's planned files)."""

    task: int
    start: int
    stop: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of the ``slot``-th unit of a worker's share, read into one window."""

    slot: int
    start: int
    stop: int


def shard(units: Sequence[Unit], workers: int, worker: int) -> list[Unit]:
    """The rows of ``units`` (laid end to end) that global worker ``worker`` of ``workers`` reads.

    Cut points are ``g * total // workers``: shares differ by at most one row.
    """
    total = sum(u.rows for u in units)
    lo, hi = worker * total // workers, (worker + 1) * total // workers
    out, offset = [], 0
    for u in units:
        a, b = max(lo, offset), min(hi, offset + u.rows)
        if b > a:
            out.append(Unit(u.task, u.start + (a - offset), u.start + (b - offset)))
        offset += u.rows
        if offset >= hi:
            break
    return out


def windows(units: Sequence[Unit], interleave: int, buffer: int) -> Iterator[list[Piece]]:
    """The windows a worker reads its units in: ``interleave`` units open, a slice of each per window."""
    per = max(1, -(-buffer // interleave))
    active: list[list[int]] = []  # [slot, next row]
    queue = 0
    while True:
        while len(active) < interleave and queue < len(units):
            active.append([queue, units[queue].start])
            queue += 1
        if not active:
            return
        window = []
        for slot in active:
            unit = units[slot[0]]
            stop = min(unit.stop, slot[1] + per)
            window.append(Piece(slot[0], slot[1], stop))
            slot[1] = stop
        active = [s for s in active if s[1] < units[s[0]].stop]
        yield window


Chunk = tuple[pa.RecordBatch, np.ndarray, int]  # (rows, their file positions, source rows read up to)


class _Source:
    """The decoded chunks of one open unit, in order, the next one decoding ahead on the pool.

    ``next`` hands out the chunk decoded ahead and submits the one after it
    (unless the unit ends there), so each open unit has at most one chunk in
    flight: its stream is a generator, never advanced by two threads at once.
    Without a pool the chunks decode on the caller's thread.
    """

    def __init__(self, open_stream: Callable[[], Iterator[Chunk]], stop: int,
                 submit: Callable[[Callable[[], Any], float], Future] | None, may_start: Callable[[], bool],
                 closed: Callable[[], bool], priority: Callable[[], float], first: float) -> None:
        self._open = open_stream
        self._closed = closed
        self._stream: Iterator[Chunk] | None = None
        self._stop = stop
        self._submit = submit
        self._may_start = may_start
        self._priority = priority  # the window the next chunk is needed by (the pool runs the most urgent first)
        self.pending: Future | None = submit(self._advance, first) if submit is not None else None

    def _advance(self) -> Chunk | None:
        if self._stream is None:
            self._stream = self._open()
        return next(self._stream, None)

    def next(self) -> Chunk | None:
        if self.pending is None:  # nothing decoding ahead (no pool, or the budget was spent): decode it now
            return None if self._closed() else self._advance()
        chunk, self.pending = self.pending.result(), None
        if chunk is not None and chunk[2] < self._stop and self._may_start():
            self.pending = self._submit(self._advance, self._priority())  # type: ignore[misc]
        return chunk

    def cancel(self) -> None:
        if self.pending is not None:
            self.pending.cancel()


class WindowReader:
    """Reads the windows of one worker's share, in order; keeps each open unit's stream between windows.

    ``read(window, w)`` returns the window's kept rows in emission order as
    one batch, and each row's rank in the window's permutation (increasing):
    a reader resumed at ``(w, rank)`` re-reads window ``w`` and keeps the
    rows from that rank on. Windows must be read in order (streams carry
    over).

    With a ``pool``, decoding runs ahead of the windows (decode-ahead): every
    open unit decodes its next chunk while the current one is sliced into
    windows, and the units the next windows open start decoding their first
    chunk as soon as this window is collected, so a window that opens new units
    (every ``interleave``-th, in a table of one-chunk row groups) finds them
    decoded instead of waiting on all of them at once. At most ``ahead``
    chunks (default ``interleave``) decode ahead at a time: memory holds about
    ``2 * interleave`` decoded chunks besides the windows.
    On an object store at least ``REMOTE_AHEAD`` decode ahead, so that requests overlap even unshuffled.
    ``close`` stops it: no more decoding starts, queued decodes are dropped and running ones waited for.
    """

    def __init__(self, reader: "TrainingReader", units: list[Unit], epoch: int, worker: int,
                 pool: "ThreadPoolExecutor | PriorityPool | None" = None, ahead: int | None = None,
                 plan: Sequence[list[Piece]] | None = None) -> None:
        self.r = reader
        self.units = units
        self.epoch = epoch
        self.worker = worker
        self.sources: dict[int, _Source] = {}
        self.carry: dict[int, Chunk] = {}
        self.layers: dict[int, list] = {}
        self.pool = pool
        self.ahead = (reader.interleave if reader.local else max(reader.interleave, REMOTE_AHEAD)) if ahead is None else ahead
        self.window = 0  # the window being collected
        self.first_window: dict[int, int] = {}  # slot -> the first window that reads it (priorities)
        for w, window in enumerate(plan or ()):
            for p in window:
                self.first_window.setdefault(p.slot, w)
        self.opened = -1  # the highest slot whose source exists (slots open in order)
        self.closed = False
        self._lock = Lock()
        self.chunk = max(DECODE_ROWS, -(-reader.shuffle_buffer // reader.interleave))

    def _layers(self, task_index: int) -> list:
        with self._lock:
            if task_index not in self.layers:
                self.layers[task_index] = self.r.scan.layers_for(self.r.tasks[task_index].file.file_path)
            return self.layers[task_index]

    def submit(self, fn: Callable[[], Any], priority: float, kind: int = DECODE) -> Future:
        """Run ``fn`` on the pool; a :class:`PriorityPool` runs the calls of a kind (``DECODE``, ``PERMUTE``)
        in the order of the windows that need them, one worker preferring each kind."""
        if isinstance(self.pool, PriorityPool):
            return self.pool.submit(fn, priority=priority, kind=kind)
        return self.pool.submit(fn)  # type: ignore[union-attr]

    def _open(self, slot: int, start: int) -> _Source:
        unit = self.units[slot]

        def stream() -> Iterator[Chunk]:
            return self.r.scan.read_range(self.r.tasks[unit.task], start, unit.stop, layers=self._layers(unit.task),
                                          batch_size=self.chunk)

        source = self.sources[slot] = _Source(
            stream, unit.stop, self.submit if self.pool is not None else None, self._may_start, lambda: self.closed,
            lambda: self.window + 1, self.first_window.get(slot, self.window + 1))
        self.opened = max(self.opened, slot)
        return source

    def _decoding(self) -> int:
        """Chunks decoding ahead now (or decoded and not yet taken)."""
        return sum(1 for s in list(self.sources.values()) if s.pending is not None)

    def _may_start(self) -> bool:
        return not self.closed and self._decoding() < self.ahead

    def _open_ahead(self, window: list[Piece]) -> None:
        """Start decoding the first chunks of the units the next windows open (slots open in order), within budget."""
        if self.pool is None or not window:
            return
        slot = self.opened + 1
        while slot < len(self.units) and self._may_start():
            self._open(slot, self.units[slot].start)
            slot += 1

    def close(self) -> None:
        """Start no more decoding, drop the decodes still queued and wait for those running (a few at most)."""
        self.closed = True
        running = [s.pending for s in self.sources.values() if s.pending is not None and not s.pending.cancel()]
        wait(running)
        self.sources.clear()
        self.carry.clear()

    def _piece(self, piece: Piece) -> tuple[list[pa.RecordBatch], list[np.ndarray]]:
        """The surviving rows of one piece and their file positions."""
        batches, positions = [], []
        chunk = self.carry.pop(piece.slot, None)
        source = self.sources.get(piece.slot) or self._open(piece.slot, piece.start)
        end = piece.start
        while True:
            if chunk is None:
                if end >= piece.stop:
                    break
                chunk = source.next()
                if chunk is None:
                    break
            batch, pos, end = chunk
            chunk = None
            if end > piece.stop:  # the chunk runs into the next piece: keep the rest for it
                cut = int(np.searchsorted(pos, piece.stop))
                self.carry[piece.slot] = (batch.slice(cut), pos[cut:], end)
                batch, pos = batch.slice(0, cut), pos[:cut]
                end = piece.stop
            if batch.num_rows:
                batches.append(batch)
                positions.append(pos)
        if piece.stop >= self.units[piece.slot].stop:
            done = self.sources.pop(piece.slot, None)
            if done is not None:
                done.cancel()
            self.carry.pop(piece.slot, None)
        return batches, positions

    def read(self, window: list[Piece], w: int) -> tuple[pa.RecordBatch | None, np.ndarray | None]:
        """One window's kept rows in emission order (None when none), and each one's rank in the window's order
        (None: each row's rank is its index; see :meth:`Window.finish`)."""
        return self.prepare(window, w).finish()

    def prepare(self, window: list[Piece], w: int) -> "Window":
        """Collect one window's decoded rows (windows in order: streams carry over); ``finish`` permutes them.

        The split lets consecutive windows be permuted on several threads
        while this one stays sequential (it is cheap: slices and sampling).
        """
        self.window = w
        for p in window:  # open this window's new units first: their decodes are needed before those ahead
            if p.slot not in self.sources and p.slot not in self.carry and p.slot > self.opened:
                self._open(p.slot, p.start)
        pieces = [self._piece(p) for p in window]
        self._open_ahead(window)
        r = self.r
        parts, spans, uniforms_of = [], [], []
        offset = 0
        for piece, (batches, positions) in zip(window, pieces):
            task = self.units[piece.slot].task
            for b, pos in zip(batches, positions):
                parts.append(b)
                spans.append((offset - piece.start, pos))
                uniforms_of.append((task, pos))
            offset += piece.stop - piece.start
        if not parts:
            return Window(None, [], None, offset, False, None)
        rows = pa.Table.from_batches(parts, schema=parts[0].schema)
        complete = rows.num_rows == offset  # no row filtered out: the local index is 0..offset-1
        keep, weights = keep_rows(r, rows, uniforms_of)
        if r.weight_column is not None:
            rows = rows.append_column(pa.field(r.weight_column, pa.float32(), nullable=False), pa.array(weights))
        if r._label_extra:
            rows = rows.drop_columns(r._label_extra)
        seed = (r.seed, self.epoch, self.worker, w) if r.shuffle else None
        return Window(rows, spans, keep, offset, complete, seed)


@dataclass
class Window:
    """One window's rows as decoded (``rows``: a chunked table), ready to be put in emission order."""

    rows: pa.Table | None
    spans: list[tuple[int, np.ndarray]]  # per chunk: (shift, file positions); position + shift = index in the window
    keep: np.ndarray | None  # sampling's verdict per row (None: all kept)
    size: int  # the window's source rows (before filters and sampling)
    complete: bool  # no row was filtered out
    seed: tuple[int, int, int, int] | None  # (seed, epoch, worker, window); None: unshuffled

    def _local(self) -> np.ndarray:
        """Each decoded row's index in the window (0..size-1), built only when rows were filtered or sampled
        out: a complete window's rows are its indices in order (an array per window saved)."""
        return np.concatenate([pos + shift for shift, pos in self.spans]).astype(np.int64, copy=False)

    def finish(self) -> tuple[pa.RecordBatch | None, np.ndarray | None]:
        """The kept rows in emission order as one batch (None when none), and each one's rank in the window's
        order (increasing); ranks None means each row's rank is its index in the batch (nothing dropped)."""
        rows, keep, offset = self.rows, self.keep, self.size
        if rows is None:
            return None, np.empty(0, np.int64)
        ranks: np.ndarray | None = None
        if self.seed is not None:
            perm = window_permutation(*self.seed, offset)
            if self.complete and keep is None:
                order = perm
            else:  # walk the permutation, keeping the rows that are there
                survivors = np.arange(rows.num_rows) if keep is None else np.flatnonzero(keep)
                idx = self._local()
                row_of = np.full(offset, -1, np.int64)
                row_of[idx[survivors]] = survivors
                picked = row_of[perm]
                found = picked >= 0
                order, ranks = picked[found], np.flatnonzero(found)
            rows = _gather(rows, order)
        elif keep is not None:
            survivors = np.flatnonzero(keep)
            ranks = self._local()[survivors]
            rows = _gather(rows, survivors)
        elif not self.complete:
            ranks = self._local()
        if not rows.num_rows:
            return None, ranks
        batches = rows.combine_chunks().to_batches()
        return (batches[0] if len(batches) == 1 else pa.concat_batches(batches)), ranks


def window_permutation(seed: int, epoch: int, worker: int, window: int, n: int) -> np.ndarray:
    """The emission order of window ``window``'s ``n`` source rows: a uniform permutation fixed by its arguments.

    A Fisher-Yates shuffle driven by a SplitMix64 stream whose start is drawn
    from NumPy's ``SeedSequence([seed, epoch, worker, window])``: swap ``i``
    maps the high 32 bits of the next draw to ``[0, i]`` by a multiply-shift
    (Lemire's method, bias below ``n / 2**32``). Compiled, a 65,536-row window
    costs about a quarter of ``Generator.permutation`` (0.21 vs 0.77 ms; it runs
    on every window of every epoch). Windows beyond 2**32 rows use ``Generator.permutation``.
    """
    sequence = np.random.SeedSequence([seed, epoch, worker, window])
    if n > 1 << 32:
        return np.random.default_rng(sequence).permutation(n)
    dtype = np.uint16 if n <= 1 << 16 else np.uint32
    return _fisher_yates()(sequence.generate_state(1, np.uint64)[0], np.arange(n, dtype=dtype))


def prepare_permutations() -> None:
    """Load the compiled shuffle now (numba's import and cache: ~0.5 s once per process).

    A reader calls it when it is built, so that data-loader workers forked
    from its process inherit the loaded kernel instead of loading it again at
    every epoch's start (measured: 1M rows, 2 workers, 0.28M rows/s instead of 0.70M).
    """
    for dtype in (np.uint16, np.uint32):  # both index widths a window uses
        _fisher_yates()(np.uint64(0), np.arange(2, dtype=dtype))


@functools.cache
def _fisher_yates() -> Callable[[np.uint64, np.ndarray], np.ndarray]:
    """The compiled shuffle loop (numba: a per-element loop NumPy has no kernel for), built on first use."""
    import numba

    @numba.njit(cache=True, nogil=True)
    def shuffle(state: np.uint64, out: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
        n = out.shape[0]
        x = np.uint64(state)
        for k in range(n - 1):
            i = n - 1 - k
            x += np.uint64(0x9E3779B97F4A7C15)  # SplitMix64 (Steele, Lea, Flood 2014)
            z = x
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            z = z ^ (z >> np.uint64(31))
            j = ((z >> np.uint64(32)) * np.uint64(i + 1)) >> np.uint64(32)
            t = out[i]
            out[i] = out[j]
            out[j] = t
        return out

    return shuffle


def _gather(rows: pa.Table, order: np.ndarray) -> pa.Table:
    """``rows.take(order)`` for indices known to be in range: the narrowest index type, no bounds check.

    ``rows`` stays chunked (one chunk per decoded slice). Arrow's take of a
    chunked table concatenates the chunks first (pyarrow 26, ``TakeCAC``; perf:
    about 12 ms of memcpy per 1M-row, 20-column epoch besides 20 ms of take):
    a sequential copy of cold decoded rows, then a random gather out of the
    copy while it is cached, measured cheaper than gathering straight out of
    the cold chunks (combined ahead: 35-43 vs 28-31 ms per epoch). Removing
    that copy needs a gather that reads the chunks where they are.
    """
    n = rows.num_rows
    if order.dtype.itemsize > 2 and n <= 1 << 16:
        order = order.astype(np.uint16)
    elif order.dtype.itemsize > 4 and n <= 1 << 32:
        order = order.astype(np.uint32)
    return pc.take(rows, pa.array(order), boundscheck=False)


# ------------------------------------------------------------------- quality
def shuffle_quality(batches: Iterable[pa.RecordBatch], key: str, source: str = LOCATOR_FILE, seed: int = 0) -> dict[str, Any]:
    """How well ``batches`` are shuffled, next to a full random permutation of the same rows.

    Two measures, for the batches as given (``reader``) and for the same rows
    fully permuted and cut at the same batch sizes (``random``):

    * ``distinct_sources_per_batch``: mean number of distinct ``source`` values
      (data files) per batch; higher is better mixed.
    * ``position_key_correlation``: Spearman correlation between a row's
      position in the stream and its ``key``; 0 is ideal, 1 is file order.
    """
    keys, sources, sizes = [], [], []
    for b in batches:
        keys.append(b.column(key))
        if source in b.schema.names:
            sources.append(b.column(source))
        sizes.append(b.num_rows)
    if not sizes or not sum(sizes):
        raise FeatureLakeError("shuffle_quality needs at least one row")
    k = pa.chunked_array(keys).to_numpy()
    s = pc.dictionary_encode(pa.chunked_array(sources)).combine_chunks().indices.to_numpy() if sources else None
    perm = np.random.default_rng(seed).permutation(len(k))
    return {
        "rows": int(len(k)),
        "batches": len(sizes),
        "reader": _quality(k, s, sizes),
        "random": _quality(k[perm], s[perm] if s is not None else None, sizes),
    }


def _quality(keys: np.ndarray, sources: np.ndarray | None, sizes: list[int]) -> dict[str, float]:
    out: dict[str, float] = {}
    if len(keys) > 1:
        key_rank = np.argsort(np.argsort(keys, kind="stable"), kind="stable").astype(np.float64)
        c = np.corrcoef(np.arange(len(keys), dtype=np.float64), key_rank)[0, 1]
        out["position_key_correlation"] = round(float(c), 4)
    if sources is not None:
        bounds = np.cumsum([0] + sizes)
        distinct = [len(np.unique(sources[a:b])) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        out["distinct_sources_per_batch"] = round(float(np.mean(distinct)), 3)
    return out
