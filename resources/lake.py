"""``LakeResource``: the Dagster handle on a featurelake :class:`~featurelake.Lake`.

The resource only decides *which* lake to open; all work is done by the engine.

* ``home`` set            -> embedded lake ``Lake(home)`` (SQLite catalog + local warehouse)
* ``catalog_name`` set    -> the pyiceberg catalog of that name (``.pyiceberg.yaml`` or
                             ``PYICEBERG_CATALOG__<NAME>__*`` variables, read at run time)
* ``catalog_uri`` set     -> a lake on that catalog (PostgreSQL/SQLite SqlCatalog, REST)
                             with ``warehouse`` as its data location
* nothing set             -> ``Lake.from_env()`` when FEATURELAKE_HOME,
                             FEATURELAKE_CATALOG or FEATURELAKE_CATALOG_URI is set, else the embedded lake in
                             ``./.featurelake``

Opening a lake (catalog connection, metadata) is not free, so lakes are cached per
process, keyed by their resolved configuration.

Secrets stay out of Dagster: :func:`lake_resource_from_env` binds the catalog URI as
``EnvVar("FEATURELAKE_CATALOG_URI")`` (resolved at run time, so the job snapshot stores only
the variable's name), and :meth:`LakeResource.describe` redacts credentials
(featurelake.secrets), so materialization metadata, logs and Failure messages never carry them.
"""
from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from dagster import ConfigurableResource, EnvVar
from pydantic import Field

if TYPE_CHECKING:  # the engine is imported lazily: loading definitions stays cheap
    from featurelake import Lake

DEFAULT_HOME = "./.featurelake"

_CACHE: dict[tuple, "Lake"] = {}
_CACHE_LOCK = threading.Lock()


def clear_lake_cache() -> None:
    """Forget every cached lake (tests; after a process forks a new configuration)."""
    with _CACHE_LOCK:
        _CACHE.clear()


def _resolved_home(home: str) -> str:
    return str(Path(os.path.expanduser(home)).resolve())


class LakeResource(ConfigurableResource):
    """Opens the featurelake lake this deployment uses."""

    home: Optional[str] = Field(
        default=None,
        description="Folder of an embedded lake (SQLite catalog + local warehouse).",
    )
    catalog_name: Optional[str] = Field(
        default=None,
        description="Name of a pyiceberg catalog configured in .pyiceberg.yaml or PYICEBERG_CATALOG__<NAME>__* "
        "environment variables (how pyiceberg users configure catalogs; secrets stay in the environment).",
    )
    catalog_uri: Optional[str] = Field(
        default=None,
        description="Catalog URI (e.g. postgresql+psycopg2://..., sqlite:///..., http(s):// REST). "
        "A URI with a password belongs in the environment: pass EnvVar('FEATURELAKE_CATALOG_URI').",
    )
    warehouse: Optional[str] = Field(
        default=None,
        description="Warehouse location used with catalog_uri (local path or object store URI).",
    )
    landing: Optional[str] = Field(
        default=None,
        description="Folder for raw landing files; default <lake home>/landing "
        "(or FEATURELAKE_LANDING).",
    )

    # -- which lake ----------------------------------------------------------------
    def _key(self) -> tuple:
        if self.home:
            return ("home", _resolved_home(self.home))
        if self.catalog_name:
            return ("named", _value(self.catalog_name), _value(self.warehouse) or "")
        if self.catalog_uri:
            return ("catalog", _value(self.catalog_uri), _value(self.warehouse) or "")
        if os.environ.get("FEATURELAKE_HOME"):
            return ("home", _resolved_home(os.environ["FEATURELAKE_HOME"]))
        if os.environ.get("FEATURELAKE_CATALOG"):
            return ("named", os.environ["FEATURELAKE_CATALOG"], os.environ.get("FEATURELAKE_WAREHOUSE", ""))
        if os.environ.get("FEATURELAKE_CATALOG_URI"):
            return (
                "catalog",
                os.environ["FEATURELAKE_CATALOG_URI"],
                os.environ.get("FEATURELAKE_WAREHOUSE", ""),
            )
        return ("home", _resolved_home(DEFAULT_HOME))

    def describe(self) -> str:
        """Where this resource points, for logs and metadata."""
        from featurelake.secrets import redact

        key = self._key()
        if key[0] == "home":
            return f"embedded lake at {key[1]}"
        if key[0] == "named":
            return f"pyiceberg catalog {key[1]!r}" + (f" (warehouse {redact(key[2])})" if key[2] else "")
        return redact(f"catalog {key[1]} (warehouse {key[2] or 'default'})")

    def lake(self) -> "Lake":
        """The :class:`featurelake.Lake` for this configuration (cached per process)."""
        key = self._key()
        with _CACHE_LOCK:
            lake = _CACHE.get(key)
            if lake is None:
                lake = _open(key)
                _CACHE[key] = lake
            return lake

    def landing_dir(self) -> Path:
        """Folder where raw source files land (created on demand)."""
        if self.landing:
            root = Path(self.landing)
        elif os.environ.get("FEATURELAKE_LANDING"):
            root = Path(os.environ["FEATURELAKE_LANDING"])
        else:
            key = self._key()
            if key[0] == "home":
                root = Path(key[1]) / "landing"
            else:
                home = getattr(self.lake(), "home", None)
                if not home:
                    raise ValueError(
                        "LakeResource: no landing folder for a catalog-configured lake; "
                        "set the resource's `landing` field or FEATURELAKE_LANDING"
                    )
                root = Path(home) / "landing"
        root = root.expanduser().resolve()
        root.mkdir(parents=True, exist_ok=True)
        return root


