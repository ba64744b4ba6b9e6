"""Group ``main``: raw impressions -> the main-branch training-sample table.

Both assets are daily partitioned. ``raw_impressions`` is the source: the day's
synthetic impressions land as one Parquet file (cheap, replaced atomically).
``samples`` loads that day into the Iceberg table ``ml.samples`` with an
overwrite restricted to the day's ``ts`` range, so re-materializing a day
replaces it and never duplicates rows.

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

from resources import LakeResource

GROUP = "main"
SAMPLES_TABLE = "ml.samples"
PRIMARY_KEY = "sample_id"
TIME_COLUMN = "ts"
PARTITION_BY = ["day(ts)"]

DEFAULT_START = "2026-01-01"
DEFAULT_ROWS_PER_DAY = 20_000


def demo_start() -> date:
    """First day of the demo data (FEATURELAKE_DEMO_START, default 2026-01-01)."""
    return date.fromisoformat(os.environ.get("FEATURELAKE_DEMO_START") or DEFAULT_START)


def default_rows_per_day() -> int:
    """Rows generated per day (FEATURELAKE_DEMO_ROWS_PER_DAY, default 20 000)."""
    return int(os.environ.get("FEATURELAKE_DEMO_ROWS_PER_DAY") or DEFAULT_ROWS_PER_DAY)


START = demo_start()
daily_partitions = DailyPartitionsDefinition(start_date=START.isoformat())


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
        metadata={
            "rows": MetadataValue.int(rows),
            "dagster/row_count": MetadataValue.int(rows),
            "files": MetadataValue.int(1),
            "bytes": MetadataValue.int(size),
            "path": MetadataValue.path(str(path)),
            "day": MetadataValue.text(day.isoformat()),
            "seed": MetadataValue.int(config.seed),
            "seconds": MetadataValue.float(round(seconds, 4)),
        }
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
        table = ensure_table(lake, name, data.schema)
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
    f"(primary key {PRIMARY_KEY}, partitioned by day(ts)); a day is replaced atomically.",
)
def samples(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
    day = partition_day(context.partition_key)
    path = landing_path(lake.landing_dir(), day)
    if not path.exists():
        raise Failure(
            f"no landed raw impressions for {day} at {path}: materialize raw_impressions first"
        )
    started = time.perf_counter()
    data = pq.read_table(path)
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
        metadata={
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
        }
    )


main_assets = [raw_impressions, samples]
