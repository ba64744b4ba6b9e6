"""The featurelake Dagster code location.

``workspace.yaml`` loads ``python_module: platform_defs`` (attribute ``defs``).
Resources are chosen per deployment from the environment (see
:func:`resources.lake_resource_from_env`): FEATURELAKE_HOME -> embedded lake,
FEATURELAKE_CATALOG_URI (+ FEATURELAKE_WAREHOUSE) -> a catalog-backed lake.
"""
from __future__ import annotations

from dagster import AssetSelection, Definitions, define_asset_job

from assets import main as main_group
from resources import lake_resource_from_env

main_job = define_asset_job(
    "main_job",
    selection=AssetSelection.groups(main_group.GROUP),
    partitions_def=main_group.daily_partitions,
    description="Raw impressions -> ml.samples (features) -> labels backfilled, for one day.",
)


def build_resources(env=None) -> dict:
    """The resources of this deployment (read from the environment)."""
    return {"lake": lake_resource_from_env(env)}


def build_defs(env=None) -> Definitions:
    return Definitions(
        assets=[*main_group.main_assets],
        jobs=[main_job],
        resources=build_resources(env),
    )


defs = build_defs()

__all__ = ["defs", "build_defs", "build_resources", "main_job"]
