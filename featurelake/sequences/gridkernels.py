"""Compiled loops of the history cache: filling time grids, searching them, and cutting every row of a batch.

Why compiled (numba): these are per-event and per-row loops with a few
dependent reads each, which numpy can only express as many whole-array
passes with temporaries. Measured on the sequences benchmark (4,000 users x
800 events, 4,096-row batches): filling the grids of an epoch's 3.2M events
took 194 ms as numpy passes (bincount over 6.4M cells, repeats, cumsums);
a warm batch's cut (segment, grid search, ``max_len`` / window bounds,
offsets and sizes) took ~0.45 ms as numpy steps.

How the loops stay fast: a cell is a power of two of time units (a shift,
not a division: a 64-bit divide before each grid read made the reads wait on
it, 6.1 ms an epoch's 164K rows with ``//``, 2.7 ms with ``>>``), and a
batch is cut in passes whose reads do not depend on each other (all grid
reads, then all time reads), so that the memory system overlaps them.

Times are compared as offsets from a run's first time in uint64 (exact for
any int64 pair), so extreme query times cannot wrap.

This module imports numba at its top: import it lazily (see
:func:`featurelake.sequences.timegrid.kernels`), as ``featurelake.shuffle``
does, so that importing featurelake does not load numba. ``cache=True`` keeps
the machine code on disk; ``nogil=True`` lets the join workers overlap.
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True, inline="always")
def _run_shift(times: np.ndarray, s: int, n: int, cells_per_event: int) -> tuple[int, int]:  # pragma: no cover
    """A run's cell shift (the least giving at most ``cells_per_event`` cells an event) and its cells."""
    span = np.uint64(np.int64(times[s + n - 1])) - np.uint64(np.int64(times[s])) if n else np.uint64(0)
    target = np.uint64(cells_per_event * max(n, 1))
    k = 0
    while (span >> np.uint64(k)) >= target:
        k += 1
    return k, np.int64(span >> np.uint64(k)) + 1


@numba.njit(cache=True, nogil=True)
def grid_entries(times: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                 cells_per_event: int) -> int:  # pragma: no cover - compiled
    """The grid entries :func:`fill_grid` writes for these runs (at most ``cells_per_event * max(n, 1) + 2`` a run)."""
    total = 0
    for r in range(len(counts)):
        _, nc = _run_shift(times, starts[r], counts[r], cells_per_event)
        total += nc + 2
    return total


@numba.njit(cache=True, nogil=True)
def fill_grid(times: np.ndarray, starts: np.ndarray, counts: np.ndarray, cells_per_event: int, used: int,
              first: np.ndarray, shift: np.ndarray, cells: np.ndarray, off: np.ndarray,
              grid: np.ndarray) -> int:  # pragma: no cover - compiled
    """Grids of runs: run ``r`` is ``times[starts[r]:starts[r] + counts[r]]`` (sorted).

    Per run: ``first[r]`` its first time, ``shift[r]`` its cell shift,
    ``cells[r]`` the cells its events fall in, ``off[r]`` where its
    ``cells[r] + 2`` entries start (from ``used``); entry ``g`` = its events in
    cells below ``g``: a count per cell, then a running sum (branch-free; a
    walk over cells and events was 3x slower). ``grid`` must have room (see
    :func:`grid_entries`). Returns the entries written.
    """
    at = used
    for r in range(len(counts)):
        s = starts[r]
        n = counts[r]
        k, nc = _run_shift(times, s, n, cells_per_event)
        f = np.int64(times[s]) if n else np.int64(0)
        first[r] = f
        shift[r] = k
        cells[r] = nc
        off[r] = at
        for g in range(nc + 2):
            grid[at + g] = 0
        for j in range(s, s + n):
            grid[at + 1 + np.int64((np.uint64(np.int64(times[j])) - np.uint64(f)) >> np.uint64(k))] += 1
        run = 0
        for g in range(nc + 2):
            run += grid[at + g]
            grid[at + g] = run
        at += nc + 2
    return at - used


