"""Group ``main``: raw impressions -> the main-branch training-sample table -> labels.

All assets are daily partitioned. ``raw_impressions`` is the source: the day's
synthetic impressions land as one Parquet file (cheap, replaced atomically).
``samples`` loads that day's *features* into the Iceberg table ``ml.samples``
with an overwrite restricted to the day's ``ts`` range, so re-materializing a
day replaces it and never duplicates rows. The label ``click`` is left out of
the samples: labels arrive separately, as in production (clicks are joined
later than impressions). ``labels`` then backfills ``click`` plus derived
per-user features of the day onto the existing rows through the engine's
merge-on-read ``backfill``: no data file is rewritten, only small update files
holding the new column values are written (the first backfill adds the columns
to the schema in the same commit).

Re-materializing ``samples`` for a day replaces that day's rows, so its labels
are gone until ``labels`` runs again for the day (it is downstream of
``samples``, so the asset graph re-runs it).

The assets return ``MaterializeResult`` with metadata only: data never travels
through IO managers.

No ``from __future__ import annotations`` here: Dagster resolves the config and
resource parameters of asset functions from real (not string) annotations.
"""
import os
import time
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Optional

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dagster import (
    AssetExecutionContext,
    Config,
    DailyPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
)
from pydantic import Field

from assets.metadata import with_mib
from resources import RAY, LakeResource, RayCluster, path_metadata

GROUP = "main"
SAMPLES_TABLE = "ml.samples"
PRIMARY_KEY = "sample_id"
TIME_COLUMN = "ts"
PARTITION_BY = ["day(ts)"]
#: The label: in the landing file, not loaded by ``samples``, backfilled by ``labels``.
LABEL_COLUMN = "click"
#: Derived per-user features of the day, backfilled together with the label.
USER_IMPRESSIONS = "user_impressions_1d"
USER_CTR = "user_ctr_1d"
LABEL_COLUMNS = [LABEL_COLUMN, USER_IMPRESSIONS, USER_CTR]

DEFAULT_START = "2026-01-01"
#: Daily partitions by default: the days the demo materializes, so the UI shows them all filled.
DEFAULT_PARTITION_DAYS = 3
DEFAULT_ROWS_PER_DAY = 20_000


def demo_start() -> date:
    """First daily partition and first day of the synthetic data.

    FEATURELAKE_PARTITIONS_START (or the older FEATURELAKE_DEMO_START), default 2026-01-01.
    """
    for name in ("FEATURELAKE_PARTITIONS_START", "FEATURELAKE_DEMO_START"):
        raw = os.environ.get(name)
        if raw:
            try:
                return date.fromisoformat(raw)
            except ValueError as e:
                raise ValueError(f"{name}={raw!r} is not a date (YYYY-MM-DD)") from e
    return date.fromisoformat(DEFAULT_START)


def partition_days() -> Optional[int]:
    """How many daily partitions exist: FEATURELAKE_PARTITIONS_DAYS, default 3 (the demo's days).

    ``open`` (or 0) makes them open-ended: one partition per day up to yesterday, as a
    production deployment with a daily schedule wants.
    """
    raw = (os.environ.get("FEATURELAKE_PARTITIONS_DAYS") or "").strip().lower()
    if not raw:
        return DEFAULT_PARTITION_DAYS
    if raw in ("open", "0"):
        return None
    try:
        days = int(raw)
    except ValueError:
        days = -1
    if days < 0:
        raise ValueError(f"FEATURELAKE_PARTITIONS_DAYS={raw!r} is not a number of days or 'open'")
    return days


def default_rows_per_day() -> int:
    """Rows generated per day (FEATURELAKE_DEMO_ROWS_PER_DAY, default 20 000)."""
    return int(os.environ.get("FEATURELAKE_DEMO_ROWS_PER_DAY") or DEFAULT_ROWS_PER_DAY)


START = demo_start()
PARTITION_DAYS = partition_days()
daily_partitions = DailyPartitionsDefinition(
    start_date=START.isoformat(),
    end_date=(START + timedelta(days=PARTITION_DAYS)).isoformat() if PARTITION_DAYS else None,
)


def partition_day(partition_key: str) -> date:
    return date.fromisoformat(partition_key[:10])


def day_index(day: date, start: Optional[date] = None) -> int:
    """The synthetic generator's day number for a calendar day."""
    return (day - (start or START)).days


def landing_path(landing_dir: Path, day: date) -> Path:
    return Path(landing_dir) / "impressions" / f"{day.isoformat()}.parquet"


def _ts_literal(moment: datetime, with_tz: bool) -> str:
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    return text + "+00:00" if with_tz else text


