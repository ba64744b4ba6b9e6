"""The compaction sensor: request compaction where small files or update layers pile up.

Every tick the sensor walks the lake's tables and their branches and reads
only cheap metadata (``featurelake.health``: snapshot summaries, platform
state, and manifests only when the summary shows enough data files to
matter; never a data or update file). It requests a run of the ``compaction``
asset for partition ``<table>|<branch>`` when, at the branch head,

* compactable small files (small files sharing a partition) >= ``min_small_files``, or
* the most update layers stacked on one data file >= ``min_update_layers``, or
* live update files >= ``min_update_files``, or
* the table's external-reader staleness policy is violated (table properties
  ``external-readers.max-pending-layers`` / ``external-readers.max-staleness``,
  see ``featurelake.health.StalenessPolicy``): other engines must never read
  values staler than the table allows.

A threshold of 0 or None switches that rule off. Defaults come from
FEATURELAKE_COMPACT_MIN_SMALL_FILES (16), FEATURELAKE_COMPACT_MIN_UPDATE_LAYERS
(4) and FEATURELAKE_COMPACT_MIN_UPDATE_FILES (0: off); factory arguments win.

Never the same work twice:

* the run key is ``<table>|<branch>|<head snapshot id>``: the daemon never
  launches two runs with one run key, and a compaction's own commit moves the
  head, so only a *new* write can request that branch again;
* the cursor remembers the head snapshot evaluated per table/branch, so an
  unchanged branch costs one metadata load and no health read, and direct
  evaluations (tests, the demo) do not repeat either. Changing the thresholds
  resets it;
* a branch whose compaction run is still queued or running is left alone
  (re-evaluated on the next tick).

A compaction run that fails is not retried for the same snapshot: the next
write to the branch makes it eligible again.

No ``from __future__ import annotations``: Dagster reads the resource
annotation of the sensor function.
"""
import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional, Sequence

from dagster import (
    AssetSelection,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    build_sensor_context,
    define_asset_job,
    sensor,
)

from assets import maintenance as maintenance_group
from platform_defs.runs import run_job
from resources import LakeResource

CURSOR_VERSION = 1
DEFAULT_MIN_SMALL_FILES = 16
DEFAULT_MIN_UPDATE_LAYERS = 4
DEFAULT_MIN_UPDATE_FILES = 0
DEFAULT_INTERVAL_S = 300
IN_FLIGHT = [
    DagsterRunStatus.QUEUED,
    DagsterRunStatus.NOT_STARTED,
    DagsterRunStatus.STARTING,
    DagsterRunStatus.STARTED,
]

compaction_job = define_asset_job(
    "compaction_job",
    selection=AssetSelection.assets(maintenance_group.compaction),
    partitions_def=maintenance_group.compaction_partitions,
    description="Compact one table branch (partition '<namespace.table>|<branch>').",
)


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError as e:
        raise ValueError(f"{name}={raw!r} is not an integer") from e


def _autostart() -> bool:
    return os.environ.get("FEATURELAKE_MAINTENANCE_AUTOSTART", "").lower() in ("1", "true", "yes", "on")


