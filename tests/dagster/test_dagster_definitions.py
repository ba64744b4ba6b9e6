"""The code location loads: in-process and through the `dagster` CLI."""
import subprocess

from dagster import AssetKey

from dagster_test_helpers import ROOT, dagster_bin, subprocess_env


def test_definitions_validate_cli(tmp_path, lake_home, dagster_home):
    proc = subprocess.run(
        [dagster_bin("dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        env=subprocess_env(lake_home, dagster_home),
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Validation successful" in out


def test_defs_in_process(lake_home, monkeypatch):
    from platform_defs import build_defs
    from resources import LakeResource

    monkeypatch.setenv("FEATURELAKE_HOME", str(lake_home))
    defs = build_defs()
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"raw_impressions", "samples", "labels"} <= keys
    for name in ("raw_impressions", "samples", "labels"):
        assert graph.get(AssetKey(name)).group_name == "main"
    assert graph.get(AssetKey("labels")).parent_keys == {AssetKey("samples"), AssetKey("raw_impressions")}
    # user sequences: group main too; the unpartitioned store depends on every events partition
    for name in ("user_events", "sequence_store"):
        assert graph.get(AssetKey(name)).group_name == "main"
    assert graph.get(AssetKey("user_events")).partitions_def == graph.get(AssetKey("samples")).partitions_def
    assert graph.get(AssetKey("sequence_store")).partitions_def is None
    assert graph.get(AssetKey("sequence_store")).parent_keys == {AssetKey("user_events")}
    job = defs.resolve_job_def("main_job")
    assets = {"raw_impressions", "samples", "labels", "user_events", "sequence_store"}
    checks = {"samples_samples_keys_unique", "samples_samples_match_landing", "labels_labels_match_landing"}
    nodes = {n.name for n in job.nodes}
    assert assets | checks <= nodes and len(nodes - assets - checks) == 1  # + the freshness checks
    blocking = {k.name for k in graph.asset_check_keys if graph.get_check_spec(k).blocking}
    assert {"samples_keys_unique", "samples_match_landing", "labels_match_landing"} <= blocking
    assert {n.name for n in defs.resolve_job_def("sequence_job").nodes} == {"sequence_store"}
    lake = defs.resources["lake"]
    assert isinstance(lake, LakeResource)
    assert lake.home == str(lake_home)


def test_resource_chosen_from_env(tmp_path):
    from resources import LakeResource, lake_resource_from_env

    r = lake_resource_from_env({"FEATURELAKE_HOME": str(tmp_path)})
    assert r.home == str(tmp_path) and r.catalog_uri is None
    r = lake_resource_from_env(
        {"FEATURELAKE_CATALOG_URI": "sqlite:///x.db", "FEATURELAKE_WAREHOUSE": str(tmp_path)}
    )
    assert r.home is None and r.catalog_uri == "sqlite:///x.db" and r.warehouse == str(tmp_path)
    assert lake_resource_from_env({}).home is not None
    assert isinstance(r, LakeResource)


def test_resource_caches_lake_per_config(lake_home, tmp_path):
    from resources import LakeResource

    a = LakeResource(home=str(lake_home)).lake()
    b = LakeResource(home=str(lake_home) + "/").lake()
    assert a is b
    assert str(a.home) == str(lake_home.resolve())
    other = LakeResource(home=str(tmp_path / "other")).lake()
    assert other is not a


def test_resource_catalog_uri(tmp_path):
    from resources import LakeResource

    r = LakeResource(
        catalog_uri=f"sqlite:///{tmp_path / 'cat.db'}",
        warehouse=str(tmp_path / "wh"),
        landing=str(tmp_path / "landing"),
    )
    lake = r.lake()
    assert lake.tables() == []
    assert r.landing_dir() == (tmp_path / "landing").resolve()
