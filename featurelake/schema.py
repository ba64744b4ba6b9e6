"""Schemas, partition specs and table defaults, and fitting input data to them.

Arrow is the user's language, Iceberg the lake's: this module converts between
them, parses partition transforms written as strings (``day(ts)``), chooses the
slim-metadata table properties, and checks that incoming Arrow data fits a
table before anything is written.
"""
from __future__ import annotations


import re
import sys
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

from featurelake import _compat  # noqa: F401  (patches pyiceberg before any data passes through it)
from featurelake.errors import InvalidArgumentError, InvalidNameError, NullKeyError, SchemaMismatchError
from featurelake.writer_settings import DEFAULTS as DEFAULT_WRITER

# Tells other engines (and people reading metadata) that column updates live in update files
MERGE_ON_READ_PROPERTY = "featurelake.merge-on-read"
EXTERNAL_READERS_NOTE_PROPERTY = "featurelake.external-readers"
EXTERNAL_READERS_NOTE = (
    "column updates are merge-on-read update files that Iceberg readers do not see: until compact, "
    "read with featurelake (Table.read, Lake.sql, featurelake sql); snapshot summaries count "
    "featurelake.pending-update-files"
)
LOCATOR_FILE = "_file"
LOCATOR_POS = "_pos"
RESERVED_PREFIX = "_"

_TRANSFORM = re.compile(r"\s*(\w+)\s*\(\s*(?:([0-9]+)\s*,\s*)?([A-Za-z_][\w.]*)\s*\)\s*")
_PLAIN = re.compile(r"\s*([A-Za-z_][\w.]*)\s*")
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
    check_column_names(schema.names)
    repeated = sorted({k for k in primary_key if list(primary_key).count(k) > 1})
    if repeated:
        raise InvalidArgumentError(f"primary key names column(s) {repeated} more than once")
    schema = lake_schema(schema)
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
        m = _TRANSFORM.fullmatch(text)
        if m:
            name, arg, column = m.group(1).lower(), m.group(2), m.group(3)
        elif _PLAIN.fullmatch(text):
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
        elif name in ("bucket", "truncate") and arg:
            width = int(arg)
            if not 1 <= width <= 2**31 - 1:
                raise InvalidArgumentError(f"{name}() needs a width from 1 to 2147483647: {text!r}")
            if name == "bucket":
                transform, suffix = BucketTransform(width), f"_bucket_{width}"
            else:
                transform, suffix = TruncateTransform(width), f"_trunc_{width}"
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
        "write.parquet.compression-codec": DEFAULT_WRITER.codec,  # see featurelake.writer_settings
        "featurelake.primary-key": ",".join(primary_key),
        MERGE_ON_READ_PROPERTY: "true",
        EXTERNAL_READERS_NOTE_PROPERTY: EXTERNAL_READERS_NOTE,
    }
    stat_columns = list(primary_key) + [schema.find_column_name(f.source_id) for f in spec.fields]
    for col in dict.fromkeys(stat_columns):
        if col is None:
            continue
        kind = "truncate(32)" if isinstance(schema.find_field(col).field_type, StringType) else "full"
        props[f"write.metadata.metrics.column.{col}"] = kind
    return props


RESERVED_PROPERTIES = ("featurelake.primary-key",)
FORMAT_VERSION = "2"


