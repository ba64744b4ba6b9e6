"""Group ``maintenance``: the compaction sensor, the compaction asset, nightly expiry + GC."""
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest
from dagster import AssetKey, build_schedule_context, materialize

from backends import both_backends
from featurelake.synthetic import impressions_for_day, impressions_schema

KEY = "sample_id"
TABLE = "ml.samples"
THRESHOLDS = {"min_small_files": 4, "min_update_layers": 2, "min_update_files": 0}


def rows(d: int, batch: int, n: int = 30) -> pa.Table:
    t = pa.Table.from_batches(list(impressions_for_day(d, n, seed=batch)))
    return t.set_column(0, KEY, pa.array([d * 10**9 + batch * 10**4 + j for j in range(n)], pa.int64()))


@pytest.fixture
def resource(env_resource):
    return env_resource  # the deployment's resource, from the environment (lake_env)


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


DAEMON_YAML = """\
telemetry:
  enabled: false
run_coordinator:  # submitted runs launch at once ...
  module: dagster._core.run_coordinator
  class: DefaultRunCoordinator
run_launcher:  # ... in this process (the daemon would start a subprocess)
  module: dagster._core.launcher.sync_in_memory_run_launcher
  class: SyncInMemoryRunLauncher
"""


class SensorDaemon:
    """The Dagster sensor daemon's own tick code, on a code location loaded in process.

    Each tick evaluates the sensor, creates runs in the instance's run storage
    with their run keys (skipping keys the daemon has seen, its own rule) and
    launches them. Ticks are a minute apart (the sensor's interval is 30 s).
    """

    def __init__(self, instance, workspace) -> None:
        self.instance, self.workspace = instance, workspace
        self.now = datetime.now(timezone.utc)

    def tick(self):
        import logging

        from dagster._core.test_utils import freeze_time
        from dagster._daemon.sensor import execute_sensor_iteration

        self.now += timedelta(minutes=1)
        with freeze_time(self.now):
            list(execute_sensor_iteration(self.workspace, logging.getLogger("sensor-daemon"), None, None))
        return self.instance.get_ticks(*self._ids(), limit=1)[0]

    def _ids(self):
        [state] = self.instance.all_instigator_state()
        return state.instigator_origin_id, state.selector_id

    def delete_cursor(self) -> None:
        """What `dagster sensor cursor --delete` does."""
        from dagster._core.scheduler.instigation import SensorInstigatorData

        state = self.instance.get_instigator_state(*self._ids())
        data = state.instigator_data
        self.instance.update_instigator_state(state.with_data(SensorInstigatorData(
            last_tick_timestamp=data.last_tick_timestamp, last_run_key=data.last_run_key,
            min_interval=data.min_interval, cursor=None, last_tick_start_timestamp=data.last_tick_start_timestamp,
            last_sensor_start_timestamp=data.last_sensor_start_timestamp, sensor_type=data.sensor_type,
        )))

    def runs(self):
        return sorted(self.instance.get_runs(), key=lambda r: r.tags["dagster/tick"] if "dagster/tick" in r.tags else "")


@pytest.fixture
def daemon(tmp_path, lake_env, table):
    from dagster import DagsterInstance
    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.test_utils import create_test_daemon_workspace_context
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget

    home = tmp_path / "daemon-instance"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAEMON_YAML)
    here = Path(__file__).parent
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(python_file=str(here / "daemon_sensor_defs.py"), attribute="defs", working_directory=str(here)),
        location_name="featurelake-test",
    )
    instance = DagsterInstance.from_config(str(home))
    try:
        with create_test_daemon_workspace_context(InProcessWorkspaceLoadTarget(origin), instance) as workspace:
            yield SensorDaemon(instance, workspace)
    finally:
        instance.dispose()


def _compaction_metadata(instance, run_id: str) -> dict:
    [event] = [
        e for e in instance.all_logs(run_id) if e.dagster_event and e.dagster_event.event_type_value == "ASSET_MATERIALIZATION"
    ]
    return {k: v.value for k, v in event.dagster_event.step_materialization_data.materialization.metadata.items()}


