"""List-view joins: each row's history as (offset, size) into one shared pool of events, not a copy.

Why: rows of one user share that user's events, and a 4,096-row batch with
256-event histories materialises about a million events when every row gets
its own copy (``list`` layout). An Arrow ``list_view`` column holds an
offset and a size per row into one values array, ranges may overlap, so the
per-row work is a search of the row's time in its user's time run, O(rows)
numpy, and the events are stored once.

Two ways to fill the pool:

* :func:`lookup_view` (``SequenceTable.view(layout="list_view")``): the
  same chunk selection as :meth:`SequenceStore.lookup` (heads, chunks,
  ``before`` / ``max_len`` / window cuts); the fetched chunks are the pool,
  so nothing is gathered per row.
* :class:`~featurelake.sequences.historycache.HistoryCache` (``layout="list_view", cache_bytes=N``): each user's
  whole decoded history is kept in one append-only arena across batches, so
  a user is fetched and decoded once per arena (per epoch when it fits);
  a batch's column is a zero-copy view of the arena. When the arena would
  pass ``cache_bytes`` it is dropped and refilled (batches already handed
  out keep their own reference). It needs fixed-size column codecs, and
  fetches whole histories: meant for bounded histories, not lifetime logs.

Dictionary-coded string columns come out as ``dictionary<uint16, string>``
(the codes are the stored bytes). :func:`as_list` turns a list view into
the ``list`` layout's exact type and values (pyarrow 26's own
``cast(list_view -> list)`` returns an invalid array, so it is not used).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from featurelake.errors import FeatureLakeError
from featurelake.sequences.lookup import SequenceStore
from featurelake.sequences.codecs import FixedCodec

LAYOUTS = ("list", "list_view")
_MAX_POOL = (1 << 31) - 1


# ------------------------------------------------------------------- types
def view_fields(store: SequenceStore, columns: Sequence[str]) -> list[pa.Field]:
    """The struct fields of a list-view column: dictionary-coded columns keep their codes."""
    out = []
    for col in columns:
        f = store._field(col)
        cd = store.codecs[store.group_of[col]]
        if isinstance(cd, FixedCodec) and col in cd.dictionaries:
            f = pa.field(f.name, pa.dictionary(pa.uint16(), f.type), f.nullable, f.metadata)
        out.append(f)
    return out


def view_type(store: SequenceStore, columns: Sequence[str]) -> pa.DataType:
    return pa.list_view(pa.struct(view_fields(store, columns)))


def _fixed_column(cd: FixedCodec, name: str, vals: np.ndarray, bitmap: pa.Buffer | None, n: int,
                  packed_bools: bool = False) -> pa.Array:
    """One column over ``n`` decoded slots, zero-copy (dictionary columns as their uint16 codes)."""
    f = cd.schema.field(name)
    if name in cd.dictionaries:
        codes = pa.Array.from_buffers(pa.uint16(), n, [bitmap, pa.py_buffer(vals)])
        return pa.DictionaryArray.from_arrays(codes, cd._dict_arrays[name], safe=False)
    if pa.types.is_boolean(f.type):
        data = vals if packed_bools else np.packbits(vals.view(np.bool_), bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), n, [bitmap, pa.py_buffer(data)])
    return pa.Array.from_buffers(f.type, n, [bitmap, pa.py_buffer(vals)])


def _bitmap(valid: np.ndarray | None) -> pa.Buffer | None:
    if valid is None or valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _list_view(n: int, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray, values: pa.Array,
               typ: pa.DataType) -> pa.ListViewArray:
    """Rows ``rows`` view ``values[lo:hi]``; the other rows are empty (``lo`` <= ``hi`` <= ``len(values)``)."""
    size = (hi - lo).astype(np.int32)
    if len(rows) == n:
        offsets = lo.astype(np.int32)
    else:
        sizes = np.zeros(n, np.int32)
        sizes[rows] = size
        size = sizes
        offsets = np.zeros(n, np.int32)
        offsets[rows] = lo
    return pa.ListViewArray.from_arrays(pa.array(offsets), pa.array(size), values, type=typ)


def _new_stats(n: int) -> dict[str, int]:
    return {"rows": n, "users": 0, "head_bytes": 0, "chunk_bytes": 0, "chunk_values": 0, "events": 0,
            "decoded_bytes": 0, "pool_events": 0}


# ------------------------------------------------------------ no cache
def lookup_view(store: SequenceStore, keys: pa.Array, before: Any, columns: Sequence[str], max_len: int | None,
                window: Any, threads: int, batch_keys: int) -> tuple[pa.ListViewArray, dict[str, int]]:
    """:meth:`SequenceStore.lookup` as a list view over the fetched chunks (same selection, no per-row copy)."""
    columns = store.check_columns(columns)
    n, b, w, rows = store.prepare(keys, before, max_len, window)
    stats = _new_stats(n)
    typ = view_type(store, columns)
    fields = view_fields(store, columns)
    lo = hi = np.zeros(0, np.int64)
    fetched: dict[int, Any] = {}
    counts = np.zeros(0, np.int64)
    if len(rows):
        lo, hi, delta, fetched, counts = store._select(keys, rows, b, w, max_len, columns, threads, batch_keys, stats,
                                                       narrow=True)
    c = store.chunk_events
    fixed = [isinstance(store.codecs[store.group_of[col]], FixedCodec) for col in columns]
    pool = int(counts.sum())
    if pool == 0:
        values = pa.StructArray.from_arrays([pa.nulls(0, f.type) for f in fields], fields=fields)
        lo = hi = np.zeros(len(rows), np.int64)
    elif all(fixed):  # the padded chunk slots are the pool: a row's events are contiguous in them
        slots = len(counts) * c
        if slots > _MAX_POOL:
            raise FeatureLakeError("a list-view lookup fetched more than 2**31 event slots: use smaller batches")
        arrays = []
        for col in columns:
            g = store.group_of[col]
            vals, ok = fetched[g][col]
            if ok is not None and np.count_nonzero(ok) == pool:
                ok = None  # every fetched event is valid (padding slots are the only zeros): no bitmap
            arrays.append(_fixed_column(store.codecs[g], col, store.codecs[g].widen(col, vals), _bitmap(ok), slots))
        values = pa.StructArray.from_arrays(arrays, fields=fields)
        lo, hi = lo + delta, hi + delta
    else:  # IPC groups are back to back: gather fixed-codec columns into the same order (one take per pool)
        if pool > _MAX_POOL:
            raise FeatureLakeError("a list-view lookup fetched more than 2**31 events: use smaller batches")
        pool_off = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=pool_off[1:])
        slot = np.repeat(np.arange(len(counts), dtype=np.int64) * c - pool_off[:-1], counts) + np.arange(pool)
        arrays = []
        for col, is_fixed in zip(columns, fixed):
            g = store.group_of[col]
            if is_fixed:
                vals, ok = fetched[g][col]
                vals = store.codecs[g].widen(col, vals[slot])
                arrays.append(_fixed_column(store.codecs[g], col, vals, _bitmap(None if ok is None else ok[slot]), pool))
            else:
                arrays.append(fetched[g].column(col).combine_chunks())
        values = pa.StructArray.from_arrays(arrays, fields=fields)
    stats["events"] = int((hi - lo).sum())
    stats["pool_events"] = pool
    return _list_view(n, rows, lo, hi, values, typ), stats


# ---------------------------------------------------------- conversion
def list_type(t: pa.DataType) -> pa.DataType:
    """The ``list`` layout's type for a list-view type (dictionary fields decoded)."""
    v = t.value_type
    if pa.types.is_struct(v):
        v = pa.struct([pa.field(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type, f.nullable,
                                f.metadata) for f in v])
    elif pa.types.is_dictionary(v):
        v = v.value_type
    return pa.list_(pa.field(t.value_field.name, v, t.value_field.nullable))


