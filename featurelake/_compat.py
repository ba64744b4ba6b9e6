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
