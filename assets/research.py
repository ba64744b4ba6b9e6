"""Group ``research``: a research branch is a dynamic partition, merged into main only through a gate.

    research_branch -> branch_features -> [blocking checks] -> branch_merge

* Partition key ``K`` (DynamicPartitionsDefinition ``research_branches``) is
  the research branch ``research/K`` of ``ml.samples``. Keys are added from
  assets/research_spec.yaml by ``research_spec_sensor`` or in the UI.
* ``research_branch`` resolves the branch's candidate features -- run config
  ``features`` if given, else the YAML spec of ``K``, else ``K`` itself when
  it names a registered feature -- records them in its materialization
  metadata (the single source for the downstream steps) and (re)creates the
  branch from main's current head, zero copy. Re-materializing restarts the
  experiment: the old branch is dropped, and candidate columns it added that
  the new spec no longer names and that no other ref holds values of are
  soft-deleted (Iceberg schemas are table-wide, so a rejected candidate would
  otherwise stay visible on main as an all-null column).
* ``branch_features`` computes the candidates with the feature registry
  (assets/feature_defs.py) from the branch's own sample columns and backfills
  them on the branch (merge-on-read: update files only). The write always goes
  to the branch, never to main: blocking checks protect downstream assets
  only.
* ``branch_quality`` is one multi-asset check with four blocking checks on
  ``branch_features`` -- ``null_fraction``, ``value_range``,
  ``distinct_count``, ``drift`` -- each validating that kind of expectation
  for every candidate of the branch (great_expectations, plus a KS drift
  measure against main: featurelake/quality.py). Observed values, thresholds,
  per-feature verdicts and the failing expectations go into the check
  metadata. A failing check stops ``branch_merge`` in the same run, so main's
  snapshot id does not move.
* ``branch_merge`` merges the branch into main. It validates again before
  merging (a run that selects ``branch_merge`` without its checks must not
  slip past the gate) and refuses with QualityGateError unless the gate
  passed or was overridden.

The gate is per branch: a branch merges all its candidates or none. A
researcher who wants the passing candidates of a blocked branch narrows the
spec (YAML, or run config ``features``) and re-materializes: the branch is
rebuilt from main with only those features, and the rejected column is
retired.

Override (an explicit, recorded human decision): launch the run with both tags

    featurelake/gate-override-by      who decides (e.g. an email)
    featurelake/gate-override-reason  why

A failing expectation then yields a check result with ``passed=False`` and
severity WARN -- it stays recorded as failed, but WARN does not block -- with
``overridden_by`` / ``override_reason`` in its metadata; ``branch_merge``
merges and records the override and the expectations it overrode. A run with
only one of the two tags fails before merging. The override applies to that
run (that branch) only.

No ``from __future__ import annotations``: Dagster reads real annotations.
"""
import os
import time
import warnings
from pathlib import Path
from typing import Optional

from dagster import (
    AllPartitionMapping,
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetDep,
    AssetExecutionContext,
    AssetRecordsFilter,
    AssetSelection,
    Config,
    DefaultSensorStatus,
    DynamicPartitionsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    PreviewWarning,
    RunRequest,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset,
    define_asset_job,
    multi_asset_check,
    sensor,
)
from pydantic import Field

from assets import label_targets as labels_group
from assets.feature_defs import FEATURES
from assets.main import SAMPLES_TABLE, samples
from assets.metadata import with_mib
from resources import LakeResource

GROUP = "research"
BRANCH_PREFIX = "research/"
research_partitions = DynamicPartitionsDefinition(name="research_branches")

OVERRIDE_BY_TAG = "featurelake/gate-override-by"
OVERRIDE_REASON_TAG = "featurelake/gate-override-reason"
CHECK_KINDS = ("null_fraction", "value_range", "distinct_count", "drift")
SPEC_ENV = "FEATURELAKE_RESEARCH_SPEC"
DEFAULT_SPEC = Path(__file__).with_name("research_spec.yaml")


# --------------------------------------------------------------------- spec
def spec_path() -> Path:
    return Path(os.environ.get(SPEC_ENV) or DEFAULT_SPEC)


