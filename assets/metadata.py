"""Metadata that reads well in the Dagster UI.

Byte counts stay exact integers (plots and comparisons use them) and get a
``<name>_mib`` companion in MiB, the size a person reads at a glance; mappings
of records (per table, per feature) become ``MetadataValue.table`` so the UI
shows a grid instead of raw JSON.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from dagster import MetadataValue, TableColumn, TableRecord, TableSchema

MIB = 1024 * 1024


def mib(n: int) -> float:
    """``n`` bytes in MiB, rounded to 3 decimals (1 KiB resolution)."""
    return round(int(n) / MIB, 3)


def with_mib(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` with a ``<key>_mib`` float next to every integer entry whose key names bytes."""
    out: dict[str, Any] = {}
    for key, value in metadata.items():
        out[key] = value
        raw = value.value if isinstance(value, MetadataValue) else value
        if "bytes" in key and isinstance(raw, int) and not isinstance(raw, bool) and not key.endswith("_mib"):
            out[f"{key}_mib"] = MetadataValue.float(mib(raw))
    return out


def records_table(records: Mapping[str, Mapping[str, Any]], key: str = "table",
                  columns: Optional[Sequence[str]] = None) -> MetadataValue:
    """A ``{name: {column: value}}`` mapping as a UI table, one row per name (bytes also in MiB)."""
    names = list(columns) if columns is not None else []
    if columns is None:
        for record in records.values():
            names += [c for c in record if c not in names]
    rows = []
    for name, record in records.items():
        row = {key: str(name)}
        for c in names:
            value = record.get(c)
            row[c] = value if isinstance(value, (int, float, str, bool)) or value is None else str(value)
            if "bytes" in c and isinstance(value, int) and not isinstance(value, bool):
                row[f"{c}_mib"] = mib(value)
        rows.append(TableRecord(row))
    types = {bool: "bool", int: "int", float: "float"}
    schema_cols = [TableColumn(key, "string")]
    for c in names:
        sample = next((r.get(c) for r in records.values() if r.get(c) is not None), "")
        schema_cols.append(TableColumn(c, types.get(type(sample), "string")))
        if "bytes" in c and isinstance(sample, int):
            schema_cols.append(TableColumn(f"{c}_mib", "float"))
    return MetadataValue.table(records=rows, schema=TableSchema(columns=schema_cols))


__all__ = ["mib", "with_mib", "records_table", "MIB"]
