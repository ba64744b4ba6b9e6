"""Group ``maintenance``: the compaction sensor, the compaction asset, nightly expiry + GC."""
import json
from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pytest
from dagster import AssetKey, build_schedule_context, materialize

from featurelake.synthetic import impressions_for_day, impressions_schema

KEY = "sample_id"
TABLE = "ml.samples"
THRESHOLDS = {"min_small_files": 4, "min_update_layers": 2, "min_update_files": 0}


def rows(d: int, batch: int, n: int = 30) -> pa.Table:
    t = pa.Table.from_batches(list(impressions_for_day(d, n, seed=batch)))
    return t.set_column(0, KEY, pa.array([d * 10**9 + batch * 10**4 + j for j in range(n)], pa.int64()))


@pytest.fixture
def resource(lake_home):
    from resources import LakeResource

    return LakeResource(home=str(lake_home))


@pytest.fixture
def table(resource):
    lake = resource.lake()
    return lake.create_table(TABLE, impressions_schema(), primary_key=KEY, partition_by=["day(ts)"])


@pytest.fixture
def sensor_def():
    from platform_defs.sensors import compaction_sensor

    return compaction_sensor("test_compaction_sensor", **THRESHOLDS)


def evaluate(sensor_def, instance, resource, cursor=None):
    from platform_defs.sensors import evaluate_sensor

    return evaluate_sensor(sensor_def, instance, resource, cursor=cursor)


def append_small_files(table, count: int, start: int = 0) -> None:
    for b in range(start, start + count):
        table.append(rows(0, b))  # all into partition day 0


# ---------------------------------------------------------------- the sensor
def test_sensor_does_not_trigger_below_thresholds(instance, resource, table, sensor_def):
    result = evaluate(sensor_def, instance, resource)  # empty table
    assert not result.run_requests and result.skip_reason
    append_small_files(table, 3)
    result = evaluate(sensor_def, instance, resource, cursor=result.cursor)
    assert not result.run_requests
    assert "no branch over thresholds" in result.skip_reason.skip_message
    assert not result.dynamic_partitions_requests


def test_sensor_triggers_on_small_files_once_per_snapshot(instance, resource, table, sensor_def):
    from platform_defs.sensors import run_requested_compactions

    append_small_files(table, 4)
    head = table.stats()["snapshot_id"]
    first = evaluate(sensor_def, instance, resource)
    assert len(first.run_requests) == 1
    req = first.run_requests[0]
    assert req.partition_key == f"{TABLE}|main"
    assert req.run_key == f"{TABLE}|main|{head}"
    assert "small files 4 >= 4" in req.tags["featurelake/reason"]
    [add] = first.dynamic_partitions_requests
    assert add.partitions_def_name == "compaction_targets" and list(add.partition_keys) == [f"{TABLE}|main"]

    # the same snapshot: never requested again (cursor), same run key without a cursor
    again = evaluate(sensor_def, instance, resource, cursor=first.cursor)
    assert not again.run_requests
    fresh = evaluate(sensor_def, instance, resource)
    assert [r.run_key for r in fresh.run_requests] == [req.run_key]

    # the requested run compacts: files and bytes before/after in the metadata
    before = table.read().sort_by(KEY)
    [run] = run_requested_compactions(first, instance, resource)
    assert run["success"]
    md = run["metadata"]
    assert md["files_before"] == 4 and md["files_after"] == 1
    assert md["small_files_before"] == 4 and md["files_in"] == 4 and md["files_out"] == 1
    assert md["bytes_before"] > 0 and md["bytes_after"] > 0
    assert md["snapshot_before"] == str(head) and md["snapshot_after"] != str(head)
    assert table.read().sort_by(KEY).equals(before)
    assert instance.has_dynamic_partition("compaction_targets", f"{TABLE}|main")
    # the daemon's run-key rule, done in process: the same request is not run twice
    assert run_requested_compactions(first, instance, resource) == []

    # after the compaction's own commit: healthy, nothing requested
    after = evaluate(sensor_def, instance, resource, cursor=again.cursor)
    assert not after.run_requests

    # a new write makes the branch eligible again (new snapshot, new run key)
    append_small_files(table, 3, start=10)
    later = evaluate(sensor_def, instance, resource, cursor=after.cursor)
    assert len(later.run_requests) == 1
    assert later.run_requests[0].run_key == f"{TABLE}|main|{table.stats()['snapshot_id']}"
    assert later.run_requests[0].run_key != req.run_key
    assert not later.dynamic_partitions_requests  # the partition exists already


def test_sensor_triggers_on_update_layers_per_branch(instance, resource, table, sensor_def):
    table.append(rows(0, 0, n=50))
    table.append(rows(1, 0, n=50))
    table.create_branch("research/ctr")
    keys = table.read(columns=[KEY])[KEY]
    for value in (1.0, 2.0):
        table.backfill(pa.table({KEY: keys, "score": pa.array([value] * len(keys))}), branch="research/ctr")
    table.backfill(pa.table({KEY: keys, "score": pa.array([0.5] * len(keys))}))  # one layer on main
    result = evaluate(sensor_def, instance, resource)
    assert [r.partition_key for r in result.run_requests] == [f"{TABLE}|research/ctr"]
    assert "update layers 2 >= 2" in result.run_requests[0].tags["featurelake/reason"]

    from platform_defs.sensors import run_requested_compactions

    [run] = run_requested_compactions(result, instance, resource)
    assert run["success"] and run["metadata"]["update_files_folded"] == 4
    assert run["metadata"]["max_update_layers_after"] == 0
    assert table.stats(branch="main")["update_files"] == 2  # main untouched