# ---------------------------------------------------------------- thresholds
@dataclass(frozen=True)
class Thresholds:
    """When a branch needs compaction; 0 or None switches a rule off."""

    min_small_files: Optional[int] = DEFAULT_MIN_SMALL_FILES
    min_update_layers: Optional[int] = DEFAULT_MIN_UPDATE_LAYERS
    min_update_files: Optional[int] = DEFAULT_MIN_UPDATE_FILES

    @classmethod
    def from_env(
        cls,
        min_small_files: Optional[int] = None,
        min_update_layers: Optional[int] = None,
        min_update_files: Optional[int] = None,
    ) -> "Thresholds":
        """Arguments given win; the others come from the environment (or the defaults)."""
        return cls(
            min_small_files=min_small_files
            if min_small_files is not None
            else _env_int("FEATURELAKE_COMPACT_MIN_SMALL_FILES", DEFAULT_MIN_SMALL_FILES),
            min_update_layers=min_update_layers
            if min_update_layers is not None
            else _env_int("FEATURELAKE_COMPACT_MIN_UPDATE_LAYERS", DEFAULT_MIN_UPDATE_LAYERS),
            min_update_files=min_update_files
            if min_update_files is not None
            else _env_int("FEATURELAKE_COMPACT_MIN_UPDATE_FILES", DEFAULT_MIN_UPDATE_FILES),
        )

    def reasons(self, health: dict) -> list[str]:
        """Why ``health`` needs compaction (empty: it does not)."""
        out = []
        checks = (
            ("compactable_small_files", self.min_small_files, "small files"),
            ("max_update_layers", self.min_update_layers, "update layers"),
            ("update_files", self.min_update_files, "update files"),
        )
        for key, threshold, label in checks:
            value = health.get(key)
            if threshold and value is not None and value >= threshold:
                out.append(f"{label} {value} >= {threshold}")
        return out

    @property
    def skip_manifests_below(self) -> int:
        """Manifests are read only when the summary shows at least this many data files."""
        return self.min_small_files if self.min_small_files else 2**62

    def describe(self) -> str:
        """The rules in words, leaving out those switched off."""
        def plural(n: int, word: str) -> str:
            return f"{n} {word}" if n == 1 else f"{n} {word}s"

        rules = []
        if self.min_small_files:
            rules.append(f"at least {plural(self.min_small_files, 'small file')} share a partition")
        if self.min_update_layers:
            rules.append(f"one data file carries at least {plural(self.min_update_layers, 'update layer')}")
        if self.min_update_files:
            verb = "is" if self.min_update_files == 1 else "are"
            rules.append(f"at least {plural(self.min_update_files, 'update file')} {verb} live")
        return "; or ".join(rules)

    def fingerprint(self) -> str:
        return f"{self.min_small_files or 0}/{self.min_update_layers or 0}/{self.min_update_files or 0}"

    def as_dict(self) -> dict:
        return {
            "min_small_files": self.min_small_files or 0,
            "min_update_layers": self.min_update_layers or 0,
            "min_update_files": self.min_update_files or 0,
        }


# ---------------------------------------------------------------- planning (no Dagster)
@dataclass
class CompactionRequest:
    table: str
    branch: str
    snapshot_id: int
    reasons: list[str]
    health: dict

    @property
    def partition_key(self) -> str:
        return maintenance_group.target_key(self.table, self.branch)

    @property
    def run_key(self) -> str:
        return f"{self.table}|{self.branch}|{self.snapshot_id}"


@dataclass
class CompactionPlan:
    requests: list[CompactionRequest] = field(default_factory=list)
    cursor: str = ""
    evaluated: int = 0  # branches whose health was read this tick
    unchanged: int = 0  # branches skipped: head already evaluated
    in_flight: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    healthy: dict[str, dict] = field(default_factory=dict)  # key -> health below thresholds


def _load_cursor(cursor: Optional[str], thresholds: Thresholds) -> dict[str, int]:
    if not cursor:
        return {}
    try:
        raw = json.loads(cursor)
    except ValueError:
        return {}
    if raw.get("v") != CURSOR_VERSION or raw.get("thresholds") != thresholds.fingerprint():
        return {}  # new thresholds: evaluate every branch again
    return {str(k): int(v) for k, v in (raw.get("seen") or {}).items()}


def _dump_cursor(seen: dict[str, int], thresholds: Thresholds) -> str:
    return json.dumps(
        {"v": CURSOR_VERSION, "thresholds": thresholds.fingerprint(), "seen": dict(sorted(seen.items()))},
        separators=(",", ":"),
    )


