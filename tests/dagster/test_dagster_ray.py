"""The Ray path through Dagster: with the threshold at 0, `labels`, `compaction` and `sequence_store`
run on the session's local Ray cluster, record it in their metadata, and give the in-process results."""
import pyarrow as pa
import pytest
from dagster import materialize

pytest.importorskip("ray")

from test_dagster_labels import _assert_matches_oracle, _labelled, _oracle  # noqa: E402
from test_dagster_labels import _metadata as _labels_metadata  # noqa: E402
from test_dagster_labels import _run as _run_main  # noqa: E402
from test_dagster_sequences import _metadata, _oracle_events  # noqa: E402
from test_dagster_sequences import _run as _run_sequences  # noqa: E402

DAY = "2026-01-01"


def test_assets_take_the_ray_path_above_the_threshold(monkeypatch, ray_cluster, lake_home, instance):
    from assets import main_assets
    from assets.maintenance import compaction, target_key
    from assets.sequences import sequence_store, user_events
    from featurelake import Lake
    from resources import LakeResource

    monkeypatch.setenv("FEATURELAKE_RAY_THRESHOLD_BYTES", "0")
    result = _run_main(main_assets, DAY, lake_home, instance)
    meta = _labels_metadata(result)
    assert meta["execution"] == "ray" and meta["ray_tasks"] >= 1
    lake = Lake(lake_home)
    t = lake.table("ml.samples")
    _assert_matches_oracle(_labelled(t), _oracle([0]))

    expected = t.read().sort_by("sample_id")
    key = target_key(t.name, "main")
    instance.add_dynamic_partitions("compaction_targets", [key])
    res = materialize([compaction], instance=instance, partition_key=key, resources={"lake": LakeResource(home=str(lake_home))})
    [mat] = res.asset_materializations_for_node("compaction")
    cmeta = {k: v.value for k, v in mat.metadata.items()}
    assert cmeta["execution"] == "ray" and cmeta["ray_tasks"] >= 1
    assert t.read().sort_by("sample_id").equals(expected) and t.stats()["update_files"] == 0

    _run_sequences([user_events], lake_home, instance, key=DAY)
    smeta = _metadata(_run_sequences([sequence_store], lake_home, instance), "sequence_store")
    assert smeta["execution"] == "ray" and smeta["ray_tasks"] >= 3 and smeta["mode"] == "full"
    assert smeta["events"] == _oracle_events([DAY]).num_rows

    monkeypatch.setenv("FEATURELAKE_RAY_THRESHOLD_BYTES", str(1 << 60))  # below it: in-process
    smeta = _metadata(_run_sequences([sequence_store], lake_home, instance, store_config={"force": True}), "sequence_store")
    assert smeta["execution"] == "in-process" and smeta["ray_tasks"] == 0
