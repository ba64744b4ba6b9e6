"""The checks of `samples` and `labels` on a real Dagster instance: passing, and failing for real causes.

* key uniqueness (blocking): another engine appends rows whose keys already exist; the next
  daily run fails at the check and `labels` is not run for that day;
* row counts against the landing file: rows deleted from the table, labels changed after landing;
* freshness: fresh right after a run, overdue once the bound has passed, failing when never run.
"""
import time
from datetime import timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from dagster import AssetCheckKey, AssetKey, AssetSelection, DagsterRunStatus, materialize

from assets.main import labels, samples
from assets.main_checks import blocking_checks, freshness_checks
from platform_defs.runs import run_job
from resources import LakeResource

QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
ROWS = 200


def _day(instance, lake_home, day: str, raise_on_error: bool = True):
    return run_job("main_job", instance, {"lake": LakeResource(home=str(lake_home))}, partition_key=day,
                   asset_selection=["raw_impressions", "samples", "labels"], raise_on_error=raise_on_error,
                   run_config={**QUIET, "ops": {"raw_impressions": {"config": {"rows_per_day": ROWS}}}})


def _verdicts(result) -> dict[str, bool]:
    return {e.asset_check_key.name: e.passed for e in result.get_asset_check_evaluations()}


def _run_checks(instance, lake_home, checks, day="2026-01-01") -> dict[str, bool]:
    """Run only ``checks`` (not their assets), in main_job, against what the lake holds now."""
    keys = [key for c in checks for key in c.check_keys]
    result = run_job("main_job", instance, {"lake": LakeResource(home=str(lake_home))}, partition_key=day,
                     asset_check_selection=keys, run_config=QUIET, raise_on_error=False)
    return _verdicts(result)


def _run_freshness(instance, lake_home, checks) -> dict[str, bool]:
    """Run freshness checks as their sensor's runs do: alone, unpartitioned."""
    result = materialize([samples, labels, *checks], selection=AssetSelection.checks(*checks), instance=instance,
                         resources={"lake": LakeResource(home=str(lake_home))}, run_config=QUIET,
                         raise_on_error=False)
    return {f"{e.asset_check_key.asset_key.to_user_string()}:{e.asset_check_key.name}": e.passed
            for e in result.get_asset_check_evaluations()}


def test_key_check_blocks_labels_when_another_engine_wrote_duplicate_keys(instance, lake_home):
    first = _day(instance, lake_home, "2026-01-01")
    assert _verdicts(first) == {"samples_keys_unique": True, "samples_match_landing": True,
                                "labels_match_landing": True, "freshness_check": True}

    # plain pyiceberg appends 5 existing rows again, dated two days later: the keys are now live twice
    t = LakeResource(home=str(lake_home)).lake().table("ml.samples")
    rows = t.iceberg.scan(limit=5).to_arrow()
    later = pc.add(rows["ts"], pa.scalar(timedelta(days=2), pa.duration("us")))
    t.iceberg.append(rows.set_column(rows.schema.get_field_index("ts"), "ts", later).cast(t.iceberg.schema().as_arrow()))
    assert t.verify_index()["duplicate_keys"] == 5  # the oracle: featurelake's own verification

    second = _day(instance, lake_home, "2026-01-02", raise_on_error=False)
    assert not second.success
    assert instance.get_run_by_id(second.run_id).status == DagsterRunStatus.FAILURE
    assert _verdicts(second)["samples_keys_unique"] is False
    materialized = {e.asset_key.to_user_string() for e in second.get_asset_materialization_events()}
    assert materialized == {"raw_impressions", "samples"}  # labels blocked
    evaluation = [e for e in second.get_asset_check_evaluations() if e.asset_check_key.name == "samples_keys_unique"][0]
    assert evaluation.metadata["duplicate_keys"].value == 5


def test_row_count_checks_fail_when_table_and_landing_disagree(instance, lake_home):
    _day(instance, lake_home, "2026-01-01")
    t = LakeResource(home=str(lake_home)).lake().table("ml.samples")
    rows = t.read(columns=["sample_id", "click"]).sort_by("sample_id")
    negatives = rows.filter(pc.equal(rows["click"], 0)).slice(0, 3)
    # three negative labels turned positive after landing: same labelled rows, 3 more positives
    t.backfill(pa.table({"sample_id": negatives["sample_id"], "click": pa.array([1, 1, 1], pa.int32())}))
    got = _run_checks(instance, lake_home, blocking_checks)
    assert got == {"samples_keys_unique": True, "samples_match_landing": True, "labels_match_landing": False}

    t.delete(f"sample_id = {rows['sample_id'][0].as_py()}")  # one sample row gone from the table
    got = _run_checks(instance, lake_home, blocking_checks)
    assert got["samples_match_landing"] is False and got["samples_keys_unique"] is True
    check = instance.event_log_storage.get_asset_check_execution_history(
        AssetCheckKey(AssetKey("samples"), "samples_match_landing"), limit=1)[0]
    metadata = check.event.dagster_event.event_specific_data.metadata
    assert (metadata["landing_rows"].value, metadata["table_rows"].value) == (ROWS, ROWS - 1)


def test_freshness_checks_pass_when_fresh_and_fail_when_overdue_or_never_run(instance, lake_home):
    tight = freshness_checks(hours=1 / 3600)  # one second
    both = ("samples:freshness_check", "labels:freshness_check")
    assert _run_freshness(instance, lake_home, freshness_checks()) == dict.fromkeys(both, False)  # never run
    _day(instance, lake_home, "2026-01-01")
    assert _run_freshness(instance, lake_home, freshness_checks()) == dict.fromkeys(both, True)
    time.sleep(1.2)
    assert _run_freshness(instance, lake_home, tight) == dict.fromkeys(both, False)


def test_freshness_hours_from_the_environment(monkeypatch):
    from assets.main_checks import freshness_hours

    monkeypatch.setenv("FEATURELAKE_FRESHNESS_HOURS", "2.5")
    assert freshness_hours() == 2.5
    monkeypatch.setenv("FEATURELAKE_FRESHNESS_HOURS", "soon")
    with pytest.raises(ValueError, match="FEATURELAKE_FRESHNESS_HOURS"):
        freshness_hours()
