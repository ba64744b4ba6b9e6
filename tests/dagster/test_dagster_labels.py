"""The `labels` asset: the click label and per-user features backfilled by merge-on-read."""
import numpy as np
import pyarrow as pa
import pytest
from dagster import materialize

from dagster_test_helpers import ROWS

DAYS = ["2026-01-01", "2026-01-02"]
DERIVED = ["user_impressions_1d", "user_ctr_1d"]


def _run(assets, key, lake_home, instance, rows=ROWS, labels_config=None, raise_on_error=True):
    from resources import LakeResource

    ops = {}
    names = {a.key.to_user_string() for a in assets}
    if "raw_impressions" in names:
        ops["raw_impressions"] = {"config": {"rows_per_day": rows}}
    if labels_config is not None:
        ops["labels"] = {"config": labels_config}
    return materialize(
        assets,
        instance=instance,
        partition_key=key,
        resources={"lake": LakeResource(home=str(lake_home))},
        run_config={"ops": ops},
        raise_on_error=raise_on_error,
    )


def _metadata(result, node="labels"):
    [mat] = result.asset_materializations_for_node(node)
    return {k: v.value for k, v in mat.metadata.items()}


def _oracle(day_indexes, rows=ROWS):
    """Label and per-user-per-day features, computed with pandas from the generator."""
    from assets.main import START
    from featurelake.synthetic import impressions_for_day, impressions_schema

    batches = [b for d in day_indexes for b in impressions_for_day(d, rows, start=START)]
    df = pa.Table.from_batches(batches, schema=impressions_schema()).to_pandas()
    df["day"] = df["ts"].dt.date
    by = df.groupby(["day", "user_id"])["click"]
    df["user_impressions_1d"] = by.transform("size").astype("int32")
    df["user_ctr_1d"] = (by.transform("sum") / by.transform("count")).astype("float32")
    return df[["sample_id", "click", *DERIVED]].sort_values("sample_id").reset_index(drop=True)


def _labelled(t):
    return t.read(columns=["sample_id", "click", *DERIVED]).to_pandas().sort_values("sample_id").reset_index(drop=True)


def _data_files(t) -> set:
    return {task.file.file_path for task in t.refresh().scan().plan_files()}


def _assert_matches_oracle(got, oracle):
    assert len(got) == len(oracle)
    assert got["sample_id"].tolist() == oracle["sample_id"].tolist()
    assert got["click"].tolist() == oracle["click"].tolist()
    assert got["user_impressions_1d"].tolist() == oracle["user_impressions_1d"].tolist()
    np.testing.assert_allclose(got["user_ctr_1d"].to_numpy(), oracle["user_ctr_1d"].to_numpy(), rtol=1e-6)


def test_labels_backfill_two_days(lake_home, instance):
    from assets.main import labels, raw_impressions, samples
    from featurelake import Lake

    for day in DAYS:
        assert _run([raw_impressions, samples], day, lake_home, instance).success
    t = Lake(lake_home).table("ml.samples")
    # samples carry features only: the label is not even in the schema yet
    assert "click" not in t.schema.names and not set(DERIVED) & set(t.schema.names)
    files_before = _data_files(t)
    stats_before = t.stats()
    assert stats_before["update_files"] == 0

    results = [_run([labels], day, lake_home, instance) for day in DAYS]
    assert all(r.success for r in results)
    t = Lake(lake_home).table("ml.samples")
    # merge-on-read: the backfills wrote update files only, every data file is untouched
    assert _data_files(t) == files_before
    stats = t.stats()
    assert stats["rows"] == 2 * ROWS and stats["data_bytes"] == stats_before["data_bytes"]
    assert stats["update_files"] >= 2 and stats["update_bytes"] > 0
    assert {"click", *DERIVED} <= set(t.schema.names)
    oracle = _oracle([0, 1])
    _assert_matches_oracle(_labelled(t), oracle)
    assert t.read(columns=["click"], filter="click = 1").num_rows == int(oracle["click"].sum())

    first, second = (_metadata(r) for r in results)
    assert first["new_columns"] == "click, user_impressions_1d, user_ctr_1d"
    assert second["new_columns"] == ""
    for md in (first, second):
        assert md["rows_updated"] == ROWS and md["dagster/row_count"] == ROWS
        assert md["update_files"] >= 1 and md["data_files_touched"] == md["update_files"]
        assert md["bytes_written"] > 0
        assert md["table_data_bytes"] == stats["data_bytes"]
        assert md["table_bytes"] > md["table_data_bytes"]
        assert md["write_ratio"] == pytest.approx(md["bytes_written"] / md["table_data_bytes"], rel=1e-3)
        assert 0 < md["write_ratio"] < 0.5  # a few narrow columns: far below the data size
        assert md["unknown_skipped"] == 0
    assert int(oracle["click"].iloc[:ROWS].sum()) == first["positives"]
    assert sum(m["bytes_written"] for m in (first, second)) == stats["update_bytes"]
    assert int(second["snapshot_id"]) == stats["snapshot_id"]

    # re-materializing a day's labels adds a layer with the same values; data files unchanged
    again = _run([labels], DAYS[0], lake_home, instance)
    t = Lake(lake_home).table("ml.samples")
    assert _data_files(t) == files_before
    assert t.stats()["update_files"] == stats["update_files"] + _metadata(again)["update_files"]
    _assert_matches_oracle(_labelled(t), oracle)


