"""Compiled loops of a lookup: fixed-codec byte planes to values, row ranges to output columns, codes to strings.

Why compiled (numba, ``nogil=True``): the NumPy forms of these steps
(:meth:`featurelake.sequences.codecs.FixedCodec.decode_into`,
the row-range copies (a window view or ``np.take``, since removed),
:class:`featurelake.sequences.strings.DictionaryStrings`) are a handful of
whole-array calls each, with a temporary between calls, and hold the GIL
between them. Measured on the sequences benchmark (4,096-row batches, 256
events a row, about 7,700 chunks of 128 events a batch, 1 thread): decoding
took 11.5 ms a batch (join, plane checks, plane copies), the row-range
copies 6.4 ms and the strings 12.4 ms, next to a 32 ms multi-get. The loops
here touch every byte once, and, run without the GIL, let a lookup decode
each multi-get part in the pool thread that fetched it and copy its output
columns in pieces on several threads.

The kernels are compiled on first use (``cache=True``: later processes load
them from numba's cache in ~0.3 s; a cold compile of all of them costs a
few seconds) and know nothing of stores or builds; tests compare them with
the NumPy forms (tests/test_sequence_kernels.py).
"""
from __future__ import annotations

import functools
from types import ModuleType
from typing import Any

import numpy as np


def unsigned_view(a: np.ndarray) -> np.ndarray:
    """``a``'s bytes as unsigned ints of its item size (what :func:`planes` writes: any fixed-width dtype)."""
    return a.view(f"u{a.dtype.itemsize}")


@functools.cache
def kernels() -> ModuleType:
    """The compiled kernels (:mod:`featurelake.sequences.kernels_jit`: numba's import and cache load, once)."""
    from featurelake.sequences import kernels_jit

    return kernels_jit


