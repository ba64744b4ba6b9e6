"""Serving a sequence store: open a build, look up users' events before a time.

Why a module of its own: the read path is the hot one and has its own
concerns. :class:`SequenceStore` opens one build (through its record,
:class:`featurelake.sequences.build.BuildInfo`) and answers a batch of (key, before)
lookups: it reads the heads of the batch's unique users (and, for users
with two-level heads, only the head pages the rows' ``before`` and window
bounds fall in, in one more round: :class:`featurelake.sequences.heads.Heads`), picks only the
chunks that can hold the last ``max_len`` events before each row's time
(inside ``window``), has them fetched and decoded per column group
(:mod:`featurelake.sequences.fetch`) and cuts each row's list out of one
pool with a single ``take`` per column. User keys, ``before`` times and
windows come in the store's forms from :mod:`featurelake.sequences.arguments`.
"""
from __future__ import annotations

from itertools import chain
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from featurelake.errors import CorruptFileError, FeatureLakeError, SchemaMismatchError
from featurelake.sequences.arguments import before_ints, parse_key_type, window_int
from featurelake.sequences.buildinfo import BUILD_FORMAT, DEFAULT_THREADS, READ_FORMATS, BuildInfo, SequenceBuildError
from featurelake.sequences.layout import _int_times
from featurelake.sequences.codecs import FixedCodec
from featurelake.sequences.assemble import assemble
from featurelake.sequences.fetch import fetch_chunks, part_size
from featurelake.sequences.gather import lookup_pool
from featurelake.sequences.heads import Heads
from featurelake.sequences.kernels import kernels
from featurelake.sequences.search import chunk_pairs, count_below
from featurelake.sequences.store import READERS, KeyCodec, backend_from_dict

DEFAULT_BATCH_KEYS = 512     # keys per multi-get call (RocksDB: 256-1024 beat bigger calls)
_PLANES: dict[str, dict[tuple[int, str], int]] = {}  # per store folder: SequenceStore._planes


