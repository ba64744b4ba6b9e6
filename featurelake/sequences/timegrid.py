"""Time grids: where a time falls in each of many sorted runs of times, in a fixed number of numpy steps.

Why: the list-view history cache (:class:`featurelake.sequences.listview.HistoryCache`)
answers, for every row of a batch, "the first event of this user at or after
``before``" over an arena of millions of events. A binary search costs
about 5 ns a step and ~20 dependent steps a row (measured: 0.42 ms for a
4,096-row batch over 3.2M events, the whole warm join's budget). Here each
run (a user's history) gets a uniform grid over its time range, ``CELLS_PER_EVENT``
cells an event: cell ``g`` records how many of the run's events fall in
cells before it. A query computes its cell by arithmetic, reads two grid
entries and steps forward over the few events inside that cell; the rare
rows whose cell is crowded (bursts of events closer than a cell) finish
with a binary search over that cell only. 0.16 ms for the same batch,
and 8 bytes an event instead of the 8-byte sort keys it replaces.
"""
from __future__ import annotations

import numpy as np

from featurelake.sequences.search import bisect_left

CELLS_PER_EVENT = 2  # grid cells per event of a run: ~0.5 events a cell when times are spread evenly
STEPS = 8            # forward steps inside a cell before the crowded rows fall back to a binary search


class TimeGrid:
    """Grids over runs of sorted int64 times, appended run by run; see the module docstring."""

    def __init__(self) -> None:
        self.first = np.empty(0, np.int64)   # per run: its first time
        self.width = np.empty(0, np.int64)   # per run: time units per cell (>= 1)
        self.cells = np.empty(0, np.int64)   # per run: its number of cells
        self.off = np.empty(0, np.int64)     # per run: where its cells + 2 entries start in ``grid``
        self.grid = np.empty(0, np.int32)    # per run, per cell g: events of the run in cells < g
        self.used = 0
        self.steps = STEPS                   # forward steps inside a cell (0: every cut by binary search)

    @property
    def nbytes(self) -> int:
        return self.grid.nbytes + 4 * self.first.nbytes

    def append(self, times: np.ndarray, counts: np.ndarray) -> None:
        """Add runs: ``times`` holds their events back to back (each run sorted), ``counts`` their lengths."""
        counts = np.asarray(counts, np.int64)
        k = len(counts)
        if not k:
            return
        ends = np.cumsum(counts)
        starts = ends - counts
        has = counts > 0
        t = np.asarray(times, np.int64)
        first = np.where(has, t[np.where(has, starts, 0)] if len(t) else 0, 0)
        last = np.where(has, t[np.where(has, ends - 1, 0)] if len(t) else 0, 0)
        cells = np.maximum(counts, 1) * CELLS_PER_EVENT
        width = (last - first) // cells + 1   # (last - first) // width < cells: every event inside the grid
        entries = cells + 2                   # cells 0..cells, and one more so that g + 1 is always readable
        off = self.used + np.cumsum(entries) - entries
        total = int(entries.sum())
        if self.used + total > len(self.grid):
            grown = np.empty(max(self.used + total, 2 * len(self.grid), 1024), np.int32)
            grown[: self.used] = self.grid[: self.used]
            self.grid = grown
        # each event's entry number over all new runs; events in entries before each entry (one
        # bincount and a cumsum), less the events of the runs before it
        run = np.repeat(np.arange(k), counts)
        cell_id = (off - self.used)[run] + (t - first[run]) // width[run]
        below = np.zeros(total + 1, np.int64)
        np.cumsum(np.bincount(cell_id, minlength=total), out=below[1:])
        self.grid[self.used : self.used + total] = below[:-1] - np.repeat(starts, entries)
        self.used += total
        self.first = np.concatenate([self.first, first])
        self.width = np.concatenate([self.width, width])
        self.cells = np.concatenate([self.cells, cells])
        self.off = np.concatenate([self.off, off])

    def frozen(self) -> "TimeGrid":
        """A view of the runs so far that later appends do not change (they replace arrays or write past it)."""
        out = TimeGrid.__new__(TimeGrid)
        out.__dict__.update(self.__dict__)
        return out

    def search(self, run: np.ndarray, base: np.ndarray, q: np.ndarray, times: np.ndarray) -> np.ndarray:
        """Per query: the first slot of run ``run[i]`` (its events at ``times[base[i]:]``) with a time >= ``q[i]``.

        Returns slots in ``times``' positions (``base`` + events of the run below ``q``).
        """
        cell = np.minimum((q - self.first.take(run)).clip(0) // self.width.take(run), self.cells.take(run))
        at = self.off.take(run) + cell
        h = base + self.grid.take(at)
        end = base + self.grid.take(at + 1)
        # forward over the events inside each row's cell: most cells hold none or one
        act = np.flatnonzero(h < end)
        for _ in range(self.steps):
            if not len(act):
                return h
            at = h[act]
            act = act[times[at] < q[act]]
            h[act] += 1
            act = act[h[act] < end[act]]
        if len(act):  # crowded cells (bursts closer than a cell): a binary search over the rest of the cell
            h[act] = bisect_left(times, h[act], end[act], q[act])
        return h