def plan_compactions(
    lake,
    thresholds: Thresholds,
    cursor: Optional[str] = None,
    *,
    tables: Optional[Iterable[str]] = None,
    branches: Optional[Iterable[str]] = None,
    in_flight: Callable[[str], bool] = lambda key: False,
    now=None,
) -> CompactionPlan:
    """Which table branches need compaction now (the sensor's logic, without Dagster).

    ``now`` (a datetime, default the clock) is when staleness time bounds are judged.
    """
    from pyiceberg.table.refs import SnapshotRefType

    from featurelake.health import staleness_of, staleness_policy, table_health

    seen = _load_cursor(cursor, thresholds)
    plan = CompactionPlan()
    wanted_branches = set(branches) if branches is not None else None
    names = list(tables) if tables is not None else lake.tables()
    present: set[str] = set()
    for name in names:
        try:
            table = lake.table(name)
        except Exception as e:  # dropped between listing and loading, catalog hiccup
            plan.errors[name] = f"{type(e).__name__}: {e}"
            continue
        ice = table._ice  # loaded just now by lake.table
        refs = ice.metadata.refs
        try:
            policy = staleness_policy(ice.metadata.properties)
        except Exception as e:  # a bad policy property: report it, watch the thresholds anyway
            plan.errors[name] = f"{type(e).__name__}: {e}"
            policy = None
        for branch in sorted(n for n, r in refs.items() if r.snapshot_ref_type == SnapshotRefType.BRANCH):
            if wanted_branches is not None and branch not in wanted_branches:
                continue
            key = maintenance_group.target_key(name, branch)
            present.add(key)
            head = refs[branch].snapshot_id
            # a time bound can be crossed without a new commit: such branches are re-read (cached health)
            if seen.get(key) == head and not (policy and policy.max_staleness):
                plan.unchanged += 1
                continue
            if in_flight(key):
                plan.in_flight.append(key)
                continue
            try:
                health = table_health(
                    table, branch, ice=ice, skip_manifests_below=thresholds.skip_manifests_below
                )
            except Exception as e:  # unreadable state: report, retry next tick
                plan.errors[key] = f"{type(e).__name__}: {e}"
                continue
            plan.evaluated += 1
            seen[key] = head
            reasons = thresholds.reasons(health)
            if policy is not None:
                health["staleness"] = staleness_of(health, policy, now)
                reasons += health["staleness"]["violations"]
            if reasons:
                plan.requests.append(CompactionRequest(name, branch, head, reasons, health))
            else:
                plan.healthy[key] = health
    # forget branches that are gone (only among the tables looked at this tick)
    looked_at = set(names)
    for key in list(seen):
        table_name = key.split(maintenance_group.KEY_SEPARATOR, 1)[0]
        if table_name in looked_at and key not in present and key not in plan.errors:
            if wanted_branches is None or key.split(maintenance_group.KEY_SEPARATOR, 1)[1] in wanted_branches:
                del seen[key]
    plan.cursor = _dump_cursor(seen, thresholds)
    return plan


# ---------------------------------------------------------------- the sensor
def sensor_description(thresholds: Thresholds) -> str:
    """What the sensor watches, in words (shown in the UI)."""
    rules = thresholds.describe()
    policy = "the table's external-reader staleness policy (external-readers.max-pending-layers / max-staleness) is broken"
    when = f"when, at its head, {rules}; or when {policy}" if rules else f"only when {policy} (the file thresholds are off)"
    return (
        f"Requests compaction of a table branch {when}. Reads snapshot summaries, "
        "platform state and manifests only, never a data file; one run per (table, branch, snapshot)."
    )


def _in_flight_keys(instance) -> set[str]:
    runs = instance.get_runs(
        filters=RunsFilter(job_name=compaction_job.name, statuses=IN_FLIGHT), limit=1000
    )
    return {r.tags.get("dagster/partition") for r in runs if r.tags.get("dagster/partition")}


def compaction_sensor(
    name: str = "compaction_sensor",
    *,
    min_small_files: Optional[int] = None,
    min_update_layers: Optional[int] = None,
    min_update_files: Optional[int] = None,
    tables: Optional[Sequence[str]] = None,
    branches: Optional[Sequence[str]] = None,
    minimum_interval_seconds: Optional[int] = None,
    default_status: Optional[DefaultSensorStatus] = None,
) -> SensorDefinition:
    """A sensor requesting ``compaction`` runs when thresholds are crossed (see the module doc).

    Thresholds not given come from the environment; ``tables`` / ``branches``
    restrict what it watches (default: everything). It starts STOPPED unless
    FEATURELAKE_MAINTENANCE_AUTOSTART is set (or ``default_status`` says so).
    """
    thresholds = Thresholds.from_env(min_small_files, min_update_layers, min_update_files)
    interval = (
        minimum_interval_seconds
        if minimum_interval_seconds is not None
        else _env_int("FEATURELAKE_COMPACT_SENSOR_INTERVAL_S", DEFAULT_INTERVAL_S)
    )
    status = default_status or (DefaultSensorStatus.RUNNING if _autostart() else DefaultSensorStatus.STOPPED)
    watched_tables = list(tables) if tables is not None else None
    watched_branches = list(branches) if branches is not None else None

    @sensor(
        name=name,
        job=compaction_job,
        minimum_interval_seconds=interval,
        default_status=status,
        description=sensor_description(thresholds),
        metadata={"thresholds": thresholds.as_dict()},
    )
    def _compaction_sensor(context: SensorEvaluationContext, lake: LakeResource):
        busy = _in_flight_keys(context.instance) if _has_instance(context) else set()
        plan = plan_compactions(
            lake.lake(),
            thresholds,
            context.cursor,
            tables=watched_tables,
            branches=watched_branches,
            in_flight=lambda key: key in busy,
        )
        for key, error in plan.errors.items():
            context.log.warning(f"compaction sensor: {key}: {error}")
        requests = [
            RunRequest(
                run_key=r.run_key,
                partition_key=r.partition_key,
                tags={
                    "featurelake/table": r.table,
                    "featurelake/branch": r.branch,
                    "featurelake/snapshot": str(r.snapshot_id),
                    "featurelake/reason": "; ".join(r.reasons),
                },
            )
            for r in plan.requests
        ]
        for r in plan.requests:
            context.log.info(f"compaction requested for {r.partition_key} at {r.snapshot_id}: {'; '.join(r.reasons)}")
        new_keys = []
        if plan.requests:
            existing = set(context.instance.get_dynamic_partitions(maintenance_group.PARTITIONS_NAME))
            new_keys = sorted({r.partition_key for r in plan.requests} - existing)
        skip = None
        if not requests:
            skip = (
                f"no branch over thresholds ({plan.evaluated} evaluated, {plan.unchanged} unchanged, "
                f"{len(plan.in_flight)} compacting)"
            )
        return SensorResult(
            run_requests=requests,
            dynamic_partitions_requests=(
                [maintenance_group.compaction_partitions.build_add_request(new_keys)] if new_keys else []
            ),
            cursor=plan.cursor,
            skip_reason=skip,
        )

    return _compaction_sensor