def load_spec(path: Optional[Path] = None) -> dict:
    """The research spec: ``{"research_branches": {key: {"features": [...], ...}}, "training_targets": [...]}``."""
    import yaml

    path = Path(path) if path is not None else spec_path()
    if not path.exists():
        return {"research_branches": {}, "training_targets": []}
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    branches = raw.get("research_branches") or {}
    if not isinstance(branches, dict):
        raise ValueError(f"{path}: research_branches must map partition keys to specs")
    out = {}
    for key, spec in branches.items():
        spec = {"features": spec} if isinstance(spec, list) else dict(spec or {})
        feats = spec.get("features") or []
        if isinstance(feats, str):
            feats = [feats]
        if not feats:
            raise ValueError(f"{path}: research branch {key!r} names no features")
        branch_for(str(key))  # refuse a key that makes no valid branch name
        out[str(key)] = {"features": [str(f) for f in feats], "description": str(spec.get("description") or "")}
    targets = raw.get("training_targets") or []
    if isinstance(targets, str):
        targets = [targets]
    return {"research_branches": out, "training_targets": [str(t) for t in targets], "path": str(path)}


def branch_for(key: str) -> str:
    """The Iceberg branch of partition ``key``: ``research/<key>``."""
    from featurelake.errors import InvalidNameError
    from featurelake.refs import check_ref_name

    try:
        return check_ref_name(key if key.startswith(BRANCH_PREFIX) else f"{BRANCH_PREFIX}{key}")
    except InvalidNameError as e:
        raise Failure(f"research partition {key!r} is not a valid branch name: {e}") from e


def resolve_features(key: str, configured=None, spec: Optional[dict] = None) -> tuple:
    """(candidate features, where they came from) for partition ``key``."""
    if configured:
        feats, source = list(configured), "run config"
    else:
        spec = spec if spec is not None else load_spec()
        entry = spec["research_branches"].get(key)
        if entry is not None:
            feats, source = list(entry["features"]), f"spec {spec.get('path', 'yaml')}"
        elif key in FEATURES:
            feats, source = [key], "partition key"
        else:
            raise Failure(
                f"research branch {key!r} has no spec: add it to {spec_path()}, give research_branch "
                f"the run config features: [...], or name the partition after a registered feature "
                f"({FEATURES.names()})"
            )
    unknown = [f for f in feats if f not in FEATURES]
    if unknown:
        raise Failure(f"research branch {key!r}: unknown feature(s) {unknown}; registered: {FEATURES.names()}")
    return list(dict.fromkeys(feats)), source


def recorded_spec(instance, key: str) -> tuple:
    """(branch, features) that ``research_branch`` recorded for partition ``key``."""
    records = instance.fetch_materializations(
        AssetRecordsFilter(asset_key=research_branch.key, asset_partitions=[key]), limit=1
    ).records
    if not records:
        raise Failure(f"research branch {key!r} was never created: materialize research_branch for it first")
    md = records[0].asset_materialization.metadata
    return md["branch"].value, list(md["features"].value)


def gate_override(tags) -> Optional[dict]:
    """The override this run carries (both tags), None without one; half an override is an error."""
    who = (tags.get(OVERRIDE_BY_TAG) or "").strip()
    why = (tags.get(OVERRIDE_REASON_TAG) or "").strip()
    if not who and not why:
        return None
    if not (who and why):
        raise Failure(
            f"a gate override needs both run tags {OVERRIDE_BY_TAG} (who) and {OVERRIDE_REASON_TAG} (why); "
            f"got by={who!r}, reason={why!r}"
        )
    return {"by": who, "reason": why}


def _table(lake: LakeResource):
    lk = lake.lake()
    if not lk.table_exists(SAMPLES_TABLE):
        raise Failure(f"{SAMPLES_TABLE} does not exist yet: materialize the main group first")
    return lk.table(SAMPLES_TABLE)


# ------------------------------------------------------------------- assets
class ResearchBranchConfig(Config):
    features: list[str] = Field(
        default_factory=list,
        description="Candidate features of this branch (registered in assets/feature_defs.py); "
        "empty: take them from assets/research_spec.yaml.",
    )