def test_thresholds_from_env_and_cursor_reset(monkeypatch, instance, resource, table):
    from platform_defs.sensors import Thresholds, compaction_sensor, plan_compactions

    monkeypatch.setenv("FEATURELAKE_COMPACT_MIN_SMALL_FILES", "2")
    monkeypatch.setenv("FEATURELAKE_COMPACT_MIN_UPDATE_LAYERS", "0")
    t = Thresholds.from_env(min_update_files=7)
    assert (t.min_small_files, t.min_update_layers, t.min_update_files) == (2, 0, 7)
    append_small_files(table, 2)
    strict = compaction_sensor("strict", min_small_files=5)
    loose = compaction_sensor("loose")  # 2 from the environment
    first = evaluate(strict, instance, resource)
    assert not first.run_requests
    # another threshold fingerprint: the old cursor does not hide the branch
    assert len(evaluate(loose, instance, resource, cursor=first.cursor).run_requests) == 1
    # a branch whose compaction is running is left for the next tick
    plan = plan_compactions(resource.lake(), t, in_flight=lambda key: True)
    assert plan.in_flight == [f"{TABLE}|main"] and not plan.requests
    assert json.loads(plan.cursor)["seen"] == {}


# ---------------------------------------------------------------- the asset
def test_compaction_asset_refuses_bad_partitions(instance, resource, table):
    from assets.maintenance import compaction

    table.append(rows(0, 0))
    snapshots = [s["snapshot_id"] for s in table.snapshots()]
    files = sorted(p for p in (resource.lake().home / "warehouse").rglob("*") if p.is_file())
    instance.add_dynamic_partitions("compaction_targets", ["no-separator", f"{TABLE}|nope"])
    for key, error in (("no-separator", "is not '<namespace.table>|<branch>'"), (f"{TABLE}|nope", "nope")):
        result = materialize(
            [compaction], instance=instance, partition_key=key, resources={"lake": resource}, raise_on_error=False
        )
        assert not result.success
        [failure] = result.get_step_failure_events()
        assert error in str(failure.event_specific_data.error)
    assert [s["snapshot_id"] for s in table.snapshots()] == snapshots  # nothing committed
    assert sorted(p for p in (resource.lake().home / "warehouse").rglob("*") if p.is_file()) == files


# ---------------------------------------------------------------- nightly schedule
def test_nightly_schedule_runs_expiry_and_gc(monkeypatch, lake_home, instance, resource, table):
    from platform_defs import build_defs
    from platform_defs.schedules import nightly_maintenance_schedule

    monkeypatch.setenv("FEATURELAKE_HOME", str(lake_home))
    defs = build_defs()
    prod = defs.resolve_schedule_def("nightly_maintenance")
    assert prod.cron_schedule == "0 3 * * *" and prod.job_name == "nightly_maintenance_job"
    graph = defs.resolve_asset_graph()
    for name in ("compaction", "snapshot_expiry", "garbage_collection"):
        assert graph.get(AssetKey(name)).group_name == "maintenance"
    assert defs.resolve_sensor_def("compaction_sensor").job_name == "compaction_job"

    append_small_files(table, 3)
    table.compact()
    snapshots = len(table.iceberg.metadata.snapshots)
    job = defs.resolve_job_def("nightly_maintenance_job")
    when = datetime(2026, 1, 5, 3, tzinfo=timezone.utc)

    def run(schedule_def):
        ctx = build_schedule_context(instance=instance, scheduled_execution_time=when)
        [req] = schedule_def.evaluate_tick(ctx).run_requests
        assert req.run_key == "nightly-maintenance-2026-01-05"
        result = job.execute_in_process(run_config=req.run_config, instance=instance)
        assert result.success
        return {
            e.asset_key.to_user_string(): {k: v.value for k, v in e.step_materialization_data.materialization.metadata.items()}
            for e in result.get_asset_materialization_events()
        }

    # dry run: reports what would go, changes nothing
    dry = run(nightly_maintenance_schedule("dry", older_than_days=0, grace_days=0, dry_run=True))
    assert dry["snapshot_expiry"]["dry_run"] and dry["snapshot_expiry"]["snapshots_expired"] == snapshots - 1
    assert dry["snapshot_expiry"]["would_free_files"] > 0
    assert dry["garbage_collection"]["dry_run"]
    assert len(table.iceberg.metadata.snapshots) == snapshots

    # the real thing: expired and freed what the dry run forecast
    real = run(nightly_maintenance_schedule("real", older_than_days=0, grace_days=0))
    assert real["snapshot_expiry"]["snapshots_expired"] == snapshots - 1
    assert real["garbage_collection"]["files"] == dry["snapshot_expiry"]["would_free_files"]
    assert real["garbage_collection"]["bytes"] == dry["snapshot_expiry"]["would_free_bytes"]
    assert len(table.iceberg.metadata.snapshots) == 1
    assert table.read().num_rows == 90  # still readable
    assert resource.lake().collect_garbage(older_than=timedelta(0), dry_run=True).files == []


def test_sensor_leaves_a_branch_whose_compaction_is_running(instance, resource, table, sensor_def):
    from dagster import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    append_small_files(table, 4)
    run = create_run_for_test(
        instance, job_name="compaction_job", status=DagsterRunStatus.STARTED,
        tags={"dagster/partition": f"{TABLE}|main"},
    )
    busy = evaluate(sensor_def, instance, resource)
    assert not busy.run_requests and "1 compacting" in busy.skip_reason.skip_message
    instance.report_run_failed(run)  # done (here: failed): the next tick requests it
    assert len(evaluate(sensor_def, instance, resource, cursor=busy.cursor).run_requests) == 1
