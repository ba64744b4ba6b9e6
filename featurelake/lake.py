"""The lake: a pyiceberg catalog plus a warehouse, and the tables in it.

The embedded default keeps everything under one home folder (a SQLite
SqlCatalog and a local warehouse), so a notebook, a test and the Dagster
pipeline can share a lake without any server. Production points the same code
at a PostgreSQL SqlCatalog or a REST catalog with object storage.
"""
from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import pyarrow as pa
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError, TableAlreadyExistsError

from featurelake.errors import InvalidNameError, LakeNotFoundError, TableExistsError, TableNotFoundError
from featurelake.guard import delete_quietly_io, recording, storage_errors, track
from featurelake.schema import (
    build_partition_spec,
    build_sort_order,
    check_user_properties,
    iceberg_schema_from_arrow,
    table_properties,
)

if TYPE_CHECKING:
    from featurelake.table import Table

from featurelake.home import CATALOG_FILE, DEFAULT_HOME, WAREHOUSE_DIR, lake_exists
CATALOG_NAME = "featurelake"
_NAME_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")


def _split_name(name: str) -> tuple[str, str]:
    parts = name.split(".")
    if len(parts) != 2 or not all(_NAME_PART.fullmatch(p) for p in parts):
        raise InvalidNameError(
            f"table name {name!r} must be 'namespace.table' with letters, digits and underscores"
        )
    return parts[0], parts[1]


class Lake:
    """A featurelake lake: a catalog of Iceberg tables and sequence tables.

    ``Lake(home)`` opens (creating on first use) the embedded lake under
    ``home``; with ``create=False`` a missing lake is a LakeNotFoundError and
    nothing is created. ``Lake.from_env()`` follows the deployment's environment.
    """

    def __init__(
        self, home: str | os.PathLike | None = None, *, catalog: Catalog | None = None, create: bool = True
    ) -> None:
        if catalog is not None:
            self.home: Path | None = Path(home).resolve() if home is not None else None
            self.catalog = catalog
            return
        home = Path(home if home is not None else os.environ.get("FEATURELAKE_HOME", DEFAULT_HOME)).resolve()
        if not create and not lake_exists(home):
            raise LakeNotFoundError(f"no lake exists at {home} (no {CATALOG_FILE} there); nothing was created")
        warehouse = home / WAREHOUSE_DIR
        with storage_errors(f"open the lake at {home}"):
            warehouse.mkdir(parents=True, exist_ok=True)
            self.home = home
            self.catalog = _sql_catalog(f"sqlite:///{home / CATALOG_FILE}", warehouse.as_uri())

    @classmethod
    def from_env(cls) -> "Lake":
        """Open the lake the environment names.

        ``FEATURELAKE_CATALOG_URI`` (an SQLAlchemy URL for a SqlCatalog, or an
        ``http(s)://`` REST catalog) with ``FEATURELAKE_WAREHOUSE`` wins;
        otherwise the embedded lake at ``FEATURELAKE_HOME`` (default
        ``./.featurelake``).
        """
        uri = os.environ.get("FEATURELAKE_CATALOG_URI")
        if not uri:
            return cls(os.environ.get("FEATURELAKE_HOME", DEFAULT_HOME))
        warehouse = os.environ.get("FEATURELAKE_WAREHOUSE")
        return cls.from_uri(uri, warehouse)

    @classmethod
    def from_uri(cls, uri: str, warehouse: str | None = None, **properties: str) -> "Lake":
        """Open a lake on a configured catalog (no home folder)."""
        if uri.startswith(("http://", "https://")):
            from pyiceberg.catalog.rest import RestCatalog

            props = dict(properties, uri=uri)
            if warehouse:
                props["warehouse"] = warehouse
            return cls(catalog=RestCatalog(CATALOG_NAME, **props))
        if not warehouse:
            raise ValueError("a SQL catalog needs a warehouse location (FEATURELAKE_WAREHOUSE)")
        if "://" not in warehouse:
            Path(warehouse).mkdir(parents=True, exist_ok=True)
            warehouse = Path(warehouse).resolve().as_uri()
        return cls(catalog=_sql_catalog(uri, warehouse, **properties))

    # ------------------------------------------------------------------ tables
    def create_table(
        self,
        name: str,
        schema: pa.Schema,
        primary_key: str | Sequence[str],
        partition_by: Sequence[str] = (),
        properties: dict[str, str] | None = None,
        sort_by: Sequence[str] = (),
    ) -> "Table":
        """Create a sample table; the primary key becomes Iceberg identifier fields.

        ``partition_by`` takes transforms such as ``day(ts)``,
        ``bucket(16, user_id)`` or ``identity(region)``. ``sort_by`` (e.g.
        ``["user_id", "ts"]``) is the Iceberg sort order every write and
        compaction keeps, so similar rows sit together and compress better.
        Tables get slim metadata: column statistics only for key and
        partition source columns.
        """
        from featurelake.table import Table

        namespace, _ = _split_name(name)
        keys = [primary_key] if isinstance(primary_key, str) else list(primary_key)
        ice_schema = iceberg_schema_from_arrow(schema, keys)
        spec = build_partition_spec(ice_schema, partition_by)
        props = table_properties(ice_schema, keys, spec)
        props.update(check_user_properties(properties or {}))
        order = build_sort_order(ice_schema, sort_by)
        extra = {"sort_order": order} if order is not None else {}
        with storage_errors(f"create table {name}"), recording() as session:
            # checked first: the catalog writes the new metadata.json before it finds the name taken
            if self.catalog.table_exists(name):
                raise TableExistsError(f"table {name!r} already exists")
            try:
                self.catalog.create_namespace(namespace)
            except NamespaceAlreadyExistsError:
                pass
            try:
                ice = self.catalog.create_table(name, schema=ice_schema, partition_spec=spec, properties=props, **extra)
            except BaseException as e:
                self._forget_failed_create(name, session.created())
                if isinstance(e, TableAlreadyExistsError):
                    raise TableExistsError(f"table {name!r} already exists") from e
                raise
        return Table(self, name, ice)

    def _forget_failed_create(self, name: str, created: list[str]) -> None:
        """Delete the metadata a failed create_table wrote, unless the catalog points at it after all."""
        if not created:
            return
        try:
            if self.catalog.table_exists(name) and self.catalog.load_table(name).metadata_location in created:
                return
            io = self.catalog._load_file_io(location=created[0])
        except Exception:  # noqa: BLE001 - cannot tell: keep the files, GC collects orphans later
            return
        delete_quietly_io(io, created)

    @storage_errors("table")
    def table(self, name: str) -> "Table":
        """Open an existing table."""
        from featurelake.table import Table

        _split_name(name)
        try:
            ice = self.catalog.load_table(name)
        except NoSuchTableError as e:
            raise TableNotFoundError(f"no table {name!r} in the lake") from e
        return Table(self, name, ice)

    @storage_errors("table exists")
    def table_exists(self, name: str) -> bool:
        _split_name(name)
        return self.catalog.table_exists(name)

    # ------------------------------------------------------- sequence tables
    def create_sequence_table(
        self,
        name: str,
        schema: pa.Schema,
        key: str,
        time: str,
        partition_by: Sequence[str] = (),
        properties: dict[str, str] | None = None,
        event_id: str = "event_id",
    ):
        """Create a table of user events (one row per event) for normalized sequences.

        ``key`` is the user column, ``time`` the event time. Unless the schema
        has an ``event_id`` column, one is added and filled by ``append``.
        See :mod:`featurelake.sequences`.
        """
        from featurelake.sequences import create_sequence_table

        return create_sequence_table(self, name, schema, key, time, partition_by, properties, event_id)

    def sequence_table(self, name: str):
        """Open an existing sequence table (append, build, lookup, view)."""
        from featurelake.sequences import open_sequence_table

        return open_sequence_table(self, name)

    @storage_errors("tables")
    def tables(self) -> list[str]:
        """Every table in the lake, as ``namespace.table``, sorted."""
        names = []
        for ns in self.catalog.list_namespaces():
            for ident in self.catalog.list_tables(ns):
                names.append(".".join(ident))
        return sorted(names)

    @storage_errors("drop table")
    def drop_table(self, name: str) -> None:
        """Remove a table from the catalog (its files stay until garbage collection)."""
        _split_name(name)
        try:
            self.catalog.drop_table(name)
        except NoSuchTableError as e:
            raise TableNotFoundError(f"no table {name!r} in the lake") from e

    def sql(self, query: str, branch: str = "main") -> pa.Table:
        """Run a SQL query (DuckDB) over lake tables read with their update files merged.

        Name tables ``ns.table`` (at ``branch``) or ``"ns.table@ref"`` (a branch,
        tag or snapshot id). The one correct way to query un-compacted tables
        with SQL: other engines miss the update files. See :mod:`featurelake.sql`.
        """
        from featurelake.sql import sql

        return sql(self, query, branch)

    @storage_errors("collect garbage")
    def collect_garbage(self, older_than: timedelta = timedelta(days=3), dry_run: bool = False):
        """Delete files no retained snapshot of any branch or tag references.

        Only files older than ``older_than`` go (writes in flight are younger).
        ``dry_run`` lists them and their bytes without deleting. Returns a
        GarbageReport.
        """
        from featurelake.gc import collect_garbage

        return collect_garbage(self, older_than, dry_run)

    def __repr__(self) -> str:
        where = str(self.home) if self.home else getattr(self.catalog, "name", "?")
        return f"Lake({where!r})"


