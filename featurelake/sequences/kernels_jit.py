"""The numba kernels of :mod:`featurelake.sequences.kernels` (imported on first use: numba's import costs ~0.5 s).

All are ``nogil`` and ``cache=True``; each loop is written so that LLVM
vectorizes its inner loop (contiguous rows, no running index inside it) --
written per value with a running output index, the plane decode and the
row-range copy measured 2-4x slower than NumPy's whole-array copies.
"""
from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from featurelake.sequences.gridkernels import bisect_left

jit = numba.njit(cache=True, nogil=True)


@intrinsic
def _store_u64(typingctx, arr, pos, val):  # pragma: no cover - compiled
    """``arr``'s 8 bytes at byte ``pos`` set to ``val`` (little-endian), an unaligned store: one instruction."""
    sig = types.void(arr, types.int64, types.uint64)

    def codegen(context, builder, signature, args):
        a, p, v = args
        ary = context.make_array(signature.args[0])(context, builder, a)
        ptr = builder.bitcast(builder.gep(ary.data, [p]), ir.IntType(64).as_pointer())
        builder.store(v, ptr).align = 1
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _u8_ptr(typingctx, addr):  # pragma: no cover - compiled
    """The address ``addr`` (an int64) as a pointer to bytes, for :func:`numba.carray`."""
    sig = types.CPointer(types.uint8)(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.IntType(8).as_pointer())

    return sig, codegen


@intrinsic
def _load_i64(typingctx, addr):  # pragma: no cover - compiled
    """The int64 at address ``addr`` (aligned)."""
    sig = types.int64(types.int64)

    def codegen(context, builder, signature, args):
        return builder.load(builder.inttoptr(args[0], ir.IntType(64).as_pointer()))

    return sig, codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _plane_row(row, off, w, k, c, delta, dst, acc):  # pragma: no cover - compiled
    """One value's column (``row``: its bytes) into ``dst``: :func:`planes`' loop body; returns (OR of values, OR of
    the bytes of the planes not decoded)."""
    high = np.uint8(0)
    seen = np.uint64(0)
    plane = row[off : off + c]  # (slices indexed by range loops: no negative-index checks, vectorized)
    for j in range(c):
        acc[j] = plane[j]
    for b in range(1, k):
        plane = row[off + b * c : off + (b + 1) * c]
        sh = np.uint64(8 * b)
        for j in range(c):
            acc[j] |= np.uint64(plane[j]) << sh
    rest = row[off + k * c : off + w * c]
    for j in range(rest.shape[0]):
        high |= rest[j]
    if delta:
        run = np.uint64(0)
        for j in range(c):
            run += acc[j]
            acc[j] = run
    for j in range(c):
        seen |= acc[j]
        dst[j] = acc[j]
    return seen, high


@jit
def planes(grid, rows, off, w, k, c, delta, out, first):  # pragma: no cover - compiled
    """Values of one column from byte planes: row ``rows[i]`` of ``grid`` into row ``first + rows[i]`` of ``out``.

    ``grid``: (values, size) uint8, the column's ``w`` planes of ``c`` bytes
    at ``off``; only the low ``k`` planes are decoded (``out``: (pairs, c)
    unsigned ints of ``k`` bytes, a view of any fixed-width dtype);
    ``delta``: running sums (two's complement: the same bits as signed sums;
    needs ``k == w``). Returns the OR of the decoded values and the OR of the
    bytes of the planes not decoded (non-zero: some value does not fit ``k`` bytes).
    """
    seen = np.uint64(0)
    high = np.uint8(0)
    acc = np.empty(c, np.uint64)
    for i in range(rows.shape[0]):
        r = rows[i]
        s, h = _plane_row(grid[r], off, w, k, c, delta, out[first + r], acc)
        seen |= s
        high |= h
    return seen, high


@jit
def planes_at(addrs, size, rows, off, w, k, c, delta, out, first):  # pragma: no cover - compiled
    """:func:`planes` of values read where they lie: value ``r``'s ``size`` bytes at address ``addrs[r]``.

    Why: joining a multi-get's values into one grid first is a copy of
    every fetched byte (with the GIL held); the caller
    (:class:`featurelake.sequences.kernels.InPlace`) keeps the values alive
    and has checked that each is a bytes object of ``size`` bytes.
    """
    seen = np.uint64(0)
    high = np.uint8(0)
    acc = np.empty(c, np.uint64)
    for i in range(rows.shape[0]):
        r = rows[i]
        s, h = _plane_row(numba.carray(_u8_ptr(addrs[r]), (size,)), off, w, k, c, delta, out[first + r], acc)
        seen |= s
        high |= h
    return seen, high


