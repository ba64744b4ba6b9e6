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

from featurelake.errors import (
    CatalogConfigError,
    CatalogUnavailableError,
    InvalidNameError,
    LakeNotFoundError,
    TableExistsError,
    TableNotFoundError,
)
from featurelake.guard import delete_quietly_io, recording, storage_errors, track
from featurelake.schema import (
    build_partition_spec,
    build_sort_order,
    check_user_properties,
    iceberg_schema_from_arrow,
    table_properties,
)
from featurelake.secrets import redact, scrub, secrets_in

if TYPE_CHECKING:
    from featurelake.table import Table

from featurelake.home import CATALOG_FILE, DEFAULT_HOME, WAREHOUSE_DIR, lake_exists

SQLITE_BUSY_TIMEOUT_S = 60  # how long the embedded catalog waits for another process's write lock
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

    ``cache_dir`` is the local folder for what must live on a local disk
    although the tables live on an object store: sequence store builds
    (RocksDB, built from the table's events). Default: the embedded lake's
    home, else ``$FEATURELAKE_CACHE_DIR``.
    """

    def __init__(
        self,
        home: str | os.PathLike | None = None,
        *,
        catalog: Catalog | None = None,
        create: bool = True,
        cache_dir: str | os.PathLike | None = None,
    ) -> None:
        if catalog is not None:
            self.home: Path | None = Path(home).resolve() if home is not None else None
            self.catalog = catalog
            #: where the lake's tables live; garbage collection walks only this folder for orphans
            self.warehouse: str | None = catalog.properties.get("warehouse")
            self.cache_dir = _cache_dir(cache_dir, self.home)
            return
        home = Path(home if home is not None else os.environ.get("FEATURELAKE_HOME", DEFAULT_HOME)).resolve()
        if not create and not lake_exists(home):
            raise LakeNotFoundError(f"no lake exists at {home} (no {CATALOG_FILE} there); nothing was created")
        warehouse = home / WAREHOUSE_DIR
        with storage_errors(f"open the lake at {home}"):
            warehouse.mkdir(parents=True, exist_ok=True)
            self.home = home
            self.warehouse = str(warehouse)
            self.catalog = _sql_catalog(_sqlite_url(home / CATALOG_FILE), self.warehouse)
        self.cache_dir: Path | None = _cache_dir(cache_dir, self.home)

    @classmethod
    def from_env(cls) -> "Lake":
        """Open the lake the environment names.

        ``FEATURELAKE_CATALOG_URI`` (an SQLAlchemy URL for a SqlCatalog, or an
        ``http(s)://`` REST catalog) with ``FEATURELAKE_WAREHOUSE`` wins;
        otherwise the embedded lake at ``FEATURELAKE_HOME`` (default
        ``./.featurelake``).
        """
        named = os.environ.get("FEATURELAKE_CATALOG")
        warehouse = os.environ.get("FEATURELAKE_WAREHOUSE")
        if named:
            return cls.from_catalog(named, **({"warehouse": warehouse} if warehouse else {}))
        uri = os.environ.get("FEATURELAKE_CATALOG_URI")
        if not uri:
            return cls(os.environ.get("FEATURELAKE_HOME", DEFAULT_HOME))
        return cls.from_uri(uri, warehouse)

    @classmethod
    def from_catalog(cls, name: str, *, cache_dir: str | os.PathLike | None = None, **properties: str) -> "Lake":
        """Open the lake of a pyiceberg catalog configured by name, the way pyiceberg users do:
        ``.pyiceberg.yaml`` or ``PYICEBERG_CATALOG__<NAME>__<PROPERTY>`` environment
        variables (read now, so secrets come from the environment at run time)."""
        from pyiceberg.catalog import load_catalog
        from pyiceberg.utils.config import Config

        configured = Config().get_catalog_config(name)
        if not configured and not properties:
            raise CatalogConfigError(
                f"no pyiceberg catalog named {name!r}: configure it in .pyiceberg.yaml or PYICEBERG_CATALOG__{name.upper()}__URI"
            )
        return cls(catalog=load_catalog(name, **{**(configured or {}), **properties}), cache_dir=cache_dir)

    @classmethod
    def from_uri(
        cls, uri: str, warehouse: str | None = None, *, cache_dir: str | os.PathLike | None = None, **properties: str
    ) -> "Lake":
        """Open a lake on a configured catalog (no home folder).

        A catalog that cannot be opened raises :class:`CatalogUnavailableError`, whose message
        carries neither the URI's password nor any secret property (see featurelake.secrets).
        """
        if not uri.startswith(("http://", "https://")) and not warehouse:
            raise ValueError("a SQL catalog needs a warehouse location (FEATURELAKE_WAREHOUSE)")
        try:
            return cls(catalog=_open_catalog(uri, warehouse, **properties), cache_dir=cache_dir)
        except Exception as e:  # the driver's own error: translated below, outside this handler
            failure = f"{type(e).__name__}: {e}"
        raise CatalogUnavailableError(
            f"cannot open the catalog {redact(uri)}: {scrub(failure, secrets_in(uri, properties))}"
        )

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

    # -------------------------------------------------------- feature tables
    def create_feature_table(
        self,
        name: str,
        schema: pa.Schema,
        key: str,
        time: str | None = None,
        partition_by: Sequence[str] = (),
        properties: dict[str, str] | None = None,
    ):
        """Create a table of entity features (item, author, ad), versioned by ``time`` or, without one, by append.

        Embeddings are declared as fixed-size lists. Joined to training rows
        at read time with ``t.batches(features={"item": ft.view(...)})``.
        See :mod:`featurelake.sequences.features`.
        """
        from featurelake.sequences.features import create_feature_table

        return create_feature_table(self, name, schema, key, time, partition_by, properties)

    def feature_table(self, name: str):
        """Open an existing feature table (append, build, lookup, view)."""
        from featurelake.sequences.features import open_feature_table

        return open_feature_table(self, name)

    @storage_errors("tables")
    def tables(self) -> list[str]:
        """Every table in the lake, as ``namespace.table``, sorted."""
        names = []
        for ns in self.catalog.list_namespaces():
            for ident in self.catalog.list_tables(ns):
                names.append(".".join(ident))
        return sorted(names)

    @storage_errors("drop table")
    def drop_table(self, name: str, purge: bool = False) -> int:
        """Remove a table from the catalog; returns the number of files deleted.

        ``purge=False`` keeps its files: garbage collection removes the folder
        once it is older than the grace period. ``purge=True`` deletes them now
        (after the catalog drop, so no reader sees a half-deleted table; files
        a failed purge leaves behind are collected later).
        """
        _split_name(name)
        try:
            ice = self.catalog.load_table(name) if purge else None
            self.catalog.drop_table(name)
        except NoSuchTableError as e:
            raise TableNotFoundError(f"no table {name!r} in the lake") from e
        if ice is None:
            return 0
        from featurelake.gc import purge_files

        return purge_files(self, name, ice)

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

    def describe(self) -> str:
        """Where this lake lives, for people and logs, credentials redacted (featurelake.secrets)."""
        if self.home is not None:
            return f"embedded lake at {self.home}"
        props = getattr(self.catalog, "properties", {}) or {}
        where = props.get("uri") or getattr(self.catalog, "name", "?")
        return redact(f"catalog {where} (warehouse {props.get('warehouse') or 'default'})")

    def __repr__(self) -> str:
        where = str(self.home) if self.home else getattr(self.catalog, "name", "?")
        return f"Lake({where!r})"


def _sqlite_url(path: Path) -> str:
    """The SQLAlchemy URL of a SQLite file, escaped: a raw ``a%20b`` would open ``a b``'s catalog."""
    from sqlalchemy.engine import URL

    return URL.create("sqlite", database=str(path)).render_as_string(hide_password=False)


def _env_properties() -> dict[str, str]:
    """Catalog and FileIO properties from ``PYICEBERG_CATALOG__FEATURELAKE__*`` (e.g. the
    S3 endpoint and keys of the ``FEATURELAKE_CATALOG_URI`` shortcut), read at run time."""
    from pyiceberg.utils.config import Config

    conf = Config().get_catalog_config(CATALOG_NAME) or {}
    return {k: str(v) for k, v in conf.items() if not isinstance(v, dict) and k not in ("uri", "warehouse", "type")}


def _cache_dir(explicit: str | os.PathLike | None, home: Path | None) -> Path | None:
    """The lake's local cache folder: as given, else the embedded home, else ``$FEATURELAKE_CACHE_DIR``."""
    if explicit is not None:
        return Path(explicit).expanduser().resolve()
    if home is not None:
        return home
    env = os.environ.get("FEATURELAKE_CACHE_DIR")
    return Path(env).expanduser().resolve() if env else None


def _open_catalog(uri: str, warehouse: str | None, **properties: str) -> Catalog:
    props = dict(_env_properties(), **properties)
    if uri.startswith(("http://", "https://")):
        from pyiceberg.catalog.rest import RestCatalog

        props["uri"] = uri
        if warehouse:
            props["warehouse"] = warehouse
        return RestCatalog(CATALOG_NAME, **props)
    if "://" not in warehouse:
        # a plain path, never a file: URI: pyiceberg takes a file: URI's path literally
        # (no percent-decoding), so `a b` would land in a sibling folder named `a%20b`
        Path(warehouse).mkdir(parents=True, exist_ok=True)
        warehouse = str(Path(warehouse).resolve())
    return _sql_catalog(uri, warehouse, **props)


def _sql_catalog(uri: str, warehouse: str, **properties: str) -> Catalog:
    from pyiceberg.catalog.sql import SqlCatalog
    from pyiceberg.table import Table as IcebergTable
    from pyiceberg.typedef import EMPTY_DICT

    from featurelake.metadata_json import write_table_metadata
    from featurelake.lru import LRU

    parsed = LRU(64)

    class CachingSqlCatalog(SqlCatalog):
        """A SqlCatalog that parses each metadata file once and serialises each schema once.

        Every read and commit loads the table; pyiceberg parses the whole
        metadata JSON each time, and that grows with the schema history (a
        wide table after 60 new-column backfills: 500 KB, ~100 ms a load).
        A metadata file never changes once written, so its parse is cached
        by location; the catalog row is still read every time.
        """

        def _load_file_io(self, properties=EMPTY_DICT, location=None):  # type: ignore[override]
            return track(super()._load_file_io(properties, location))

        def _init_catalog(self) -> None:
            if self.engine.url.get_backend_name() == "sqlite":
                _wait_when_busy(self.engine)
            super()._init_catalog()

        @staticmethod
        def _write_metadata(metadata, io, metadata_path: str) -> None:  # type: ignore[override]
            # each schema of the history serialised once, not on every commit (featurelake.metadata_json)
            write_table_metadata(metadata, io.new_output(metadata_path))

        def commit_table(self, table, requirements, updates):  # type: ignore[override]
            # the metadata a commit writes is the next load's: keep it parsed (one parse less per commit)
            response = super().commit_table(table, requirements, updates)
            parsed.put(response.metadata_location, response.metadata)
            return response

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


def _wait_when_busy(engine) -> None:
    """Make every SQLite connection wait for a lock held by another process instead of failing.

    sqlite3's default is 5 s, after which a raw ``database is locked`` error
    surfaced; a Dagster run, the webserver and a notebook share one catalog.
    """
    from sqlalchemy import event

    @event.listens_for(engine, "connect")
    def _busy_timeout(dbapi_connection, _record) -> None:
        dbapi_connection.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_S * 1000}")