@asset(
    group_name=GROUP,
    partitions_def=research_partitions,
    deps=[AssetDep(samples, partition_mapping=AllPartitionMapping())],
    kinds={"iceberg"},
    description=f"The research branch `{BRANCH_PREFIX}<key>` of {SAMPLES_TABLE}, (re)created from main "
    "(zero copy); records the branch's candidate features.",
)
def research_branch(
    context: AssetExecutionContext, config: ResearchBranchConfig, lake: LakeResource
) -> MaterializeResult:
    from featurelake.features import columns_in_use

    key = context.partition_key
    features, source = resolve_features(key, config.features)
    branch = branch_for(key)
    t = _table(lake)
    previous = t.branches().get(branch)
    retired: list = []
    if previous is not None:
        try:
            added = t.diff(branch)["columns_added"]
        except Exception:  # no shared history left (expired): nothing to retire
            added = []
        t.drop_branch(branch)
        stale = [c for c in added if c not in features]
        in_use = columns_in_use(t, stale) if stale else set()
        for column in stale:
            if column not in in_use:
                t.soft_delete_column(column)
                retired.append(column)
    start = t.create_branch(branch)
    context.log.info(
        f"{SAMPLES_TABLE}@{branch}: {'re' if previous is not None else ''}created at main snapshot {start}; "
        f"candidates {features} ({source})" + (f"; retired columns {retired}" if retired else "")
    )
    return MaterializeResult(
        metadata=with_mib({
            "branch": MetadataValue.text(branch),
            "table": MetadataValue.text(SAMPLES_TABLE),
            "features": MetadataValue.json(features),
            "spec_source": MetadataValue.text(source),
            "from_snapshot_id": MetadataValue.text(str(start)),
            "reset": MetadataValue.bool(previous is not None),
            "previous_head": MetadataValue.text(str(previous) if previous is not None else ""),
            "retired_columns": MetadataValue.text(", ".join(retired)),
        })
    )


