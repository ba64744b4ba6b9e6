"""The nightly maintenance schedule: snapshot expiry, then garbage collection.

``nightly_maintenance`` (cron ``0 3 * * *``, UTC) runs ``nightly_maintenance_job``
(``snapshot_expiry`` -> ``garbage_collection`` of group ``maintenance``) over
every table of the lake. Retention comes from the assets' config, whose
defaults are read from the environment when the run starts
(FEATURELAKE_EXPIRE_OLDER_THAN_DAYS, FEATURELAKE_EXPIRE_RETAIN_LAST,
FEATURELAKE_GC_GRACE_DAYS); :func:`nightly_maintenance_schedule` can pin them
and make the whole run a dry run. The schedule starts STOPPED unless
FEATURELAKE_MAINTENANCE_AUTOSTART is set.

No ``from __future__ import annotations`` (Dagster reads annotations).
"""
import os
from typing import Optional

from dagster import (
    AssetSelection,
    DefaultScheduleStatus,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    define_asset_job,
    schedule,
)

from assets import maintenance as maintenance_group

NIGHTLY_CRON = "0 3 * * *"

nightly_maintenance_job = define_asset_job(
    "nightly_maintenance_job",
    selection=AssetSelection.assets(*maintenance_group.nightly_assets),
    description="Expire old snapshots on every table, then garbage-collect unreferenced files.",
)


def nightly_run_config(
    *,
    older_than_days: Optional[float] = None,
    retain_last: Optional[int] = None,
    grace_days: Optional[float] = None,
    dry_run: bool = False,
) -> dict:
    """Run config of ``nightly_maintenance_job``; values left None keep the env defaults."""
    expiry: dict = {"dry_run": bool(dry_run)}
    if older_than_days is not None:
        expiry["older_than_days"] = float(older_than_days)
    if retain_last is not None:
        expiry["retain_last"] = int(retain_last)
    gc: dict = {"dry_run": bool(dry_run)}
    if grace_days is not None:
        gc["grace_days"] = float(grace_days)
    return {"ops": {"snapshot_expiry": {"config": expiry}, "garbage_collection": {"config": gc}}}


def nightly_maintenance_schedule(
    name: str = "nightly_maintenance",
    *,
    cron_schedule: str = NIGHTLY_CRON,
    older_than_days: Optional[float] = None,
    retain_last: Optional[int] = None,
    grace_days: Optional[float] = None,
    dry_run: bool = False,
    execution_timezone: str = "UTC",
    default_status: Optional[DefaultScheduleStatus] = None,
) -> ScheduleDefinition:
    """The nightly expiry + GC schedule (see the module doc)."""
    autostart = os.environ.get("FEATURELAKE_MAINTENANCE_AUTOSTART", "").lower() in ("1", "true", "yes", "on")
    status = default_status or (DefaultScheduleStatus.RUNNING if autostart else DefaultScheduleStatus.STOPPED)
    run_config = nightly_run_config(
        older_than_days=older_than_days, retain_last=retain_last, grace_days=grace_days, dry_run=dry_run
    )

    @schedule(
        name=name,
        cron_schedule=cron_schedule,
        job=nightly_maintenance_job,
        execution_timezone=execution_timezone,
        default_status=status,
        description="Nightly: expire old snapshots on every table, then delete unreferenced files "
        "older than the grace period" + (" (dry run)" if dry_run else "") + ".",
    )
    def _nightly(context: ScheduleEvaluationContext):
        when = context.scheduled_execution_time
        day = when.strftime("%Y-%m-%d") if when else "manual"
        return RunRequest(
            run_key=f"nightly-maintenance-{day}",
            run_config=run_config,
            tags={"featurelake/maintenance": "nightly", "featurelake/dry_run": str(bool(dry_run)).lower()},
        )

    return _nightly


__all__ = ["nightly_maintenance_job", "nightly_maintenance_schedule", "nightly_run_config", "NIGHTLY_CRON"]
