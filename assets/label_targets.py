"""Group ``labels``: a training target is a dynamic partition with its own label branch.

A new training target (a new model objective) needs new label columns on
every sample, but the features stay what main has. ``target_labels`` for
target ``T`` backfills only T's label column(s) on the branch ``labels/T`` of
``ml.samples``: the branch shares every data file (the features) with main,
zero copy, and owns nothing but the update files holding the labels. Main's
snapshot is never touched. A trainer reads ``t.read(branch="labels/T")``.

Targets are defined in :data:`TARGETS` (a function from landed impressions to
``sample_id`` + label columns); their partitions are added in the UI or from
``training_targets`` in assets/research_spec.yaml (``research_spec_sensor``).

Re-materializing a target first brings its branch up to main (``rebase``:
new days of samples appear) and then labels only the rows still without a
label, so repeated runs write nothing twice. When the rebase conflicts (main
rewrote data files the labels were written against, e.g. a re-materialized
day) the branch is recreated from main and labelled again: labels are derived
data, cheap to rebuild.

Iceberg schemas are table-wide: a label column added on ``labels/T`` is in
main's schema too (all null there); only the values are branch-local.

No ``from __future__ import annotations``: Dagster reads real annotations.
"""
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dagster import (
    AllPartitionMapping,
    AssetDep,
    AssetExecutionContext,
    AssetSelection,
    DynamicPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
    define_asset_job,
)

from assets.main import PRIMARY_KEY, SAMPLES_TABLE, raw_impressions, samples
from assets.metadata import with_mib
from resources import LakeResource

GROUP = "labels"
BRANCH_PREFIX = "labels/"
target_partitions = DynamicPartitionsDefinition(name="training_targets")


# ------------------------------------------------------------------- targets
@dataclass(frozen=True)
class Target:
    """A training target: landed impressions (``inputs``) -> ``sample_id`` + ``columns``."""

    name: str
    columns: tuple
    inputs: tuple
    fn: Callable[[pa.Table], pa.Table]
    description: str = ""


TARGETS: dict = {}


def target(name: str, *, columns, inputs, description: str = ""):
    """Register ``fn(landed rows) -> table of sample_id + columns`` as training target ``name``."""

    def register(fn):
        TARGETS[name] = Target(name, tuple(columns), tuple(dict.fromkeys([PRIMARY_KEY, *inputs])), fn,
                               description or " ".join((fn.__doc__ or "").split()))
        return fn

    return register


def _unit(sample_id: pa.ChunkedArray, salt: int) -> np.ndarray:
    """A deterministic uniform [0, 1) draw per sample (splitmix64 of the id): reproducible labels."""
    with np.errstate(over="ignore"):
        x = np.asarray(sample_id.to_numpy(), dtype=np.uint64) + np.uint64(salt) * np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@target("ctr", columns=["label_ctr"], inputs=["click"])
def ctr_target(raw: pa.Table) -> pa.Table:
    """Click-through: the impression was clicked (0/1)."""
    return pa.table({PRIMARY_KEY: raw[PRIMARY_KEY], "label_ctr": pc.cast(raw["click"], pa.int8())})


LONG_DWELL_SECONDS = 30.0


@target("long_dwell", columns=["dwell_s", "label_long_dwell"], inputs=["click", "f3"])
def long_dwell_target(raw: pa.Table) -> pa.Table:
    """Long dwell: a click followed by at least 30 s on the item.

    The synthetic source has no dwell time, so one is derived deterministically:
    clicks dwell ``exp(2.6 + 0.5 * f3 + 0.8 * z)`` seconds (z a standard normal
    drawn from the sample id, a null f3 counts as 0), impressions without a
    click dwell 0 s.
    """
    u1 = np.clip(_unit(raw[PRIMARY_KEY], 1), 1e-12, 1.0)
    u2 = _unit(raw[PRIMARY_KEY], 2)
    z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
    f3 = np.nan_to_num(np.asarray(raw["f3"].to_numpy(), dtype=np.float64), nan=0.0)
    clicked = np.nan_to_num(np.asarray(raw["click"].to_numpy(), dtype=np.float64), nan=0.0) > 0
    dwell = np.where(clicked, np.exp(2.6 + 0.5 * f3 + 0.8 * z), 0.0)
    return pa.table(
        {
            PRIMARY_KEY: raw[PRIMARY_KEY],
            "dwell_s": pa.array(dwell.astype(np.float32)),
            "label_long_dwell": pa.array((dwell >= LONG_DWELL_SECONDS).astype(np.int8)),
        }
    )


def branch_for_target(name: str) -> str:
    from featurelake.refs import check_ref_name

    return check_ref_name(f"{BRANCH_PREFIX}{name}")


def landed_impressions(landing_dir: Path, columns) -> pa.Table:
    """Every landed day of raw impressions (the label source), ``columns`` only."""
    files = sorted(Path(landing_dir).glob("impressions/*.parquet"))
    if not files:
        raise Failure(f"no landed raw impressions under {landing_dir}: materialize raw_impressions first")
    return pa.concat_tables([pq.read_table(f, columns=list(columns)) for f in files])


