"""Serving a sequence store: open a build, look up users' events before a time.

Why a module of its own: the read path is the hot one and has its own
concerns. :class:`SequenceStore` opens one build (through its record,
:class:`featurelake.sequences.build.BuildInfo`) and answers a batch of (key, before)
lookups: it reads the heads of the batch's unique users (and, for users
with two-level heads, only the head pages the rows' ``before`` and window
bounds fall in, in one more round: :class:`featurelake.sequences.heads.Heads`), picks only the
chunks that can hold the last ``max_len`` events before each row's time
(inside ``window``), fetches them with batched multi-gets on a shared thread
pool, decodes them per column group and cuts each row's list out of one
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
from featurelake.sequences.gather import lookup_pool, scratch_array
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
        step = _part_size(len(keys), batch, threads)
        parts = [keys[i : i + step] for i in range(0, len(keys), step)]
        if threads <= 1:
            return list(chain.from_iterable(map(self.reader.multi_get, parts)))
        return list(chain.from_iterable(lookup_pool(threads).map(self.reader.multi_get, parts)))

    def _fetch(self, users: np.ndarray, chunks: np.ndarray, names: dict[int, list[str]], threads: int,
               batch: int, stats: dict, partial: dict[int, tuple[list[str], np.ndarray]] | None = None,
               scratch: bool = False, narrow: bool = False, compiled: bool = False,
               cuts: dict[str, Any] | None = None, flags_set: dict[tuple[int, str], int] | None = None
               ) -> dict[int, Any]:
        """Chunks of (user, chunk) pairs for the groups in ``names``, fetched and decoded in parallel.

        Per group: fixed codec -> {column: (values, validity)} with
        ``chunk_events`` slots per pair, decoded by each worker straight into
        its slots of one preallocated array (no per-part arrays to merge); IPC
        codec -> a Table of the pairs' events back to back. ``partial`` maps a
        fixed-codec group to (columns, pair mask): those columns are decoded
        only for the pairs the mask selects (the time column, needed only
        where a row's list is cut). ``scratch``: decode into this thread's
        reusable buffers (:func:`scratch_array`), for callers that copy out of
        them before their next lookup. ``narrow``: integer columns come back
        in the bytes their values use (:meth:`FixedCodec.planes_used`), for
        callers that widen them (:meth:`FixedCodec.widen`) when they copy or
        wrap them. A part is decoded as soon as its multi-get returns, at the
        widths earlier lookups of this store needed; a part needing more
        widens the batch's pool of that column (the slots decoded so far are
        copied over) and the later parts decode at the new width. No part's
        values outlive its decoding: their memory is reused, still in cache.
        ``compiled`` (used when every group is fixed-codec): each part is
        decoded by the compiled kernels (:mod:`featurelake.sequences.kernels`),
        from the fetched bytes objects themselves (no grid joined), in one
        call a group, its cuts counted in the same call
        (:class:`~featurelake.sequences.kernels.PartDecoder`),
        without the GIL, in the pool thread that fetched it, so decoding
        overlaps the other parts' multi-gets; parts whose values need more
        bytes than guessed are decoded again, wider, once all are in.
        ``cuts`` (compiled only): {"pairs", "bounds", "counts"}: per query,
        how many of pair ``pairs[i]``'s events (``counts``: each pair's) have
        a time below ``bounds[i]``, counted by the thread that decoded the
        pair's times, while they are in its cache, into ``cuts["below"]``
        (left unset where the time pool is narrowed: the caller counts); a
        time column fetched only for them is searched where it lies, its
        pool left unwritten. ``flags_set`` (compiled only): filled with
        {(group, column): validity flags set} when every part was decoded in
        place (padding slots are never set: equal to the pairs' events means
        no nulls).
        """
        groups = sorted(names)
        keys = self.codec.chunk_keys(users, chunks, groups)
        if self.recorder is not None:
            self.recorder.append(keys)
        ng = len(groups)
        npairs = len(users)
        per_pairs = _part_size(npairs, max(1, batch // ng), threads)
        partial = partial or {}
        fixed = [g for g in groups if isinstance(self.codecs[g], FixedCodec)]
        compiled = compiled and len(fixed) == ng
        empty = scratch_array if scratch else None

        def guessed(g: int) -> dict[str, np.dtype]:  # the widths the last lookup of this build needed
            cd = self.codecs[g]
            return {col: cd.narrow_dtype(col, self._planes.get((g, col), 8)) for col in names[g]} if narrow else {}

        out: dict[int, Any] = {g: self.codecs[g].alloc(names[g] + partial.get(g, ([], None))[0], npairs, empty,
                                                       guessed(g)) for g in fixed}

        def decode(g: int, grid: np.ndarray, p0: int) -> int:
            cd = self.codecs[g]
            decoded = cd.decode_into(grid, names[g], out[g], p0)
            if g in partial:
                cols, mask = partial[g]
                rows = np.flatnonzero(mask[p0 : p0 + len(grid)])
                if len(rows):
                    decoded += cd.decode_into(grid, cols, out[g], p0, rows)
            return decoded

        def get(p0: int) -> list[bytes]:
            vals = self.reader.multi_get(keys[p0 * ng : min(npairs, p0 + per_pairs) * ng])
            if None in vals:  # one C-level scan (no bytes value equals None)
                raise CorruptFileError(
                    f"sequence store {self.info.db_dir} lacks a chunk its head lists (build {self.info.build_id})",
                    self.info.db_dir,
                )
            return vals

        seen: dict[int, dict[str, int]] = {g: {} for g in fixed}  # the most bytes a value needed, per column

        def widen(g: int, col: str, planes: int, upto: int) -> None:
            """Column ``col``'s pool at the dtype ``planes`` bytes need, its ``upto`` slots decoded so far kept."""
            vals, valid = out[g][col]
            dt = self.codecs[g].narrow_dtype(col, planes)
            wider = empty(("pool", col, dt.str), len(vals), dt) if empty else np.empty(len(vals), dt)
            wider[:upto] = vals[:upto]
            out[g][col] = (wider, valid)

        def use(p0: int, vals: list[bytes]) -> tuple[list[Any], int, int]:
            tables, decoded, nbytes = [], 0, 0
            for gi, g in enumerate(groups):
                cd = self.codecs[g]
                part = vals[gi::ng] if ng > 1 else vals
                if isinstance(cd, FixedCodec):
                    grid = cd.grid(part)
                    nbytes += grid.nbytes
                    for col in names[g] if narrow else ():
                        k = cd.planes_used(grid, col)
                        seen[g][col] = max(seen[g].get(col, 1), k)
                        if k > out[g][col][0].itemsize:  # wider than guessed: parts so far are in order below p0
                            widen(g, col, k, p0 * cd.c)
                    decoded += decode(g, grid, p0)  # the grid is dropped now: its memory is reused, still cached
                else:
                    table = cd.decode(part, None, 0)
                    decoded += table.nbytes
                    nbytes += sum(map(len, part))
                    tables.append(table)
            return tables, nbytes, decoded

        redo: list[tuple[int, str, int, Any, int]] = []  # (group, column, bytes needed, grid or InPlace, first pair)

        def fetch_compiled(p0: int) -> tuple[list[Any], int, int, list[tuple[int, str, int]]]:
            """One part fetched and decoded by the compiled kernels: one call a group, without the GIL
            (:class:`~featurelake.sequences.kernels.PartDecoder`), in place or from a joined grid.

            A narrowed column whose values here need more bytes is noted, with
            the part's grid, to decode again once every part is in (widening a
            pool other threads are writing into would race).
            """
            vals = get(p0)
            nbytes = decoded = 0
            widths = []
            flags: list[dict | None] = []
            for gi, g in enumerate(groups):
                cd = self.codecs[g]
                part = vals[gi::ng] if ng > 1 else vals
                got = decoders[g].decode(part, p0)  # read where they lie: no copy into a grid
                if got is None:
                    flags.append(None)  # not bytes of the codec's size: joined (which checks the sizes), decoded per column
                    grid = cd.grid(part)
                    d, needs = compiled_decode(cd, grid, names[g], out[g], p0)
                    if g in partial:
                        rows = np.flatnonzero(partial[g][1][p0 : p0 + len(grid)])
                        if len(rows):
                            d += compiled_decode(cd, grid, partial[g][0], out[g], p0, rows)[0]
                    if g == 0 and below is not None:
                        count_cuts(p0)
                else:
                    d, needs, grid, nset = got
                    flags.append({(g, col): k for col, k in nset.items()})
                nbytes += len(part) * cd.size
                decoded += d
                for col, k in needs.items():
                    widths.append((g, col, k))
                    if k > out[g][col][0].itemsize:
                        redo.append((g, col, k, grid, p0))  # (list.append: atomic)
            return [], nbytes, decoded, widths, flags

        def count_cuts(p0: int) -> None:
            """The cuts of queries on this part's pairs (their times just decoded), for parts joined into a grid."""
            a, b = np.searchsorted(q_sorted, (p0, p0 + per_pairs))
            if b > a:
                q = q_order[a:b]
                below[q] = kernels().count_below(q_times, cuts["counts"], q_pairs[q], cuts["bounds"][q])

        # Without compiled kernels, pool threads only multi-get (RocksDB runs without the GIL); this thread
        # decodes each part as it arrives, in order. Decoding in the pool threads too made them queue for the
        # GIL between numpy calls, and the multi-gets with them (4 threads on 2 cores ran slower than one:
        # measured). The compiled kernels hold no GIL: the pool threads decode their own parts.
        starts = range(0, npairs, per_pairs)
        below = None
        if compiled and cuts is not None and self.time in out.get(0, {}) and out[0][self.time][0].dtype.itemsize == 8:
            q_pairs = cuts["pairs"]
            q_order = np.argsort(q_pairs, kind="stable")
            q_sorted = q_pairs[q_order]
            q_times = out[0][self.time][0].view(np.int64).reshape(-1, self.chunk_events)
            below = cuts["below"] = np.empty(len(q_pairs), np.int64)
        if compiled:
            from featurelake.sequences.kernels import PartDecoder
            from featurelake.sequences.kernels import decode_into as compiled_decode

            queries = None
            if below is not None:
                queries = (q_times, cuts["counts"], q_pairs, q_order, q_sorted, cuts["bounds"], below)
            decoders = {g: PartDecoder(self.codecs[g], names[g], partial.get(g), out[g], queries if g == 0 else None,
                                       self.time if g == 0 and self.time not in names[g] else None) for g in groups}
            if threads > 1 and npairs > per_pairs:
                results = list(lookup_pool(threads).map(fetch_compiled, starts))
            else:
                results = [fetch_compiled(p0) for p0 in starts]
            if narrow:
                for g, col, k in chain.from_iterable(r[3] for r in results):
                    seen[g][col] = max(seen[g].get(col, 1), k)
            wider: dict[tuple[int, str], int] = {}  # pools too narrow for some parts: widened, those parts decoded again
            for g, col, k, _, _ in redo:
                wider[(g, col)] = max(k, wider.get((g, col), 0))
            for (g, col), k in wider.items():
                widen(g, col, k, len(out[g][col][0]))
            for g, col, _, grid, p0 in redo:
                compiled_decode(self.codecs[g], grid, [col], out[g], p0)
            parts_flags = [f for r in results for f in r[4]]
            if flags_set is not None and None not in parts_flags:
                for f in parts_flags:
                    for key, k in f.items():
                        flags_set[key] = flags_set.get(key, 0) + k
        elif threads > 1 and npairs > per_pairs:
            pool = lookup_pool(threads)
            futures = [pool.submit(get, p0) for p0 in starts]
            results = [use(p0, fut.result()) for p0, fut in zip(starts, futures)]
        else:
            results = [use(p0, get(p0)) for p0 in starts]
        for g, needs in seen.items():
            for col, k in needs.items():
                self._planes[(g, col)] = k
        ipc = [g for g in groups if not isinstance(self.codecs[g], FixedCodec)]
        for i, g in enumerate(ipc):
            parts = [r[0][i] for r in results]
            out[g] = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
        stats["chunk_bytes"] += sum(r[1] for r in results)
        stats["chunk_values"] += len(keys)
        stats["decoded_bytes"] += sum(r[2] for r in results)
        return out

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
        fetched = self._fetch(users[pair_user], pair_chunk, names, threads, batch_keys, stats, partial, scratch, narrow,
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


def _part_size(n: int, batch: int, threads: int) -> int:
    """Items per multi-get call: at most ``batch``, and a multiple of ``threads`` calls of equal size
    (6 calls on 4 threads take 2 rounds, the second half idle; 8 smaller ones fill both)."""
    if threads <= 1 or n <= batch:
        return max(1, batch)
    rounds = -(-n // (threads * batch))
    return max(1, -(-n // (rounds * threads)))
