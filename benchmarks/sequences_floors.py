"""The floors the sequences benchmark compares its joins against (see :mod:`benchmarks.sequences`).

* :func:`assembly_floor`: building the joined lists from arrays already in memory (no store, no decode).
* :func:`lookups_vs_floor`: full lookups vs the raw multi-get of exactly the keys they fetched.
* :func:`record_cold_keys` / :func:`cold_floor`: the keys a history-cache epoch that starts empty fetches,
  and the raw multi-get of exactly those keys, the storage floor of a cold list-view epoch.
* :func:`steady_allocator`: glibc's heap trimming off, so that the floors measure compute, not page faults.

Split out of ``benchmarks/sequences.py`` to keep it a readable size.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.common import ratio



def assembly_floor(samples, view, cols: list[str], repeat: int, batch_size: int) -> float:
    """Seconds to assemble the joined lists alone: the same output built from arrays already in memory.

    Per batch: gather every row's events (its list's length, contiguous, the
    best case) from in-memory numpy columns, decode the string column's codes,
    and build the list<struct> column -- no store, no decode, no selection.
    No join that materializes the lists can run faster on this machine.
    """
    from featurelake.sequences.codecs import FixedCodec

    batches = list(samples.batches(columns=cols, batch_size=batch_size, sequences={"hist": view}))
    store = view.store
    codecs = {c: store.codecs[store.group_of[c]] for c in view.columns}
    prepared = []
    for b in batches:
        lst = b.column("hist")
        total = len(lst.values)
        pool = {}
        for c in view.columns:
            cd = codecs[c]
            arr = lst.values.field(c)
            if isinstance(cd, FixedCodec) and c in cd.dictionaries:
                pool[c] = (pa.compute.index_in(arr, value_set=cd._dict_arrays[c]).fill_null(0).to_numpy().astype(np.uint16), cd)
            else:
                pool[c] = (arr.to_numpy(zero_copy_only=False), None)
        prepared.append((lst.offsets, total, pool))
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for offsets, total, pool in prepared:
            idx = np.arange(total, dtype=np.int64)
            arrays = []
            for c in view.columns:
                vals, cd = pool[c]
                got = vals.take(idx)
                arrays.append(cd.to_arrow(c, got, None) if cd is not None else pa.array(got))
            pa.ListArray.from_arrays(offsets, pa.StructArray.from_arrays(arrays, names=view.columns))
        best = min(best, time.perf_counter() - t0)
    return best


def steady_allocator() -> bool:
    """Let glibc keep freed memory in the process (no trimming, no per-array mmap) for the floor comparison.

    The raw multi-get holds a batch's ~20 MB of values at once; whether the
    allocator hands those pages back to the OS after each call (and faults
    them in again, ~4,000 page faults a batch) depended on what the process
    had freed before (glibc raises its thresholds after freeing large
    arrays), which moved the floor by 30% between otherwise equal runs.
    Without trimming both sides measure compute. Returns whether it applied.
    """
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_trim_threshold, 1 << 30)) and bool(libc.mallopt(m_mmap_threshold, 32 << 20))
    except (OSError, AttributeError):
        return False


def lookups_vs_floor(store, batches: list[pa.RecordBatch], threads: int, repeat: int, columns: list[str],
                     max_len: int) -> dict[str, Any]:
    """Lookups/s of full lookups vs raw multi-gets of exactly the keys they fetched."""
    store.recorder = []
    for b in batches:
        store.lookup(b.column("user_id"), b.column("ts"), columns, max_len, None, threads=threads)
    recorded = store.recorder
    store.recorder = None
    rows = sum(b.num_rows for b in batches)
    looks, floors = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for b in batches:
            store.lookup(b.column("user_id"), b.column("ts"), columns, max_len, None, threads=threads)
        looks.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for keys in recorded:
            store.multi_get(keys, threads)
        floors.append(time.perf_counter() - t0)
    t_look, t_floor = min(looks), min(floors)
    return {
        "rows": rows,
        "keys_fetched": sum(len(k) for k in recorded),
        "lookups_per_s": round(rows / t_look),
        "raw_multiget_rows_per_s": round(rows / t_floor),
        "lookup_over_floor_time": ratio(t_look, t_floor),
        # each repetition times the lookups and the floor back to back: the median of those ratios
        # cancels load that drifts on a shared machine (the best-of ratio above pairs unrelated moments)
        "lookup_over_floor_time_paired_median": round(float(np.median([a / b for a, b in zip(looks, floors)])), 4),
        "lookup_over_floor_time_runs": [round(a / b, 3) for a, b in zip(looks, floors)],
        "threads": threads,
    }


def record_cold_keys(samples, view, cols: list[str], batch_size: int) -> list[list[bytes]]:
    """The store keys one epoch over ``samples`` fetches through ``view`` (a fresh history-cache view: a cold epoch).

    Every multi-get the view's store makes (heads and chunks) is recorded;
    the epoch itself is not timed.
    """
    view.store.recorder = []
    for _ in samples.batches(columns=cols, batch_size=batch_size, sequences={"hist": view}):
        pass
    recorded, view.store.recorder = view.store.recorder, None
    return recorded


def cold_floor(store, recorded: list[list[bytes]], threads: int, batch_keys: int) -> float:
    """Seconds to multi-get exactly ``recorded`` (raw values, no decode), with the join's threads and batch size.

    A cold epoch cannot fetch its users' histories faster than this: it is
    the storage floor that the cold list-view join is compared to.
    """
    t0 = time.perf_counter()
    for keys in recorded:
        store.multi_get(keys, threads, batch_keys)
    return time.perf_counter() - t0
