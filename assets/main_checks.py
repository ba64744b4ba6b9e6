"""Checks of group ``main``: what users expect of ``samples`` and ``labels``.

Blocking checks (run in the same run, right after their asset; a failure stops
everything downstream of it in that run, and the run fails):

* ``samples_keys_unique``: the key index agrees with the data and no key is
  live twice (``Table.verify_index``; another engine appending rows with
  existing keys is how duplicates get in);
* ``samples_match_landing``: the day's rows in ``ml.samples`` equal the rows of
  the day's landing file;
* ``labels_match_landing``: the day's labelled rows and positives in
  ``ml.samples`` equal those of the landing file.

Freshness (not blocking: a check right after a materialization always passes,
so :data:`freshness_sensor` evaluates it on its own):
``samples`` and ``labels`` must have been materialized within the last
FEATURELAKE_FRESHNESS_HOURS hours (default 26: a daily pipeline plus slack).

No ``from __future__ import annotations``: Dagster reads the annotations.
"""
import os
import warnings
from datetime import timedelta

import pyarrow.compute as pc
import pyarrow.parquet as pq
from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    MetadataValue,
    asset_check,
    build_last_update_freshness_checks,
    build_sensor_for_freshness_checks,
)

from assets.main import (
    LABEL_COLUMN,
    PRIMARY_KEY,
    SAMPLES_TABLE,
    daily_partitions,
    day_filter,
    labels,
    landing_path,
    partition_day,
    samples,
)
from resources import LakeResource

DEFAULT_FRESHNESS_HOURS = 26.0

# Per-partition check results are a preview feature of dagster 1.13 (pinned); the freshness check
# factories are "superseded" by FreshnessPolicy, which needs the daemon to be evaluated at all.
warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec")
warnings.filterwarnings("ignore", message="Function `build_(last_update_freshness_checks|sensor_for_freshness_checks)`")


def freshness_hours() -> float:
    """FEATURELAKE_FRESHNESS_HOURS, default 26."""
    raw = os.environ.get("FEATURELAKE_FRESHNESS_HOURS") or str(DEFAULT_FRESHNESS_HOURS)
    try:
        hours = float(raw)
    except ValueError:
        hours = -1.0
    if hours <= 0:
        raise ValueError(f"FEATURELAKE_FRESHNESS_HOURS={raw!r} is not a positive number of hours")
    return hours


def _day_counts(lake: LakeResource, context: AssetCheckExecutionContext):
    """(day, landing file, the table) of the check's partition; None members when missing."""
    day = partition_day(context.partition_key)
    path = landing_path(lake.landing_dir(), day)
    lk = lake.lake()
    table = lk.table(SAMPLES_TABLE) if lk.table_exists(SAMPLES_TABLE) else None
    return day, (path if path.exists() else None), table


def _missing(what: str) -> AssetCheckResult:
    return AssetCheckResult(passed=False, description=what, metadata={"reason": MetadataValue.text(what)})


@asset_check(
    asset=samples,
    blocking=True,
    partitions_def=daily_partitions,
    description=f"No key of {SAMPLES_TABLE} is live twice and the key index agrees with the data "
    "(Table.verify_index: every row found at its own place).",
)
def samples_keys_unique(context: AssetCheckExecutionContext, lake: LakeResource) -> AssetCheckResult:
    lk = lake.lake()
    if not lk.table_exists(SAMPLES_TABLE):
        return _missing(f"{SAMPLES_TABLE} does not exist")
    report = lk.table(SAMPLES_TABLE).verify_index()
    counts = ("rows", "duplicate_keys", "duplicate_entries", "missing", "wrong", "uncovered_files", "segments")
    passed = bool(report["ok"])
    return AssetCheckResult(
        passed=passed,
        description="every key once, index right" if passed else
        f"{report['duplicate_keys']} duplicate keys, {report['missing']} rows missing from the index, "
        f"{report['wrong']} wrong entries: run `featurelake index verify {SAMPLES_TABLE}`",
        metadata={name: MetadataValue.int(int(report[name])) for name in counts},
    )


@asset_check(
    asset=samples,
    blocking=True,
    partitions_def=daily_partitions,
    description=f"The day's rows in {SAMPLES_TABLE} equal the rows of the day's landing file.",
)
def samples_match_landing(context: AssetCheckExecutionContext, lake: LakeResource) -> AssetCheckResult:
    day, path, table = _day_counts(lake, context)
    if path is None or table is None:
        return _missing(f"no landing file or no table for {day}")
    landed = pq.ParquetFile(path).metadata.num_rows
    in_table = table.read(columns=[PRIMARY_KEY], filter=day_filter(day)).num_rows
    return AssetCheckResult(
        passed=landed == in_table,
        description=f"{in_table} rows in the table for {day}, {landed} in the landing file",
        metadata={
            "day": MetadataValue.text(day.isoformat()),
            "landing_rows": MetadataValue.int(landed),
            "table_rows": MetadataValue.int(in_table),
            "landing_file": MetadataValue.path(str(path)),
        },
    )


@asset_check(
    asset=labels,
    blocking=True,
    partitions_def=daily_partitions,
    description=f"The day's labelled rows and positives ({LABEL_COLUMN} = 1) in {SAMPLES_TABLE} "
    "equal those of the day's landing file.",
)
def labels_match_landing(context: AssetCheckExecutionContext, lake: LakeResource) -> AssetCheckResult:
    day, path, table = _day_counts(lake, context)
    if path is None or table is None or LABEL_COLUMN not in table.iceberg.schema().column_names:
        return _missing(f"no landing file, table or label column for {day}")
    landed = pq.read_table(path, columns=[LABEL_COLUMN]).column(0)
    served = table.read(columns=[LABEL_COLUMN], filter=day_filter(day)).column(0)
    counts = {
        "landing_labelled": len(landed) - landed.null_count,
        "table_labelled": len(served) - served.null_count,
        "landing_positives": int(pc.sum(landed).as_py() or 0),
        "table_positives": int(pc.sum(served).as_py() or 0),
    }
    passed = (counts["landing_labelled"], counts["landing_positives"]) == (
        counts["table_labelled"], counts["table_positives"])
    return AssetCheckResult(
        passed=passed,
        description=f"{counts['table_labelled']} labelled rows ({counts['table_positives']} positive) in the "
        f"table for {day}, {counts['landing_labelled']} ({counts['landing_positives']}) in the landing file",
        metadata={"day": MetadataValue.text(day.isoformat()),
                  **{k: MetadataValue.int(v) for k, v in counts.items()}},
    )


def freshness_checks(hours=None) -> list:
    """Last-update freshness checks of ``samples`` and ``labels`` (default FEATURELAKE_FRESHNESS_HOURS)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "superseded" (see above)
        return list(build_last_update_freshness_checks(
            assets=[samples, labels], lower_bound_delta=timedelta(hours=hours or freshness_hours())))


blocking_checks = [samples_keys_unique, samples_match_landing, labels_match_landing]
main_freshness_checks = freshness_checks()
freshness_sensor = build_sensor_for_freshness_checks(
    freshness_checks=main_freshness_checks, name="main_freshness_sensor")
main_checks = [*blocking_checks, *main_freshness_checks]

__all__ = ["main_checks", "blocking_checks", "freshness_checks", "main_freshness_checks", "freshness_sensor",
           "freshness_hours", "samples_keys_unique", "samples_match_landing", "labels_match_landing"]