def dictionary_words(values: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Strings as the string kernel reads them: UTF-8 lengths (int64) and (strings, n) little-endian uint64 words."""
    enc = [v.encode() for v in values]
    lens = np.array([len(v) for v in enc], np.int64)
    n = max(1, -(-int(lens.max(initial=0)) // 8))
    words = np.frombuffer(b"".join(v.ljust(8 * n, b"\0") for v in enc) or bytes(8), "<u8").reshape(-1, n)
    return lens, np.ascontiguousarray(words, np.uint64)


def needed_bytes(seen: int, width: int) -> int:
    """The bytes (1, 2, 4 or ``width``) values whose OR is ``seen`` need (what ``FixedCodec.planes_used`` finds)."""
    for k in (1, 2, 4):
        if k < width and seen < 1 << (8 * k):
            return k
    return width


class InPlace:
    """One multi-get's fixed-codec values, to decode where they lie: their data addresses, the values kept alive.

    Why: a grid (:meth:`featurelake.sequences.codecs.FixedCodec.grid`) is one
    ``b"".join`` of the values, a copy of every fetched byte made with the
    GIL held (1.1 ms of a 4,096-row batch's lookup, measured, while the pool
    threads' multi-gets wait for the GIL). The compiled kernels read each
    value's bytes in the bytes object itself (:func:`kernels_jit.planes_at`).
    Built only by :func:`in_place` and :meth:`PartDecoder.decode`, which check,
    in one compiled pass over the objects' headers, that every value is a
    ``bytes`` of the codec's size.
    """

    __slots__ = ("values", "addrs", "size", "_grid")

    def __init__(self, values: list[bytes], addrs: np.ndarray, size: int) -> None:
        self.values, self.addrs, self.size, self._grid = values, addrs, size, None

    def __len__(self) -> int:
        return len(self.values)

    @property
    def nbytes(self) -> int:
        return len(self.values) * self.size

    def grid(self, codec) -> np.ndarray:
        """The values as a grid (joined once, on demand: only needed to count a too-narrow column's planes)."""
        if self._grid is None:
            self._grid = codec.grid(self.values)
        return self._grid


def _bytes_layout() -> tuple[int, int, int] | None:
    """Offsets of a bytes object's type, size and data from its ``id`` (CPython), None where they do not hold."""
    import ctypes
    import sys

    if sys.implementation.name != "cpython" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    type_at, size_at, data_at = 8, 16, bytes.__basicsize__ - 1  # PyVarObject header, then ob_shash, then ob_sval
    for probe in (b"featurelake-probe-" * 3, bytes(range(256))):
        a = id(probe)
        if (ctypes.c_int64.from_address(a + type_at).value != id(bytes)
                or ctypes.c_int64.from_address(a + size_at).value != len(probe)
                or ctypes.string_at(a + data_at, len(probe)) != probe):
            return None
    return type_at, size_at, data_at


def _list_items_at() -> int | None:
    """Offset of a list's item array pointer (``ob_item``) from its ``id`` (CPython), None where it does not hold."""
    import ctypes
    import sys

    if sys.implementation.name != "cpython" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None
    items_at = 24  # PyVarObject header (refcount, type, size), then ob_item
    for probe in ([b"a", b"bc", b"def"], [bytes(8) for _ in range(100)]):
        a = id(probe)
        if ctypes.c_int64.from_address(a + 16).value != len(probe):
            return None
        items = ctypes.c_int64.from_address(a + items_at).value
        if any(ctypes.c_int64.from_address(items + 8 * i).value != id(v) for i, v in enumerate(probe)):
            return None
    return items_at


_LAYOUT = _bytes_layout()
_LIST_ITEMS = _list_items_at()


def object_addresses(values: list[bytes]) -> tuple[int, Any]:
    """The address of an array of ``values``' object addresses (int64), and what keeps that array alive.

    Why: :func:`kernels_jit.decode_part` reads the objects' headers itself;
    a list's own item array is that array already, so a part's values need
    no ``np.fromiter(map(id, values))`` (a Python loop over every value with
    the GIL held, in the pool threads: 0.3 ms of a 4,096-row batch,
    measured). Other sequences get that array. The caller must not change
    ``values`` while the address is used.
    """
    if _LIST_ITEMS is not None and type(values) is list:
        import ctypes

        return ctypes.c_int64.from_address(id(values) + _LIST_ITEMS).value, values
    ids = np.fromiter(map(id, values), np.int64, len(values))
    return ids.ctypes.data, ids
# kernels_jit.decode_part's arguments for no columns, no partial columns, no cuts
_NO_COLUMNS = np.zeros((0, 8), np.int64)
_NO_MASK = np.zeros(0, np.uint8)
_NO_SEEN = np.zeros(0, np.uint64)
_NO_HIGH = np.zeros(0, np.uint8)
_NO_VALID = np.zeros(0, np.int64)
_NO_QUERIES = (np.zeros((0, 1), np.int64), *(np.zeros(0, np.int64) for _ in range(6)))


def in_place(values: list[bytes], size: int) -> InPlace | None:
    """``values`` to decode in place, or None (a value not a ``bytes`` of ``size`` bytes, or not CPython): join them.

    (:class:`PartDecoder` checks and decodes a part in one call; this is its check alone.)"""
    if _LAYOUT is None or not values:
        return None
    items, _alive = object_addresses(values)  # (_alive: the item array, kept until the call returns)
    addrs = np.empty(len(values), np.int64)
    if kernels().decode_part(items, len(values), id(bytes), size, *_LAYOUT, addrs, _NO_COLUMNS, _NO_MASK, 0, 1,
                             _NO_SEEN, _NO_HIGH, _NO_VALID, *_NO_QUERIES) < 0:
        return None
    return InPlace(values, addrs, size)


def decode_into(codec, grid: "np.ndarray | InPlace", names, out: dict, first: int, rows: np.ndarray | None = None
                ) -> tuple[int, dict[str, int]]:
    """:meth:`featurelake.sequences.codecs.FixedCodec.decode_into` of one (values, size) ``grid``, compiled.

    Runs without the GIL. ``grid`` may also be the values in place
    (:func:`in_place`): decoded alike, byte for byte. ``out``'s integer
    columns may be narrowed
    (:meth:`~featurelake.sequences.codecs.FixedCodec.narrow_dtype`): each
    value's low bytes are written, and the bytes the values need are
    returned, so that a caller can decode again, wider, where they did not
    fit. Returns the stored bytes decoded (as ``decode_into`` does) and, per
    narrowable column, the bytes its values need.
    """
    k = kernels()
    c = codec.c
    p = len(grid) if rows is None else len(rows)
    idx = np.arange(len(grid), dtype=np.int64) if rows is None else rows.astype(np.int64, copy=False)
    at = isinstance(grid, InPlace)
    decoded = 0
    needs: dict[str, int] = {}
    for name in names:
        off, stored, voff = codec.layout[name]
        vals, valid = out[name]
        w = stored.itemsize
        args = (idx, off, w, min(w, vals.dtype.itemsize), c, name in codec.delta, unsigned_view(vals).reshape(-1, c), first)
        seen, high = k.planes_at(grid.addrs, grid.size, *args) if at else k.planes(grid, *args)
        if stored.kind in "iu" and name not in codec.delta:  # (bytes set above the output's: planes_used says how many)
            if high:
                g = grid.grid(codec) if at else grid
                needs[name] = codec.planes_used(g if rows is None else g[idx], name)
            else:
                needs[name] = needed_bytes(int(seen), w)
        decoded += p * c * w
        if valid is not None:
            if at:
                k.flags_at(grid.addrs, grid.size, idx, voff, c, valid.reshape(-1, c), first)
            else:
                k.flags(grid, idx, voff, c, valid.reshape(-1, c), first)
            decoded += p * c
    return decoded, needs


class PartDecoder:
    """How one lookup's parts of one fixed-codec group decode in one compiled call each (:meth:`decode`).

    Built once per lookup and group, in the calling thread (the output
    addresses, the column specs); used from the pool threads, each with its
    own part. Why: see :func:`kernels_jit.decode_part` (one GIL hand-back a
    part instead of seven). ``names``: columns decoded for every value;
    ``partial``: (columns, pair mask), columns decoded only for the pairs the
    mask selects; ``out``: the group's pools (:meth:`FixedCodec.alloc`),
    which must not be replaced while parts decode. ``queries``: (times pool
    as (pairs, c) int64, counts, query pairs, their order by pair, the sorted
    pairs, bounds, output) for the cuts counted in the part that holds the
    times, or None. ``cut_only``: a partial column (the time column) needed
    only for those cuts: searched where it lies, its pool left unwritten.
    """

    def __init__(self, codec, names, partial, out: dict, queries: tuple | None = None, cut_only: str | None = None
                 ) -> None:
        self.codec, self.names, self.out = codec, list(names), out
        self.partial_names = list(partial[0]) if partial else []
        self.mask = partial[1].view(np.uint8) if partial else _NO_MASK
        rows = []
        for j, name in enumerate(self.names + self.partial_names):
            off, stored, voff = codec.layout[name]
            vals, valid = out[name]
            mode = 0 if j < len(self.names) else 2 if name == cut_only and queries is not None else 1
            rows.append((off, stored.itemsize, name in codec.delta, -1 if voff is None or valid is None else voff,
                         vals.ctypes.data, 0 if valid is None else valid.ctypes.data, mode,
                         min(stored.itemsize, vals.dtype.itemsize)))
        self.spec = np.array(rows, np.int64).reshape(-1, 8)
        self.queries = queries or _NO_QUERIES
        self.narrowable = [(j, name, codec.layout[name][1].itemsize) for j, name in enumerate(self.names)
                           if codec.layout[name][1].kind in "iu" and name not in codec.delta]
        self.flagged = [(j, name) for j, name in enumerate(self.names) if self.spec[j, 3] >= 0]
        self.per_value = sum(codec.c * (self.spec[j, 1] + (self.spec[j, 3] >= 0)) for j in range(len(self.names)))
        self.per_partial = sum(codec.c * (self.spec[j, 1] + (self.spec[j, 3] >= 0))
                               for j in range(len(self.names), len(self.spec)))

    def decode(self, values: list[bytes], first: int) -> tuple[int, dict[str, int], "InPlace", dict[str, int]] | None:
        """Decode ``values`` into pool rows ``first ..``: (stored bytes decoded, per narrowable column the bytes its
        values need, the values in place, per column of every value the validity flags set), or None when they are
        not all ``bytes`` of the codec's size (nothing written: the caller joins them into a grid, which checks
        their sizes)."""
        if _LAYOUT is None or not values:
            return None
        n = len(values)
        items, _alive = object_addresses(values)  # (_alive: the item array, kept until the call returns)
        addrs = np.empty(n, np.int64)
        ncol = len(self.spec)
        seen = np.zeros(ncol, np.uint64)
        high = np.zeros(ncol, np.uint8)
        nvalid = np.zeros(ncol, np.int64)
        masked = kernels().decode_part(items, n, id(bytes), self.codec.size, *_LAYOUT, addrs, self.spec, self.mask, first,
                                       self.codec.c, seen, high, nvalid, *self.queries)
        if masked < 0:
            return None
        grid = InPlace(values, addrs, self.codec.size)
        needs = {}
        for j, name, w in self.narrowable:
            needs[name] = self.codec.planes_used(grid.grid(self.codec), name) if high[j] else needed_bytes(int(seen[j]), w)
        return (n * self.per_value + masked * self.per_partial, needs, grid,
                {name: int(nvalid[j]) for j, name in self.flagged})
