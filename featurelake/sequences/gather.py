"""What a lookup's copies share: the index of rows' event ranges, per-thread scratch buffers, the thread pool.

A lookup decodes the chunks its rows need into one pool per column (a row's
events are contiguous there: its pairs are one user's consecutive chunks) and
then copies each row's range ``[start, start + length)`` out, rows back to
back (:mod:`featurelake.sequences.assemble`, by the compiled kernels). Columns
Arrow takes itself (IPC codec) need the index of every event: :func:`ranges`.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np


def ranges(starts: np.ndarray, lengths: np.ndarray, total: int, out: np.ndarray | None = None) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, lengths)])`` in one cumsum (``total`` = sum of lengths),
    into ``out`` (int64, ``total`` long) when given."""
    nz = lengths > 0
    s, n = starts[nz].astype(np.int64), lengths[nz].astype(np.int64)
    step = np.empty(total, np.int64) if out is None else out
    step.fill(1)
    if len(s):
        first = np.cumsum(n) - n
        step[0] = s[0]
        step[first[1:]] = s[1:] - (s[:-1] + n[:-1]) + 1
    return np.cumsum(step, out=step)


SCRATCH_MAX_BYTES = 64 << 20  # larger arrays are not kept
_SCRATCH = threading.local()


def scratch_array(key: Any, n: int, dtype: Any) -> np.ndarray:
    """An uninitialized array of ``n`` items, reusing this thread's buffer for ``key``.

    Why: a lookup's decoded pools and gather indexes are tens of MB, dropped
    as soon as the lists are copied out; fresh allocations of that size come
    back from the OS as untouched pages, and faulting them in cost as much as
    the numpy work on them (thousands of page faults a batch, measured).
    The array is valid until this thread asks for ``key`` again; each thread
    keeps at most one buffer per key, none over ``SCRATCH_MAX_BYTES``.
    """
    dt = np.dtype(dtype)
    need = n * dt.itemsize
    if need > SCRATCH_MAX_BYTES:
        return np.empty(n, dt)
    bufs = _SCRATCH.__dict__.setdefault("bufs", {})
    buf = bufs.get(key)
    if buf is None or buf.nbytes < need:
        buf = bufs[key] = np.empty(need + need // 4, np.uint8)
    return buf[:need].view(dt)


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def lookup_pool(threads: int) -> ThreadPoolExecutor:
    """The process's pool of ``threads`` lookup threads (multi-gets, decoding, copies), started once."""
    with _POOLS_LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            pool = _POOLS[threads] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="featurelake-seq")
        return pool