def test_sensor_runs_through_the_daemon_once_per_run_key(daemon, table, backend):
    from dagster import DagsterRunStatus

    from daemon_sensor_defs import SENSOR

    append_small_files(table, 4)
    head = table.stats()["snapshot_id"]
    before = table.read().sort_by(KEY)

    # tick 1: one run, created with its run key in the instance, launched, compacts
    first = daemon.tick()
    key = f"{TABLE}|main|{head}"
    assert first.run_keys == [key]
    [run] = daemon.runs()
    assert run.status == DagsterRunStatus.SUCCESS
    assert run.tags["dagster/run_key"] == key and run.tags["dagster/sensor_name"] == SENSOR
    assert run.tags["dagster/partition"] == f"{TABLE}|main" and "small files 4 >= 4" in run.tags["featurelake/reason"]
    assert daemon.instance.has_dynamic_partition("compaction_targets", f"{TABLE}|main")
    md = _compaction_metadata(daemon.instance, run.run_id)
    assert (md["files_before"], md["files_after"], md["small_files_before"]) == (4, 1, 4)
    assert md["snapshot_before"] == str(head) and md["snapshot_after"] == str(table.stats()["snapshot_id"]) != str(head)
    assert table.stats()["data_files"] == 1 and table.read().sort_by(KEY).equals(before)

    # tick 2: the compaction's own commit left the branch healthy: nothing
    assert not daemon.tick().run_keys and len(daemon.runs()) == 1

    # new small files, one of them unreadable: a new run key, and the run fails writing nothing
    compacted = {t.file.file_path for t in table.scan().tasks()}
    append_small_files(table, 4, start=10)
    bad = next(t.file.file_path for t in table.scan().tasks() if t.file.file_path not in compacted)
    failing_head = table.stats()["snapshot_id"]
    backend.overwrite(bad, b"garbage!" * 64 + backend.read_bytes(bad)[512:])
    third = daemon.tick()
    assert third.run_keys == [f"{TABLE}|main|{failing_head}"]
    assert [r.status for r in daemon.runs()].count(DagsterRunStatus.FAILURE) == 1
    assert table.stats()["snapshot_id"] == failing_head

    # the cursor remembers the head; without it, the sensor asks again with the same run key
    # and the daemon skips it: a failed compaction is not retried for the same snapshot
    assert not daemon.tick().run_keys
    daemon.delete_cursor()
    skipped = daemon.tick()
    assert skipped.run_keys == third.run_keys  # requested again ...
    assert skipped.status.value == "SKIPPED" and not skipped.run_ids  # ... and not run again
    assert len(daemon.runs()) == 2

    # a new write: a new snapshot, a new run key, a new run
    append_small_files(table, 1, start=20)
    later = daemon.tick()
    assert later.run_keys == [f"{TABLE}|main|{table.stats()['snapshot_id']}"] and len(daemon.runs()) == 3


def test_sensor_evaluation_is_stable_without_a_cursor(instance, resource, table, sensor_def):
    append_small_files(table, 4)
    head = table.stats()["snapshot_id"]
    first = evaluate(sensor_def, instance, resource)
    [req] = first.run_requests
    assert req.partition_key == f"{TABLE}|main" and req.run_key == f"{TABLE}|main|{head}"
    [add] = first.dynamic_partitions_requests
    assert add.partitions_def_name == "compaction_targets" and list(add.partition_keys) == [f"{TABLE}|main"]
    assert not evaluate(sensor_def, instance, resource, cursor=first.cursor).run_requests
    assert [r.run_key for r in evaluate(sensor_def, instance, resource).run_requests] == [req.run_key]


@both_backends
def test_sensor_triggers_on_update_layers_per_branch(daemon, table):
    from dagster import DagsterRunStatus

    table.append(rows(0, 0, n=50))
    table.append(rows(1, 0, n=50))
    table.create_branch("research/ctr")
    keys = table.read(columns=[KEY])[KEY]
    for value in (1.0, 2.0):
        table.backfill(pa.table({KEY: keys, "score": pa.array([value] * len(keys))}), branch="research/ctr")
    table.backfill(pa.table({KEY: keys, "score": pa.array([0.5] * len(keys))}))  # one layer on main
    tick = daemon.tick()
    assert [k.rsplit("|", 1)[0] for k in tick.run_keys] == [f"{TABLE}|research/ctr"]
    [run] = daemon.runs()
    assert run.status == DagsterRunStatus.SUCCESS and "update layers 2 >= 2" in run.tags["featurelake/reason"]
    md = _compaction_metadata(daemon.instance, run.run_id)
    # four layers (two backfills x two data files), each backfill's in one shared update file
    assert md["update_files_folded"] == 2 and md["max_update_layers_after"] == 0
    assert table.read(columns=["score"], branch="research/ctr")["score"].to_pylist() == [2.0] * 100
    assert table.stats(branch="main")["update_files"] == 1 and table.stats(branch="main")["max_update_layers"] == 1  # main untouched


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
@both_backends
def test_nightly_schedule_runs_expiry_and_gc(instance, resource, table, backend):
    from platform_defs import build_defs
    from platform_defs.schedules import nightly_maintenance_schedule

    defs = build_defs()  # the production definitions, their lake from the environment (lake_env)
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
    stored = backend.files()
    real = run(nightly_maintenance_schedule("real", older_than_days=0, grace_days=0))
    assert real["snapshot_expiry"]["snapshots_expired"] == snapshots - 1
    assert real["garbage_collection"]["files"] == dry["snapshot_expiry"]["would_free_files"]
    assert real["garbage_collection"]["bytes"] == dry["snapshot_expiry"]["would_free_bytes"]
    assert len(table.iceberg.metadata.snapshots) == 1
    assert table.read().num_rows == 90  # still readable
    assert resource.lake().collect_garbage(older_than=timedelta(0), dry_run=True).files == []
    # the store, listed by its own client: exactly the files GC reported are gone
    left = backend.files()
    assert all(p.endswith(".metadata.json") for p in left - stored)  # the expiry's commit
    assert len(stored - left) == real["garbage_collection"]["files"] > 0
    assert {backend.name_of(p) for p in real["garbage_collection"]["sample_files"]} <= stored - left


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