def test_samples_rematerialized_drop_labels_until_labels_reruns(lake_home, instance):
    from assets.main import labels, main_assets, samples
    from featurelake import Lake

    assert _run(main_assets, DAYS[0], lake_home, instance).success
    assert _run([samples], DAYS[0], lake_home, instance).success  # the day's rows replaced
    t = Lake(lake_home).table("ml.samples")
    assert t.read(columns=["click"]).column("click").null_count == ROWS
    assert _run([labels], DAYS[0], lake_home, instance).success
    _assert_matches_oracle(_labelled(Lake(lake_home).table("ml.samples")), _oracle([0]))


def test_labels_fail_cleanly(lake_home, instance):
    from assets.main import labels, raw_impressions, samples
    from featurelake import Lake

    # no sample table yet
    assert _run([raw_impressions], DAYS[0], lake_home, instance).success
    result = _run([labels], DAYS[0], lake_home, instance, raise_on_error=False)
    assert not result.success
    [failure] = result.get_step_failure_events()
    assert "materialize samples" in str(failure.event_specific_data.error)
    assert not Lake(lake_home).table_exists("ml.samples")  # nothing created

    # the landing file changed after samples loaded the day: unknown keys
    assert _run([samples], DAYS[0], lake_home, instance).success
    assert _run([raw_impressions], DAYS[0], lake_home, instance, rows=ROWS + 7).success
    t = Lake(lake_home).table("ml.samples")
    head = t.stats()["snapshot_id"]
    result = _run([labels], DAYS[0], lake_home, instance, raise_on_error=False)
    assert not result.success
    [failure] = result.get_step_failure_events()
    assert "re-materialize samples" in str(failure.event_specific_data.error)
    assert t.stats()["snapshot_id"] == head  # nothing committed
    assert not list((lake_home / "warehouse").rglob("_updates/*.parquet"))  # and no update file written

    result = _run([labels], DAYS[0], lake_home, instance, labels_config={"on_unknown": "skip"})
    md = _metadata(result)
    assert md["rows_updated"] == ROWS and md["unknown_skipped"] == 7


def test_label_rows_derived_features():
    from assets.main import label_rows

    raw = pa.table(
        {
            "sample_id": pa.array([1, 2, 3, 4, 5], pa.int64()),
            "user_id": pa.array([7, 7, 8, 7, 9], pa.int64()),
            "click": pa.array([1, 0, 0, None, None], pa.int32()),
        }
    )
    got = {r["sample_id"]: r for r in label_rows(raw).to_pylist()}
    assert got[1]["user_impressions_1d"] == 3 and got[1]["user_ctr_1d"] == pytest.approx(0.5)
    assert got[3]["user_impressions_1d"] == 1 and got[3]["user_ctr_1d"] == 0.0
    assert got[5]["user_ctr_1d"] is None and got[4]["click"] is None
    assert label_rows(raw).schema.field("user_ctr_1d").type == pa.float32()
