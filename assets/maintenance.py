"""Group ``maintenance``: compaction, snapshot expiry and garbage collection.

``compaction`` is partitioned by *table and branch* with one
``DynamicPartitionsDefinition`` (``compaction_targets``) whose keys are
``"<namespace.table>|<branch>"``, e.g. ``ml.samples|main``. A dynamic
definition and not a ``MultiPartitionsDefinition``: branches belong to one
table (``research/x`` of ``ml.samples`` has no meaning for another table), so a
table x branch product would be mostly invalid keys, and both sets change at
run time anyway. ``|`` can appear in neither a table name nor a branch name
(see ``featurelake.refs.check_ref_name``), so a key splits unambiguously. The
compaction sensor (``platform_defs/sensors.py``) adds a key the first time it
requests that table/branch; a key can also be added by hand in the UI.

A materialization of ``ml.samples|main`` runs ``Table.compact(branch="main")``
(update files folded, small files bin-packed per partition, one atomic
commit) and reports files and bytes before and after, read from cheap metadata
(``featurelake.health``).

``snapshot_expiry`` then ``garbage_collection`` are the nightly maintenance
(the ``nightly_maintenance`` schedule, ``platform_defs/schedules.py``): expire
snapshots older than N days on every table (ref heads and the last
``retain_last`` per branch are kept), then delete the files no retained
snapshot references once they are older than the grace period. Both have a
``dry_run``: expiry then reports what it would expire (and what GC would then
free) without committing, and GC lists files and bytes without deleting.

Defaults come from the environment, read when a run starts:
FEATURELAKE_EXPIRE_OLDER_THAN_DAYS (7), FEATURELAKE_EXPIRE_RETAIN_LAST (1),
FEATURELAKE_GC_GRACE_DAYS (3).

No ``from __future__ import annotations``: Dagster reads the config and
resource annotations of asset functions at definition time.
"""
import os
import time
from datetime import datetime, timedelta, timezone
from typing import Optional

from dagster import (
    AssetExecutionContext,
    Config,
    DynamicPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)
from pydantic import Field

from assets.metadata import records_table, with_mib
from resources import RAY, LakeResource, RayCluster, path_metadata

GROUP = "maintenance"
PARTITIONS_NAME = "compaction_targets"
KEY_SEPARATOR = "|"

compaction_partitions = DynamicPartitionsDefinition(name=PARTITIONS_NAME)


def target_key(table: str, branch: str) -> str:
    """The ``compaction`` partition key of a table/branch."""
    return f"{table}{KEY_SEPARATOR}{branch}"


def parse_target(key: str) -> tuple[str, str]:
    """``"ml.samples|main"`` -> ``("ml.samples", "main")``."""
    table, sep, branch = key.partition(KEY_SEPARATOR)
    if not sep or not table or not branch or KEY_SEPARATOR in branch:
        raise Failure(
            f"compaction partition {key!r} is not '<namespace.table>{KEY_SEPARATOR}<branch>' "
            "(e.g. 'ml.samples|main')"
        )
    return table, branch


def _env_number(name: str, default: float, cast=float):
    raw = os.environ.get(name)
    if raw in (None, ""):
        return cast(default)
    try:
        return cast(raw)
    except ValueError as e:
        raise ValueError(f"{name}={raw!r} is not a number") from e


def default_expire_days() -> float:
    return _env_number("FEATURELAKE_EXPIRE_OLDER_THAN_DAYS", 7.0)


def default_retain_last() -> int:
    return _env_number("FEATURELAKE_EXPIRE_RETAIN_LAST", 1, int)


def default_grace_days() -> float:
    return _env_number("FEATURELAKE_GC_GRACE_DAYS", 3.0)


def _text_id(value) -> MetadataValue:
    # snapshot ids are 63-bit: text keeps them exact in the UI (GraphQL ints are 32-bit)
    return MetadataValue.text("" if value is None else str(value))


# ---------------------------------------------------------------- compaction
class CompactionConfig(Config):
    target_file_bytes: Optional[int] = Field(
        default=None,
        description="Size of the rewritten files (default: the table's "
        "write.target-file-size-bytes, else 128 MiB).",
    )
    small_file_bytes: Optional[int] = Field(
        default=None,
        description="Files below this size are bin-packed (default: the table's "
        "featurelake.small-file-bytes, else 32 MiB).",
    )
    max_bad_file_ratio: float = Field(
        default=0.0,
        description="Share of unreadable data files left in place instead of failing the run.",
    )


def _health_metadata(before: dict, after: dict) -> dict:
    out = {}
    for name, key in (
        ("files", "data_files"),
        ("bytes", "bytes"),
        ("data_bytes", "data_bytes"),
        ("small_files", "small_files"),
        ("update_files", "update_files"),
        ("update_bytes", "update_bytes"),
        ("max_update_layers", "max_update_layers"),
    ):
        out[f"{name}_before"] = MetadataValue.int(int(before.get(key) or 0))
        out[f"{name}_after"] = MetadataValue.int(int(after.get(key) or 0))
    return out


