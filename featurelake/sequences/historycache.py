"""The list-view history cache: each user's whole decoded history kept across batches in one arena.

Why: in a training epoch each user appears in many batches; fetching and
decoding their chunks again for every batch is what a list-view join spends
its time on. :class:`HistoryCache` (``layout="list_view", cache_bytes=N``)
fetches and decodes a user once per arena (once per epoch when it fits) and
serves a batch as a zero-copy list view of the arena, each row cut in the
users' time grids (:mod:`featurelake.sequences.timegrid`) by one compiled
call. The list-view types and column builders it shares with the uncached
join live in :mod:`featurelake.sequences.listview`.
"""
from __future__ import annotations

import threading
from typing import Any, NamedTuple, Sequence

import numpy as np
import pyarrow as pa

from featurelake.errors import FeatureLakeError
from featurelake.sequences.codecs import FixedCodec
from featurelake.sequences.listview import _fixed_column, _new_stats, view_fields, _MAX_POOL
from featurelake.sequences.lookup import SequenceStore
from featurelake.sequences.timegrid import CELLS_PER_EVENT, TimeGrid, kernels

BLOCK_SLACK = 1.25  # a history cache append copies its pools whole while they hold at most this many slots an event
DIRECT_SPAN = 4  # int user keys spanning at most this many values a cached user are found by direct addressing
RESERVE_EVENTS = 1 << 23  # an arena's first allocation (address space: pages are touched only as events arrive)

_NO_TIMES = np.empty(0, np.int64)


class _Arena(NamedTuple):
    """The arena's events at one state (which arena, its events so far) as a batch's list-view values."""

    resets: int
    array: pa.StructArray
    times: np.ndarray  # the arena's time column, the same slots


class _State(NamedTuple):
    """Everything a batch's cut reads, at one arena state (immutable: appends and resets make a new one).

    A warm batch takes it and cuts outside the lock: appends replace these
    arrays or write past what they cover, a reset makes new ones.
    """

    resets: int
    low: int               # dense int keys: the segment table's lowest key ...
    high: int              # ... and highest (``table`` empty: keys are bisected)
    table: np.ndarray      # segment by key - low (-1: not cached)
    keys: np.ndarray       # sorted cached keys (int64) ...
    ordinal: np.ndarray    # ... and the segment of each
    seg_start: np.ndarray
    seg_count: np.ndarray
    grid: TimeGrid
    arena: _Arena