def day_filter(day: date, ts_type: Optional[pa.DataType] = None, column: str = TIME_COLUMN) -> str:
    """pyiceberg filter string selecting one UTC day of ``column``."""
    with_tz = bool(ts_type is not None and pa.types.is_timestamp(ts_type) and ts_type.tz)
    lo = datetime(day.year, day.month, day.day)
    hi = lo + timedelta(days=1)
    return (
        f"{column} >= '{_ts_literal(lo, with_tz)}' and {column} < '{_ts_literal(hi, with_tz)}'"
    )


class RawImpressionsConfig(Config):
    rows_per_day: int = Field(
        default_factory=default_rows_per_day,
        description="Synthetic impressions generated for the day.",
    )
    seed: int = Field(default=0, description="Generator seed.")


# ---------------------------------------------------------------------------------
@asset(
    group_name=GROUP,
    partitions_def=daily_partitions,
    kinds={"parquet"},
    description="The day's raw impressions (synthetic source), landed as one Parquet file.",
)
def raw_impressions(
    context: AssetExecutionContext, config: RawImpressionsConfig, lake: LakeResource
) -> MaterializeResult:
    from featurelake.synthetic import impressions_for_day, impressions_schema

    day = partition_day(context.partition_key)
    index = day_index(day)
    if index < 0:
        raise Failure(f"partition {day} is before the data start {START}")
    path = landing_path(lake.landing_dir(), day)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")

    started = time.perf_counter()
    rows = 0
    writer: Optional[pq.ParquetWriter] = None
    try:
        for batch in impressions_for_day(index, config.rows_per_day, start=START, seed=config.seed):
            if writer is None:
                writer = pq.ParquetWriter(tmp, batch.schema, compression="zstd")
            writer.write_batch(batch)
            rows += batch.num_rows
        if writer is None:  # no rows: still land an empty, well-typed file
            writer = pq.ParquetWriter(tmp, impressions_schema(), compression="zstd")
        writer.close()
        writer = None
        os.replace(tmp, path)  # atomic: a re-materialization replaces the day
    finally:
        if writer is not None:
            writer.close()
        if tmp.exists():
            tmp.unlink()
    seconds = time.perf_counter() - started

    size = path.stat().st_size
    context.log.info(f"landed {rows} impressions for {day} in {path} ({size} bytes)")
    return MaterializeResult(
        metadata=with_mib({
            "rows": MetadataValue.int(rows),
            "dagster/row_count": MetadataValue.int(rows),
            "files": MetadataValue.int(1),
            "bytes": MetadataValue.int(size),
            "path": MetadataValue.path(str(path)),
            "day": MetadataValue.text(day.isoformat()),
            "seed": MetadataValue.int(config.seed),
            "seconds": MetadataValue.float(round(seconds, 4)),
        })
    )


# ---------------------------------------------------------------------------------
def ensure_table(lake, name: str, schema: pa.Schema):
    """Open table ``name``, creating it (primary key, day partitions) if missing."""
    from featurelake.errors import TableExistsError

    if not lake.table_exists(name):
        try:
            return lake.create_table(
                name, schema=schema, primary_key=PRIMARY_KEY, partition_by=PARTITION_BY
            )
        except TableExistsError:  # a concurrent partition run created it first
            pass
    return lake.table(name)


def _overwrite_day(lake, name: str, data: pa.Table, day: date, attempts: int = 4):
    """Replace ``day`` of table ``name`` with ``data``; retry on commit conflicts."""
    from featurelake.errors import CommitConflictError

    for attempt in range(1, attempts + 1):
        table = ensure_table(lake, name, sample_schema())
        filt = day_filter(day, _ts_type(table, data))
        try:
            return table, filt, table.overwrite(data, filter=filt)
        except CommitConflictError:
            if attempt == attempts:
                raise
            time.sleep(0.2 * attempt)


def _ts_type(table, data: pa.Table) -> Optional[pa.DataType]:
    try:
        return table.iceberg.schema().as_arrow().field(TIME_COLUMN).type
    except Exception:
        return data.schema.field(TIME_COLUMN).type


def sample_schema() -> pa.Schema:
    """The schema ``ml.samples`` is created with: the impressions minus the label."""
    from featurelake.synthetic import impressions_schema

    schema = impressions_schema()
    return schema.remove(schema.get_field_index(LABEL_COLUMN))


def _features_only(data: pa.Table) -> pa.Table:
    """The landed impressions without the label (labels arrive through ``labels``)."""
    return data.drop_columns([LABEL_COLUMN]) if LABEL_COLUMN in data.column_names else data


def _landed(lake: LakeResource, day: date) -> Path:
    path = landing_path(lake.landing_dir(), day)
    if not path.exists():
        raise Failure(
            f"no landed raw impressions for {day} at {path}: materialize raw_impressions first"
        )
    return path


