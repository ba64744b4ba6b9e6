"""Fetching a lookup's chunks: batched multi-gets on a shared thread pool, each part decoded as it arrives.

Why a module of its own: :class:`featurelake.sequences.lookup.SequenceStore`
decides which (user, chunk) pairs a batch of lookups needs and cuts each row's
list out of them; this module gets those pairs' chunks from the store and
decodes them into per-group pools (fixed codec: one preallocated array per
column, filled by the thread that fetched each part, by compiled kernels
without the GIL where they apply; IPC codec: tables back to back), counting
the rows' cuts while the times are in cache.
"""
from __future__ import annotations

from itertools import chain
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from featurelake.errors import CorruptFileError
from featurelake.sequences.codecs import FixedCodec
from featurelake.sequences.gather import lookup_pool, scratch_array
from featurelake.sequences.kernels import kernels

if TYPE_CHECKING:
    from featurelake.sequences.lookup import SequenceStore


def fetch_chunks(store: "SequenceStore", users: np.ndarray, chunks: np.ndarray, names: dict[int, list[str]], threads: int,
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
    keys = store.codec.chunk_keys(users, chunks, groups)
    if store.recorder is not None:
        store.recorder.append(keys)
    ng = len(groups)
    npairs = len(users)
    per_pairs = part_size(npairs, max(1, batch // ng), threads)
    partial = partial or {}
    fixed = [g for g in groups if isinstance(store.codecs[g], FixedCodec)]
    compiled = compiled and len(fixed) == ng
    empty = scratch_array if scratch else None

    def guessed(g: int) -> dict[str, np.dtype]:  # the widths the last lookup of this build needed
        cd = store.codecs[g]
        return {col: cd.narrow_dtype(col, store._planes.get((g, col), 8)) for col in names[g]} if narrow else {}

    out: dict[int, Any] = {g: store.codecs[g].alloc(names[g] + partial.get(g, ([], None))[0], npairs, empty,
                                                   guessed(g)) for g in fixed}

    def decode(g: int, grid: np.ndarray, p0: int) -> int:
        cd = store.codecs[g]
        decoded = cd.decode_into(grid, names[g], out[g], p0)
        if g in partial:
            cols, mask = partial[g]
            rows = np.flatnonzero(mask[p0 : p0 + len(grid)])
            if len(rows):
                decoded += cd.decode_into(grid, cols, out[g], p0, rows)
        return decoded

    def get(p0: int) -> list[bytes]:
        vals = store.reader.multi_get(keys[p0 * ng : min(npairs, p0 + per_pairs) * ng])
        if None in vals:  # one C-level scan (no bytes value equals None)
            raise CorruptFileError(
                f"sequence store {store.info.db_dir} lacks a chunk its head lists (build {store.info.build_id})",
                store.info.db_dir,
            )
        return vals

    seen: dict[int, dict[str, int]] = {g: {} for g in fixed}  # the most bytes a value needed, per column

    def widen(g: int, col: str, planes: int, upto: int) -> None:
        """Column ``col``'s pool at the dtype ``planes`` bytes need, its ``upto`` slots decoded so far kept."""
        vals, valid = out[g][col]
        dt = store.codecs[g].narrow_dtype(col, planes)
        wider = empty(("pool", col, dt.str), len(vals), dt) if empty else np.empty(len(vals), dt)
        wider[:upto] = vals[:upto]
        out[g][col] = (wider, valid)

    def use(p0: int, vals: list[bytes]) -> tuple[list[Any], int, int]:
        tables, decoded, nbytes = [], 0, 0
        for gi, g in enumerate(groups):
            cd = store.codecs[g]
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
            cd = store.codecs[g]
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
    if compiled and cuts is not None and store.time in out.get(0, {}) and out[0][store.time][0].dtype.itemsize == 8:
        q_pairs = cuts["pairs"]
        # (pair numbers below 2**16 sorted as uint16: NumPy's stable sort is then a radix sort, ~4x faster than its
        # timsort of int64 for a 4,096-row batch; the same order)
        q_order = np.argsort(q_pairs.astype(np.uint16) if npairs <= 1 << 16 else q_pairs, kind="stable")
        q_sorted = q_pairs[q_order]
        q_times = out[0][store.time][0].view(np.int64).reshape(-1, store.chunk_events)
        below = cuts["below"] = np.empty(len(q_pairs), np.int64)
    if compiled:
        from featurelake.sequences.kernels import PartDecoder
        from featurelake.sequences.kernels import decode_into as compiled_decode

        queries = None
        if below is not None:
            queries = (q_times, cuts["counts"], q_pairs, q_order, q_sorted, cuts["bounds"], below)
        decoders = {g: PartDecoder(store.codecs[g], names[g], partial.get(g), out[g], queries if g == 0 else None,
                                   store.time if g == 0 and store.time not in names[g] else None) for g in groups}
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
            compiled_decode(store.codecs[g], grid, [col], out[g], p0)
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
            store._planes[(g, col)] = k
    ipc = [g for g in groups if not isinstance(store.codecs[g], FixedCodec)]
    for i, g in enumerate(ipc):
        parts = [r[0][i] for r in results]
        out[g] = parts[0] if len(parts) == 1 else pa.concat_tables(parts)
    stats["chunk_bytes"] += sum(r[1] for r in results)
    stats["chunk_values"] += len(keys)
    stats["decoded_bytes"] += sum(r[2] for r in results)
    return out


def part_size(n: int, batch: int, threads: int) -> int:
    """Items per multi-get call: at most ``batch``, and a multiple of ``threads`` calls of equal size
    (6 calls on 4 threads take 2 rounds, the second half idle; 8 smaller ones fill both)."""
    if threads <= 1 or n <= batch:
        return max(1, batch)
    rounds = -(-n // (threads * batch))
    return max(1, -(-n // (rounds * threads)))