class HistoryCache:
    """Whole decoded histories of the users seen so far, in one append-only arena shared by batches.

    Thread-safe (the background join workers share it; misses are fetched
    outside the lock). Each append's region starts at a multiple of 8 slots,
    so validity and boolean bitmaps are packed once, on append. Each row's
    cut is found in the users' time grids (:mod:`featurelake.sequences.timegrid`). ``cache_bytes`` bounds the arena: when a batch's
    new users would pass it, the arena is dropped and refilled with that
    batch's users (a single batch may still exceed it).
    """

    def __init__(self, store: SequenceStore, columns: Sequence[str], cache_bytes: int) -> None:
        if isinstance(cache_bytes, bool) or int(cache_bytes) <= 0:
            raise FeatureLakeError(f"cache_bytes must be a positive int, not {cache_bytes!r}")
        self.store = store
        self.columns = list(columns)
        self.cols = self.columns + ([store.time] if store.time not in self.columns else [])
        for col in self.cols:
            if not isinstance(store.codecs[store.group_of[col]], FixedCodec):
                raise FeatureLakeError(
                    f"the history cache needs fixed-size column codecs; column {col!r} is stored as Arrow IPC "
                    "(view it without cache_bytes, or build with codecs='auto' and fixed-width columns)")
        self.layout = {col: store.codecs[store.group_of[col]].layout[col] for col in self.cols}
        self.bools = {col for col in self.cols if pa.types.is_boolean(store._field(col).type)}
        # values, bitmaps (an upper bound) and the time grid's cells
        per_event = sum(dt.itemsize for _, dt, _ in self.layout.values()) + len(self.cols) + 4 * CELLS_PER_EVENT
        self.max_events = max(8, min(_MAX_POOL - 8, int(cache_bytes) // per_event))
        self.fields = view_fields(store, self.columns)
        self.type = pa.list_view(pa.struct(self.fields))
        self.lock = threading.Lock()
        self.fill_lock = threading.Lock()  # one fetch of missing histories at a time
        self.inflight: list[tuple[np.ndarray, threading.Event]] = []  # users being fetched, outside the lock
        self.resets = -1
        self._reset()
        kernels()  # numba loads now, not first under the lock in a join worker
        tt = store.time_type
        # the time types whose values are the store's int64s as they are (see arguments.times_to_int)
        self._time_type = tt if pa.types.is_timestamp(tt) or tt.equals(pa.int64()) else None
        self._rows = np.arange(0)

    def _reset(self) -> None:
        self.keys = np.empty(0, np.int64 if self.store.codec.kind == "int" else object)  # sorted
        self.ordinal = np.empty(0, np.int64)   # per sorted key: its segment (users in arena order)
        self.direct: tuple[int, np.ndarray] | None = None  # int keys spanning few values: (lowest, segment by key - lowest)
        self.seg_start = np.empty(0, np.int64)
        self.seg_count = np.empty(0, np.int64)
        self.grid = TimeGrid()  # where a time falls in each segment
        self.size = 0
        self.data = {col: np.empty(0, np.uint8 if col in self.bools else dt) for col, (_, dt, _) in self.layout.items()}
        self.bits = {col: np.empty(0, np.uint8) for col, (_, _, voff) in self.layout.items() if voff is not None}
        self._memo: _Arena | None = None
        self._state: _State | None = None
        self.resets += 1

    def _grow(self, events: int) -> None:
        """Room for ``events`` slots: the first allocation reserves up to ``RESERVE_EVENTS`` (untouched memory
        costs no pages), later ones double (copying what is used; a cold epoch that grew from 1,024 slots spent
        70 ms of its ~330 in these copies and their fresh pages, measured under load)."""
        cap = len(self.data[self.store.time])
        if events <= cap:
            return
        cap = max(events, min(self.max_events, max(2 * cap, RESERVE_EVENTS)), 1024)
        cap = (cap + 7) & ~7
        for col, arr in self.data.items():
            new = np.empty(cap // 8 if col in self.bools else cap, arr.dtype)
            used = self.size // 8 if col in self.bools else self.size
            new[:used] = arr[:used]
            self.data[col] = new
        for col, arr in self.bits.items():
            new = np.empty(cap // 8, np.uint8)
            new[: self.size // 8] = arr[: self.size // 8]
            self.bits[col] = new

    @staticmethod
    def _region(flags: np.ndarray, src: np.ndarray | None, dst: np.ndarray | None, lo: int, total: int) -> np.ndarray:
        """``total`` flags of a new arena region: the pools' slots from ``lo`` (a block) or the events gathered."""
        out = np.zeros(total, bool)
        if src is None:
            got = flags[lo : lo + total]
            out[: len(got)] = got
        else:
            out[dst] = flags[src]
        return out

    def _fetch(self, keys: pa.Array, threads: int, batch_keys: int, stats: dict):
        """Whole histories of ``keys`` (distinct users): event counts and where each event sits in the chunks."""
        # narrow: integer columns decode only the byte planes their values use; the copy into the arena widens them
        lo, hi, delta, fetched, _ = self.store._select(keys, np.arange(len(keys)), None, None, None, self.cols,
                                                       threads, batch_keys, stats, narrow=True)
        return hi - lo, lo + delta, fetched

    def _append(self, users: np.ndarray, got) -> None:
        """Copy fetched histories into the arena: ``got`` = (events per user, each user's first slot in the pools, pools).

        A user's events are contiguous in the pools (its chunks back to back,
        padded to ``chunk_events``). When the users' slots cover the pools
        with little padding (the last chunk of each history), the pools are
        copied as one block per column (a memcpy; the padding stays in the
        arena, between segments) instead of gathering every event.
        """
        n, src0, fetched = got
        m = int(n.sum())
        has = n > 0
        lo = int(src0[has].min()) if m else 0
        span = int((src0 + n)[has].max()) - lo if m else 0
        block = m and span <= BLOCK_SLACK * m + 1024
        if block:
            total = (span + 7) & ~7
            starts = self.size + np.where(has, src0 - lo, 0)
        else:
            width = (n + 7) & ~7
            total = int(width.sum())
            starts = self.size + np.cumsum(width) - width
        self._grow(self.size + total)
        a, z = self.size, self.size + total
        src = dst = None
        if m and not block:  # each event's slot in the pools and in the new region
            ramp = np.arange(m, dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
            src = np.repeat(src0, n) + ramp
            dst = np.repeat(starts - self.size, n) + ramp
        if m:
            for col in self.cols:
                vals, ok = fetched[self.store.group_of[col]][col]
                if col in self.bools:
                    self.data[col][a // 8 : z // 8] = np.packbits(self._region(vals.view(np.bool_), src, dst, lo, total),
                                                                  bitorder="little")
                elif block:
                    self.data[col][a : a + span] = vals[lo : lo + span]
                else:
                    self.data[col][a + dst] = vals[src]
                if col in self.bits:
                    self.bits[col][a // 8 : z // 8] = np.packbits(self._region(ok, src, dst, lo, total), bitorder="little")
        seg0 = len(self.seg_start)
        self.seg_start = np.concatenate([self.seg_start, starts])
        self.seg_count = np.concatenate([self.seg_count, n])
        self.size = z
        self.grid.append(self.data[self.store.time], n, starts)  # the runs where they now sit in the arena
        keys = np.concatenate([self.keys, users])
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.ordinal = np.concatenate([self.ordinal, np.arange(seg0, len(self.seg_start), dtype=np.int64)])[order]
        self.direct = None
        self._state = None
        if keys.dtype != object and len(keys):
            low, high = int(self.keys[0]), int(self.keys[-1])
            if high - low < DIRECT_SPAN * len(keys) + 4096:  # dense ids: a segment table indexed by key
                table = np.full(high - low + 1, -1, np.int64)
                table[self.keys - low] = self.ordinal
                self.direct = (low, table)

    def _find(self, kv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each key's segment and whether it is cached (-1 where not)."""
        if self.direct is not None and len(kv):
            low, table = self.direct
            if int(kv.min()) >= low and int(kv.max()) < low + len(table):
                seg = table[kv - low]
                return seg, seg >= 0
        if not len(self.keys):
            return np.full(len(kv), -1, np.int64), np.zeros(len(kv), bool)
        pos = np.minimum(np.searchsorted(self.keys, kv), len(self.keys) - 1)
        hit = self.keys[pos] == kv
        return np.where(hit, self.ordinal[pos], -1), hit

    def _add(self, kv: np.ndarray, sel: pa.Array, users: np.ndarray, got, threads: int, batch_keys: int,
             stats: dict) -> None:
        """Append the fetched histories ``got`` of ``users`` that a batch (keys ``kv``) still misses; under the lock.

        The other join worker may have appended some meanwhile, or dropped the
        arena: users it dropped are fetched again here. When the new users
        would pass the bound, the arena is dropped and refilled with this
        batch's users only (a single batch may still exceed it).
        """
        _, hit = self._find(kv)
        if hit.all():
            return
        miss = np.flatnonzero(~hit)
        need, first = np.unique(kv[miss], return_index=True)
        at = np.minimum(np.searchsorted(users, need), max(len(users) - 1, 0))
        fetched = users[at] == need if len(users) else np.zeros(len(need), bool)
        n, src, pools = got
        parts = [(need[fetched], (n[at[fetched]], src[at[fetched]], pools))]
        if not fetched.all():  # dropped by the other worker's reset since this batch fetched
            parts.append((need[~fetched], self._fetch(sel.take(pa.array(miss[first[~fetched]])), threads, batch_keys,
                                                      stats)))
        new = sum(int(((p[1][0] + 7) & ~7).sum()) for p in parts)
        if self.size and self.size + new > self.max_events:
            self._reset()  # refill with this batch's users only
            old_rows = np.flatnonzero(hit)
            if len(old_rows):
                old, ofirst = np.unique(kv[old_rows], return_index=True)
                parts.append((old, self._fetch(sel.take(pa.array(old_rows[ofirst])), threads, batch_keys, stats)))
        for who, part in parts:
            self._append(who, part)

    def _snapshot(self) -> _State:
        """The arena's state for a batch's cut (built once per state: warm batches share it); under the lock."""
        state = self._state
        if state is None or state.resets != self.resets:
            if self.direct is not None:
                low, table = self.direct
                high = low + len(table) - 1
            else:
                low, high, table = 0, -1, _NO_TIMES
            keys = self.keys if self.keys.dtype != object else _NO_TIMES
            state = self._state = _State(self.resets, low, high, table, keys, self.ordinal, self.seg_start,
                                         self.seg_count, self.grid.frozen(), self._values())
        return state

    def _arguments(self, keys: pa.Array, before: Any, max_len: int | None, window: Any
                   ) -> tuple[int, np.ndarray | None, int | None, np.ndarray]:
        """:meth:`SequenceStore.prepare`, with the common batch (int64 keys and times in the store's type, no nulls,
        no window) answered without its passes (a validity array, ``all``, a fresh ``arange``: ~25 us a batch)."""
        if (window is None and keys.null_count == 0 and isinstance(before, pa.Array) and before.null_count == 0
                and len(before) == len(keys) and self._time_type is not None and before.type.equals(self._time_type)
                and (max_len is None or (not isinstance(max_len, bool) and int(max_len) >= 0))):
            n = len(keys)
            rows = self._rows  # read once: the other join worker may replace it meanwhile
            if len(rows) < n:
                rows = self._rows = np.arange(max(n, 2 * len(rows)))  # shared by batches: never written
            return n, before.view(pa.int64()).to_numpy(), None, rows[:n]
        return self.store.prepare(keys, before, max_len, window)

    def join(self, keys: pa.Array, before: Any, max_len: int | None, window: Any, threads: int,
             batch_keys: int) -> tuple[pa.ListViewArray, dict[str, int]]:
        """One batch's list-view column over the arena (fetching the users it has not seen).

        Int keys first try the warm path: one compiled call finds every row's
        segment and cuts it over a snapshot of the arena (no numpy pass, no
        lock held while cutting); a batch with a user not cached goes the way
        that fetches it.
        """
        store = self.store
        n, b, w, rows = self._arguments(keys, before, max_len, window)
        stats = _new_stats(n)
        stats.update(cache_hits=0, cache_misses=0)
        if len(rows) and store.codec.kind == "int":
            sel = keys if len(rows) == n else keys.take(pa.array(rows))
            kv = sel.to_numpy(zero_copy_only=False) if sel.type == pa.int64() else store.codec.values(sel)
            with self.lock:
                state = self._snapshot()
            offsets = np.empty(n, np.int32) if len(rows) == n else np.zeros(n, np.int32)
            sizes = np.empty(n, np.int32) if len(rows) == n else np.zeros(n, np.int32)
            grid = state.grid
            events = kernels().find_cut_rows(
                kv, state.low, state.high, state.table, state.keys, state.ordinal, np.empty(len(kv), np.int64), rows,
                state.seg_start, state.seg_count, grid.first, grid.shift, grid.cells, grid.off, grid.grid, grid.steps,
                state.arena.times, _NO_TIMES if b is None else b, b is not None, -1 if max_len is None else int(max_len),
                -1 if w is None else int(w), offsets, sizes)
            if events >= 0:  # every user cached
                stats.update(events=int(events), pool_events=len(state.arena.array), cache_hits=len(rows))
                return pa.Array.from_buffers(self.type, n, [None, pa.py_buffer(offsets), pa.py_buffer(sizes)],
                                             children=[state.arena.array]), stats
        return self._join_missing(keys, n, b, w, rows, max_len, threads, batch_keys, stats)

    def _join_missing(self, keys: pa.Array, n: int, b: np.ndarray | None, w: int | None, rows: np.ndarray,
                      max_len: int | None, threads: int, batch_keys: int,
                      stats: dict) -> tuple[pa.ListViewArray, dict[str, int]]:
        """:meth:`join` of a batch that may miss users: they are fetched (outside the lock) and appended."""
        store = self.store
        got = None
        if len(rows):
            sel = keys if len(rows) == n else keys.take(pa.array(rows))
            kv = store.codec.values(sel)
            with self.lock:
                pos, hit = self._find(kv)  # pos: each row's segment
                arena = self.resets        # segments are numbered per arena: a reset renumbers them
                if not hit.all():
                    miss_rows = np.flatnonzero(~hit)
                    users, first = np.unique(kv[miss_rows], return_index=True)
                    # users another worker is fetching now are waited for, not fetched twice
                    wait = [done for who, done in self.inflight if np.isin(users, who).any()]
                    mine = ~np.isin(users, np.concatenate([who for who, _ in self.inflight])) if self.inflight else None
                    if mine is not None:
                        users, first = users[mine], first[mine]
                    if len(users):
                        flight = (users, threading.Event())
                        self.inflight.append(flight)
            if not hit.all():
                try:
                    if len(users):
                        # fetched outside the lock (the other worker's batches of cached users go on meanwhile),
                        # one fetch at a time: two at once fought over the GIL (an epoch filling the cache took
                        # 244 ms with two, 197 ms with one at a time; measured)
                        stats["cache_misses"] = len(users)
                        with self.fill_lock:
                            got = self._fetch(sel.take(pa.array(miss_rows[first])), threads, batch_keys, stats)
                finally:
                    if len(users):
                        with self.lock:
                            if got is not None:
                                self._add(kv, sel, users, got, threads, batch_keys, stats)
                            self.inflight = [f for f in self.inflight if f is not flight]
                        flight[1].set()
                for done in wait:
                    done.wait()
        with self.lock:
            if len(rows):
                if not hit.all() or self.resets != arena:
                    pos, hit = self._find(kv)
                    if not hit.all():  # dropped by a reset meanwhile: fetched again, under the lock (rare)
                        self._add(kv, sel, np.unique(kv[:0]), (np.zeros(0, np.int64), np.zeros(0, np.int64), {}),
                                  threads, batch_keys, stats)
                        pos, hit = self._find(kv)
                stats["cache_hits"] = len(rows) - stats["cache_misses"]
            # appends replace these arrays (or write past ``size``), never change what this batch reads
            state = self._snapshot()
            seg_start, seg_count, grid, values = state.seg_start, state.seg_count, state.grid, state.arena
        offsets = np.empty(n, np.int32) if len(rows) == n else np.zeros(n, np.int32)
        sizes = np.empty(n, np.int32) if len(rows) == n else np.zeros(n, np.int32)
        events = 0
        if len(rows):
            events = kernels().cut_rows(pos, rows, seg_start, seg_count, grid.first, grid.shift, grid.cells, grid.off,
                                        grid.grid, grid.steps, values.times, _NO_TIMES if b is None else b,
                                        b is not None, -1 if max_len is None else int(max_len),
                                        -1 if w is None else int(w), offsets, sizes)
        stats["events"] = int(events)
        stats["pool_events"] = len(values.array)
        out = pa.Array.from_buffers(self.type, n, [None, pa.py_buffer(offsets), pa.py_buffer(sizes)],
                                    children=[values.array])
        return out, stats

    def _values(self) -> "_Arena":
        """The arena's events so far as the list view's values (built once per arena state: batches of a warm
        cache share it); under the lock."""
        memo = self._memo
        if memo is not None and memo.resets == self.resets and len(memo.array) == self.size:
            return memo
        size = self.size
        arrays = []
        for col in self.columns:
            cd = self.store.codecs[self.store.group_of[col]]
            vals = self.data[col][: size // 8 if col in self.bools else size]
            bm = self.bits.get(col)
            arrays.append(_fixed_column(cd, col, vals, None if bm is None else pa.py_buffer(bm[: size // 8]), size,
                                        packed_bools=True))
        self._memo = _Arena(self.resets, pa.StructArray.from_arrays(arrays, fields=self.fields),
                            self.data[self.store.time][:size])
        return self._memo
