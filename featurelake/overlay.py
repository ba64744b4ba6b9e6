"""Overlaying update layers on a data file's columns (merge on read).

A layer is (entry, positions or None for dense, values): the newest layer
wins per row. Per column the layers are reduced once to what can show: the
newest dense layer (everything older lies under it) and the sparse layers
above it, each cut to the rows of the batch (one ``searchsorted`` per layer,
shared by its columns; none when the whole layer falls in the batch, as in
a whole-file read: its positions and values are used as they are).

* Columns no layer touches pass through untouched (no copy).
* A dense layer on top replaces the column outright: a zero-copy slice of it.
* Fixed-width columns (numbers, dates, times, decimals) get each sparse
  layer's values written at its rows, oldest first. When the reader decoded
  the column for this read alone (``owned``), they are written into the
  column's own buffer: no copy of the rows no layer touches, which is what a
  merge costs otherwise. Otherwise into one copy. The validity bitmap is
  rebuilt only where nulls come or go.
* Other types (strings, lists, booleans) concatenate the base with the
  layers' values and pick, per row, the newest with one ``take`` over the
  final source of every row, computed once for all layers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Collection

import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from featurelake.state import UpdateEntry

_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def apply_layers(
    base: pa.RecordBatch,
    layers: "list[tuple[UpdateEntry | None, np.ndarray | None, pa.RecordBatch]]",
    start: int,
    owned: Collection[str] = (),
) -> pa.RecordBatch:
    """Overlay update layers on rows [start, start+n) of a data file; the latest layer wins.

    ``layers`` are oldest first: (entry, sorted row positions in the file or
    None when the layer holds every row in file order, values). ``owned``
    names the columns of ``base`` decoded for this read alone, whose buffers
    nothing else holds: fixed-width ones are updated in place (see the module
    docstring). Columns no layer touches are passed through as they are; when
    every touched column was updated in place without a change to its nulls,
    ``base`` itself is returned (its buffers now hold the merged values).
    """
    n = base.num_rows
    end = start + n
    names = base.schema.names
    index = {name: i for i, name in enumerate(names)}
    per_column: dict[int, list[tuple[np.ndarray | None, pa.Array]]] = {}
    for _, pos, values in layers:
        touched = [(index[name], vi) for vi, name in enumerate(values.schema.names) if name in index]
        if not touched:
            continue
        if pos is None:  # dense: the layer holds every row of the file, in order; older layers no longer show
            for ci, vi in touched:
                per_column[ci] = [(None, values.column(vi).slice(start, n))]
            continue
        if not len(pos):
            continue
        if pos[0] >= start and pos[-1] < end:
            # the whole layer falls in this batch (a whole-file read): its positions and values as they are,
            # no search and no slices
            local = pos - start if start else pos
            for ci, vi in touched:
                per_column.setdefault(ci, []).append((local, values.column(vi)))
            continue
        lo, hi = np.searchsorted(pos, [start, end])
        if lo == hi:
            continue
        local = pos[lo:hi] - start if start else pos[lo:hi]
        for ci, vi in touched:
            per_column.setdefault(ci, []).append((local, values.column(vi).slice(lo, hi - lo)))
    if not per_column:
        return base
    columns = base.columns
    changed = False
    for ci, updates in per_column.items():
        col = columns[ci]
        target = col.type
        updates = [(local, piece if piece.type == target else piece.cast(target)) for local, piece in updates]
        mine = names[ci] in owned
        if updates[0][0] is None:  # a dense layer at the bottom: it is the base (held by the layer cache: not ours)
            col, mine = updates.pop(0)[1], False
        if not updates:
            merged = col
        elif _byte_width(target):
            merged = scatter(col, updates, in_place=mine)
        else:
            merged = take_newest(col, updates)
        if merged is not columns[ci]:
            columns[ci] = merged
            changed = True
    return pa.RecordBatch.from_arrays(columns, schema=base.schema) if changed else base


_WIDTHS: dict[pa.DataType, int] = {}


def _byte_width(t: pa.DataType) -> int:
    """Bytes per value of a fixed-width type whose values can be moved as machine words (0: not one);
    worked out once per type (a column's type is asked for on every batch)."""
    width = _WIDTHS.get(t)
    if width is None:
        if len(_WIDTHS) > 1024:
            _WIDTHS.clear()
        width = _WIDTHS[t] = _width_of(t)
    return width


def _width_of(t: pa.DataType) -> int:
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_temporal(t)
            or pa.types.is_decimal(t) or pa.types.is_fixed_size_binary(t)):
        return 0
    try:
        bits = t.bit_width
    except ValueError:
        return 0
    return bits // 8 if bits % 8 == 0 and bits >= 8 else 0