@jit
def flags(grid, rows, off, c, out, first):  # pragma: no cover - compiled
    """Validity bytes of one column: ``c`` bytes at ``off`` of row ``rows[i]`` into row ``first + rows[i]``."""
    for i in range(rows.shape[0]):
        r = rows[i]
        src = grid[r, off : off + c]
        dst = out[first + r]
        for j in range(c):
            dst[j] = src[j] != 0


@jit
def flags_at(addrs, size, rows, off, c, out, first):  # pragma: no cover - compiled
    """:func:`flags` of values read where they lie (see :func:`planes_at`)."""
    for i in range(rows.shape[0]):
        r = rows[i]
        src = numba.carray(_u8_ptr(addrs[r]), (size,))[off : off + c]
        dst = out[first + r]
        for j in range(c):
            dst[j] = src[j] != 0


@jit
def gather(src, starts, lengths, out):  # pragma: no cover - compiled
    """Ranges ``src[starts[r] : starts[r] + lengths[r]]`` back to back into ``out`` (converted to its dtype)."""
    k = 0
    for r in range(starts.shape[0]):
        n = lengths[r]
        a = src[starts[r] : starts[r] + n]
        o = out[k : k + n]
        for j in range(n):
            o[j] = a[j]
        k += n


@jit
def string_bytes(codes, valid, starts, lengths, lens):  # pragma: no cover - compiled
    """Bytes of the strings of the ranges' codes, -1 if one is not a dictionary code (null slots, ``valid``
    False, are empty; an empty ``valid``: no nulls)."""
    total = 0
    size = lens.shape[0]
    check = valid.shape[0] > 0
    for r in range(starts.shape[0]):
        s, n = starts[r], lengths[r]
        cs = codes[s : s + n]
        ok = valid[s : s + n] if check else valid
        for j in range(n):
            if check and not ok[j]:
                continue
            code = cs[j]
            if code >= size:
                return -1  # not a code of the dictionary: the caller raises
            total += lens[code]
    return total


@jit
def strings(codes, valid, starts, lengths, lens, words, base, end, offsets, data):  # pragma: no cover - compiled
    """The ranges' strings: ``offsets[k]`` the start of the ``k``-th (from byte ``base``), bytes into ``data``.

    ``offsets`` has one item per string (the caller writes the end);
    ``words``: (codes, n) uint64, each code's string in little-endian
    8-byte words, zero-padded. Words are stored unaligned, 8 bytes at a
    time, where they end before ``end`` (this piece's last byte: the next
    piece's bytes may be written at the same time); the rest byte by byte.
    Measured on 1M codes of 4 strings: 2.5 ms, against 11.7 ms copying each
    string byte by byte.
    """
    pos = base
    check = valid.shape[0] > 0
    nw = words.shape[1]
    k = 0
    for r in range(starts.shape[0]):
        s, n = starts[r], lengths[r]
        cs = codes[s : s + n]
        ok = valid[s : s + n] if check else valid
        offs = offsets[k : k + n]
        k += n
        for j in range(n):
            offs[j] = pos
            if check and not ok[j]:
                continue
            code = cs[j]
            ln = lens[code]
            for q in range(nw):
                at = pos + 8 * q
                if at >= pos + ln:
                    break
                v = words[code, q]
                if at + 8 <= end:
                    _store_u64(data, at, v)
                else:
                    for t in range(min(8, pos + ln - at)):
                        data[at + t] = np.uint8((v >> np.uint64(8 * t)) & np.uint64(255))
            pos += ln


