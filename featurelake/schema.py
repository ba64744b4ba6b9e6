"""Schemas, partition specs and table defaults, and fitting input data to them.

Arrow is the user's language, Iceberg the lake's: this module converts between
them, parses partition transforms written as strings (``day(ts)``), chooses the
slim-metadata table properties, and checks that incoming Arrow data fits a
table before anything is written.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

import pyarrow as pa
from pyiceberg.io.pyarrow import _pyarrow_to_schema_without_ids, schema_to_pyarrow
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.transforms import (
    BucketTransform,
    DayTransform,
    HourTransform,
    IdentityTransform,
    MonthTransform,
    Transform,
    TruncateTransform,
    YearTransform,
)
from pyiceberg.types import StringType

from featurelake.errors import InvalidNameError, SchemaMismatchError

LOCATOR_FILE = "_file"
LOCATOR_POS = "_pos"
RESERVED_PREFIX = "_"

_TRANSFORM = re.compile(r"^\s*(\w+)\s*\(\s*(?:(\d+)\s*,\s*)?([A-Za-z_][\w.]*)\s*\)\s*$")
_PLAIN = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*$")
_UNARY: dict[str, type[Transform]] = {
    "identity": IdentityTransform,
    "year": YearTransform,
    "years": YearTransform,
    "month": MonthTransform,
    "months": MonthTransform,
    "day": DayTransform,
    "days": DayTransform,
    "hour": HourTransform,
    "hours": HourTransform,
}


def key_columns(primary_key: str | Sequence[str]) -> list[str]:
    return [primary_key] if isinstance(primary_key, str) else list(primary_key)


def iceberg_schema_from_arrow(schema: pa.Schema, primary_key: Sequence[str]) -> Schema:
    """An Iceberg schema for ``schema`` with ``primary_key`` as required identifier fields."""
    if not isinstance(schema, pa.Schema):
        raise SchemaMismatchError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
    bad = [f.name for f in schema if not f.name or f.name.startswith(RESERVED_PREFIX)]
    if bad:
        raise InvalidNameError(f"column names may not be empty or start with '_' (reserved): {bad}")
    missing = [k for k in primary_key if k not in schema.names]
    if missing or not primary_key:
        raise SchemaMismatchError(f"primary key column(s) {missing or primary_key} not in schema", missing)
    for k in primary_key:
        t = schema.field(k).type
        if pa.types.is_nested(t) or pa.types.is_floating(t):
            raise SchemaMismatchError(f"primary key column {k!r} cannot be of type {t}", [k])
    fields = [f.with_nullable(False) if f.name in primary_key else f for f in schema]
    base = _pyarrow_to_schema_without_ids(pa.schema(fields))
    # Give fresh ids so identifier fields can be named by id before the catalog re-assigns them.
    from pyiceberg.schema import assign_fresh_schema_ids

    fresh = assign_fresh_schema_ids(base)
    ids = [fresh.find_field(k).field_id for k in primary_key]
    return Schema(*fresh.fields, identifier_field_ids=ids)


def build_partition_spec(schema: Schema, partition_by: Sequence[str]) -> PartitionSpec:
    """Parse ``["day(ts)", "bucket(16, user_id)", "region"]`` into a PartitionSpec."""
    fields = []
    for i, text in enumerate(partition_by):
        m = _TRANSFORM.match(text)
        if m:
            name, arg, column = m.group(1).lower(), m.group(2), m.group(3)
        elif _PLAIN.match(text):
            name, arg, column = "identity", None, text.strip()
        else:
            raise InvalidNameError(f"cannot parse partition transform {text!r}; e.g. 'day(ts)', 'bucket(16, id)'")
        try:
            source = schema.find_field(column)
        except ValueError as e:
            raise SchemaMismatchError(f"partition column {column!r} is not in the schema", [column]) from e
        transform: Transform[Any, Any]
        if name in _UNARY:
            if arg is not None:
                raise InvalidNameError(f"{name}() takes just a column: {text!r}")
            transform = _UNARY[name]()
            suffix = "" if name == "identity" else f"_{name.rstrip('s')}"
        elif name == "bucket" and arg:
            transform, suffix = BucketTransform(int(arg)), f"_bucket_{arg}"
        elif name == "truncate" and arg:
            transform, suffix = TruncateTransform(int(arg)), f"_trunc_{arg}"
        else:
            raise InvalidNameError(f"unknown partition transform {text!r}")
        if not transform.can_transform(source.field_type):
            raise SchemaMismatchError(f"{text!r}: cannot apply to {source.field_type} column {column!r}", [column])
        fields.append(
            PartitionField(source_id=source.field_id, field_id=1000 + i, transform=transform, name=f"{column}{suffix}")
        )
    return PartitionSpec(*fields)


def build_sort_order(schema: Schema, sort_by: Sequence[str]):
    """A SortOrder from column names (ascending; prefix ``-`` for descending), nulls first."""
    from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder

    fields = []
    for name in sort_by:
        desc = name.startswith("-")
        column = name[1:] if desc else name
        try:
            source = schema.find_field(column)
        except ValueError as e:
            raise SchemaMismatchError(f"sort column {column!r} is not in the schema", [column]) from e
        fields.append(
            SortField(
                source_id=source.field_id,
                transform=IdentityTransform(),
                direction=SortDirection.DESC if desc else SortDirection.ASC,
                null_order=NullOrder.NULLS_FIRST,
            )
        )
    return SortOrder(*fields) if fields else None


def table_properties(schema: Schema, primary_key: Sequence[str], spec: PartitionSpec) -> dict[str, str]:
    """Defaults for sample tables: slim metadata, merged manifests, pruned metadata files.

    Column statistics are kept only for key and partition source columns, as
    ByteDance does for very wide sample tables: they are the only ones used to
    prune, and no update file can make them stale (keys and partition columns
    are never updated in place).
    """
    props = {
        "write.metadata.metrics.default": "none",
        "commit.manifest-merge.enabled": "true",
        "write.metadata.delete-after-commit.enabled": "true",
        "write.metadata.previous-versions-max": "50",
        "commit.retry.num-retries": "10",
        "write.parquet.compression-codec": "zstd",
        "featurelake.primary-key": ",".join(primary_key),
    }
    stat_columns = list(primary_key) + [schema.find_column_name(f.source_id) for f in spec.fields]
    for col in dict.fromkeys(stat_columns):
        if col is None:
            continue
        kind = "truncate(32)" if isinstance(schema.find_field(col).field_type, StringType) else "full"
        props[f"write.metadata.metrics.column.{col}"] = kind
    return props


def arrow_schema(schema: Schema, field_ids: bool = True) -> pa.Schema:
    """The Arrow schema of an Iceberg schema (requiredness as nullability, field ids in metadata)."""
    return schema_to_pyarrow(schema, include_field_ids=field_ids)


def _plain(t: pa.DataType) -> pa.DataType:
    """The type with large/view variants folded, for compatibility checks."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t