def _prepare_branch(t, branch: str) -> str:
    """Create, rebase or recreate the label branch; returns what was done."""
    from featurelake.errors import MergeConflictError

    if branch not in t.branches():
        t.create_branch(branch)
        return "created"
    before = t.branches()[branch]
    try:
        head = t.rebase(branch)
    except MergeConflictError:
        t.drop_branch(branch)
        t.create_branch(branch)
        return "recreated (rebase conflict)"
    return "rebased onto main" if head != before else "up to date"


# --------------------------------------------------------------------- asset
@asset(
    group_name=GROUP,
    partitions_def=target_partitions,
    deps=[
        AssetDep(samples, partition_mapping=AllPartitionMapping()),
        AssetDep(raw_impressions, partition_mapping=AllPartitionMapping()),
    ],
    kinds={"iceberg"},
    description=f"The training target's label column(s) backfilled on branch `{BRANCH_PREFIX}<target>` "
    f"of {SAMPLES_TABLE}: features shared with main (zero copy), main untouched.",
)
def target_labels(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
    name = context.partition_key
    spec = TARGETS.get(name)
    if spec is None:
        raise Failure(f"unknown training target {name!r}; defined targets: {sorted(TARGETS)} (assets/label_targets.py)")
    lk = lake.lake()
    if not lk.table_exists(SAMPLES_TABLE):
        raise Failure(f"{SAMPLES_TABLE} does not exist yet: materialize the main group first")
    t = lk.table(SAMPLES_TABLE)
    branch = branch_for_target(name)
    started = time.perf_counter()
    main_before = t.branches().get("main")
    action = _prepare_branch(t, branch)

    # rows of the branch that still lack this target's label
    marker = spec.columns[0]
    have_marker = marker in t.schema.names
    current = t.read(columns=[PRIMARY_KEY, marker] if have_marker else [PRIMARY_KEY], branch=branch)
    todo = current.filter(pc.is_null(current[marker])) if have_marker else current
    todo_keys = todo.column(PRIMARY_KEY)

    raw = landed_impressions(lake.landing_dir(), spec.inputs)
    raw = raw.filter(pc.is_in(raw[PRIMARY_KEY], value_set=todo_keys.combine_chunks()))
    labels = spec.fn(raw).select([PRIMARY_KEY, *spec.columns])
    rows_without_source = todo.num_rows - labels.num_rows

    bytes_written = update_files = 0
    new_columns = []
    snapshot_id = t.branches()[branch]
    if labels.num_rows:
        snapshot_id = t.backfill(labels, branch=branch)
        report = t.last_update_report
        bytes_written, update_files = int(report.bytes_written), int(report.update_files)
        new_columns = list(report.new_columns)
    seconds = time.perf_counter() - started

    stats = t.stats(branch)
    main_after = t.branches().get("main")
    labelled = t.read(columns=list(spec.columns), branch=branch)
    label = labelled.column(spec.columns[-1])  # the 0/1 label is the last column
    rows_labelled_total = labelled.num_rows - label.null_count
    positive_rate = float(pc.mean(pc.cast(label, pa.float64())).as_py() or 0.0) if rows_labelled_total else 0.0
    context.log.info(
        f"target {name}: {labels.num_rows} rows labelled on {branch} ({action}); "
        f"{bytes_written} bytes written; branch owns {stats.get('exclusive_bytes')} bytes, "
        f"shares {stats.get('shared_bytes')} with other refs; main {'unchanged' if main_before == main_after else 'MOVED'}"
    )
    return MaterializeResult(
        metadata=with_mib({
            "target": MetadataValue.text(name),
            "branch": MetadataValue.text(branch),
            "table": MetadataValue.text(SAMPLES_TABLE),
            "columns": MetadataValue.text(", ".join(spec.columns)),
            "new_columns": MetadataValue.text(", ".join(new_columns)),
            "branch_action": MetadataValue.text(action),
            "rows_labelled": MetadataValue.int(labels.num_rows),
            "dagster/row_count": MetadataValue.int(labels.num_rows),
            "rows_labelled_total": MetadataValue.int(int(rows_labelled_total)),
            "rows_without_source": MetadataValue.int(int(rows_without_source)),
            "positive_rate": MetadataValue.float(round(positive_rate, 6)),
            "update_files": MetadataValue.int(update_files),
            "bytes_written": MetadataValue.int(bytes_written),
            "branch_rows": MetadataValue.int(int(stats.get("rows", 0))),
            "exclusive_bytes": MetadataValue.int(int(stats.get("exclusive_bytes", 0))),
            "shared_bytes": MetadataValue.int(int(stats.get("shared_bytes", 0))),
            "branch_snapshot_id": MetadataValue.text(str(snapshot_id)),
            "main_snapshot_id": MetadataValue.text(str(main_after)),
            "main_unchanged": MetadataValue.bool(main_before == main_after),
            "seconds": MetadataValue.float(round(seconds, 4)),
        })
    )


labels_assets = [target_labels]

labels_job = define_asset_job(
    "labels_job",
    selection=AssetSelection.groups(GROUP),
    partitions_def=target_partitions,
    description="One training target: its labels backfilled on its label branch (main untouched).",
)

__all__ = [
    "GROUP",
    "TARGETS",
    "Target",
    "target",
    "target_partitions",
    "target_labels",
    "labels_assets",
    "labels_job",
    "branch_for_target",
]