@numba.njit(cache=True, nogil=True, inline="always")
def bisect_left(times: np.ndarray, lo: int, hi: int, q: int) -> int:  # pragma: no cover - compiled
    """The first slot in ``times[lo:hi]`` (sorted) with a time >= ``q`` (``hi`` when none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if times[mid] < q:
            lo = mid + 1
        else:
            hi = mid
    return lo


@numba.njit(cache=True, nogil=True, inline="always")
def _finish(times: np.ndarray, h: int, end: int, q: int, steps: int) -> int:  # pragma: no cover - compiled
    """The first slot in ``times[h:end]`` (sorted) with a time >= ``q``: ``steps`` forward steps, then a bisection."""
    k = 0
    while h < end and k < steps:
        if times[h] >= q:
            return h
        h += 1
        k += 1
    return bisect_left(times, h, end, q)


@numba.njit(cache=True, nogil=True)
def search_grid(first: np.ndarray, shift: np.ndarray, cells: np.ndarray, off: np.ndarray, grid: np.ndarray,
                steps: int, times: np.ndarray, run: np.ndarray, base: np.ndarray, q: np.ndarray
                ) -> np.ndarray:  # pragma: no cover - compiled
    """:meth:`TimeGrid.search` for every query (see :func:`_cuts`)."""
    out = np.empty(len(q), np.int64)
    _cuts(first, shift, cells, off, grid, steps, times, run, base, q, out)
    return out


@numba.njit(cache=True, nogil=True)
def _cuts(first: np.ndarray, shift: np.ndarray, cells: np.ndarray, off: np.ndarray, grid: np.ndarray, steps: int,
          times: np.ndarray, run: np.ndarray, base: np.ndarray, q: np.ndarray, out: np.ndarray
          ) -> None:  # pragma: no cover - compiled
    """``out[i]``: the first slot of run ``run[i]`` (events at ``times[base[i]:]``) with a time >= ``q[i]``.

    In passes that each read one kind of memory, so that no read waits for
    another's result within a pass: each query's grid entry (from the runs'
    small arrays), the two grid values (a gather), the time at the cell's
    first event (a gather), then the steps inside the cell. One loop
    doing all four ran 5x slower (9.1 vs 1.6 ms for the grid part of an
    epoch's 164K rows: each row's reads waited on the row's previous ones).
    The last pass decides the first two events of a cell without branches
    (a cell holds 0, 1 or 2 events ~97% of the time at two cells an event;
    a branch on each was mispredicted often: 5.0 -> 4.7 ms a warm epoch's
    cuts, measured); only the rest step on and bisect (``steps`` in all).
    Slots outside the cell are never read from the arena (empty cells, about
    half the queries at two cells an event, read the last slot, always
    cached): 5.2 -> 4.6 ms an epoch's cuts with the CPU caches flushed first,
    as after other work (4.2 -> 3.8 ms warm), measured.
    """
    n = len(q)
    at = np.empty(n, np.int64)
    for i in range(n):
        r = run[i]
        f = first[r]
        cell = np.uint64(0)
        if q[i] > f:
            cell = (np.uint64(q[i]) - np.uint64(f)) >> np.uint64(shift[r])
            c = np.uint64(cells[r])
            if cell > c:
                cell = c
        at[i] = off[r] + np.int64(cell)
    end = np.empty(n, np.int64)
    for i in range(n):
        a = at[i]
        out[i] = base[i] + grid[a]
        end[i] = base[i] + grid[a + 1]
    last = len(times) - 1
    if last < 0:
        return
    head = at  # reused: the time at each cell's first slot
    for i in range(n):  # an empty cell (about half) reads one hot slot instead of the arena
        h = out[i]
        head[i] = times[h if h < end[i] else last]
    for i in range(n):  # branch-free for cells of up to two events before q (~97%: a branch per event mispredicted)
        h = out[i]
        e = end[i]
        qi = q[i]
        c0 = (h < e) & (head[i] < qi)
        c1 = c0 & (h + 1 < e) & (times[h + 1 if h + 1 < e else last] < qi)
        out[i] = h + np.int64(c0) + np.int64(c1)
        if c1 and h + 2 < e:  # a crowded cell: more steps, then a binary search
            out[i] = _finish(times, h + 2, e, qi, steps - 2)


@numba.njit(cache=True, nogil=True)
def cut_rows(seg: np.ndarray, rows: np.ndarray, seg_start: np.ndarray, seg_count: np.ndarray, first: np.ndarray,
             shift: np.ndarray, cells: np.ndarray, off: np.ndarray, grid: np.ndarray, steps: int, times: np.ndarray,
             before: np.ndarray, has_before: bool, max_len: int, window: int, offsets: np.ndarray,
             sizes: np.ndarray) -> int:  # pragma: no cover - compiled
    """Each looked-up row's history in the arena, as ``offsets[rows[i]]`` and ``sizes[rows[i]]``.

    Row ``rows[i]`` belongs to segment ``seg[i]``: its events before
    ``before[rows[i]]`` (all of them without ``before``), the newest
    ``max_len`` (< 0: no limit), none older than ``before - window`` (< 0: no
    window). Returns the events viewed in all.
    """
    n = len(rows)
    base = np.empty(n, np.int64)
    for i in range(n):
        base[i] = seg_start[seg[i]]
    hi = np.empty(n, np.int64)
    q = np.empty(n if has_before else 0, np.int64)
    if has_before:
        for i in range(n):
            q[i] = before[rows[i]]
        _cuts(first, shift, cells, off, grid, steps, times, seg, base, q, hi)
    else:
        for i in range(n):
            hi[i] = base[i] + seg_count[seg[i]]
    lo = base
    if window >= 0:
        for i in range(n):
            q[i] -= window
        lo = np.empty(n, np.int64)
        _cuts(first, shift, cells, off, grid, steps, times, seg, base, q, lo)
    total = 0
    for i in range(n):
        h = hi[i]
        a = lo[i]
        if max_len >= 0 and h - max_len > a:
            a = h - max_len
        if a > h:
            a = h
        offsets[rows[i]] = a
        sizes[rows[i]] = h - a
        total += h - a
    return total


@numba.njit(cache=True, nogil=True)
def find_segments(kv: np.ndarray, low: int, high: int, table: np.ndarray, keys: np.ndarray, ordinal: np.ndarray,
                  seg: np.ndarray) -> int:  # pragma: no cover - compiled
    """``seg[i]``: the cached segment of user key ``kv[i]`` (-1 when not cached); returns how many are not.

    With a ``table`` (dense keys), key ``k`` in ``[low, high]`` has segment
    ``table[k - low]`` (-1: none) and keys outside are not cached; without
    (an empty table), ``keys`` (sorted) is bisected and ``ordinal`` gives the
    segment of each. Compiled so that a warm batch's lookup is no numpy pass
    (bounds, a gather, a comparison, ``all``: ~10 us a batch in Python).
    """
    m = len(table)
    nk = len(keys)
    miss = 0
    for i in range(len(kv)):
        k = kv[i]
        s = -1
        if m:
            if k >= low and k <= high:  # bounds first: only in-range keys are subtracted
                s = table[k - low]
        elif nk:
            p = bisect_left(keys, 0, nk, k)
            if p < nk and keys[p] == k:
                s = ordinal[p]
        seg[i] = s
        miss += s < 0
    return miss


@numba.njit(cache=True, nogil=True)
def find_cut_rows(kv: np.ndarray, low: int, high: int, table: np.ndarray, keys: np.ndarray, ordinal: np.ndarray,
                  seg: np.ndarray, rows: np.ndarray, seg_start: np.ndarray, seg_count: np.ndarray, first: np.ndarray,
                  shift: np.ndarray, cells: np.ndarray, off: np.ndarray, grid: np.ndarray, steps: int,
                  times: np.ndarray, before: np.ndarray, has_before: bool, max_len: int, window: int,
                  offsets: np.ndarray, sizes: np.ndarray) -> int:  # pragma: no cover - compiled
    """:func:`find_segments` then :func:`cut_rows` in one call (a warm batch: no Python between them).

    Returns -1 (nothing cut) when a key is not cached; ``seg`` then says which.
    """
    if find_segments(kv, low, high, table, keys, ordinal, seg):
        return -1
    return cut_rows(seg, rows, seg_start, seg_count, first, shift, cells, off, grid, steps, times, before, has_before,
                    max_len, window, offsets, sizes)