def _has_instance(context: SensorEvaluationContext) -> bool:
    try:
        return context.instance is not None
    except Exception:  # an invocation without an instance
        return False


# ---------------------------------------------------------------- in-process execution
def evaluate_sensor(
    sensor_def: SensorDefinition,
    instance,
    lake: LakeResource,
    cursor: Optional[str] = None,
    *,
    quiet: bool = False,
):
    """Evaluate a sensor once, in process (tests, the demo): returns its SensorResult.

    ``quiet`` keeps the sensor's INFO log lines off the console.
    """
    import logging

    context = build_sensor_context(
        instance=instance, cursor=cursor, resources={"lake": lake}, sensor_name=sensor_def.name
    )
    if quiet:
        context.log.setLevel(logging.WARNING)
    return sensor_def(context)


def run_requested_compactions(
    result,
    instance,
    lake: LakeResource,
    *,
    run_config: Optional[dict] = None,
    tags: Optional[dict] = None,
    raise_on_error: bool = True,
) -> list[dict[str, Any]]:
    """Do in process what the daemon does with a compaction sensor's result.

    Adds the requested dynamic partitions, then runs ``compaction_job`` for
    every run request (skipping run keys the instance has already run, as the
    daemon does). Returns, per request: partition, run key, run id, success and
    the materialization metadata (plain values).
    """
    for req in result.dynamic_partitions_requests or []:
        keys = [k for k in req.partition_keys if not instance.has_dynamic_partition(req.partitions_def_name, k)]
        if keys:
            instance.add_dynamic_partitions(req.partitions_def_name, keys)
    out = []
    for rr in result.run_requests or []:
        if rr.run_key and instance.get_runs(filters=RunsFilter(tags={"dagster/run_key": rr.run_key}), limit=1):
            continue
        res = run_job(
            compaction_job.name,
            instance,
            {"lake": lake},
            partition_key=rr.partition_key,
            run_config=run_config,
            tags={**dict(rr.tags), **({"dagster/run_key": rr.run_key} if rr.run_key else {}), **(tags or {})},
            raise_on_error=raise_on_error,
        )
        metadata = {}
        for event in res.get_asset_materialization_events():
            mat = event.step_materialization_data.materialization
            metadata = {k: v.value for k, v in mat.metadata.items()}
        out.append(
            {
                "partition": rr.partition_key,
                "run_key": rr.run_key,
                "run_id": res.run_id,
                "success": res.success,
                "metadata": metadata,
            }
        )
    return out


__all__ = [
    "compaction_job",
    "compaction_sensor",
    "Thresholds",
    "CompactionPlan",
    "CompactionRequest",
    "plan_compactions",
    "evaluate_sensor",
    "run_requested_compactions",
]


# ---------------------------------------------------------------- the demo's maintenance step
#: The demo's tables are tiny (a few files per branch), so its sensor uses low thresholds:
#: any live update file (the backfilled labels) or 4 small files sharing a partition.
DEMO_THRESHOLDS = {"min_small_files": 4, "min_update_layers": 2, "min_update_files": 1}