@asset(
    group_name=GROUP,
    partitions_def=compaction_partitions,
    kinds={"iceberg"},
    resource_defs={"ray": RAY},
    description="Compaction of one table branch (partition key '<namespace.table>|<branch>'): "
    "update files folded into rewritten data files and small files bin-packed per partition, "
    "in one atomic commit. Requested by the compaction sensor when small files or update "
    "layers pile up.",
)
def compaction(
    context: AssetExecutionContext, config: CompactionConfig, lake: LakeResource, ray: RayCluster
) -> MaterializeResult:
    from featurelake.errors import BranchNotFoundError
    from featurelake.health import staleness_of, staleness_policy, table_health

    name, branch = parse_target(context.partition_key)
    lk = lake.lake()
    if not lk.table_exists(name):
        raise Failure(f"compaction {context.partition_key!r}: no table {name!r} in {lake.describe()}")
    table = lk.table(name)
    try:
        before = table_health(table, branch)
    except BranchNotFoundError as e:
        raise Failure(f"compaction {context.partition_key!r}: {e}") from e

    def progress(done: int, total: int) -> None:
        context.log.debug(f"{name}@{branch}: rewrote bin {done}/{total}")

    options = dict(
        target_file_bytes=config.target_file_bytes,
        small_file_bytes=config.small_file_bytes,
        max_bad_file_ratio=config.max_bad_file_ratio,
        progress=progress,
    )
    ray_path = ray.chooses_ray(before.get("bytes") or table.stats(branch).get("bytes", 0))
    if ray_path:
        from featurelake import ray as distributed

        ray.ensure_connected(context)
        report = distributed.compact(table, branch, **options)
    else:
        report = table.compact(branch=branch, **options)
    after = table_health(table, branch)
    policy = staleness_policy(table._ice.metadata.properties)
    stale_before, stale_after = staleness_of(before, policy), staleness_of(after, policy)
    if report.skipped:
        context.log.info(f"{name}@{branch}: nothing to compact (snapshot {report.snapshot_id})")
    else:
        context.log.info(
            f"{name}@{branch}: {report.files_in} files ({report.bytes_in} bytes) + "
            f"{report.update_files_folded} update files -> {report.files_out} files "
            f"({report.bytes_out} bytes) in {report.seconds:.2f} s; table now "
            f"{after['data_files']} data files, {after['update_files']} update files"
        )
    for path in report.bad_files:
        context.log.warning(f"{name}@{branch}: unreadable data file left in place: {path}")
    return MaterializeResult(
        metadata=with_mib({
            "table": MetadataValue.text(name),
            "branch": MetadataValue.text(branch),
            "lake": MetadataValue.text(lake.describe()),
            "skipped": MetadataValue.bool(bool(report.skipped)),
            **_health_metadata(before, after),
            "files_in": MetadataValue.int(int(report.files_in)),
            "files_out": MetadataValue.int(int(report.files_out)),
            "bytes_in": MetadataValue.int(int(report.bytes_in)),
            "bytes_out": MetadataValue.int(int(report.bytes_out)),
            "update_files_folded": MetadataValue.int(int(report.update_files_folded)),
            "update_bytes_folded": MetadataValue.int(int(report.update_bytes_folded)),
            "rows_rewritten": MetadataValue.int(int(report.rows)),
            "dagster/row_count": MetadataValue.int(int(after.get("rows") or 0)),
            "attempts": MetadataValue.int(int(report.attempts)),
            **path_metadata(ray_path, report.tasks),
            "bad_files": MetadataValue.int(len(report.bad_files)),
            # what engines reading the Iceberg metadata directly saw, and see now
            "stale_seconds_before": MetadataValue.float(float(stale_before["stale_seconds"])),
            "staleness_violations_before": MetadataValue.text("; ".join(stale_before["violations"]) or "none"),
            "final_for_external_readers": MetadataValue.bool(stale_after["final_for_external_readers"]),
            "snapshot_before": _text_id(before.get("snapshot_id")),
            "snapshot_after": _text_id(after.get("snapshot_id")),
            "seconds": MetadataValue.float(round(float(report.seconds), 4)),
        })
    )


# ---------------------------------------------------------------- nightly
class SnapshotExpiryConfig(Config):
    older_than_days: float = Field(
        default_factory=default_expire_days,
        description="Expire snapshots older than this many days "
        "(FEATURELAKE_EXPIRE_OLDER_THAN_DAYS, default 7).",
    )
    retain_last: int = Field(
        default_factory=default_retain_last,
        description="Snapshots always kept per branch, however old "
        "(FEATURELAKE_EXPIRE_RETAIN_LAST, default 1).",
    )
    dry_run: bool = Field(
        default=False,
        description="Report what would expire (and what garbage collection would then free); commit nothing.",
    )