def _check_day(data: pa.Table, day: date) -> None:
    """Every row must fall inside the day, or the overwrite would not replace it."""
    if data.num_rows == 0:
        return
    ts = data.column(TIME_COLUMN)
    if ts.null_count:
        raise Failure(f"{ts.null_count} raw impressions of {day} have no {TIME_COLUMN}")
    bounds = pc.min_max(ts).as_py()
    lo, hi = bounds["min"], bounds["max"]
    lo_d = lo.date() if isinstance(lo, datetime) else lo
    hi_d = hi.date() if isinstance(hi, datetime) else hi
    if lo_d != day or hi_d != day:
        raise Failure(
            f"raw impressions for {day} have {TIME_COLUMN} from {lo} to {hi}: outside the partition"
        )


@asset(
    group_name=GROUP,
    partitions_def=daily_partitions,
    deps=[raw_impressions],
    kinds={"iceberg"},
    description=f"Main-branch training samples, Iceberg table {SAMPLES_TABLE} "
    f"(primary key {PRIMARY_KEY}, partitioned by day(ts)): the day's features, without the "
    f"label {LABEL_COLUMN!r} (backfilled by `labels`); a day is replaced atomically.",
)
def samples(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
    day = partition_day(context.partition_key)
    path = _landed(lake, day)
    started = time.perf_counter()
    data = _features_only(pq.read_table(path))
    _check_day(data, day)

    lk = lake.lake()
    table, filt, snapshot_id = _overwrite_day(lk, SAMPLES_TABLE, data, day)
    seconds = time.perf_counter() - started
    stats = table.stats()
    context.log.info(
        f"{SAMPLES_TABLE}: replaced {day} with {data.num_rows} rows "
        f"(snapshot {snapshot_id}); table now {stats.get('rows')} rows"
    )
    return MaterializeResult(
        metadata=with_mib({
            "table": MetadataValue.text(SAMPLES_TABLE),
            "lake": MetadataValue.text(lake.describe()),
            "filter": MetadataValue.text(filt),
            "partition_rows": MetadataValue.int(data.num_rows),
            "dagster/row_count": MetadataValue.int(data.num_rows),
            "rows": MetadataValue.int(int(stats.get("rows", 0))),
            "files": MetadataValue.int(int(stats.get("data_files", 0))),
            "small_files": MetadataValue.int(int(stats.get("small_files", 0))),
            "update_files": MetadataValue.int(int(stats.get("update_files", 0))),
            "bytes": MetadataValue.int(int(stats.get("bytes", 0))),
            # snapshot ids are 63-bit: text keeps them exact in the UI (GraphQL ints are 32-bit)
            "snapshot_id": MetadataValue.text(str(snapshot_id)),
            "snapshots": MetadataValue.int(int(stats.get("snapshots", 0))),
            "seconds": MetadataValue.float(round(seconds, 4)),
        })
    )


# ---------------------------------------------------------------------------------
def label_rows(raw: pa.Table) -> pa.Table:
    """The backfill input for one day: ``sample_id``, the label and derived features.

    ``raw`` holds at least ``sample_id``, ``user_id`` and ``click`` of one day.
    Derived, per user over the day:

    * ``user_impressions_1d`` (int32): the user's impressions that day;
    * ``user_ctr_1d`` (float32): the user's click rate that day (clicks over
      impressions with a known label; null when none is known).

    ``user_ctr_1d`` includes the row's own label: it is an aggregate for
    analysis and research branches, not a leak-free model input.
    """
    keys = raw.select([PRIMARY_KEY, "user_id", LABEL_COLUMN])
    per_user = keys.group_by("user_id").aggregate(
        [([], "count_all"), (LABEL_COLUMN, "sum"), (LABEL_COLUMN, "count")]
    )
    clicks = pc.cast(per_user.column(f"{LABEL_COLUMN}_sum"), pa.float64())
    known = pc.cast(per_user.column(f"{LABEL_COLUMN}_count"), pa.float64())
    ctr = pc.if_else(pc.greater(known, 0), pc.divide(clicks, known), pa.scalar(None, pa.float64()))
    per_user = pa.table(
        {
            "user_id": per_user.column("user_id"),
            USER_IMPRESSIONS: pc.cast(per_user.column("count_all"), pa.int32()),
            USER_CTR: pc.cast(ctr, pa.float32()),
        }
    )
    joined = keys.join(per_user, keys="user_id", join_type="left outer")
    return pa.table(
        {
            PRIMARY_KEY: joined.column(PRIMARY_KEY),
            LABEL_COLUMN: pc.cast(joined.column(LABEL_COLUMN), pa.int32()),
            USER_IMPRESSIONS: joined.column(USER_IMPRESSIONS),
            USER_CTR: joined.column(USER_CTR),
        }
    )


class LabelsConfig(Config):
    on_unknown: str = Field(
        default="error",
        description="Labels whose sample_id is not in the table: 'error' fails the run "
        "(samples are stale: re-materialize them), 'skip' drops those labels.",
    )


@asset(
    group_name=GROUP,
    partitions_def=daily_partitions,
    deps=[samples, raw_impressions],
    kinds={"iceberg"},
    resource_defs={"ray": RAY},
    description=f"The day's label {LABEL_COLUMN!r} and per-user derived features "
    f"({USER_IMPRESSIONS}, {USER_CTR}) backfilled onto {SAMPLES_TABLE} by merge-on-read: "
    "update files only, no data file rewritten.",
)
def labels(
    context: AssetExecutionContext, config: LabelsConfig, lake: LakeResource, ray: RayCluster
) -> MaterializeResult:
    from featurelake.errors import UnknownKeyError

    if config.on_unknown not in ("error", "skip"):
        raise Failure(f"labels: on_unknown must be 'error' or 'skip', got {config.on_unknown!r}")
    day = partition_day(context.partition_key)
    path = _landed(lake, day)
    lk = lake.lake()
    if not lk.table_exists(SAMPLES_TABLE):
        raise Failure(f"{SAMPLES_TABLE} does not exist yet: materialize samples for {day} first")
    table = lk.table(SAMPLES_TABLE)

    started = time.perf_counter()
    ray_path = ray.chooses_ray(table.stats().get("bytes", 0))
    ray_tasks = 0
    raw = pq.read_table(path, columns=[PRIMARY_KEY, "user_id", LABEL_COLUMN])
    updates = label_rows(raw)
    positives = int(pc.sum(updates.column(LABEL_COLUMN)).as_py() or 0)
    if updates.num_rows == 0:  # an empty day: nothing to set, no commit
        snapshot_id = table.stats().get("snapshot_id")
        rows_updated = update_files = files_touched = bytes_written = skipped = 0
        new_columns: list = []
    else:
        try:
            if ray_path:
                from featurelake import ray as distributed

                ray.ensure_connected(context)
                report = distributed.backfill(table, updates, on_unknown=config.on_unknown, tasks=ray.tasks)
                snapshot_id, ray_tasks = report.snapshot_id, report.tasks
            else:
                snapshot_id = table.backfill(updates, on_unknown=config.on_unknown)
        except UnknownKeyError as e:
            raise Failure(
                f"labels for {day}: {e}. The landed impressions and {SAMPLES_TABLE} disagree: "
                f"re-materialize samples for {day} (or run labels with on_unknown='skip')"
            ) from e
        report = table.last_update_report
        rows_updated = int(report.rows_updated)
        update_files = int(report.update_files)
        files_touched = int(report.data_files_touched)
        bytes_written = int(report.bytes_written)
        skipped = int(getattr(report, "unknown_skipped", 0))
        new_columns = list(report.new_columns)
    seconds = time.perf_counter() - started

    stats = table.stats()
    data_bytes = int(stats.get("data_bytes", stats.get("bytes", 0)))
    ratio = bytes_written / data_bytes if data_bytes else 0.0
    context.log.info(
        f"{SAMPLES_TABLE}: backfilled {LABEL_COLUMNS} on {rows_updated} rows of {day} "
        f"({update_files} update files, {bytes_written} bytes = {ratio:.2%} of "
        f"{data_bytes} data bytes; snapshot {snapshot_id})"
    )
    return MaterializeResult(
        metadata=with_mib({
            "table": MetadataValue.text(SAMPLES_TABLE),
            "day": MetadataValue.text(day.isoformat()),
            "columns": MetadataValue.text(", ".join(LABEL_COLUMNS)),
            "new_columns": MetadataValue.text(", ".join(new_columns)),
            "rows_updated": MetadataValue.int(rows_updated),
            "dagster/row_count": MetadataValue.int(rows_updated),
            "unknown_skipped": MetadataValue.int(skipped),
            "positives": MetadataValue.int(positives),
            "click_rate": MetadataValue.float(
                round(positives / updates.num_rows, 6) if updates.num_rows else 0.0
            ),
            "update_files": MetadataValue.int(update_files),
            "data_files_touched": MetadataValue.int(files_touched),
            "bytes_written": MetadataValue.int(bytes_written),
            "table_bytes": MetadataValue.int(int(stats.get("bytes", 0))),
            "table_data_bytes": MetadataValue.int(data_bytes),
            "table_update_bytes": MetadataValue.int(int(stats.get("update_bytes", 0))),
            "table_update_files": MetadataValue.int(int(stats.get("update_files", 0))),
            "write_ratio": MetadataValue.float(round(ratio, 6)),
            "snapshot_id": MetadataValue.text(str(snapshot_id)),
            "seconds": MetadataValue.float(round(seconds, 4)),
            **path_metadata(ray_path, ray_tasks),
        })
    )


main_assets = [raw_impressions, samples, labels]