def _sql_catalog(uri: str, warehouse: str, **properties: str) -> Catalog:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table import Table as IcebergTable
    from pyiceberg.typedef import EMPTY_DICT

    from featurelake.state import _LRU

    parsed = _LRU(64)

    class CachingSqlCatalog(SqlCatalog):
        """A SqlCatalog that parses each metadata file once.

        Every read and commit loads the table; pyiceberg parses the whole
        metadata JSON each time, and that grows with the schema history (a
        wide table after 60 new-column backfills: 500 KB, ~100 ms a load).
        A metadata file never changes once written, so its parse is cached
        by location; the catalog row is still read every time.
        """

        def _load_file_io(self, properties=EMPTY_DICT, location=None):  # type: ignore[override]
            return track(super()._load_file_io(properties, location))

        def _convert_orm_to_iceberg(self, orm_table):  # type: ignore[override]
            location = orm_table.metadata_location
            metadata = parsed.get(location) if location else None
            if metadata is None:
                table = super()._convert_orm_to_iceberg(orm_table)
                parsed.put(table.metadata_location, table.metadata)
                return table
            return IcebergTable(
                identifier=Catalog.identifier_to_tuple(orm_table.table_namespace) + (orm_table.table_name,),
                metadata=metadata,
                metadata_location=location,
                io=self._load_file_io(metadata.properties, location),
                catalog=self,
            )

    props = {"uri": uri, "warehouse": warehouse}
    if uri.startswith("sqlite"):
        # One lake home is shared by the Dagster webserver, runs and notebooks.
        props.setdefault("pool_pre_ping", "true")
    props.update(properties)
    return CachingSqlCatalog(CATALOG_NAME, **props)