def _castable(src: pa.DataType, dst: pa.DataType) -> bool:
    src, dst = _plain(src), _plain(dst)
    if src.equals(dst):
        return True
    if pa.types.is_null(src):
        return True
    if pa.types.is_integer(src) and pa.types.is_integer(dst):
        return dst.bit_width >= src.bit_width and (pa.types.is_signed_integer(dst) or not pa.types.is_signed_integer(src))
    if pa.types.is_floating(src) and pa.types.is_floating(dst):
        return dst.bit_width >= src.bit_width
    if pa.types.is_integer(src) and pa.types.is_floating(dst):
        return src.bit_width <= 32
    if pa.types.is_timestamp(src) and pa.types.is_timestamp(dst):
        return (src.tz is None) == (dst.tz is None)
    if pa.types.is_date(src) and pa.types.is_date(dst):
        return True
    if (pa.types.is_list(src) or pa.types.is_large_list(src)) and (pa.types.is_list(dst) or pa.types.is_large_list(dst)):
        return _castable(src.value_type, dst.value_type)
    if pa.types.is_struct(src) and pa.types.is_struct(dst):
        dst_fields = {f.name: f for f in dst}
        return all(f.name in dst_fields and _castable(f.type, dst_fields[f.name].type) for f in src)
    if pa.types.is_map(src) and pa.types.is_map(dst):
        return _castable(src.key_type, dst.key_type) and _castable(src.item_type, dst.item_type)
    if pa.types.is_decimal(src) and pa.types.is_decimal(dst):
        return src.scale == dst.scale and dst.precision >= src.precision
    return False


def to_table(data: Any) -> pa.Table:
    """Accept a pyarrow Table or RecordBatch, or a pandas DataFrame."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    try:
        import pandas as pd

        if isinstance(data, pd.DataFrame):
            return pa.Table.from_pandas(data, preserve_index=False)
    except ImportError:  # pragma: no cover
        pass
    raise SchemaMismatchError(f"expected a pyarrow Table/RecordBatch or pandas DataFrame, got {type(data).__name__}")


def conform(data: pa.Table, target: pa.Schema, *, allow_missing: bool = True) -> pa.Table:
    """Cast ``data`` to ``target`` (a table's Arrow schema), or raise SchemaMismatchError.

    Columns are matched by name; missing optional columns become nulls when
    ``allow_missing``; unknown columns and incompatible types are refused,
    all offenders named at once.
    """
    names = data.column_names
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise SchemaMismatchError(f"duplicate column names in input: {dup}", dup)
    unknown = [n for n in names if n not in target.names]
    problems: list[str] = []
    fields: list[str] = list(unknown)
    if unknown:
        problems.append(f"unknown column(s) {unknown}")
    columns = []
    for field in target:
        if field.name not in names:
            if not field.nullable or not allow_missing:
                problems.append(f"missing column {field.name!r}")
                fields.append(field.name)
                continue
            columns.append(pa.nulls(data.num_rows, field.type))
            continue
        col = data.column(field.name)
        if not _castable(col.type, field.type):
            problems.append(f"column {field.name!r} is {col.type}, table has {field.type}")
            fields.append(field.name)
            continue
        columns.append(col)
    if problems:
        raise SchemaMismatchError("data does not fit the table schema: " + "; ".join(problems), fields)
    try:
        casted = [c.cast(f.type) if not c.type.equals(f.type) else c for c, f in zip(columns, target)]
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SchemaMismatchError(f"data does not fit the table schema: {e}") from e
    return pa.Table.from_arrays(casted, schema=target)
