"""Run a named job of this code location in process, recorded as the UI records a launched run.

``dagster.materialize`` runs an anonymous ``__ephemeral_asset_job__``: the UI's
Jobs pages and the Overview timeline show none of those runs. :func:`run_job`
runs ``main_job``, ``research_job``, ``nightly_maintenance_job``, ... of
:func:`platform_defs.build_defs` instead, in this process (no daemon, no
subprocess per step), and records the run with the code location's origin
(location :data:`LOCATION_NAME` of ``workspace.yaml``) and its repository tag,
which is how the webserver files the runs it launched itself: so the demo's
runs appear under their jobs, on the timeline, and can be re-executed from the UI.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from dagster import AssetCheckKey, AssetKey, DagsterInstance

#: ``location_name`` of the code location in workspace.yaml.
LOCATION_NAME = "featurelake"
#: The repository a ``Definitions`` object becomes.
REPOSITORY_NAME = "__repository__"
IN_PROCESS = {"execution": {"config": {"in_process": {}}}}


def run_origin(job_name: str):
    """The origin a run of ``job_name`` launched from the workspace's code location carries."""
    from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteRepositoryOrigin

    return RemoteRepositoryOrigin(RegisteredCodeLocationOrigin(LOCATION_NAME), REPOSITORY_NAME).get_job_origin(job_name)


def run_job(
    job_name: str,
    instance: DagsterInstance,
    resources: Mapping[str, Any],
    *,
    partition_key: Optional[str] = None,
    run_config: Optional[Mapping[str, Any]] = None,
    tags: Optional[Mapping[str, str]] = None,
    asset_selection: Optional[Sequence[str]] = None,
    asset_check_selection: Optional[Sequence[AssetCheckKey]] = None,
    raise_on_error: bool = True,
):
    """Run job ``job_name`` (optionally a subset of its assets and checks) once, in process.

    ``asset_selection`` names assets (their checks come along); ``asset_check_selection``
    alone runs just those checks against what the lake holds now.
    ``resources`` replace the deployment's (e.g. ``{"lake": LakeResource(home=...)}``).
    The result has ``success``, ``run_id`` and the event accessors of
    ``dagster.ExecuteInProcessResult`` (``get_asset_materialization_events`` ...).
    """
    from dagster._core.definitions.job_base import InMemoryJob
    from dagster._core.execution.api import create_execution_plan, execute_run
    from dagster._core.execution.execute_in_process import merge_run_tags
    from dagster._core.storage.tags import REPOSITORY_LABEL_TAG

    from platform_defs import build_defs

    job_def = build_defs(resources=dict(resources)).resolve_job_def(job_name)
    keys = [AssetKey.from_user_string(k) for k in asset_selection] if asset_selection else None
    checks = set(asset_check_selection) if asset_check_selection else None
    if keys or checks:
        job_def = job_def.get_subset(asset_selection=set(keys or ()), asset_check_selection=checks)
    config = {**IN_PROCESS, **dict(run_config or {})}
    origin = run_origin(job_name)
    run_tags = dict(merge_run_tags(job_def, partition_key, tags, keys, instance, config))
    run_tags[REPOSITORY_LABEL_TAG] = origin.repository_origin.get_label()
    job = InMemoryJob(job_def)
    plan = create_execution_plan(job, run_config=config, instance_ref=instance.get_ref() if instance.is_persistent else None)
    run = instance.create_run_for_job(
        job_def=job_def,
        execution_plan=plan,
        run_config=config,
        tags=run_tags,
        asset_selection=frozenset(keys) if keys else None,
        remote_job_origin=origin,
    )
    return execute_run(job, run, instance, raise_on_error=raise_on_error)


__all__ = ["run_job", "run_origin", "LOCATION_NAME", "REPOSITORY_NAME"]
