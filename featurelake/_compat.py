"""Fixes for pyiceberg 0.12 bugs that would corrupt featurelake data.

pyiceberg rebuilds list<struct> arrays without their validity bitmap when it
projects Arrow data to an Iceberg schema (on write and on read), so a null
list of structs turns into an empty list. Upstream's code passes no mask to
``LargeListArray.from_arrays``; the patch below passes it. Remove this module
once the pinned pyiceberg carries the fix (tests/test_backfill.py's property
test catches a regression).
"""
from __future__ import annotations

import pyarrow as pa
from pyiceberg.io import pyarrow as _pio

_original_list = _pio.ArrowProjectionVisitor.list


def _list_keeping_nulls(self, list_type, list_array, value_array):
    if (
        isinstance(list_array, (pa.ListArray, pa.LargeListArray))
        and isinstance(value_array, pa.StructArray)
        and list_array.null_count
    ):
        offsets = list_array.offsets
        if isinstance(list_array, pa.ListArray):
            offsets = offsets.cast(pa.int64())
        rebuilt = pa.LargeListArray.from_arrays(offsets, value_array, mask=list_array.is_null())
        value_array = self._cast_if_needed(list_type.element_field, value_array)
        initializer = pa.large_list if isinstance(list_array, pa.LargeListArray) else pa.list_
        return rebuilt.cast(initializer(self._construct_field(list_type.element_field, value_array.type)))
    return _original_list(self, list_type, list_array, value_array)


if not getattr(_pio.ArrowProjectionVisitor.list, "_featurelake_patched", False):
    _list_keeping_nulls._featurelake_patched = True  # type: ignore[attr-defined]
    _pio.ArrowProjectionVisitor.list = _list_keeping_nulls