@jit
def strings8(codes, valid, starts, lengths, lens, words, base, end, offsets, data):  # pragma: no cover - compiled
    """:func:`strings` for dictionaries of strings of at most 8 bytes (``words``: one per code): one store a string.

    A row whose strings all end at least 8 bytes before ``end`` (``8 *
    length`` bytes from the row's first) is copied without a check per
    string, its null test hoisted out of the loop; the piece's last rows go
    through :func:`strings`. Measured on the benchmark's 1M codes of 4
    strings a batch: 0.78 ms, against 1.67 ms checking ``end`` and the
    validity at every string, 4.0 ms for :func:`strings`, 11.7 ms byte by byte.
    """
    pos = base
    check = valid.shape[0] > 0
    w = words[:, 0]
    k = 0
    for r in range(starts.shape[0]):
        s, n = starts[r], lengths[r]
        if pos + 8 * n > end:  # the tail: no store past this piece's bytes
            strings(codes, valid, starts[r:], lengths[r:], lens, words, pos, end, offsets[k:], data)
            return
        cs = codes[s : s + n]
        offs = offsets[k : k + n]
        if check:
            ok = valid[s : s + n]
            for j in range(n):
                offs[j] = pos
                if ok[j]:
                    c = cs[j]
                    _store_u64(data, pos, w[c])
                    pos += lens[c]
        else:
            for j in range(n):
                offs[j] = pos
                c = cs[j]
                _store_u64(data, pos, w[c])
                pos += lens[c]
        k += n


@jit
def strings8_unsized(codes, valid, starts, lengths, lens, words, base, offsets, data):  # pragma: no cover - compiled
    """:func:`strings8` without sizing the bytes first: returns where they end (-1: a code outside the dictionary).

    ``data`` must hold ``base + 8 * sum(lengths)`` bytes (each string takes
    at most 8: every store fits). Why: sizing the bytes (:func:`string_bytes`)
    is a pass over the codes of its own, only needed where pieces are
    written side by side; one piece (one thread) writes them in one pass and
    checks the codes as it goes (0.85 ms for the benchmark's 1M codes, against
    0.36 + 0.78 ms sized first).
    """
    pos = base
    check = valid.shape[0] > 0
    size = lens.shape[0]
    w = words[:, 0]
    k = 0
    for r in range(starts.shape[0]):
        s, n = starts[r], lengths[r]
        cs = codes[s : s + n]
        offs = offsets[k : k + n]
        ok = valid[s : s + n] if check else valid
        for j in range(n):
            offs[j] = pos
            if check and not ok[j]:
                continue
            c = cs[j]
            if c >= size:
                return -1
            _store_u64(data, pos, w[c])
            pos += lens[c]
        k += n
    return pos


@jit
def count_below(times, counts, pairs, bound):  # pragma: no cover - compiled
    """:func:`featurelake.sequences.search.count_below`: per query, a binary search of its pair's sorted times."""
    out = np.empty(pairs.shape[0], np.int64)
    for i in range(pairs.shape[0]):
        out[i] = bisect_left(times[pairs[i]], 0, counts[pairs[i]], bound[i])
    return out


@jit
def run_counts(pool, run_start, q_run, q):  # pragma: no cover - compiled
    """Per query: how many values of its run ``pool[run_start[q_run[i]] : run_start[q_run[i] + 1]]`` (sorted) are
    below ``q[i]``: a binary search each (:meth:`featurelake.sequences.heads.Heads.chunk_before`'s top level)."""
    out = np.empty(q.shape[0], np.int64)
    for i in range(q.shape[0]):
        r = q_run[i]
        a = run_start[r]
        out[i] = bisect_left(pool, a, run_start[r + 1], q[i]) - a
    return out


@numba.njit(cache=True, nogil=True, inline="always")
def _planes_rows(addrs, size, mask, first, n, off, w, k, c, delta, dst, acc):  # pragma: no cover - compiled
    """:func:`planes_at` of a part's values ``0 .. n`` (those ``mask[first + i]`` selects, when ``mask`` is given)
    into rows ``0 .. n`` of ``dst`` (``k``-byte items); returns (OR of values, OR of the bytes not decoded)."""
    seen = np.uint64(0)
    high = np.uint8(0)
    some = mask.shape[0] > 0
    for i in range(n):
        if some and not mask[first + i]:
            continue
        s, h = _plane_row(numba.carray(_u8_ptr(addrs[i]), (size,)), off, w, k, c, delta, dst[i], acc)
        seen |= s
        high |= h
    return seen, high


