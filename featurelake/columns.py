"""Logical feature delete: hide a column by renaming it, restore it, purge it later.

As ByteDance does, a deleted feature is first renamed to a reserved hidden
name: training code that reads by name stops seeing it at once, nothing is
rewritten, and because updates are matched by field id, restoring it brings
back its data and every update. ``purge_column`` drops it from the schema
after a grace period; compaction and garbage collection then reclaim bytes.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

from pyiceberg.table import Table as IcebergTable

from featurelake.commit import optimistic
from featurelake.errors import FeatureLakeError, InvalidNameError, SchemaMismatchError

if TYPE_CHECKING:
    from featurelake.table import Table

HIDDEN_PREFIX = "__deleted__"
_PROP = "featurelake.deleted."


def is_hidden(name: str) -> bool:
    return name.startswith(HIDDEN_PREFIX)


def hidden_name(name: str, field_id: int) -> str:
    return f"{HIDDEN_PREFIX}{name}__{field_id}"


def original_name(hidden: str) -> str:
    return hidden[len(HIDDEN_PREFIX) :].rsplit("__", 1)[0]


def soft_deleted(ice: IcebergTable) -> dict[str, str]:
    """Original name -> hidden name of every soft-deleted column."""
    return {original_name(f.name): f.name for f in ice.schema().fields if is_hidden(f.name)}


def soft_delete_column(table: "Table", name: str) -> str:
    """Hide column ``name``; returns its hidden name."""

    def attempt(ice: IcebergTable) -> str:
        schema = ice.schema()
        field = next((f for f in schema.fields if f.name == name), None)
        if field is None:
            raise SchemaMismatchError(f"{table.name} has no column {name!r}", [name])
        if name in table.primary_key:
            raise SchemaMismatchError(f"primary key column {name!r} cannot be deleted", [name])
        spec_sources = {schema.find_column_name(f.source_id) for f in ice.spec().fields}
        if name in spec_sources:
            raise SchemaMismatchError(f"partition source column {name!r} cannot be deleted", [name])
        hidden = hidden_name(name, field.field_id)
        tx = ice.transaction()
        with tx.update_schema() as us:
            us.rename_column(name, hidden)
        tx.set_properties({_PROP + hidden: datetime.now(timezone.utc).isoformat(timespec="seconds")})
        tx.commit_transaction()
        return hidden

    return optimistic(table.refresh, attempt, f"soft-delete {table.name}.{name}")


def restore_column(table: "Table", name: str) -> None:
    """Bring back a soft-deleted column with its data and updates."""

    def attempt(ice: IcebergTable) -> None:
        hidden = soft_deleted(ice).get(name)
        if hidden is None:
            raise SchemaMismatchError(f"{table.name} has no soft-deleted column {name!r}", [name])
        if name in {f.name for f in ice.schema().fields}:
            raise InvalidNameError(f"cannot restore {name!r}: a new column of that name exists; rename it first")
        tx = ice.transaction()
        with tx.update_schema() as us:
            us.rename_column(hidden, name)
        tx.remove_properties(_PROP + hidden)
        tx.commit_transaction()

    optimistic(table.refresh, attempt, f"restore {table.name}.{name}")


def purge_column(table: "Table", name: str, grace: timedelta = timedelta(days=7)) -> None:
    """Drop a soft-deleted column from the schema once it has been hidden for ``grace``."""

    def attempt(ice: IcebergTable) -> None:
        hidden = soft_deleted(ice).get(name)
        if hidden is None:
            raise SchemaMismatchError(f"{table.name} has no soft-deleted column {name!r}: soft-delete it first", [name])
        since = datetime.fromisoformat(ice.metadata.properties.get(_PROP + hidden, "1970-01-01T00:00:00+00:00"))
        if datetime.now(timezone.utc) - since < grace:
            raise FeatureLakeError(f"{name!r} was deleted at {since.isoformat()}; it can be purged after {grace}")
        tx = ice.transaction()
        with tx.update_schema() as us:
            us.delete_column(hidden)
        tx.remove_properties(_PROP + hidden)
        tx.commit_transaction()

    optimistic(table.refresh, attempt, f"purge {table.name}.{name}")
