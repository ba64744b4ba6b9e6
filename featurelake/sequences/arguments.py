"""Lookup arguments in the store's forms: user keys, ``before`` times and windows.

Times are rounded so that an event at or after a row's time never slips in:
``before`` in a finer unit than the sequence time rounds up.
"""
from __future__ import annotations

import datetime as _dt
from typing import Any

import numpy as np
import pyarrow as pa

from featurelake.errors import FeatureLakeError, SchemaMismatchError

_UNIT_NS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}
_INT64_ID = pa.int64().id


def parse_key_type(text: str) -> pa.DataType:
    """The Arrow type a build records for its user key (by name)."""
    simple = {"int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(), "uint8": pa.uint8(),
              "uint16": pa.uint16(), "uint32": pa.uint32(), "uint64": pa.uint64(), "string": pa.string(),
              "large_string": pa.large_string()}
    if text in simple:
        return simple[text]
    raise FeatureLakeError(f"unsupported sequence key type {text}")


def as_array(values: Any, t: pa.DataType) -> pa.Array:
    """User keys (any array-like) as the store's key form: int64 for integer keys, else strings."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array) and values.type.id == _INT64_ID and pa.types.is_integer(t):
        return values  # already the key form: no cast (~10 us a batch)
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


def times_to_int(arr: pa.Array, target: pa.DataType) -> tuple[np.ndarray, np.ndarray]:
    """Times as int64 in the target's unit, rounding up (no event at or after the time slips in)."""
    if not arr.null_count and arr.type.equals(target) and (pa.types.is_timestamp(target) or target.equals(pa.int64())):
        return arr.view(pa.int64()).to_numpy(), np.ones(len(arr), bool)  # already the store's form: no copy
    valid = (np.ones(len(arr), bool) if not arr.null_count
             else np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
    if pa.types.is_timestamp(target):
        if pa.types.is_date(arr.type):
            arr = arr.cast(pa.timestamp("s"))
        if pa.types.is_integer(arr.type):  # raw values in the sequence time's unit
            arr = arr.cast(pa.int64()).cast(target)
        if not pa.types.is_timestamp(arr.type):
            raise SchemaMismatchError(f"times of type {arr.type} cannot bound a {target} sequence time")
        raw = arr.cast(pa.int64())
        raw = (raw.fill_null(0) if raw.null_count else raw).to_numpy(zero_copy_only=False)
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


def before_ints(before: Any, n: int, target: pa.DataType) -> tuple[np.ndarray | None, np.ndarray | None]:
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
        ints, valid = times_to_int(arr, target)
        return np.full(n, ints[0], np.int64), np.full(n, bool(valid[0]))
    if len(arr) != n:
        raise FeatureLakeError(f"before has {len(arr)} values for {n} keys")
    return times_to_int(arr, target)


def window_int(window: Any, target: pa.DataType) -> int | None:
    """A lookup window (timedelta, numpy timedelta or int) in the sequence time's unit; never negative."""
    if window is None:
        return None
    if isinstance(window, _dt.timedelta):
        if not pa.types.is_timestamp(target):
            raise FeatureLakeError("a timedelta window needs a timestamp sequence time; give an int for integer times")
        us = window // _dt.timedelta(microseconds=1)
        w = us * 1000 // _UNIT_NS[target.unit]
    elif isinstance(window, np.timedelta64):
        return window_int(window.astype("timedelta64[us]").item(), target)
    else:
        w = int(window)
    if w < 0:
        raise FeatureLakeError(f"window must not be negative, got {window!r}")
    return int(w)