@jit
def decode_part(items, n, type_id, size, type_at, size_at, data_at, addrs, spec, mask, first, c, seen, high, nvalid,
                times, counts, q_pairs, q_order, q_sorted, bounds, below):  # pragma: no cover - compiled
    """One multi-get part of fixed-codec values decoded in one call: every column, the partial ones, the part's cuts.

    Why one call: each compiled call from a pool thread gives the GIL up and
    takes it back, and at 4 threads on 2 cores taking it back waited behind
    the other threads' multi-gets building their values (seven calls a part:
    the in-place check, planes and flags per column, the partial rows, the
    cuts). ``items``: the address of the part's ``n`` value objects (CPython
    object addresses, int64: a list's own item array, read here without the
    GIL, or an array of ``id`` s), each checked to be of type ``type_id`` and
    ``size`` long (header offsets ``type_at``, ``size_at``, ``data_at``:
    checked by the caller; -1: not all are, nothing decoded), their data
    addresses into ``addrs``. ``spec``: a row per
    column (int64): byte offset, stored width, delta-coded, validity offset
    (-1: none), output address, validity output address, mode, output item
    size; each output is a (pairs, ``c``) array whose rows ``first ..`` this
    part fills (the caller keeps them alive). Modes: 0 every value, 1 the
    values ``mask[first + i]`` selects, 2 none written: the column is the
    time column of the cuts below, decoded pair by pair into a scratch row
    (a time pool written only to be searched once was 1 KB a cut pair of
    memory traffic). ``seen``/``high`` per column: as :func:`planes` returns;
    ``nvalid``: the validity flags set (padding slots are never set). Then,
    per query ``q_order[t]`` whose pair ``q_sorted[t]`` is in this part,
    ``below`` = how many of the pair's ``counts`` times are below its bound
    (``times``: the decoded (pairs, c) time pool, unless a column has mode
    2); none when ``q_sorted`` is empty. Returns the values mode 1 decoded.
    """
    for i in range(n):
        a = _load_i64(items + 8 * i)
        if _load_i64(a + type_at) != type_id or _load_i64(a + size_at) != size:
            return -1
        addrs[i] = a + data_at
    acc = np.empty(c, np.uint64)
    none = mask[:0]
    cut_col = -1
    for j in range(spec.shape[0]):
        off, w, delta, voff, out_at, valid_at, mode, k = spec[j]
        if mode == 2:
            cut_col = j
            continue
        m = mask if mode == 1 else none
        base = first * c
        nb = n * c * k
        raw = numba.carray(_u8_ptr(out_at + base * k), (nb,))
        if k == 1:
            s, h = _planes_rows(addrs, size, m, first, n, off, w, k, c, delta, raw.reshape((n, c)), acc)
        elif k == 2:
            s, h = _planes_rows(addrs, size, m, first, n, off, w, k, c, delta, raw.view(np.uint16).reshape((n, c)), acc)
        elif k == 4:
            s, h = _planes_rows(addrs, size, m, first, n, off, w, k, c, delta, raw.view(np.uint32).reshape((n, c)), acc)
        else:
            s, h = _planes_rows(addrs, size, m, first, n, off, w, k, c, delta, raw.view(np.uint64).reshape((n, c)), acc)
        seen[j] = s
        high[j] = h
        if voff >= 0:
            flags_out = numba.carray(_u8_ptr(valid_at + base), (n, c))
            set_ = 0
            for i in range(n):
                if mode == 1 and not mask[first + i]:
                    continue
                src = numba.carray(_u8_ptr(addrs[i]), (size,))[voff : voff + c]
                dst = flags_out[i]
                for t in range(c):
                    f = src[t] != 0
                    dst[t] = f
                    set_ += f
            nvalid[j] = set_
    masked = 0
    for i in range(n if mask.shape[0] else 0):
        masked += mask[first + i] != 0
    nq = q_sorted.shape[0]
    if nq:
        a = bisect_left(q_sorted, 0, nq, first)
        b = bisect_left(q_sorted, a, nq, first + n)
        row = np.empty(c, np.int64)
        last = -1
        for t in range(a, b):
            q = q_order[t]
            p = q_pairs[q]
            if cut_col < 0:
                below[q] = bisect_left(times[p], 0, counts[p], bounds[q])
                continue
            if p != last:  # the queries of a pair are next to each other (sorted by pair): its times decoded once
                off, w, delta = spec[cut_col, 0], spec[cut_col, 1], spec[cut_col, 2]
                _plane_row(numba.carray(_u8_ptr(addrs[p - first]), (size,)), off, w, w, c, delta, row.view(np.uint64),
                           acc)
                last = p
            below[q] = bisect_left(row, 0, counts[p], bounds[q])
    return masked
