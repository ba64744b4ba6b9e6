"""Materialize the main group in-process against a real, persistent DagsterInstance."""
import pyarrow as pa
import pyarrow.compute as pc
from dagster import AssetKey, materialize

from backends import both_backends
from dagster_test_helpers import ROWS

DAYS = ["2026-01-01", "2026-01-02"]


def _materialize(key, resource, instance, rows=ROWS):
    from assets.main import main_assets

    return materialize(
        main_assets,
        instance=instance,
        partition_key=key,
        resources={"lake": resource},
        run_config={"ops": {"raw_impressions": {"config": {"rows_per_day": rows}}}},
    )


def _oracle(day_indexes, rows=ROWS) -> pa.Table:
    """The generator's impressions of those days: features and the label ``click``."""
    from assets.main import START
    from featurelake.synthetic import impressions_for_day, impressions_schema

    batches = [b for d in day_indexes for b in impressions_for_day(d, rows, start=START)]
    return pa.Table.from_batches(batches, schema=impressions_schema())


def _rows_sorted(table: pa.Table, columns) -> list[dict]:
    return table.select(columns).sort_by("sample_id").to_pylist()


def _metadata(result, node):
    [mat] = result.asset_materializations_for_node(node)
    return {k: v.value for k, v in mat.metadata.items()}


@both_backends
def test_materialize_two_days_then_rematerialize(env_resource, instance):
    from featurelake import Lake

    results = [_materialize(day, env_resource, instance) for day in DAYS]
    assert all(r.success for r in results)

    lake = Lake.from_env()  # opened apart from the resource, from the same environment
    t = lake.table("ml.samples")
    oracle = _oracle([0, 1])
    got = t.read()
    assert got.num_rows == oracle.num_rows == 2 * ROWS
    # every generator column, the label included (backfilled by `labels`), round-trips
    assert _rows_sorted(got, oracle.column_names) == _rows_sorted(oracle, oracle.column_names)
    from assets.main import day_filter, partition_day

    for day in DAYS:
        assert t.read(columns=["sample_id"], filter=day_filter(partition_day(day))).num_rows == ROWS

    # metadata reported by both assets
    raw_md = _metadata(results[1], "raw_impressions")
    assert raw_md["rows"] == ROWS and raw_md["files"] == 1 and raw_md["bytes"] > 0
    assert raw_md["path"].endswith("landing/impressions/2026-01-02.parquet")
    md = _metadata(results[1], "samples")
    for key in ("rows", "files", "bytes", "snapshot_id", "partition_rows", "snapshots"):
        assert key in md, key
    assert md["rows"] == 2 * ROWS and md["partition_rows"] == ROWS
    assert md["files"] >= 1 and md["bytes"] > 0
    # labels committed on top of the day's samples: the samples snapshot is the head's parent
    head = t.stats()["snapshot_id"]
    assert int(_metadata(results[1], "labels")["snapshot_id"]) == head
    history = t.snapshots()
    assert history[0]["snapshot_id"] == head and history[1]["snapshot_id"] == int(md["snapshot_id"])
    first_snapshot = int(md["snapshot_id"])

    # the persistent instance saw both partitions of every asset
    for name in ("raw_impressions", "samples", "labels"):
        assert instance.get_materialized_partitions(AssetKey(name)) == set(DAYS)

    # re-materializing a day replaces it: no duplicates, same data, a new snapshot
    again = _materialize(DAYS[0], env_resource, instance)
    assert again.success
    t = Lake.from_env().table("ml.samples")
    got = t.read()
    assert got.num_rows == 2 * ROWS
    assert pc.count_distinct(got.column("sample_id")).as_py() == 2 * ROWS
    assert _rows_sorted(got, oracle.column_names) == _rows_sorted(oracle, oracle.column_names)
    md = _metadata(again, "samples")
    assert md["rows"] == 2 * ROWS
    assert int(md["snapshot_id"]) != first_snapshot
    assert t.stats()["rows"] == 2 * ROWS
    # the S3 secret came from the environment at run time and is nowhere in the instance's logs
    from seaweed import SECRET_KEY

    for result in (*results, again):
        assert SECRET_KEY not in repr(instance.all_logs(result.run_id))


def test_samples_without_landed_raw_fails_cleanly(lake_home, instance):
    from assets.main import samples
    from resources import LakeResource

    result = materialize(
        [samples],
        instance=instance,
        partition_key=DAYS[0],
        resources={"lake": LakeResource(home=str(lake_home))},
        raise_on_error=False,
    )
    assert not result.success
    [failure] = result.get_step_failure_events()
    assert "materialize raw_impressions first" in str(failure.event_specific_data.error)
    from featurelake import Lake

    assert not Lake(lake_home).table_exists("ml.samples")


def test_day_filter_shapes():
    from datetime import date

    from assets.main import day_filter

    d = date(2026, 1, 31)
    assert day_filter(d) == "ts >= '2026-01-31T00:00:00' and ts < '2026-02-01T00:00:00'"
    assert day_filter(d, pa.timestamp("us", tz="UTC")).endswith("'2026-02-01T00:00:00+00:00'")
