"""Overlaying update layers on a data file's columns (merge on read).

A layer is (positions or None for dense, values): the newest layer wins per
row. Columns no layer touches pass through untouched (no copy); a dense layer
replaces a column outright; numeric columns are copied once and each sparse
layer scattered in; other types concatenate the base with the layers and
pick the newest value per row with one ``take``.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from featurelake.state import UpdateEntry


def apply_layers(
    base: pa.RecordBatch, layers: list[tuple[UpdateEntry, np.ndarray | None, pa.RecordBatch]], start: int
) -> pa.RecordBatch:
    """Overlay update layers on rows [start, start+n) of a data file; latest layer wins.

    Columns no layer touches are passed through as they are (no copy). A
    layer that covers every row replaces the column outright; otherwise a
    numeric column is copied once and each layer's values scattered into it
    (:func:`scatter`), and any other type concatenates the base chunk with the
    layers' values and picks, per row, the newest with one ``take``.
    """
    n = base.num_rows
    end = start + n
    columns = list(base.columns)
    names = base.schema.names
    for ci, name in enumerate(names):
        updates: list[tuple[np.ndarray | None, pa.Array]] = []  # (row offsets in this range or None = all, values)
        for _, pos, values in layers:
            vi = values.schema.get_field_index(name)
            if vi < 0:
                continue
            col = values.column(vi)
            if pos is None:  # dense: the layer holds every row of the file, in order
                updates = [(None, col.slice(start, n))]  # covers every row: older layers no longer matter
                continue
            lo, hi = np.searchsorted(pos, [start, end])
            if lo < hi:
                updates.append((pos[lo:hi] - start, col.slice(lo, hi - lo)))
        if not updates:
            continue
        target = columns[ci].type
        updates = [(local, piece if piece.type.equals(target) else piece.cast(target)) for local, piece in updates]
        if len(updates) == 1 and updates[0][0] is None:
            columns[ci] = updates[0][1]
            continue
        if updates[0][0] is None:  # a dense layer under sparse ones: it is the base
            columns[ci] = updates.pop(0)[1]
        columns[ci] = scatter(columns[ci], updates) if _fixed_width(target) else take_newest(columns[ci], updates)
    return pa.RecordBatch.from_arrays(columns, schema=base.schema)


def _fixed_width(t: pa.DataType) -> bool:
    return (pa.types.is_integer(t) or pa.types.is_floating(t)) and not pa.types.is_dictionary(t)


def _values(arr: pa.Array) -> np.ndarray:
    """The value slots of a fixed-width numeric array (nulls' slots hold anything), without a copy."""
    dtype = np.dtype(arr.type.to_pandas_dtype())
    buf = arr.buffers()[1]
    return np.frombuffer(buf, dtype=dtype, count=arr.offset + len(arr))[arr.offset :] if buf is not None else np.zeros(len(arr), dtype)


def _validity(arr: pa.Array) -> np.ndarray:
    return np.ones(len(arr), dtype=bool) if arr.null_count == 0 else np.asarray(arr.is_valid())


def scatter(col: pa.Array, updates: list[tuple[np.ndarray, pa.Array]]) -> pa.Array:
    """``col`` with each update's values written at its row offsets, in order (numeric types).

    One copy of the column and one scatter per layer: several times cheaper
    than concatenating and taking (the untouched rows are copied, never gathered).
    """
    out = _values(col).copy()
    valid = None if col.null_count == 0 else _validity(col)
    for local, piece in updates:
        out[local] = _values(piece)
        if piece.null_count or valid is not None:
            if valid is None:
                valid = np.ones(len(out), dtype=bool)
            valid[local] = _validity(piece)
    if valid is None or valid.all():
        return pa.Array.from_buffers(col.type, len(out), [None, pa.py_buffer(out)])
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(col.type, len(out), [bitmap, pa.py_buffer(out)], null_count=int(len(valid) - valid.sum()))


def take_newest(col: pa.Array, updates: list[tuple[np.ndarray, pa.Array]]) -> pa.Array:
    """``col`` with the updates applied (any type): base and layers concatenated once, one ``take``."""
    n = len(col)
    index = np.arange(n, dtype=np.int64)
    offset = n
    for local, piece in updates:
        index[local] = offset + np.arange(len(piece))
        offset += len(piece)
    return pa.concat_arrays([col] + [piece for _, piece in updates]).take(pa.array(index))