def _materialization(result, node: str) -> dict:
    """The metadata (plain values) ``node`` reported in ``result``; empty when it did not run."""
    mats = result.asset_materializations_for_node(node)
    return {k: v.value for k, v in mats[-1].metadata.items()} if mats else {}


def demo_maintenance(lake, context: dict, *, branches: Sequence[str] = ("main",)) -> Optional[dict]:
    """The demo's last step: the sensor's logic requests compaction, it runs, then nightly maintenance.

    Evaluates ``compaction_sensor`` (demo thresholds, watching ``branches``)
    against the demo's persistent instance, runs ``compaction_job`` for every
    requested partition there (so ``make ui`` shows them), evaluates the sensor
    again with its new cursor (nothing is requested twice), then runs
    ``nightly_maintenance_job`` (``snapshot_expiry`` then ``garbage_collection``)
    as a dry run: what GC would free now, and after expiring all but the branch heads.
    """
    from dagster import DagsterInstance

    from platform_defs.schedules import nightly_maintenance_job, nightly_run_config

    dagster_home = context.get("dagster_home")
    home = context.get("home")
    if not dagster_home or not home or not lake.tables():
        return None
    resource = LakeResource(home=str(home))
    sensor_def = compaction_sensor("demo_compaction_sensor", branches=list(branches), **DEMO_THRESHOLDS)
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    instance = DagsterInstance.from_config(str(dagster_home))
    try:
        first = evaluate_sensor(sensor_def, instance, resource, quiet=True)
        runs = run_requested_compactions(
            first, instance, resource, run_config=quiet, tags={"featurelake/demo": "true"}
        )
        again = evaluate_sensor(sensor_def, instance, resource, cursor=first.cursor, quiet=True)
        # the nightly job, as a dry run with no grace (the demo's files are minutes old): what expiry
        # of every snapshot but the branch heads, then garbage collection, would free
        nightly = run_job(
            nightly_maintenance_job.name, instance, {"lake": resource},
            run_config={**quiet, **nightly_run_config(older_than_days=0, retain_last=1, grace_days=0, dry_run=True)},
            tags={"featurelake/demo": "true"},
        )
    finally:
        instance.dispose()
    expiry = _materialization(nightly, "snapshot_expiry")
    gc = _materialization(nightly, "garbage_collection")

    reasons = {
        rr.partition_key: rr.tags.get("featurelake/reason", "") for rr in (first.run_requests or [])
    }
    thresholds = Thresholds.from_env(**DEMO_THRESHOLDS)
    out: dict[str, Any] = {
        "thresholds": thresholds.describe(),
        "watched_branches": ", ".join(branches),
        "requested": "; ".join(f"{k} ({v})" for k, v in reasons.items()) or "nothing over thresholds",
        "compacted": ", ".join(r["partition"] for r in runs if r["success"]),
        "compaction_seconds": round(sum(float(r["metadata"].get("seconds", 0.0)) for r in runs), 3),
        "update_files_folded": sum(int(r["metadata"].get("update_files_folded", 0)) for r in runs),
        "requested_again": len(again.run_requests or []),
    }
    for run in runs:  # one small grid per compacted table branch: a row before, a row after
        md = run["metadata"]
        out[f"compaction {run['partition']}"] = {
            when: {
                "files": int(md.get(f"files_{when}", 0)),
                "small_files": int(md.get(f"small_files_{when}", 0)),
                "update_files": int(md.get(f"update_files_{when}", 0)),
                "layers": int(md.get(f"max_update_layers_{when}", 0)),
                "update_bytes": int(md.get(f"update_bytes_{when}", 0)),
                "bytes": int(md.get(f"bytes_{when}", 0)),
            }
            for when in ("before", "after")
        }
    out.update({
        "gc_dry_run": {  # garbage_collection, dry run: what is unreferenced right now
            "grace_days": 0,
            "files": int(gc.get("files", 0)),
            "bytes": int(gc.get("bytes", 0)),
            "kept_young": int(gc.get("kept_young", 0)),
            "store_builds": int(gc.get("store_builds", 0)),  # superseded sequence-store builds
        },
        "gc_after_expiry": {  # snapshot_expiry, dry run: expire all but branch heads, then GC
            "snapshots_expired": int(expiry.get("snapshots_expired", 0)),
            "files": int(expiry.get("would_free_files", 0)),
            "bytes": int(expiry.get("would_free_bytes", 0)),
        },
    })
    return out