# ================================================================== reading
class SequenceStore:
    """One build opened for reading: heads, chunk selection, parallel fetch, assembly."""

    def __init__(self, info: BuildInfo, io: Any = None) -> None:
        if info.format not in READ_FORMATS:
            raise SequenceBuildError(
                f"build {info.build_id} has store format {info.format}; this featurelake reads format {BUILD_FORMAT}: rebuild"
            )
        self.info = info
        self.backend = backend_from_dict(info.store)
        if not Path(info.db_dir).exists():
            raise CorruptFileError(f"sequence store {info.db_dir} of build {info.build_id} is missing", info.db_dir)
        self.reader = READERS.get(info.db_dir, self.backend)
        self.io = io  # the table's FileIO: reads the cold segments of a tiered build
        if info.cold_segments:
            from featurelake.sequences.tiering import TieredReader, cache_for

            self.reader = TieredReader(self.reader, info, io, cache_for(Path(info.path).parent / ".cold-cache"))
        self.schemas = info.schemas()
        self.codecs = info.codecs()
        self.time = info.time
        self.time_type = self.schemas[0].field(info.time).type
        self.key_type = parse_key_type(info.key_type)
        self.codec = KeyCodec.for_type(self.key_type)
        self.chunk_events = int(info.chunk_events)
        self.group_of: dict[str, int] = {info.time: 0}
        for g, cols in enumerate(info.column_groups):
            for col in cols:
                self.group_of[col] = g
        self.columns = list(info.columns) or [info.time] + [c for g in info.column_groups for c in g]
        self.last_stats: dict[str, int] = {}
        self._fields: dict[str, pa.Field] = {}
        self._types: dict[tuple, pa.DataType] = {}
        self._dicts: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # assemble.dictionary_bytes
        self.recorder: list[list[bytes]] | None = None  # set to a list to keep every key fetched (benchmarks)
        self.head_cache: Any = None  # a HeadCache (featurelake.sequences.heads): set by views, whose stores are their own
        # (group, column) -> bytes a value needed in the last lookup of this build (kept for the process: a lookup
        # decodes at these widths first, see _fetch)
        self._planes: dict[tuple[int, str], int] = _PLANES.setdefault(info.db_dir, {})

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
        key = tuple(columns)
        t = self._types.get(key)
        if t is None:
            t = self._types[key] = pa.list_(pa.struct([self._field(c) for c in columns]))
        return t

    def _field(self, col: str) -> pa.Field:
        f = self._fields.get(col)
        if f is None:
            f = self._fields[col] = self.schemas[self.group_of[col]].field(col)
        return f

    def multi_get(self, keys: list[bytes], threads: int = 1, batch: int = DEFAULT_BATCH_KEYS) -> list[bytes | None]:
        """Raw batched point reads, split into calls of ``batch`` keys over ``threads`` threads.

        One thread also reads ``batch`` keys a call: RocksDB is no faster with
        larger calls, and tens of MB of values alive at once come back from
        the allocator as fresh pages (thousands of page faults a batch, measured).
        """
        if self.recorder is not None:
            self.recorder.append(keys)
        if len(keys) <= batch:
            return self.reader.multi_get(keys)
        step = part_size(len(keys), batch, threads)
        parts = [keys[i : i + step] for i in range(0, len(keys), step)]
        if threads <= 1:
            return list(chain.from_iterable(map(self.reader.multi_get, parts)))
        return list(chain.from_iterable(lookup_pool(threads).map(self.reader.multi_get, parts)))

    # --------------------------------------------------------------- lookup
    def prepare(self, keys: pa.Array, before: Any, max_len: int | None, window: Any
                ) -> tuple[int, np.ndarray | None, int | None, np.ndarray]:
        """Check a lookup's arguments and turn them into the store's integers: ``(rows, before, window, looked-up rows)``.

        The looked-up rows are those with a key and a time; the others get an empty history.
        """
        if max_len is not None and (isinstance(max_len, bool) or int(max_len) < 0):
            raise FeatureLakeError(f"max_len must be a non-negative int or None, not {max_len!r}")
        n = len(keys)
        b, b_valid = before_ints(before, n, self.time_type)
        w = window_int(window, self.time_type)
        if w is not None and b is None:
            raise FeatureLakeError("a window counts back from `before`: give before= too")
        if not keys.null_count and (b_valid is None or b_valid.all()):
            return n, b, w, np.arange(n)
        valid = np.asarray(keys.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        if b_valid is not None:
            valid &= b_valid
        return n, b, w, np.flatnonzero(valid)

    def lookup(self, keys: pa.Array, before: Any, columns: Sequence[str] | None, max_len: int | None, window: Any,
               threads: int = DEFAULT_THREADS, batch_keys: int = DEFAULT_BATCH_KEYS) -> pa.ListArray:
        """See :meth:`SequenceTable.lookup`; ``keys`` must already have the key's Arrow type family.

        Sets ``last_stats``; callers that look up from several threads at once use :meth:`lookup_stats`.
        """
        out, self.last_stats = self.lookup_stats(keys, before, columns, max_len, window, threads, batch_keys)
        return out

    def lookup_stats(self, keys: pa.Array, before: Any, columns: Sequence[str] | None, max_len: int | None,
                     window: Any, threads: int = DEFAULT_THREADS, batch_keys: int = DEFAULT_BATCH_KEYS
                     ) -> tuple[pa.ListArray, dict[str, int]]:
        """:meth:`lookup` and its statistics (rows, users, bytes fetched and decoded, events), thread-safe."""
        columns = self.check_columns(columns)
        n, b, w, rows = self.prepare(keys, before, max_len, window)
        stats = {"rows": n, "users": 0, "head_bytes": 0, "chunk_bytes": 0, "chunk_values": 0, "events": 0,
                 "decoded_bytes": 0}
        lo = np.zeros(n, np.int64)
        hi = np.zeros(n, np.int64)
        delta = np.zeros(n, np.int64)
        fetched: dict[int, Any] = {}
        pool_events = 0
        if len(rows):
            # the fetched pools are copied out below: they decode narrow, into reusable buffers
            lo[rows], hi[rows], delta[rows], fetched, counts = self._select(keys, rows, b, w, max_len, columns, threads,
                                                                            batch_keys, stats, scratch=True, narrow=True,
                                                                            compiled=True)
            pool_events = int(counts.sum())
        lengths = hi - lo
        total = int(lengths.sum())
        if total >= 1 << 31:
            raise FeatureLakeError("a lookup returned more than 2**31 events: use smaller batches or max_len")
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        fields = [self._field(c) for c in columns]
        if not total:
            arrays = [pa.nulls(0, f.type) for f in fields]
        else:
            arrays = assemble(self, columns, fetched, pool_events, lo, delta, lengths, offsets, threads)
        struct = pa.StructArray.from_arrays(arrays, fields=fields)
        stats["events"] = total
        return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), struct, type=self.output_type(columns)), stats

    def _select(self, keys, rows, b, w, max_len, columns, threads, batch_keys, stats, scratch: bool = False,
                narrow: bool = False, compiled: bool = False):
        """Per valid row: [lo, hi) into the pairs' events back to back, the offset of fixed-codec slots, the data,
        and each fetched pair's event count (the pool's layout)."""
        c = self.chunk_events
        kv = self.codec.values(keys if len(rows) == len(keys) else keys.take(pa.array(rows)))
        users, inv = np.unique(kv, return_inverse=True)
        inv = inv.reshape(-1)
        stats["users"] = len(users)
        heads = Heads(self, users, threads, batch_keys, stats)
        n_events = heads.n_events

        # which chunks each row needs: up to the last chunk starting before `before`,
        # back far enough for max_len events, not before the window
        br = b[rows] if b is not None else None
        c_win = None
        if br is None:
            c_hi = heads.n_chunks[inv] - 1
        elif w is None:
            c_hi = heads.chunk_before(inv, br, compiled)
        else:  # both bounds in one search: one round trip for the head pages they need
            both = heads.chunk_before(np.concatenate([inv, inv]), np.concatenate([br, br - w]), compiled)
            c_hi, c_win = both[: len(inv)], both[len(inv) :]
        c_lo = np.zeros(len(rows), np.int64)
        if max_len is not None:
            c_lo = np.maximum(0, (c_hi * c + 1 - int(max_len)) // c)
        if c_win is not None:
            c_lo = np.maximum(c_lo, c_win)
        m = np.maximum(c_hi - c_lo + 1, 0)
        if max_len == 0:
            m[:] = 0
        need = np.flatnonzero(m)
        lo = np.zeros(len(rows), np.int64)
        hi = np.zeros(len(rows), np.int64)
        delta = np.zeros(len(rows), np.int64)
        if not len(need):
            return lo, hi, delta, {}, np.zeros(0, np.int64)

        # the unique (user, chunk) pairs of the batch, in (user, chunk) order
        mn = m[need]
        pair_user, pair_chunk, p_lo = chunk_pairs(inv[need], c_lo[need], mn, heads.n_chunks)
        counts = np.minimum(c, n_events[pair_user] - pair_chunk * c)
        pool_off = np.zeros(len(pair_user) + 1, np.int64)
        np.cumsum(counts, out=pool_off[1:])
        p_hi = p_lo + mn - 1

        # Times are needed only where a row's list is cut: its last pair (the cut at `before`:
        # every earlier chunk ends before that chunk's first time) and, when the window bounds
        # the row, its first pair.
        need_time = br is not None
        names: dict[int, list[str]] = {}
        for col in columns:
            names.setdefault(self.group_of[col], []).append(col)
        partial = None
        win_rows = None
        if need_time:
            cut_pairs = np.zeros(len(pair_user), bool)
            cut_pairs[p_hi] = True
            if c_win is not None:
                win_rows = np.flatnonzero(c_win[need] >= c_lo[need])
                cut_pairs[p_lo[win_rows]] = True
            if self.time not in names.setdefault(0, []):
                if isinstance(self.codecs[0], FixedCodec):
                    partial = {0: ([self.time], cut_pairs)}
                else:
                    names[0].append(self.time)
        cuts = None
        if need_time and compiled:  # each row's cut(s), counted by the pool thread that decodes the pair's times
            bn = br[need]
            has_win = win_rows is not None and len(win_rows)
            cuts = {"pairs": np.concatenate([p_hi, p_lo[win_rows]]) if has_win else p_hi,
                    "bounds": np.concatenate([bn, bn[win_rows] - w]) if has_win else bn, "counts": counts}
        flags_set: dict[tuple[int, str], int] = {}
        fetched = fetch_chunks(self, users[pair_user], pair_chunk, names, threads, batch_keys, stats, partial, scratch, narrow,
                              compiled, cuts, flags_set)
        for (g, col), k in flags_set.items():  # every event valid: no validity to copy out (or to count again)
            if k == pool_off[-1]:
                fetched[g][col] = (fetched[g][col][0], None)

        s = pool_off[p_lo]
        e = pool_off[p_hi + 1]
        h = e
        counted = cuts.get("below") if cuts is not None else None
        if need_time:
            bn = br[need]
            if counted is not None:
                h = pool_off[p_hi] + counted[: len(p_hi)]
            else:
                times = self._pair_times(fetched[0], counts, pool_off)
                below = kernels().count_below if compiled else count_below  # (compiled: 4096 rows in ~0.1 ms, not 2)
                h = pool_off[p_hi] + below(times, counts, p_hi, bn)
        low = s.copy()
        if max_len is not None:
            low = np.maximum(low, h - int(max_len))
        if win_rows is not None and len(win_rows):
            q = p_lo[win_rows]
            got = counted[len(p_hi) :] if counted is not None else below(times, counts, q, bn[win_rows] - w)
            low[win_rows] = np.maximum(low[win_rows], pool_off[q] + got)
        lo[need] = np.minimum(low, h)
        hi[need] = h
        # fixed-codec slots: a row's pairs are whole chunks except maybe the last, so one offset maps them
        delta[need] = p_lo * c - pool_off[p_lo]
        return lo, hi, delta, fetched, counts

    def _pair_times(self, group0: Any, counts: np.ndarray, pool_off: np.ndarray) -> np.ndarray:
        """The time column as a (pairs, chunk_events) int64 grid (slots past a pair's count are junk)."""
        c = self.chunk_events
        if isinstance(self.codecs[0], FixedCodec):
            return group0[self.time][0].astype(np.int64, copy=False).reshape(-1, c)
        tp = _int_times(group0.column(self.time))
        grid = np.full(len(counts) * c, np.iinfo(np.int64).max, np.int64)
        slots = np.repeat(np.arange(len(counts), dtype=np.int64) * c - pool_off[:-1], counts) + np.arange(len(tp))
        grid[slots] = tp
        return grid.reshape(-1, c)