_DTYPES = {width: np.dtype(word) for width, word in _WORDS.items()}


def _dtype(width: int) -> np.dtype:
    found = _DTYPES.get(width)
    return found if found is not None else np.dtype((np.void, width))


def _values(arr: pa.Array, width: int) -> np.ndarray:
    """The value slots of a fixed-width array as machine words (nulls' slots hold anything), without a copy."""
    buf = arr.buffers()[1]
    if buf is None:
        return np.zeros(len(arr), _dtype(width))
    return np.frombuffer(buf, dtype=_dtype(width), count=arr.offset + len(arr))[arr.offset :]


def _validity(arr: pa.Array) -> np.ndarray:
    return np.ones(len(arr), dtype=bool) if arr.null_count == 0 else np.asarray(arr.is_valid())


def scatter(col: pa.Array, updates: list[tuple[np.ndarray, pa.Array]], in_place: bool = False) -> pa.Array:
    """``col`` with each update's values written at its row offsets, in order (fixed-width types).

    ``in_place``: the caller owns ``col`` (decoded for it alone), so the values
    are written into its buffer when Arrow allows (a mutable buffer); else into
    one copy. Either way each update costs its own rows only; the validity
    bitmap is rebuilt only when the column or an update holds nulls.
    """
    width = _byte_width(col.type)
    n, offset = len(col), col.offset
    data = col.buffers()[1]
    ours = in_place and data is not None and data.is_mutable
    if ours:
        out = np.frombuffer(data, dtype=_dtype(width), count=offset + n)[offset:]
    else:  # one copy, from Arrow's pool (reused memory: no page faults for each batch)
        data, offset = pa.allocate_buffer(n * width), 0
        out = np.frombuffer(data, dtype=_dtype(width), count=n)
        out[:] = _values(col, width)
    for local, piece in updates:
        out[local] = _values(piece, width)
    if col.null_count == 0 and not any(piece.null_count for _, piece in updates):
        # no nulls before or after: an existing bitmap (all set in these rows) may stay as it is; written
        # in place, ``col`` itself already holds the merged values
        if ours:
            return col
        return pa.Array.from_buffers(col.type, n, [None, data], null_count=0, offset=offset)
    valid = np.zeros(offset + n, dtype=bool)
    valid[offset:] = _validity(col)
    for local, piece in updates:
        valid[offset + local] = _validity(piece)
    nulls = int(n - np.count_nonzero(valid[offset:]))
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(col.type, n, [bitmap, data], null_count=nulls, offset=offset)


def take_newest(col: pa.Array, updates: list[tuple[np.ndarray, pa.Array]]) -> pa.Array:
    """``col`` with the updates applied (any type): the final source of every row, once for all
    layers, then base and layers concatenated once and one ``take``."""
    n = len(col)
    index = np.arange(n, dtype=np.int64)
    offset = n
    for local, piece in updates:
        index[local] = offset + np.arange(len(piece))
        offset += len(piece)
    return pa.concat_arrays([col] + [piece for _, piece in updates]).take(pa.array(index))
