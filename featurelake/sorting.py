"""Sorting that is near-free on input that is already (or almost) in order.

Keys handed to a backfill or upsert usually come from a scan of the table
(``read(columns=[key])``): a few long ascending runs, one per data file. A
plain quicksort ignores that order; timsort (numpy's ``kind="stable"`` for
wide integers) merges a few runs in near-linear time but is several times
slower than quicksort on random input. One vectorised pass counting the
descents picks the right one, and sorted input is not sorted at all.
"""
from __future__ import annotations

import numpy as np

__all__ = ["argsort", "sort", "is_sorted", "distinct_runs"]

# Up to this share of descents the input is "a few runs": timsort merges them faster than a quicksort.
_FEW_RUNS = 1 / 1024


def _descents(v: np.ndarray) -> int:
    return int(np.count_nonzero(v[1:] < v[:-1])) if len(v) > 1 else 0


def is_sorted(v: np.ndarray) -> bool:
    """Whether ``v`` is in ascending (non-decreasing) order."""
    return _descents(v) == 0


def argsort(v: np.ndarray) -> np.ndarray | None:
    """An order that sorts ``v`` ascending, or None when ``v`` is sorted already.

    Equal values keep their input order only on the timsort path: callers
    that need a stable order must not rely on it (keys here are unique).
    """
    d = _descents(v)
    if d == 0:
        return None
    if d <= max(16, int(len(v) * _FEW_RUNS)):
        return np.argsort(v, kind="stable")
    return np.argsort(v)


def sort(v: np.ndarray) -> np.ndarray:
    """``v`` sorted ascending (``v`` itself when already sorted: do not modify the result)."""
    d = _descents(v)
    if d == 0:
        return v
    if d <= max(16, int(len(v) * _FEW_RUNS)):
        return np.sort(v, kind="stable")
    return np.sort(v)


_MAX_RUNS = 256  # beyond this many long ascending runs the linear check gives up (the caller sorts)
_LONG_RUN = 64  # a run this long is checked as a range; shorter runs' values are sorted together
_MAX_LOOSE = 1 / 8  # share of values in short runs beyond which the input is not "a few runs" (the caller sorts)
_JUMP = 1024  # a step this many times the typical step starts a new run (where one file's keys end)


def distinct_runs(v: np.ndarray) -> bool:
    """True when ``v`` provably holds no value twice, checked in near-linear time; False means "not shown".

    Keys from a scan come as a few long, strictly ascending runs (one per
    data file) over disjoint key ranges, sometimes with a file whose keys are
    in no order (rows an upsert inserted): short runs. Runs are cut where the
    values descend, and also where they jump far ahead (a file's first keys
    would otherwise lengthen the run of the file before it: any cut keeps a
    run ascending). The long runs are shown distinct in one pass (each
    strictly ascending, their ranges disjoint); the few values of short runs
    are sorted on their own and each is searched in the long runs. Anything
    else (a repeat inside a run, long runs whose ranges overlap, too many runs
    or too many loose values) answers False and the caller sorts.
    """
    if v.dtype.kind not in "iu":  # floats (an integer column with nulls): NaN compares false everywhere
        return False
    n = len(v)
    if n < 2:
        return True
    steps = np.diff(v)
    typical = max(1, int(np.median(steps[:: max(1, n // 4096)])))
    jump = min(typical * _JUMP, int(np.iinfo(v.dtype).max))
    breaks = np.flatnonzero((v[1:] <= v[:-1]) | (steps > jump))  # where an ascending run ends
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks + 1, [n]])
    long = (ends - starts) >= _LONG_RUN
    if int(long.sum()) > _MAX_RUNS:
        return False
    loose_runs = np.flatnonzero(~long)
    loose_count = int((ends - starts)[loose_runs].sum())
    if loose_count > max(_LONG_RUN, n * _MAX_LOOSE):
        return False
    a, b = starts[long], ends[long]
    order = np.argsort(v[a], kind="stable")
    a, b = a[order], b[order]
    if not (v[b - 1][:-1] < v[a][1:]).all():  # long runs' ranges overlap
        return False
    if not loose_count:
        return True
    loose = np.sort(np.concatenate([v[starts[r]:ends[r]] for r in loose_runs]))
    if (loose[1:] == loose[:-1]).any():
        return False
    for lo, hi in zip(a, b):  # a loose value equal to one of a long run's
        run = v[lo:hi]
        inside = loose[np.searchsorted(loose, run[0]): np.searchsorted(loose, run[-1], side="right")]
        if len(inside) and (run[np.searchsorted(run, inside)] == inside).any():
            return False
    return True