def as_list(arr: Any) -> Any:
    """A list-view array (or chunked array) as a plain list array: each row's events copied out, dictionaries decoded.

    Other arrays are returned unchanged. Null list views stay null.
    """
    if isinstance(arr, pa.ChunkedArray):
        if not (pa.types.is_list_view(arr.type) or pa.types.is_large_list_view(arr.type)):
            return arr
        return pa.chunked_array([as_list(c) for c in arr.chunks], type=list_type(arr.type))
    if not (pa.types.is_list_view(arr.type) or pa.types.is_large_list_view(arr.type)):
        return arr
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    offs = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), np.int64)
    sizes = np.where(valid, np.asarray(arr.sizes.to_numpy(zero_copy_only=False), np.int64), 0)
    total = int(sizes.sum())
    out_off = np.zeros(len(arr) + 1, np.int64)
    np.cumsum(sizes, out=out_off[1:])
    idx = np.repeat(offs - out_off[:-1], sizes) + np.arange(total, dtype=np.int64)
    values = arr.values.take(pa.array(idx))
    typ = list_type(arr.type)
    if pa.types.is_struct(values.type):
        values = pa.StructArray.from_arrays(
            [values.field(i).cast(f.type) for i, f in enumerate(typ.value_type)], fields=list(typ.value_type))
    else:
        values = values.cast(typ.value_type)
    if total >= 1 << 31:
        raise FeatureLakeError("a list view with more than 2**31 events cannot become a list: slice it first")
    mask = None if valid.all() else pa.array(~valid)
    return pa.ListArray.from_arrays(pa.array(out_off.astype(np.int32)), values, type=typ, mask=mask)
