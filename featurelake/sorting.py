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


_MAX_RUNS = 256  # beyond this many ascending runs the linear check gives up (the caller sorts)


def distinct_runs(v: np.ndarray) -> bool:
    """True when ``v`` provably holds no value twice, checked in linear time; False means "not shown".

    Keys from a scan come as a few strictly ascending runs (one per data
    file) over disjoint key ranges: then no value repeats, and one pass
    shows it without sorting. Anything else (a repeat inside a run, runs
    whose ranges overlap, many runs) answers False and the caller sorts.
    """
    if v.dtype.kind not in "iu":  # floats (an integer column with nulls): NaN compares false everywhere
        return False
    n = len(v)
    if n < 2:
        return True
    breaks = np.flatnonzero(v[1:] <= v[:-1])  # where a strictly ascending run ends
    if len(breaks) > _MAX_RUNS:
        return False
    starts = np.concatenate([[0], breaks + 1])
    ends = np.concatenate([breaks, [n - 1]])
    lo, hi = v[starts], v[ends]
    order = np.argsort(lo, kind="stable")
    return bool((hi[order][:-1] < lo[order][1:]).all())