class GarbageCollectionConfig(Config):
    grace_days: float = Field(
        default_factory=default_grace_days,
        description="Only files older than this are deleted: writes in flight are younger "
        "(FEATURELAKE_GC_GRACE_DAYS, default 3).",
    )
    dry_run: bool = Field(default=False, description="List files and bytes; delete nothing.")


@asset(
    group_name=GROUP,
    kinds={"iceberg"},
    description="Nightly: expire snapshots older than N days on every table of the lake "
    "(ref heads and the last retain_last snapshots per branch stay). Frees no file itself.",
)
def snapshot_expiry(
    context: AssetExecutionContext, config: SnapshotExpiryConfig, lake: LakeResource
) -> MaterializeResult:
    from featurelake.health import maintenance_forecast

    if config.older_than_days < 0 or config.retain_last < 1:
        raise Failure("snapshot_expiry: older_than_days must be >= 0 and retain_last >= 1")
    lk = lake.lake()
    cutoff = datetime.now(timezone.utc) - timedelta(days=config.older_than_days)
    started = time.perf_counter()
    per_table: dict[str, dict] = {}
    errors: dict[str, str] = {}
    forecast = None
    if config.dry_run:
        forecast = maintenance_forecast(lk, cutoff, config.retain_last, grace=timedelta(0))
        per_table = {n: {"snapshots": v["snapshots"]} for n, v in forecast["tables"].items()}
    else:
        for name in lk.tables():
            try:
                expired = lk.table(name).expire_snapshots(cutoff, retain_last=config.retain_last)
                per_table[name] = {"snapshots": len(expired)}
            except Exception as e:  # one broken table must not stop the others
                errors[name] = f"{type(e).__name__}: {e}"
                context.log.error(f"snapshot_expiry: {name}: {errors[name]}")
    total = sum(v["snapshots"] for v in per_table.values())
    seconds = time.perf_counter() - started
    verb = "would expire" if config.dry_run else "expired"
    context.log.info(f"{verb} {total} snapshots older than {cutoff:%Y-%m-%d %H:%M} UTC on {len(per_table)} tables")
    metadata = {
        "dry_run": MetadataValue.bool(config.dry_run),
        "cutoff": MetadataValue.text(cutoff.isoformat(timespec="seconds")),
        "retain_last": MetadataValue.int(config.retain_last),
        "tables": MetadataValue.int(len(per_table)),
        "snapshots_expired": MetadataValue.int(total),
        "per_table": records_table(per_table),
        "seconds": MetadataValue.float(round(seconds, 4)),
    }
    if forecast is not None:  # what expiry + GC would give back (ignoring the grace period)
        metadata["would_free_files"] = MetadataValue.int(int(forecast["files"]))
        metadata["would_free_bytes"] = MetadataValue.int(int(forecast["bytes"]))
    if errors:
        raise Failure(
            f"snapshot_expiry failed on {len(errors)} table(s): {sorted(errors)}",
            metadata={**metadata, "errors": MetadataValue.json(errors)},
        )
    return MaterializeResult(metadata=with_mib(metadata))


@asset(
    group_name=GROUP,
    deps=[snapshot_expiry],
    kinds={"iceberg"},
    description="Nightly, after snapshot expiry: delete the files no retained snapshot of any "
    "branch or tag references, and the sequence store builds none is served from, once older "
    "than the grace period (dry_run lists them).",
)
def garbage_collection(
    context: AssetExecutionContext, config: GarbageCollectionConfig, lake: LakeResource
) -> MaterializeResult:
    if config.grace_days < 0:
        raise Failure("garbage_collection: grace_days must be >= 0")
    report = lake.lake().collect_garbage(older_than=timedelta(days=config.grace_days), dry_run=config.dry_run)
    verb = "would free" if config.dry_run else "freed"
    context.log.info(
        f"garbage collection {verb} {len(report.files)} files, {report.bytes} bytes "
        f"({report.kept_young} unreferenced files younger than {config.grace_days} days kept)"
    )
    return MaterializeResult(
        metadata=with_mib({
            "dry_run": MetadataValue.bool(config.dry_run),
            "grace_days": MetadataValue.float(float(config.grace_days)),
            "files": MetadataValue.int(len(report.files)),
            "bytes": MetadataValue.int(int(report.bytes)),
            "kept_young": MetadataValue.int(int(report.kept_young)),
            # sequence store builds no retained snapshot is served from (table -> build ids)
            "store_builds": MetadataValue.int(sum(len(ids) for ids in report.builds.values())),
            "per_table": records_table(report.tables),
            "sample_files": MetadataValue.json(sorted(report.files)[:20]),
            "seconds": MetadataValue.float(round(float(report.seconds), 4)),
        })
    )


maintenance_assets = [compaction, snapshot_expiry, garbage_collection]
nightly_assets = [snapshot_expiry, garbage_collection]
