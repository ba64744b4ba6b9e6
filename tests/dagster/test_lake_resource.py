"""The Dagster resource opens the lake the environment names, including a pyiceberg catalog by name."""
from __future__ import annotations

import pyarrow as pa
from dagster import DagsterInstance, asset, materialize

from resources.lake import LakeResource, clear_lake_cache, lake_resource_from_env

SCHEMA = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("x", pa.float64())])


def test_resource_takes_a_pyiceberg_catalog_by_name(tmp_path, monkeypatch):
    warehouse = tmp_path / "warehouse"
    warehouse.mkdir()
    monkeypatch.delenv("FEATURELAKE_HOME", raising=False)
    monkeypatch.delenv("FEATURELAKE_CATALOG_URI", raising=False)
    monkeypatch.setenv("FEATURELAKE_CATALOG", "research")
    monkeypatch.setenv("PYICEBERG_CATALOG__RESEARCH__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__RESEARCH__URI", f"sqlite:///{tmp_path / 'catalog.db'}")
    monkeypatch.setenv("PYICEBERG_CATALOG__RESEARCH__WAREHOUSE", str(warehouse))
    clear_lake_cache()
    resource = lake_resource_from_env()
    assert resource.catalog_name == "research"
    assert resource.describe() == "pyiceberg catalog 'research'"

    @asset
    def written(lake: LakeResource) -> None:
        t = lake.lake().create_table("ns.t", SCHEMA, primary_key="id")
        t.append(pa.table({"id": pa.array([1, 2], pa.int64()), "x": [0.5, 1.5]}, schema=SCHEMA))

    with DagsterInstance.ephemeral() as instance:
        assert materialize([written], resources={"lake": resource}, instance=instance).success
    clear_lake_cache()
    from featurelake import Lake

    # an independent open of the same catalog, the pyiceberg way, sees the rows
    got = Lake.from_catalog("research").table("ns.t").read().sort_by("id")
    assert got.column("id").to_pylist() == [1, 2] and got.column("x").to_pylist() == [0.5, 1.5]
    # and the files are in the named catalog's warehouse
    assert any(p.suffix == ".parquet" for p in warehouse.rglob("*"))
