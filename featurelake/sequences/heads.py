"""Per-user heads of a sequence store build: event counts and chunk first times, over one or two levels.

A lookup reads the heads of a batch's unique users first, then searches them
for the chunk that holds each row's ``before`` (and window start). Users
with long histories have two-level heads (:mod:`featurelake.sequences.layout`):
only the head pages a search lands in are fetched. Split from
:mod:`featurelake.sequences.lookup` (which selects and decodes chunks) because the
index over chunk times is its own structure, also read by incremental builds.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np

from featurelake.errors import CorruptFileError
from featurelake.sequences.kernels import kernels
from featurelake.sequences.store import HEAD_FANOUT

if TYPE_CHECKING:
    from featurelake.sequences.lookup import SequenceStore

MATRIX_CELLS = 1 << 22   # top levels searched as one padded matrix up to this many cells
_NO_TIME = np.iinfo(np.int64).max  # padding: never below a bound
_PAD = np.full(HEAD_FANOUT, _NO_TIME, "<i8").tobytes()


class Heads:
    """The heads of a batch's unique users, and the search for a chunk by time over one or two levels.

    A head holds (event count, last time, first times); when it lists fewer
    first times than the user has chunks it is two-level and lists the first
    time of every ``HEAD_FANOUT``-th chunk, the pages holding the rest (see
    :mod:`featurelake.sequences.layout`). Pages are fetched only for the
    (user, page) pairs a search lands in, in one multi-get.
    """

    def __init__(self, store: "SequenceStore", users: np.ndarray, threads: int, batch_keys: int, stats: dict) -> None:
        self.store, self.users, self.threads, self.batch_keys, self.stats = store, users, threads, batch_keys, stats
        c = store.chunk_events
        keys = store.codec.head_keys(users)
        cache = getattr(store, "head_cache", None)
        if cache is None:
            raw = store.multi_get(keys, threads, batch_keys)
        else:
            raw, fetched = cache.get_many(keys, lambda ks: store.multi_get(ks, threads, batch_keys))
        if None in raw:  # users without a head (one C-level scan; no bytes value equals None)
            raw = [h or b"" for h in raw]
        lens = np.fromiter(map(len, raw), np.int64, len(raw)) >> 3
        stats["head_bytes"] = int(lens.sum()) * 8 if cache is None else fetched
        buf = np.frombuffer(b"".join(raw), "<i8")
        hstart = np.zeros(len(users) + 1, np.int64)
        np.cumsum(lens, out=hstart[1:])
        present = lens > 0
        self.n_events = np.zeros(len(users), np.int64)
        self.n_events[present] = buf[hstart[:-1][present]]
        self.n_chunks = -(-self.n_events // c)
        listed = np.where(present, lens - 2, 0)
        self.two_level = listed < self.n_chunks
        self.top_start = np.zeros(len(users) + 1, np.int64)
        np.cumsum(listed, out=self.top_start[1:])
        if len(buf):
            header = np.zeros(len(buf), bool)
            header[hstart[:-1][present]] = True
            header[hstart[:-1][present] + 1] = True
            self.top = buf[~header]
        else:
            self.top = np.empty(0, np.int64)

    def _pages(self, users: np.ndarray, pages: np.ndarray) -> tuple[list[bytes], int]:
        """Head pages ``pages`` of the batch's users at ``users`` (positions), in one multi-get, and the bytes read."""
        keys = self.store.codec.page_keys(self.users[users], pages)
        cache = getattr(self.store, "head_cache", None)
        if cache is None:
            vals = self.store.multi_get(keys, self.threads, self.batch_keys)
            fetched = -1
        else:
            vals, fetched = cache.get_many(keys, lambda ks: self.store.multi_get(ks, self.threads, self.batch_keys))
        if None in vals or b"" in vals:  # one C-level scan each (a page is never empty)
            info = self.store.info
            raise CorruptFileError(f"sequence store {info.db_dir} lacks a head page (build {info.build_id})", info.db_dir)
        return vals, (sum(map(len, vals)) if fetched < 0 else fetched)

    def first_times(self) -> list[np.ndarray | None]:
        """Per user: the first time of every chunk (all pages read), None for users without a head."""
        deep = np.flatnonzero(self.two_level)
        pages: dict[int, np.ndarray] = {}
        if len(deep):
            n_pages = -(-self.n_chunks[deep] // HEAD_FANOUT)
            pu = np.repeat(deep, n_pages)
            pp = np.arange(len(pu)) - np.repeat(np.cumsum(n_pages) - n_pages, n_pages)
            vals, _ = self._pages(pu, pp)
            at = 0
            for u, k in zip(deep, n_pages):
                pages[int(u)] = np.frombuffer(b"".join(vals[at : at + k]), "<i8")
                at += k
        out: list[np.ndarray | None] = []
        for i in range(len(self.users)):
            if self.n_events[i] == 0:
                out.append(None)
            else:
                out.append(pages[i] if i in pages else self.top[self.top_start[i] : self.top_start[i + 1]])
        return out

    def chunk_before(self, q_user: np.ndarray, q: np.ndarray, compiled: bool = False) -> np.ndarray:
        """Per query: the last chunk of user ``q_user[i]`` whose first time is < ``q[i]`` (-1: none).

        ``compiled``: the top level searched by a compiled kernel (:mod:`featurelake.sequences.kernels`),
        for callers that use the kernels anyway (numba loaded)."""
        listed = np.diff(self.top_start)
        width = int(listed.max()) if len(listed) else 0
        if compiled:  # a binary search a query (4,096 rows: ~0.05 ms, against ~0.35 ms for the matrix below)
            j = kernels().run_counts(self.top, self.top_start, q_user.astype(np.int64, copy=False),
                                     q.astype(np.int64, copy=False))
        elif width and len(listed) * width <= MATRIX_CELLS:
            # few numpy calls for small batches: the top levels as one padded matrix, counted row-wise
            grid = np.full((len(listed), width), _NO_TIME, np.int64)
            grid[np.repeat(np.arange(len(listed)), listed), np.arange(len(self.top)) - np.repeat(self.top_start[:-1], listed)] = self.top
            j = (grid[q_user] < q[:, None]).sum(axis=1)
        else:
            j = _seg_search(self.top, self.top_start, q_user, q) - self.top_start[q_user]
        out = j - 1
        deep = np.flatnonzero(self.two_level[q_user] & (j > 0))
        if not len(deep):
            return out
        f = HEAD_FANOUT
        page = j[deep] - 1
        codes, pinv = np.unique(q_user[deep].astype(np.int64) * (1 << 32) + page, return_inverse=True)
        pu, pp = codes >> 32, codes & 0xFFFFFFFF
        vals, fetched = self._pages(pu, pp)
        self.stats["head_bytes"] += fetched
        # every page but a user's last holds HEAD_FANOUT times: pad the last, count row-wise
        full = 8 * f
        grid = np.frombuffer(b"".join(v if len(v) == full else v + _PAD[len(v) :] for v in vals), "<i8").reshape(-1, f)
        pinv = pinv.reshape(-1)
        k = (grid[pinv] < q[deep][:, None]).sum(axis=1)  # >= 1: the page's first time is < q
        out[deep] = page * f + k - 1
        return out


class HeadCache:
    """Head values already read, by key, for the lookups of one :class:`~featurelake.sequences.join.SequenceView`.

    Why: an epoch looks up every user many times (40 training rows a user in
    the benchmarks), and a build never changes, so a user's head (event
    count, chunk first times: ~72 bytes at 800 events) is read once per
    view instead of once per batch: the head multi-get was a quarter of a
    batch's keys. Users without a head are kept as ``b""``. Bounded by
    ``max_bytes`` (cleared when full); thread-safe for the join workers.
    """

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = int(max_bytes)
        self.values: dict[bytes, bytes] = {}
        self.bytes = 0
        self.lock = threading.Lock()

    def get_many(self, keys: list[bytes], fetch) -> tuple[list[bytes], int]:
        """The values of ``keys`` and the bytes read for them; ``fetch(missing keys) -> values`` reads those not kept."""
        get = self.values.get
        raw = [get(k) for k in keys]
        if None not in raw:
            return raw, 0
        miss = [i for i, v in enumerate(raw) if v is None]
        got = fetch([keys[i] for i in miss])
        fetched = 0
        for i, v in zip(miss, got):
            raw[i] = v = v or b""
            fetched += len(v)
        with self.lock:
            if self.bytes + fetched + 64 * len(miss) > self.max_bytes:
                self.values.clear()
                self.bytes = 0
            for i in miss:
                self.values[keys[i]] = raw[i]
            self.bytes += fetched + 64 * len(miss)  # + the dictionary's own cost of a small entry (about)
        return raw, fetched


def _seg_search(pool: np.ndarray, run_start: np.ndarray, q_run: np.ndarray, q: np.ndarray) -> np.ndarray:
    """For each query: the first position in its run of ``pool`` whose value is >= q.

    ``pool`` is sorted within each run ``[run_start[r], run_start[r+1])``.
    Vectorized: runs are laid end to end on one axis (run * span + value),
    split into groups of runs when that would overflow int64.
    """
    out = np.empty(len(q), np.int64)
    if not len(q):
        return out
    if not len(pool):
        return run_start[q_run].astype(np.int64)
    vmin, vmax = int(pool.min()), int(pool.max())
    span = vmax - vmin + 3
    qc = np.clip(q, vmin - 1, vmax + 1) - (vmin - 1)
    if span >= 1 << 61:  # absurd value ranges: one search per query
        for i, (r, v) in enumerate(zip(q_run, q)):
            a, z = run_start[r], run_start[r + 1]
            out[i] = a + np.searchsorted(pool[a:z], v, side="left")
        return out
    n_runs = len(run_start) - 1
    per = max(1, (1 << 62) // span)
    run_len = np.diff(run_start)
    shifted = pool - (vmin - 1)
    for g0 in range(0, n_runs, per):
        g1 = min(n_runs, g0 + per)
        sel = slice(None) if (g0 == 0 and g1 == n_runs) else (q_run >= g0) & (q_run < g1)
        p0, p1 = int(run_start[g0]), int(run_start[g1])
        combined = np.repeat(np.arange(g1 - g0, dtype=np.int64), run_len[g0:g1]) * span + shifted[p0:p1]
        qq = (q_run[sel].astype(np.int64) - g0) * span + qc[sel]
        out[sel] = p0 + np.searchsorted(combined, qq, side="left")
    return out
