"""The featurelake Dagster code location.

``workspace.yaml`` loads ``python_module: platform_defs`` (attribute ``defs``).
Resources are chosen per deployment from the environment (see
:func:`resources.lake_resource_from_env`): FEATURELAKE_HOME -> embedded lake,
FEATURELAKE_CATALOG_URI (+ FEATURELAKE_WAREHOUSE) -> a catalog-backed lake.
"""
from __future__ import annotations

from typing import Optional

from dagster import AssetSelection, Definitions, define_asset_job

from assets import main as main_group
from assets import main_checks
from assets import label_targets as labels_group
from assets import maintenance as maintenance_group
from assets import research as research_group
from assets import sequences as sequences_group
from platform_defs.schedules import nightly_maintenance_job, nightly_maintenance_schedule
from platform_defs.sensors import compaction_job, compaction_sensor
from resources import lake_resource_from_env

main_job = define_asset_job(
    "main_job",
    selection=AssetSelection.groups(main_group.GROUP),
    partitions_def=main_group.daily_partitions,
    description="Raw impressions -> ml.samples (features) -> labels backfilled, for one day; "
    "the day's user events -> ml.user_events, then the sequence store built (incrementally).",
)


def build_resources(env=None) -> dict:
    """The resources of this deployment (read from the environment)."""
    return {"lake": lake_resource_from_env(env)}


def build_defs(env=None, resources: Optional[dict] = None) -> Definitions:
    """The code location's definitions; ``resources`` (e.g. a demo's lake) replace the environment's."""
    return Definitions(
        assets=[
            *main_group.main_assets,
            *sequences_group.sequence_assets,
            *maintenance_group.maintenance_assets,
            *research_group.research_assets,
            *labels_group.labels_assets,
        ],
        asset_checks=[*research_group.research_checks, *main_checks.main_checks],
        jobs=[
            main_job,
            sequences_group.sequence_job,
            compaction_job,
            nightly_maintenance_job,
            research_group.research_job,
            labels_group.labels_job,
        ],
        sensors=[compaction_sensor(), research_group.research_spec_sensor, main_checks.freshness_sensor],
        schedules=[nightly_maintenance_schedule()],
        resources=resources if resources is not None else build_resources(env),
    )


defs = build_defs()

research_job = research_group.research_job
labels_job = labels_group.labels_job
sequence_job = sequences_group.sequence_job

__all__ = ["defs", "build_defs", "build_resources", "main_job", "research_job", "labels_job",
           "sequence_job"]