def check_user_properties(properties: dict[str, str]) -> dict[str, str]:
    """Refuse table properties that would contradict the platform (key, format version) or break Iceberg."""
    if not isinstance(properties, dict):
        raise InvalidArgumentError(f"properties must be a dict of str to str, got {type(properties).__name__}")
    wrong = [k for k, v in properties.items() if not isinstance(k, str) or not isinstance(v, str)]
    if wrong:
        raise InvalidArgumentError(f"table property keys and values must be strings: {wrong}")
    reserved = [k for k in properties if k in RESERVED_PROPERTIES]
    if reserved:
        raise InvalidArgumentError(f"table properties {reserved} are set by featurelake (use primary_key=...)")
    from featurelake.staleness import staleness_policy

    staleness_policy(properties)  # a bad external-reader policy fails here, not in the sensor
    version = properties.get("format-version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise InvalidArgumentError(f"featurelake tables are Iceberg format version 2, not {version!r}")
    return properties


def arrow_schema(schema: Schema, field_ids: bool = True) -> pa.Schema:
    """The Arrow schema of an Iceberg schema (requiredness as nullability, field ids in metadata).

    Cached by the schema's fields: the conversion walks the whole schema
    (0.5-2 ms for 70 columns, paid several times per commit otherwise);
    Arrow schemas are immutable, so sharing one is safe.
    """
    try:
        key = (tuple(schema.fields), field_ids)
        hash(key)
    except TypeError:  # a field type that cannot be hashed: convert without the cache
        return schema_to_pyarrow(schema, include_field_ids=field_ids)
    found = _ARROW_SCHEMAS.get(key)
    if found is None:
        found = schema_to_pyarrow(schema, include_field_ids=field_ids)
        if len(_ARROW_SCHEMAS) >= 256:
            _ARROW_SCHEMAS.clear()
        _ARROW_SCHEMAS[key] = found
    return found


_ARROW_SCHEMAS: dict[tuple, pa.Schema] = {}


def _plain(t: pa.DataType) -> pa.DataType:
    """The type with large/view variants folded, for compatibility checks."""
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t


def _castable(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether values of ``src`` may be cast to ``dst``; narrowing casts are allowed here
    because :func:`cast_column` range-checks every value (nothing lossy gets through)."""
    src, dst = _plain(src), _plain(dst)
    if src.equals(dst):
        return True
    if pa.types.is_null(src):
        return True
    if pa.types.is_integer(src) and (pa.types.is_integer(dst) or pa.types.is_floating(dst)):
        return True  # range- and precision-checked per value (pandas gives int64 for an int32 column)
    if pa.types.is_floating(src) and (pa.types.is_floating(dst) or pa.types.is_integer(dst)):
        return True  # overflow and fractions refused per value (pandas gives float64, and float64 for ints with NaN)
    if pa.types.is_timestamp(src) and pa.types.is_timestamp(dst):
        return True  # naive timestamps are UTC on either side; sub-unit precision refused per value
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
    """Accept a pyarrow Table or RecordBatch, a pandas DataFrame, or any object that exports an
    Arrow stream (``__arrow_c_stream__``: polars, DuckDB, ...), without importing its library."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if _is_pandas(data):
        return pa.Table.from_pandas(data, preserve_index=False)
    if hasattr(data, "__arrow_c_stream__"):
        try:
            return pa.RecordBatchReader.from_stream(data).read_all()
        except (pa.ArrowException, TypeError, ValueError) as e:
            raise SchemaMismatchError(f"cannot read the Arrow stream of a {type(data).__name__}: {e}") from e
    raise SchemaMismatchError(
        "expected a pyarrow Table/RecordBatch, a pandas or polars DataFrame, "
        f"or an object with __arrow_c_stream__; got {type(data).__name__}"
    )


def is_arrow_stream(data: Any) -> bool:
    """An object exporting an Arrow stream that is not a Table, RecordBatch or DataFrame (read it in batches)."""
    return (
        hasattr(data, "__arrow_c_stream__")
        and not isinstance(data, (pa.Table, pa.RecordBatch))
        and type(data).__name__ != "DataFrame"
    )


def _is_pandas(data: Any) -> bool:
    pd = sys.modules.get("pandas")  # a pandas frame exists only if pandas was imported
    return pd is not None and isinstance(data, pd.DataFrame)


def conform(data: pa.Table, target: pa.Schema, *, allow_missing: bool = True, keys: Sequence[str] = ()) -> pa.Table:
    """Cast ``data`` to ``target`` (a table's Arrow schema), or raise SchemaMismatchError.

    Columns are matched by name; missing optional columns become nulls when
    ``allow_missing``; unknown columns, incompatible types, values the cast
    would change and nulls in required columns are refused, all offenders
    named at once (nulls in ``keys`` as NullKeyError).
    """
    names = data.column_names
    check_column_names(names)
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
    casted = [cast_column(c, f.type, f.name) for c, f in zip(columns, target)]
    check_required(casted, target, keys)
    return pa.Table.from_arrays(casted, schema=target)


def cast_column(col: pa.ChunkedArray | pa.Array, dtype: pa.DataType, name: str):
    """``col`` as ``dtype``, refusing any value the cast would change (overflow, lost precision)."""
    if col.type.equals(dtype):
        return col
    src = col.type
    if pa.types.is_timestamp(src) and pa.types.is_timestamp(dtype) and (src.tz is None) != (dtype.tz is None):
        # naive means UTC: relabel first, then the same-kind cast below checks the unit
        col = col.cast(pa.timestamp(src.unit, tz=dtype.tz))
    try:
        out = col.cast(dtype, safe=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
        raise SchemaMismatchError(f"column {name!r} does not fit {dtype} without losing values: {e}", [name]) from e
    if pa.types.is_floating(src) and pa.types.is_floating(dtype) and dtype.bit_width < src.bit_width:
        import pyarrow.compute as pc

        overflow = pc.sum(pc.and_(pc.is_finite(col), pc.invert(pc.is_finite(out)))).as_py() or 0
        if overflow:
            raise SchemaMismatchError(
                f"column {name!r} does not fit {dtype} without losing values: {overflow} value(s) out of its range", [name]
            )
    return out


def check_required(columns: Sequence[pa.ChunkedArray | pa.Array], fields: Sequence[pa.Field], keys: Sequence[str] = ()) -> None:
    """Refuse nulls in required (non-nullable) fields, naming every offending column.

    A null in a primary-key column is a NullKeyError, any other a SchemaMismatchError.
    """
    bad = [f.name for c, f in zip(columns, fields) if not f.nullable and c.null_count]
    null_keys = [k for k in bad if k in keys]
    if null_keys:
        count = max(c.null_count for c, f in zip(columns, fields) if f.name in null_keys)
        raise NullKeyError(f"input has {count} row(s) with a null primary key column {null_keys[0]!r}", count=count)
    if bad:
        raise SchemaMismatchError(f"required (NOT NULL) column(s) {bad} hold nulls", bad)


def check_column_names(names: Sequence[str]) -> None:
    """Refuse duplicate, empty or control-character column names in input data."""
    dup = sorted({n for n in names if list(names).count(n) > 1})
    if dup:
        raise SchemaMismatchError(f"duplicate column names in input: {dup}", dup)
    bad = [n for n in names if not n or any(ord(ch) < 32 or ord(ch) == 127 for ch in n)]
    if bad:
        raise InvalidNameError(f"column names may not be empty or hold control characters: {bad}")


def lake_type(t: pa.DataType) -> pa.DataType:
    """The Arrow type a new column of type ``t`` gets in the lake (Iceberg v2 has no nanoseconds)."""
    if pa.types.is_timestamp(t) and t.unit == "ns":
        return pa.timestamp("us", tz=t.tz)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item = t.value_field.with_type(lake_type(t.value_type))
        return pa.large_list(item) if pa.types.is_large_list(t) else pa.list_(item)
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(lake_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(lake_type(t.key_type), t.item_field.with_type(lake_type(t.item_type)))
    return t


def stored_type(t: pa.DataType, name: str) -> pa.DataType:
    """The Arrow type the lake stores a new column of input type ``t`` as (e.g. uint64 -> int64)."""
    try:
        ice = _pyarrow_to_schema_without_ids(pa.schema([pa.field(name, lake_type(t))]))
    except Exception as e:  # pyiceberg refuses types Iceberg has no counterpart for
        raise SchemaMismatchError(f"column {name!r} has type {t}, which an Iceberg table cannot store ({e})", [name]) from e
    return schema_to_pyarrow(ice, include_field_ids=False).field(name).type


def lake_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every type the lake cannot store replaced by its lossless equivalent."""
    return pa.schema([f.with_type(lake_type(f.type)) for f in schema], metadata=schema.metadata)
