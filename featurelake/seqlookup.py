"""Serving a sequence store: open a build, look up users' events before a time.

Why a module of its own: the read path is the hot one and has its own
concerns. :class:`SequenceStore` opens one build (through its record,
:class:`featurelake.seqbuild.BuildInfo`) and answers a batch of (key, before)
lookups: it reads the heads of the batch's unique users, picks only the
chunks that can hold the last ``max_len`` events before each row's time
(inside ``window``), fetches them with batched multi-gets on a shared thread
pool, decodes them per column group and cuts each row's list out of one
pool with a single ``take`` per column. The helpers below turn user keys,
``before`` times and windows into the store's integer forms, rounding so
that an event at or after a row's time never slips in.
"""
from __future__ import annotations

import datetime as _dt
import threading
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from featurelake.errors import CorruptFileError, FeatureLakeError, SchemaMismatchError
from featurelake.seqbuild import BUILD_FORMAT, DEFAULT_THREADS, BuildInfo, SequenceBuildError
from featurelake.seqlayout import _int_times
from featurelake.seqstore import READERS, FixedCodec, KeyCodec, backend_from_dict

DEFAULT_BATCH_KEYS = 512     # keys per multi-get call (RocksDB: 256-1024 beat bigger calls)


# ================================================================== reading
class SequenceStore:
    """One build opened for reading: heads, chunk selection, parallel fetch, assembly."""

    def __init__(self, info: BuildInfo) -> None:
        if info.format != BUILD_FORMAT:
            raise SequenceBuildError(
                f"build {info.build_id} has store format {info.format}; this featurelake reads format {BUILD_FORMAT}: rebuild"
            )
        self.info = info
        self.backend = backend_from_dict(info.store)
        if not Path(info.db_dir).exists():
            raise CorruptFileError(f"sequence store {info.db_dir} of build {info.build_id} is missing", info.db_dir)
        self.reader = READERS.get(info.db_dir, self.backend)
        self.schemas = info.schemas()
        self.codecs = info.codecs()
        self.time = info.time
        self.time_type = self.schemas[0].field(info.time).type
        self.key_type = _parse_type(info.key_type)
        self.codec = KeyCodec.for_type(self.key_type)
        self.chunk_events = int(info.chunk_events)
        self.group_of: dict[str, int] = {info.time: 0}
        for g, cols in enumerate(info.column_groups):
            for col in cols:
                self.group_of[col] = g
        self.columns = list(info.columns) or [info.time] + [c for g in info.column_groups for c in g]
        self.last_stats: dict[str, int] = {}
        self.recorder: list[list[bytes]] | None = None  # set to a list to keep every key fetched (benchmarks)

    # ------------------------------------------------------------- plumbing
    def check_columns(self, columns: Sequence[str] | None) -> list[str]:
        if columns is None:
            return list(self.columns)
        if isinstance(columns, str):
            columns = [columns]
        if not columns:
            raise SchemaMismatchError("columns must name at least one sequence column (None: all)")
        bad = [c for c in columns if c not in self.group_of]
        if bad:
            raise SchemaMismatchError(f"unknown sequence column(s) {bad}; stored: {self.columns}", bad)
        if len(set(columns)) != len(columns):
            raise SchemaMismatchError(f"columns repeat a name: {list(columns)}")
        return list(columns)

    def output_type(self, columns: Sequence[str]) -> pa.DataType:
        return pa.list_(pa.struct([self._field(c) for c in columns]))

    def _field(self, col: str) -> pa.Field:
        return self.schemas[self.group_of[col]].field(col)

    def multi_get(self, keys: list[bytes], threads: int = 1, batch: int = DEFAULT_BATCH_KEYS) -> list[bytes | None]:
        """Raw batched point reads, split into calls of ``batch`` keys over ``threads`` threads."""
        if self.recorder is not None:
            self.recorder.append(keys)
        if threads <= 1 or len(keys) <= batch:
            return self.reader.multi_get(keys)
        parts = [keys[i : i + batch] for i in range(0, len(keys), batch)]
        return list(chain.from_iterable(_pool(threads).map(self.reader.multi_get, parts)))

    def _fetch(self, users: np.ndarray, chunks: np.ndarray, names: dict[int, list[str]], threads: int,
               batch: int, stats: dict) -> dict[int, Any]:
        """Chunks of (user, chunk) pairs for the groups in ``names``, fetched and decoded in parallel.

        Per group: fixed codec -> {column: (values, validity)} with
        ``chunk_events`` slots per pair; IPC codec -> a Table of the pairs'
        events back to back.
        """
        groups = sorted(names)
        keys = self.codec.chunk_keys(users, chunks, groups)
        if self.recorder is not None:
            self.recorder.append(keys)
        ng = len(groups)
        per = max(ng, (batch // ng) * ng)

        def work(lo: int) -> tuple[list[Any], int]:
            vals = self.reader.multi_get(keys[lo : lo + per])
            if any(v is None for v in vals):
                raise CorruptFileError(
                    f"sequence store {self.info.db_dir} lacks a chunk its head lists (build {self.info.build_id})",
                    self.info.db_dir,
                )
            out = []
            for gi, g in enumerate(groups):
                cd = self.codecs[g]
                part = vals[gi::ng]
                out.append(cd.decode_padded(part, names[g]) if isinstance(cd, FixedCodec) else cd.decode(part, None, 0))
            return out, sum(map(len, vals))

        starts = range(0, len(keys), per)
        if threads > 1 and len(keys) > per:
            results = list(_pool(threads).map(work, starts))
        else:
            results = [work(s) for s in starts]
        merged: dict[int, Any] = {}
        for gi, g in enumerate(groups):
            parts = [r[0][gi] for r in results]
            if len(parts) == 1:
                merged[g] = parts[0]
            elif isinstance(self.codecs[g], FixedCodec):
                merged[g] = {
                    n: (np.concatenate([p[n][0] for p in parts]),
                        None if parts[0][n][1] is None else np.concatenate([p[n][1] for p in parts]))
                    for n in names[g]
                }
            else:
                merged[g] = pa.concat_tables(parts)
        stats["chunk_bytes"] += sum(r[1] for r in results)
        stats["chunk_values"] += len(keys)
        return merged

    # --------------------------------------------------------------- lookup
    def lookup(self, keys: pa.Array, before: Any, columns: Sequence[str] | None, max_len: int | None, window: Any,
               threads: int = DEFAULT_THREADS, batch_keys: int = DEFAULT_BATCH_KEYS) -> pa.ListArray:
        """See :meth:`SequenceTable.lookup`; ``keys`` must already have the key's Arrow type family."""
        columns = self.check_columns(columns)
        if max_len is not None and (isinstance(max_len, bool) or int(max_len) < 0):
            raise FeatureLakeError(f"max_len must be a non-negative int or None, not {max_len!r}")
        n = len(keys)
        b, b_valid = _before_ints(before, n, self.time_type)
        w = _window_int(window, self.time_type)
        if w is not None and b is None:
            raise FeatureLakeError("a window counts back from `before`: give before= too")
        stats = {"rows": n, "users": 0, "head_bytes": 0, "chunk_bytes": 0, "chunk_values": 0, "events": 0}
        valid = np.asarray(keys.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        if b_valid is not None:
            valid &= b_valid
        rows = np.flatnonzero(valid)
        lo = np.zeros(n, np.int64)
        hi = np.zeros(n, np.int64)
        delta = np.zeros(n, np.int64)
        fetched: dict[int, Any] = {}
        if len(rows):
            lo[rows], hi[rows], delta[rows], fetched = self._select(keys, rows, b, w, max_len, columns, threads,
                                                                    batch_keys, stats)
        lengths = hi - lo
        total = int(lengths.sum())
        if total >= 1 << 31:
            raise FeatureLakeError("a lookup returned more than 2**31 events: use smaller batches or max_len")
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        idx = np.repeat(lo - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
        padded = None
        arrays = []
        fields = [self._field(c) for c in columns]
        for col, f in zip(columns, fields):
            g = self.group_of[col]
            if not total:
                arrays.append(pa.nulls(0, f.type))
            elif isinstance(self.codecs[g], FixedCodec):
                if padded is None:
                    padded = idx + np.repeat(delta, lengths)
                vals, ok = fetched[g][col]
                arrays.append(self.codecs[g].to_arrow(col, vals[padded], None if ok is None else ok[padded]))
            else:
                arrays.append(fetched[g].column(col).take(pa.array(idx)).combine_chunks())
        struct = pa.StructArray.from_arrays(arrays, fields=fields)
        stats["events"] = total
        self.last_stats = stats
        return pa.ListArray.from_arrays(pa.array(offsets), struct, type=self.output_type(columns))

    def _select(self, keys, rows, b, w, max_len, columns, threads, batch_keys, stats):
        """Per valid row: [lo, hi) into the pairs' events back to back, the offset of fixed-codec slots, and the data."""
        c = self.chunk_events
        kv = self.codec.values(keys.take(pa.array(rows)))
        users, inv = np.unique(kv, return_inverse=True)
        inv = inv.reshape(-1)
        stats["users"] = len(users)
        heads = self.multi_get(self.codec.head_keys(users), threads, batch_keys)
        lens = np.fromiter((len(h) // 8 if h else 0 for h in heads), np.int64, len(heads))
        stats["head_bytes"] = int(lens.sum()) * 8
        buf = np.frombuffer(b"".join(h for h in heads if h), "<i8")
        hstart = np.zeros(len(users) + 1, np.int64)
        np.cumsum(lens, out=hstart[1:])
        present = lens > 0
        n_chunks = np.where(present, lens - 2, 0)
        n_events = np.zeros(len(users), np.int64)
        n_events[present] = buf[hstart[:-1][present]]
        ft_start = np.zeros(len(users) + 1, np.int64)
        np.cumsum(n_chunks, out=ft_start[1:])
        if len(buf):
            header = np.zeros(len(buf), bool)
            header[hstart[:-1][present]] = True
            header[hstart[:-1][present] + 1] = True
            ft_pool = buf[~header]
        else:
            ft_pool = np.empty(0, np.int64)

        # which chunks each row needs: up to the last chunk starting before `before`,
        # back far enough for max_len events, not before the window
        br = b[rows] if b is not None else None
        if br is None:
            c_hi = n_chunks[inv] - 1
        else:
            c_hi = _seg_search(ft_pool, ft_start, inv, br) - ft_start[inv] - 1
        c_lo = np.zeros(len(rows), np.int64)
        if max_len is not None:
            c_lo = np.maximum(0, (c_hi * c + 1 - int(max_len)) // c)
        if w is not None:
            c_lo = np.maximum(c_lo, _seg_search(ft_pool, ft_start, inv, br - w) - ft_start[inv] - 1)
        m = np.maximum(c_hi - c_lo + 1, 0)
        if max_len == 0:
            m[:] = 0
        need = np.flatnonzero(m)
        lo = np.zeros(len(rows), np.int64)
        hi = np.zeros(len(rows), np.int64)
        delta = np.zeros(len(rows), np.int64)
        if not len(need):
            return lo, hi, delta, {}

        # the unique (user, chunk) pairs of the batch, in (user, chunk) order
        mn = m[need]
        rep = np.repeat(need, mn)
        step = np.arange(len(rep)) - np.repeat(np.cumsum(mn) - mn, mn)
        codes = np.unique(inv[rep].astype(np.int64) * (1 << 32) + c_lo[rep] + step)
        pair_user = codes >> 32
        pair_chunk = codes & 0xFFFFFFFF
        counts = np.minimum(c, n_events[pair_user] - pair_chunk * c)
        pool_off = np.zeros(len(codes) + 1, np.int64)
        np.cumsum(counts, out=pool_off[1:])

        need_time = br is not None
        names: dict[int, list[str]] = {}
        for col in columns:
            names.setdefault(self.group_of[col], []).append(col)
        if need_time and self.time not in names.setdefault(0, []):
            names[0].append(self.time)
        fetched = self._fetch(users[pair_user], pair_chunk, names, threads, batch_keys, stats)

        p_lo = np.searchsorted(codes, inv[need].astype(np.int64) * (1 << 32) + c_lo[need])
        s = pool_off[p_lo]
        e = pool_off[p_lo + mn]
        h = e
        if need_time:
            if isinstance(self.codecs[0], FixedCodec):
                slots = fetched[0][self.time][0].reshape(-1, c)
                tp = slots[np.arange(c)[None, :] < counts[:, None]]
            else:
                tp = _int_times(fetched[0].column(self.time))
            run_start = pool_off[np.searchsorted(pair_user, np.arange(len(users) + 1))]
            h = np.clip(_seg_search(tp, run_start, inv[need], br[need]), s, e)
        low = s.copy()
        if max_len is not None:
            low = np.maximum(low, h - int(max_len))
        if w is not None:
            low = np.maximum(low, np.clip(_seg_search(tp, run_start, inv[need], br[need] - w), s, e))
        lo[need] = np.minimum(low, h)
        hi[need] = h
        # fixed-codec slots: a row's pairs are whole chunks except maybe the last, so one offset maps them
        delta[need] = p_lo * c - pool_off[p_lo]
        return lo, hi, delta, fetched


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


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    with _POOLS_LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            pool = _POOLS[threads] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="featurelake-seq")
        return pool


# ---------------------------------------------------------------- time values
_UNIT_NS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


def _parse_type(text: str) -> pa.DataType:
    simple = {"int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(), "uint8": pa.uint8(),
              "uint16": pa.uint16(), "uint32": pa.uint32(), "uint64": pa.uint64(), "string": pa.string(),
              "large_string": pa.large_string()}
    if text in simple:
        return simple[text]
    raise FeatureLakeError(f"unsupported sequence key type {text}")


def _as_array(values: Any, t: pa.DataType) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(np.asarray(values) if isinstance(values, np.ndarray) else list(values))
    if pa.types.is_integer(t) and pa.types.is_integer(values.type):
        return values.cast(pa.int64())
    if pa.types.is_null(values.type):
        return pa.nulls(len(values), pa.int64() if pa.types.is_integer(t) else pa.string())
    try:
        return values.cast(pa.int64() if pa.types.is_integer(t) else pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SchemaMismatchError(f"keys of type {values.type} do not fit the sequence key type {t}: {e}") from e


def _times_to_int(arr: pa.Array, target: pa.DataType) -> tuple[np.ndarray, np.ndarray]:
    """Times as int64 in the target's unit, rounding up (no event at or after the time slips in)."""
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_timestamp(target):
        if pa.types.is_date(arr.type):
            arr = arr.cast(pa.timestamp("s"))
        if pa.types.is_integer(arr.type):  # raw values in the sequence time's unit
            arr = arr.cast(pa.int64()).cast(target)
        if not pa.types.is_timestamp(arr.type):
            raise SchemaMismatchError(f"times of type {arr.type} cannot bound a {target} sequence time")
        raw = arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        src, dst = _UNIT_NS[arr.type.unit], _UNIT_NS[target.unit]
        if src > dst:
            raw = raw * (src // dst)
        elif src < dst:
            f = dst // src
            raw = -((-raw) // f)  # ceil: t < before  <=>  t < ceil(before) for whole target units
        return raw.astype(np.int64), valid
    if not pa.types.is_integer(arr.type):
        raise SchemaMismatchError(f"times of type {arr.type} cannot bound an integer sequence time")
    return arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64), valid


def _before_ints(before: Any, n: int, target: pa.DataType) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``before`` (None, one time, or one per key) as int64 in the sequence time's unit, plus validity."""
    if before is None:
        return None, None
    if isinstance(before, pa.ChunkedArray):
        before = before.combine_chunks()
    if isinstance(before, pa.Array):
        arr = before
    elif isinstance(before, np.ndarray) and before.ndim == 1:
        arr = pa.array(before)
    elif isinstance(before, (list, tuple)):
        arr = pa.array([_dt.datetime.fromisoformat(v) if isinstance(v, str) else v for v in before])
    else:
        value = before.as_py() if isinstance(before, pa.Scalar) else before
        if isinstance(value, str):
            value = _dt.datetime.fromisoformat(value)
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            arr = pa.array([int(value)], type=target if pa.types.is_timestamp(target) else pa.int64())
        else:
            arr = pa.array([value])
        ints, valid = _times_to_int(arr, target)
        return np.full(n, ints[0], np.int64), np.full(n, bool(valid[0]))
    if len(arr) != n:
        raise FeatureLakeError(f"before has {len(arr)} values for {n} keys")
    return _times_to_int(arr, target)


def _window_int(window: Any, target: pa.DataType) -> int | None:
    if window is None:
        return None
    if isinstance(window, _dt.timedelta):
        if not pa.types.is_timestamp(target):
            raise FeatureLakeError("a timedelta window needs a timestamp sequence time; give an int for integer times")
        us = window // _dt.timedelta(microseconds=1)
        w = us * 1000 // _UNIT_NS[target.unit]
    elif isinstance(window, np.timedelta64):
        return _window_int(window.astype("timedelta64[us]").item(), target)
    else:
        w = int(window)
    if w < 0:
        raise FeatureLakeError(f"window must not be negative, got {window!r}")
    return int(w)
