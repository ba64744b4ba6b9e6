"""Vectorized searches of a lookup batch: the chunks its rows need, and each row's cut inside a chunk.

Why a module of its own: these are the numeric kernels of a lookup (numpy over
whole batches, no Python per key), shared by :mod:`featurelake.sequences.lookup`
and :mod:`featurelake.sequences.timegrid`, and tested against per-query oracles
(tests/test_sequence_search.py). They know nothing of stores or builds.
"""
from __future__ import annotations

import numpy as np

COUNT_BLOCK = 16  # count_below: times compared a block at a time


def count_below(times: np.ndarray, counts: np.ndarray, pairs: np.ndarray, bound: np.ndarray) -> np.ndarray:
    """Per query: how many of pair ``pairs[i]``'s events have a time below ``bound[i]`` (times sorted in a pair).

    ``times`` is the (pairs, chunk_events) grid (slots past a pair's count
    are ignored, whatever they hold). Two steps of a few numpy calls over
    small gathers, not a binary search of log2(chunk_events) rounds: compare
    with every ``COUNT_BLOCK``-th time of the pair, then within the one block left.
    """
    c = times.shape[1]
    if c % COUNT_BLOCK or c < 2 * COUNT_BLOCK:
        start = pairs.astype(np.int64) * c
        return bisect_left(times.reshape(-1), start, start + counts[pairs], bound) - start
    flat = times.reshape(-1)
    n = counts[pairs].astype(np.int64)
    base = pairs.astype(np.int64)[:, None] * c
    bound = bound[:, None]
    last = np.arange(COUNT_BLOCK - 1, c, COUNT_BLOCK, dtype=np.int64)  # each block's last slot
    below = (flat[base + last] < bound) & (last < n[:, None])
    blocks = below.sum(axis=1)  # whole blocks below the bound (times are sorted: a prefix of the blocks)
    slot = (blocks * COUNT_BLOCK)[:, None] + np.arange(COUNT_BLOCK, dtype=np.int64)
    inside = (flat[base + np.minimum(slot, c - 1)] < bound) & (slot < n[:, None])
    return blocks * COUNT_BLOCK + inside.sum(axis=1)


def chunk_pairs(users: np.ndarray, first: np.ndarray, count: np.ndarray, n_chunks: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (user, chunk) pairs that rows need, sorted, and each row's first pair.

    Row ``i`` needs chunks ``first[i] .. first[i] + count[i] - 1`` of user
    ``users[i]`` (a position into ``n_chunks``). Where the batch's users have
    few chunks in all, the ranges are marked on a line of every chunk of
    those users (two bincounts and a cumsum, no sort); users with long
    histories fall back to one sort of the pairs rows name.
    """
    base = np.zeros(len(n_chunks) + 1, np.int64)
    np.cumsum(n_chunks, out=base[1:])
    space = int(base[-1])
    named = int(count.sum())
    start = base[users] + first
    if space <= 4 * named + (1 << 16):
        edges = np.bincount(start, minlength=space + 1) - np.bincount(start + count, minlength=space + 1)
        needed = np.cumsum(edges[:space]) > 0
        ids = np.flatnonzero(needed)
        rank = np.cumsum(needed) - 1
        p_first = rank[start]
    else:
        rep = np.repeat(start, count)
        ids = np.unique(rep + (np.arange(named) - np.repeat(np.cumsum(count) - count, count)))
        p_first = np.searchsorted(ids, start)
    pair_user = np.searchsorted(base, ids, side="right") - 1
    return pair_user, ids - base[pair_user], p_first


def bisect_left(values: np.ndarray, lo: np.ndarray, hi: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Per query: the first position in ``values[lo[i]:hi[i]]`` (sorted) with a value >= ``q[i]`` (vectorized)."""
    lo = lo.astype(np.int64, copy=True)
    hi = hi.astype(np.int64, copy=True)
    idx = np.flatnonzero(lo < hi)
    while len(idx):
        mid = (lo[idx] + hi[idx]) >> 1
        less = values[mid] < q[idx]
        lo[idx[less]] = mid[less] + 1
        hi[idx[~less]] = mid[~less]
        idx = idx[lo[idx] < hi[idx]]
    return lo