@asset(
    group_name=GROUP,
    partitions_def=research_partitions,
    deps=[research_branch],
    kinds={"iceberg"},
    description="The branch's candidate features computed from its sample columns and backfilled on the "
    "branch (merge-on-read, never on main).",
)
def branch_features(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
    import pyarrow.compute as pc

    from featurelake.features import compute_features

    key = context.partition_key
    branch, features = recorded_spec(context.instance, key)
    t = _table(lake)
    if branch not in t.branches():
        raise Failure(f"branch {branch!r} is gone: re-materialize research_branch for {key!r}")
    started = time.perf_counter()
    data = compute_features(t, features, branch=branch, registry=FEATURES)
    snapshot_id = t.backfill(data, branch=branch)
    report = t.last_update_report
    seconds = time.perf_counter() - started
    stats = t.stats(branch)
    diff = t.diff(branch)
    nulls = {f: int(data.column(f).null_count) for f in features}
    means = {f: _round(pc.mean(data.column(f)).as_py()) for f in features}
    context.log.info(
        f"{SAMPLES_TABLE}@{branch}: backfilled {features} on {report.rows_updated} rows "
        f"({report.update_files} update files, {report.bytes_written} bytes; snapshot {snapshot_id})"
    )
    return MaterializeResult(
        metadata=with_mib({
            "branch": MetadataValue.text(branch),
            "features": MetadataValue.json(features),
            "descriptions": MetadataValue.json({f: FEATURES.get(f).description for f in features}),
            "rows_updated": MetadataValue.int(int(report.rows_updated)),
            "dagster/row_count": MetadataValue.int(int(report.rows_updated)),
            "new_columns": MetadataValue.text(", ".join(report.new_columns)),
            "update_files": MetadataValue.int(int(report.update_files)),
            "bytes_written": MetadataValue.int(int(report.bytes_written)),
            "null_counts": MetadataValue.json(nulls),
            "means": MetadataValue.json(means),
            "columns_added_vs_main": MetadataValue.text(", ".join(diff["columns_added"])),
            "exclusive_bytes": MetadataValue.int(int(stats.get("exclusive_bytes", 0))),
            "shared_bytes": MetadataValue.int(int(stats.get("shared_bytes", 0))),
            "snapshot_id": MetadataValue.text(str(snapshot_id)),
            "seconds": MetadataValue.float(round(seconds, 4)),
        })
    )


def _round(v):
    return round(v, 6) if isinstance(v, float) else v


# Partitioned checks (one result per research branch, not one per asset) are a Dagster
# preview feature in 1.13: its PreviewWarning is silenced here, on purpose, once.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", PreviewWarning)
    _CHECK_SPECS = [
        AssetCheckSpec(
            kind,
            asset=branch_features,
            blocking=True,
            partitions_def=research_partitions,
            description=f"great_expectations {kind.replace('_', ' ')} expectations of every candidate "
            "feature on the branch (drift: KS statistic against main).",
        )
        for kind in CHECK_KINDS
    ]


@multi_asset_check(
    specs=_CHECK_SPECS,
    name="branch_quality",
    description="Validates the branch's candidate features once and reports one blocking check per "
    "expectation kind; a failure stops branch_merge.",
)
def branch_quality(context: AssetCheckExecutionContext, lake: LakeResource):
    from featurelake.quality import validate_features

    key = context.partition_key
    branch, features = recorded_spec(context.instance, key)
    override = gate_override(context.run.tags)
    t = _table(lake)
    result = validate_features(t, features, branch, registry=FEATURES)
    for kind in CHECK_KINDS:
        outcomes = result.for_kind(kind)
        failing = [o.name for o in outcomes if not o.success]
        passed = not failing
        metadata = {
            "branch": MetadataValue.text(branch),
            "rows": MetadataValue.int(result.rows),
            "features_checked": MetadataValue.text(", ".join(o.feature for o in outcomes) or "(none declared)"),
            "verdicts": MetadataValue.json({o.feature: "passed" if o.success else "FAILED" for o in outcomes}),
            "observed": MetadataValue.json({o.feature: o.observed for o in outcomes}),
            "expected": MetadataValue.json({o.feature: o.expected for o in outcomes}),
            "failing_expectations": MetadataValue.text(", ".join(failing)),
            "errors": MetadataValue.json({o.feature: o.error for o in outcomes if o.error}),
        }
        severity = AssetCheckSeverity.ERROR
        description = (
            f"{len(outcomes)} {kind} expectation(s) passed" if passed
            else f"failed: {', '.join(failing)}"
        )
        if not passed and override is not None:
            severity = AssetCheckSeverity.WARN  # recorded as failed; WARN does not block
            metadata["overridden_by"] = MetadataValue.text(override["by"])
            metadata["override_reason"] = MetadataValue.text(override["reason"])
            description = f"OVERRIDDEN by {override['by']} ({override['reason']}): {description}"
            context.log.warning(f"{branch}: {kind} gate overridden by {override['by']}: {override['reason']}")
        yield AssetCheckResult(
            check_name=kind,
            asset_key=branch_features.key,
            passed=passed,
            severity=severity,
            description=description,
            metadata=metadata,
        )


@asset(
    group_name=GROUP,
    partitions_def=research_partitions,
    deps=[branch_features],
    kinds={"iceberg"},
    description=f"The research branch merged into main of {SAMPLES_TABLE}; runs only when every "
    "blocking check of branch_features passed (or a human overrode the gate).",
)
def branch_merge(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
    from featurelake.errors import MergeConflictError, QualityGateError
    from featurelake.quality import validate_features

    key = context.partition_key
    branch, features = recorded_spec(context.instance, key)
    override = gate_override(context.run.tags)
    t = _table(lake)
    if branch not in t.branches():
        raise Failure(f"branch {branch!r} is gone: re-materialize research_branch for {key!r}")
    # the gate again: blocking checks protect this step only when they ran in this run
    result = validate_features(t, features, branch, registry=FEATURES)
    if not result.success and override is None:
        err = QualityGateError(f"{SAMPLES_TABLE}@{branch}: {result.summary()}")
        raise Failure(
            f"not merged: {err}",
            metadata={"failing_expectations": MetadataValue.text(", ".join(result.failing))},
        ) from err
    heads = t.branches()
    main_before, branch_head = heads["main"], heads[branch]
    diff = t.diff(branch)
    started = time.perf_counter()
    try:
        main_after = t.merge(branch, into="main")
    except MergeConflictError as e:
        shown = "; ".join(f"{c} of {f.rsplit('/', 1)[-1]}: {why}" for f, c, why in e.conflicts[:10])
        raise Failure(f"{branch} conflicts with main: {shown}. Re-materialize research_branch to restart "
                      f"from main's head.") from e
    seconds = time.perf_counter() - started
    gate = "passed" if result.success else "overridden"
    if override is not None and not result.success:
        context.log.warning(
            f"{branch} merged into main despite failing {result.failing}: override by "
            f"{override['by']} ({override['reason']})"
        )
    stats = t.stats(branch)
    return MaterializeResult(
        metadata=with_mib({
            "branch": MetadataValue.text(branch),
            "features": MetadataValue.json(features),
            "gate": MetadataValue.text(gate),
            "overridden_by": MetadataValue.text(override["by"] if override and not result.success else ""),
            "override_reason": MetadataValue.text(override["reason"] if override and not result.success else ""),
            "overridden_expectations": MetadataValue.text(", ".join(result.failing)),
            "main_before": MetadataValue.text(str(main_before)),
            "main_after": MetadataValue.text(str(main_after)),
            "fast_forward": MetadataValue.bool(main_after == branch_head),
            "columns_added": MetadataValue.text(", ".join(diff["columns_added"])),
            "columns_updated": MetadataValue.text(", ".join(diff["columns_updated"])),
            "bytes_merged": MetadataValue.int(int(diff["bytes_added"])),
            "branch_exclusive_bytes": MetadataValue.int(int(stats.get("exclusive_bytes", 0))),
            "seconds": MetadataValue.float(round(seconds, 4)),
        })
    )


research_assets = [research_branch, branch_features, branch_merge]
research_checks = [branch_quality]

research_job = define_asset_job(
    "research_job",
    selection=AssetSelection.groups(GROUP),
    partitions_def=research_partitions,
    description="One research branch: create it, backfill its candidate features, run the blocking "
    "quality checks, merge into main only if they pass.",
)


# ------------------------------------------------------------------- sensor
@sensor(
    name="research_spec_sensor",
    jobs=[research_job, labels_group.labels_job],
    minimum_interval_seconds=60,
    default_status=DefaultSensorStatus.STOPPED,
    description="Adds the research branches and training targets of assets/research_spec.yaml as "
    "dynamic partitions and requests one run for each new one.",
)
def research_spec_sensor(context: SensorEvaluationContext):
    spec = load_spec()
    have_branches = set(context.instance.get_dynamic_partitions(research_partitions.name))
    have_targets = set(context.instance.get_dynamic_partitions(labels_group.target_partitions.name))
    new_branches = [k for k in spec["research_branches"] if k not in have_branches]
    new_targets = [k for k in spec["training_targets"] if k not in have_targets]
    if not new_branches and not new_targets:
        return SkipReason(f"every research branch and training target of {spec_path().name} exists")
    requests, runs = [], []
    if new_branches:
        requests.append(research_partitions.build_add_request(new_branches))
        runs += [RunRequest(job_name=research_job.name, partition_key=k, run_key=f"research:{k}")
                 for k in new_branches]
    if new_targets:
        requests.append(labels_group.target_partitions.build_add_request(new_targets))
        runs += [RunRequest(job_name=labels_group.labels_job.name, partition_key=k, run_key=f"target:{k}")
                 for k in new_targets]
    return SensorResult(run_requests=runs, dynamic_partitions_requests=requests)


__all__ = [
    "GROUP",
    "research_partitions",
    "research_branch",
    "branch_features",
    "branch_quality",
    "branch_merge",
    "research_assets",
    "research_checks",
    "research_job",
    "research_spec_sensor",
    "load_spec",
    "branch_for",
    "resolve_features",
    "gate_override",
    "OVERRIDE_BY_TAG",
    "OVERRIDE_REASON_TAG",
    "CHECK_KINDS",
]
