"""Fixes for pyiceberg 0.12 bugs that would corrupt featurelake data.

pyiceberg rebuilds list<struct> arrays without their validity bitmap when it
projects Arrow data to an Iceberg schema (on write and on read), so a null
list of structs turns into an empty list. Upstream's code passes no mask to
``LargeListArray.from_arrays``; the patch below passes it. Remove this module
once the pinned pyiceberg carries the fix (tests/test_backfill.py's property
test catches a regression). The patch is process-wide (any pyiceberg read in the process runs
it), so it must handle every array pyiceberg can hand it, sliced ones included
(tests/safety/test_compat.py scans nested data with plain pyiceberg against a pyarrow oracle).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.io import pyarrow as _pio

_original_list = _pio.ArrowProjectionVisitor.list


def _zero_based(list_array: pa.Array, value_array: pa.Array) -> tuple[pa.Array, pa.Array]:
    """The list's offsets rebased to start at 0, and the slice of the values they cover.

    A sliced list (pyarrow's scanner slices row groups larger than its batch size, e.g. after
    ``compact``) has offsets that are themselves a slice into the full values; Arrow refuses to
    combine such offsets with a validity mask ("Null bitmap with offsets slice not supported").
    """
    offsets = list_array.offsets.cast(pa.int64())
    if len(offsets) == 0:
        return pa.array([0], pa.int64()), value_array.slice(0, 0)
    start, end = offsets[0].as_py(), offsets[-1].as_py()
    return pc.subtract(offsets, pa.scalar(start, pa.int64())), value_array.slice(start, end - start)


def _list_keeping_nulls(self, list_type, list_array, value_array):
    if (
        isinstance(list_array, (pa.ListArray, pa.LargeListArray))
        and isinstance(value_array, pa.StructArray)
        and list_array.null_count
    ):
        offsets, values = _zero_based(list_array, value_array)
        rebuilt = pa.LargeListArray.from_arrays(offsets, values, mask=list_array.is_null())
        values = self._cast_if_needed(list_type.element_field, values)
        initializer = pa.large_list if isinstance(list_array, pa.LargeListArray) else pa.list_
        return rebuilt.cast(initializer(self._construct_field(list_type.element_field, values.type)))
    return _original_list(self, list_type, list_array, value_array)


if not getattr(_pio.ArrowProjectionVisitor.list, "_featurelake_patched", False):
    _list_keeping_nulls._featurelake_patched = True  # type: ignore[attr-defined]
    _pio.ArrowProjectionVisitor.list = _list_keeping_nulls


# pyiceberg's update_table_metadata ends by deep-copying the whole table metadata, and
# Transaction.table_metadata calls it (re-applying every staged update) on each access: a single
# commit reads it some twenty times. On a table with a long history (many schemas after many
# backfills) that was 55% of a backfill's time (measured: 0.70 s of 1.28 s). The metadata models
# are frozen (pydantic frozen=True, updated only through model_copy), so the result can share its
# parts with the base, and can be cached until the staged updates or the base metadata change.
import pyiceberg.catalog as _catalog  # noqa: E402
import pyiceberg.table.update as _update  # noqa: E402
from pyiceberg.table import Transaction as _Transaction  # noqa: E402
from pyiceberg.utils.datetime import datetime_to_millis as _datetime_to_millis  # noqa: E402

_deep_update_table_metadata = getattr(_update.update_table_metadata, "_featurelake_original", _update.update_table_metadata)


def _update_table_metadata(base_metadata, updates, enforce_validation: bool = False, metadata_location=None):
    """pyiceberg's update_table_metadata without the final deep copy (same steps otherwise)."""
    if enforce_validation:
        return _deep_update_table_metadata(base_metadata, updates, enforce_validation, metadata_location)
    from datetime import datetime

    context = _update._TableMetadataUpdateContext()
    new_metadata = base_metadata
    for update in updates:
        new_metadata = _update._apply_table_update(update, new_metadata, context)
    if context.has_changes():
        if metadata_location:
            new_metadata = _update._update_table_metadata_log(new_metadata, metadata_location, base_metadata.last_updated_ms)
        if base_metadata.last_updated_ms == new_metadata.last_updated_ms:
            new_metadata = new_metadata.model_copy(update={"last_updated_ms": _datetime_to_millis(datetime.now().astimezone())})
    new_metadata.spec().check_compatible(new_metadata.schema())
    new_metadata.sort_order().check_compatible(new_metadata.schema())
    return new_metadata


_update_table_metadata._featurelake_original = _deep_update_table_metadata  # type: ignore[attr-defined]
_update.update_table_metadata = _update_table_metadata
_catalog.update_table_metadata = _update_table_metadata


def _cached_table_metadata(self):
    cached = getattr(self, "_featurelake_metadata", None)
    if cached is not None and cached[0] is self._table.metadata and cached[1] is self._updates:
        return cached[2]
    metadata = _update_table_metadata(self._table.metadata, self._updates)
    self._featurelake_metadata = (self._table.metadata, self._updates, metadata)
    return metadata


_cached_table_metadata._featurelake_patched = True  # type: ignore[attr-defined]
if not getattr(getattr(_Transaction.table_metadata, "fget", None), "_featurelake_patched", False):
    _Transaction.table_metadata = property(_cached_table_metadata)