def _value(field: Optional[str]) -> Optional[str]:
    """A field's value; an ``EnvVar`` not yet resolved by Dagster (the resource used outside a
    run, e.g. in a notebook) is read from the environment now."""
    return field.get_value() if isinstance(field, EnvVar) else field


def _open(key: tuple) -> "Lake":
    from featurelake import Lake

    if key[0] == "home":
        return Lake(key[1])
    if key[0] == "named":
        _, name, warehouse = key
        return Lake.from_catalog(name, **({"warehouse": warehouse} if warehouse else {}))
    _, uri, warehouse = key
    return Lake.from_uri(uri, warehouse or None)


def lake_resource_from_env(env: Optional[dict] = None) -> LakeResource:
    """The ``LakeResource`` for this deployment, chosen from the environment.

    FEATURELAKE_HOME -> embedded lake there; else FEATURELAKE_CATALOG -> the pyiceberg
    catalog of that name; else FEATURELAKE_CATALOG_URI (+
    FEATURELAKE_WAREHOUSE) -> that catalog; else the embedded lake in ./.featurelake.
    FEATURELAKE_LANDING overrides where raw landing files go.

    With ``env`` None (a deployment) the catalog URI and warehouse are bound as ``EnvVar``s:
    Dagster reads them at run time and stores only their names in job snapshots. An explicit
    ``env`` mapping is used as given.
    """
    from_process = env is None
    env = os.environ if env is None else env
    landing = env.get("FEATURELAKE_LANDING") or None
    if env.get("FEATURELAKE_HOME"):
        return LakeResource(home=env["FEATURELAKE_HOME"], landing=landing)
    if env.get("FEATURELAKE_CATALOG"):
        warehouse = env.get("FEATURELAKE_WAREHOUSE") or None
        return LakeResource(catalog_name=env["FEATURELAKE_CATALOG"], warehouse=warehouse, landing=landing)
    if env.get("FEATURELAKE_CATALOG_URI"):
        if from_process:
            warehouse = EnvVar("FEATURELAKE_WAREHOUSE") if env.get("FEATURELAKE_WAREHOUSE") else None
            return LakeResource(catalog_uri=EnvVar("FEATURELAKE_CATALOG_URI"), warehouse=warehouse, landing=landing)
        return LakeResource(
            catalog_uri=env["FEATURELAKE_CATALOG_URI"],
            warehouse=env.get("FEATURELAKE_WAREHOUSE") or None,
            landing=landing,
        )
    return LakeResource(home=DEFAULT_HOME, landing=landing)
