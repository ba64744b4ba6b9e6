"""Groups `research` and `labels`: the quality gate both ways, the override, label branches."""
import numpy as np
import pyarrow as pa
import pytest
from dagster import AssetCheckSeverity, AssetKey, SkipReason, build_sensor_context, materialize

from backends import both_backends
from dagster_test_helpers import ROWS

DAY, DAY2 = "2026-01-01", "2026-01-02"
SPEC = """\
research_branches:
  exp:
    description: one sound candidate, one broken
    features: [f0_f1_blend, f2_norm]
  sound:
    features: f0_f1_blend
training_targets: [ctr, long_dwell]
"""


@pytest.fixture
def spec_file(tmp_path, monkeypatch):
    path = tmp_path / "research_spec.yaml"
    path.write_text(SPEC)
    monkeypatch.setenv("FEATURELAKE_RESEARCH_SPEC", str(path))
    return path


def _resources(lake_home):
    from resources import LakeResource

    return {"lake": LakeResource(home=str(lake_home))}


def _main_day(day, lake_home, instance, resources=None):
    from assets.main import main_assets

    result = materialize(main_assets, instance=instance, partition_key=day, resources=resources or _resources(lake_home),
                         run_config={"ops": {"raw_impressions": {"config": {"rows_per_day": ROWS}}}})
    assert result.success


def _research(key, lake_home, instance, features=None, tags=None, nodes=None, resources=None):
    from assets import research

    instance.add_dynamic_partitions(research.research_partitions.name, [key])
    ops = {"research_branch": {"config": {"features": features}}} if features else {}
    return materialize(
        nodes or [*research.research_assets, *research.research_checks],
        instance=instance,
        partition_key=key,
        resources=resources or _resources(lake_home),
        run_config={"ops": ops} if ops else None,
        tags=tags or {},
        raise_on_error=False,
    )


def _table(lake_home):
    from featurelake import Lake

    return Lake(lake_home).table("ml.samples")


def _checks(result):
    return {e.asset_check_key.name: e for e in result.get_asset_check_evaluations()}


def _md(result, node):
    mats = result.asset_materializations_for_node(node)
    return {k: v.value for k, v in mats[-1].metadata.items()} if mats else None


def _steps_succeeded(result):
    return {e.step_key for e in result.get_step_success_events()}


def _blend_oracle(t):
    got = t.read(columns=["sample_id", "f0", "f1", "f0_f1_blend"]).to_pandas().sort_values("sample_id")
    f0, f1 = got["f0"].to_numpy(np.float32), got["f1"].to_numpy(np.float32)
    want = ((f0 + f1).astype(np.float64) / np.sqrt(2.0)).astype(np.float32)
    return got["f0_f1_blend"].to_numpy(), want


# ------------------------------------------------------------------------ gate
def test_gate_blocks_failing_branch_then_merges_narrowed_branch(lake_home, instance, spec_file):
    from assets.research import branch_features, branch_merge, research_branch

    _main_day(DAY, lake_home, instance)
    t = _table(lake_home)
    main_before = t.branches()["main"]

    # a partition nobody declared fails cleanly, before any branch exists
    unknown = _research("nothing-declared", lake_home, instance)
    assert not unknown.success
    assert "has no spec" in str(unknown.get_step_failure_events()[0].event_specific_data.error)
    assert "research/nothing-declared" not in t.branches()

    # branch_merge in a run without the checks still enforces the gate itself
    assert _research("exp", lake_home, instance, nodes=[research_branch, branch_features]).success
    alone = _research("exp", lake_home, instance, nodes=[branch_merge])
    assert not alone.success
    error = str(alone.get_step_failure_events()[0].event_specific_data.error)
    assert "not merged" in error and "f2_norm.null_fraction" in error
    assert t.branches()["main"] == main_before

    # the whole group: the blocking checks fail and stop branch_merge
    blocked = _research("exp", lake_home, instance)
    assert not blocked.success
    checks = _checks(blocked)
    assert set(checks) == {"null_fraction", "value_range", "distinct_count", "drift"}
    assert {k: c.passed for k, c in checks.items()} == {
        "null_fraction": False, "value_range": False, "distinct_count": True, "drift": False}
    assert all(c.severity == AssetCheckSeverity.ERROR for c in checks.values())
    md = {k: {m: v.value for m, v in c.metadata.items()} for k, c in checks.items()}
    assert md["null_fraction"]["failing_expectations"] == "f2_norm.null_fraction"
    assert md["drift"]["failing_expectations"] == "f2_norm.drift"
    assert md["null_fraction"]["verdicts"] == {"f0_f1_blend": "passed", "f2_norm": "FAILED"}
    nulls = md["null_fraction"]["observed"]["f2_norm"]
    f2 = t.read(columns=["f2"]).column(0).to_numpy(zero_copy_only=False)
    assert nulls["null_fraction"] == pytest.approx((np.isnan(f2) | (f2 < -0.25)).mean(), abs=1e-6)
    assert md["drift"]["observed"]["f2_norm"]["ks"] > 0.5 > md["drift"]["observed"]["f0_f1_blend"]["ks"]
    assert md["value_range"]["expected"]["f2_norm"] == {"min": -5.0, "max": 5.0}
    # the write went to the branch; branch_merge never ran; main's snapshot id did not move
    assert "branch_features" in _steps_succeeded(blocked)
    assert "branch_merge" not in _steps_succeeded(blocked) and _md(blocked, "branch_merge") is None
    assert t.branches()["main"] == main_before
    assert t.read(columns=["f2_norm"], branch="research/exp").column(0).null_count < ROWS
    assert t.read(columns=["f2_norm"]).column(0).null_count == ROWS  # schema is table-wide, values are not
    assert not instance.get_materialized_partitions(AssetKey("branch_merge"))

    # the researcher narrows the branch to the passing candidate: rebuilt from main, gate passes, merged
    merged = _research("exp", lake_home, instance, features=["f0_f1_blend"])
    assert merged.success
    assert all(c.passed for c in _checks(merged).values())
    created = _md(merged, "research_branch")
    assert created["reset"] and created["features"] == ["f0_f1_blend"] and created["spec_source"] == "run config"
    assert created["retired_columns"] == "f2_norm"
    md = _md(merged, "branch_merge")
    assert md["gate"] == "passed" and md["overridden_by"] == ""
    assert int(md["main_before"]) == main_before and int(md["main_after"]) == t.branches()["main"] != main_before
    assert md["columns_added"] == "f0_f1_blend"
    got, want = _blend_oracle(t)
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)
    names = t.schema.names
    assert "f2_norm" not in names and any(n.startswith("__deleted__f2_norm") for n in names)
    assert instance.get_materialized_partitions(AssetKey("branch_merge")) == {"exp"}


@both_backends
def test_research_group_gates_and_merges_on_both_backends(env_resource, instance, spec_file):
    """The research group and its quality checks on the embedded lake and on REST + S3 (the
    lake named by the environment): the failing branch is blocked, main untouched; the sound
    one is merged with values equal to the numpy oracle."""
    from assets.main import main_assets
    from featurelake import Lake

    resources = {"lake": env_resource}
    day = materialize(main_assets, instance=instance, partition_key=DAY, resources=resources,
                      run_config={"ops": {"raw_impressions": {"config": {"rows_per_day": ROWS}}}})
    assert day.success
    t = Lake.from_env().table("ml.samples")
    before = t.branches()["main"]

    blocked = _research("exp", None, instance, resources=resources)
    assert not blocked.success
    assert {k: c.passed for k, c in _checks(blocked).items()} == {
        "null_fraction": False, "value_range": False, "distinct_count": True, "drift": False}
    assert "branch_merge" not in _steps_succeeded(blocked)
    t = Lake.from_env().table("ml.samples")
    assert t.branches()["main"] == before

    merged = _research("sound", None, instance, resources=resources)
    assert merged.success and all(c.passed for c in _checks(merged).values())
    t = Lake.from_env().table("ml.samples")
    assert t.branches()["main"] == t.branches()["research/sound"] != before
    got, want = _blend_oracle(t)
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)


def test_spec_from_yaml_merges_passing_branch(lake_home, instance, spec_file):
    _main_day(DAY, lake_home, instance)
    t = _table(lake_home)
    before = t.branches()["main"]
    result = _research("sound", lake_home, instance)
    assert result.success
    assert _md(result, "research_branch")["spec_source"].startswith("spec ")
    assert _md(result, "branch_features")["rows_updated"] == ROWS
    assert _md(result, "branch_merge")["fast_forward"]  # main had not moved: the ref moves, no new files
    assert t.branches()["main"] == t.branches()["research/sound"] != before
    assert t.stats("research/sound")["exclusive_bytes"] == 0  # after the merge everything is shared


def test_override_is_explicit_and_recorded(lake_home, instance, spec_file):
    from assets.research import OVERRIDE_BY_TAG, OVERRIDE_REASON_TAG

    _main_day(DAY, lake_home, instance)
    t = _table(lake_home)
    before = t.branches()["main"]
    # half an override (no reason) is refused: nothing merged
    half = _research("f2_norm", lake_home, instance, tags={OVERRIDE_BY_TAG: "ana@example.com"})
    assert not half.success and t.branches()["main"] == before
    assert _md(half, "branch_merge") is None

    tags = {OVERRIDE_BY_TAG: "ana@example.com", OVERRIDE_REASON_TAG: "nulls expected for new users"}
    result = _research("f2_norm", lake_home, instance, tags=tags)  # key names a feature: its own spec
    assert result.success
    checks = _checks(result)
    failed = {k for k, c in checks.items() if not c.passed}
    assert failed == {"null_fraction", "value_range", "drift"}  # still recorded as failed ...
    for k in failed:  # ... at WARN severity (does not block) with who and why
        c = checks[k]
        assert c.severity == AssetCheckSeverity.WARN
        assert c.metadata["overridden_by"].value == "ana@example.com"
        assert c.metadata["override_reason"].value == "nulls expected for new users"
    assert "overridden_by" not in checks["distinct_count"].metadata
    md = _md(result, "branch_merge")
    assert md["gate"] == "overridden" and md["overridden_by"] == "ana@example.com"
    assert md["override_reason"] == "nulls expected for new users"
    assert set(md["overridden_expectations"].split(", ")) == {"f2_norm.null_fraction", "f2_norm.value_range",
                                                                "f2_norm.drift"}
    assert _md(result, "research_branch")["spec_source"] == "partition key"
    assert t.branches()["main"] != before
    assert t.read(columns=["f2_norm"]).column(0).null_count < ROWS  # the override did publish it
    run = instance.get_run_by_id(result.run_id)
    assert run.tags[OVERRIDE_BY_TAG] == "ana@example.com"


# ---------------------------------------------------------------------- labels
def _target(name, lake_home, instance, resources=None):
    from assets.label_targets import labels_assets, target_partitions

    instance.add_dynamic_partitions(target_partitions.name, [name])
    return materialize(labels_assets, instance=instance, partition_key=name, resources=resources or _resources(lake_home),
                       raise_on_error=False)


@both_backends
def test_target_labels_only_on_their_branch(env_resource, instance):
    """The labels group, on the embedded lake and on REST + S3 (the lake named by the environment)."""
    from assets.main import START
    from featurelake import Lake
    from featurelake.synthetic import impressions_for_day, impressions_schema

    resources = {"lake": env_resource}
    _main_day(DAY, None, instance, resources)
    t = Lake.from_env().table("ml.samples")
    main_before = t.branches()["main"]
    main_stats = t.stats()

    results = {name: _target(name, None, instance, resources) for name in ("ctr", "long_dwell")}
    assert all(r.success for r in results.values())
    assert t.branches()["main"] == main_before  # main untouched
    md = _md(results["ctr"], "target_labels")
    assert md["branch"] == "labels/ctr" and md["branch_action"] == "created" and md["main_unchanged"]
    assert md["rows_labelled"] == ROWS and md["rows_without_source"] == 0
    # features shared with main (zero copy): the branch owns only its label update files
    stats = t.stats("labels/ctr")
    assert stats["data_files"] == main_stats["data_files"]
    assert 0 < stats["exclusive_bytes"] == md["bytes_written"] < stats["shared_bytes"]
    assert stats["shared_bytes"] == t.stats()["bytes"]
    diff = t.diff("labels/ctr")
    assert diff["columns_added"] == ["label_ctr"] and diff["data_files_added"] == 0

    oracle = pa.Table.from_batches(list(impressions_for_day(0, ROWS, start=START)), schema=impressions_schema())
    want = oracle.select(["sample_id", "click"]).sort_by("sample_id")
    got = t.read(columns=["sample_id", "label_ctr"], branch="labels/ctr").sort_by("sample_id")
    assert got.column("label_ctr").to_pylist() == want.column("click").to_pylist()
    assert t.read(columns=["label_ctr"]).column(0).null_count == ROWS  # main has no label values
    assert t.read(columns=["label_ctr"], branch="labels/long_dwell").column(0).null_count == ROWS
    # long_dwell: dwell only after a click, label = dwell >= 30 s
    dwell = t.read(columns=["sample_id", "dwell_s", "label_long_dwell"], branch="labels/long_dwell").sort_by("sample_id")
    clicks = np.asarray(want.column("click").to_pylist())
    d = dwell.column("dwell_s").to_numpy()
    assert (d[clicks == 0] == 0).all() and (d[clicks == 1] > 0).all()
    assert (dwell.column("label_long_dwell").to_numpy() == (d >= 30.0)).all()
    assert set(t.read(columns=["label_long_dwell"]).column(0).to_pylist()) == {None}

    # again: nothing left to label, nothing written
    again = _md(_target("ctr", None, instance, resources), "target_labels")
    assert again["rows_labelled"] == 0 and again["bytes_written"] == 0 and again["branch_action"] == "up to date"
    # a new day on main: the branch is rebased and only the new day is labelled
    _main_day(DAY2, None, instance, resources)
    later = _md(_target("ctr", None, instance, resources), "target_labels")
    assert later["branch_action"] == "rebased onto main" and later["rows_labelled"] == ROWS
    assert later["rows_labelled_total"] == 2 * ROWS
    assert t.read(columns=["label_ctr"], branch="labels/ctr").column(0).null_count == 0

    unknown = _target("no_such_target", None, instance, resources)
    assert not unknown.success
    assert "unknown training target" in str(unknown.get_step_failure_events()[0].event_specific_data.error)


# ---------------------------------------------------------------- sensor, defs
def test_spec_sensor_adds_partitions_and_requests_runs(instance, spec_file):
    from assets.research import research_spec_sensor

    result = research_spec_sensor(build_sensor_context(instance=instance))
    added = {r.partitions_def_name: set(r.partition_keys) for r in result.dynamic_partitions_requests}
    assert added == {"research_branches": {"exp", "sound"}, "training_targets": {"ctr", "long_dwell"}}
    runs = {(r.job_name, r.partition_key) for r in result.run_requests}
    assert runs == {("research_job", "exp"), ("research_job", "sound"), ("labels_job", "ctr"),
                    ("labels_job", "long_dwell")}
    for r in result.dynamic_partitions_requests:
        instance.add_dynamic_partitions(r.partitions_def_name, list(r.partition_keys))
    assert isinstance(research_spec_sensor(build_sensor_context(instance=instance)), SkipReason)


def test_repository_spec_and_definitions(lake_home, monkeypatch):
    from assets.feature_defs import FEATURES
    from assets.label_targets import TARGETS
    from assets.research import DEFAULT_SPEC, load_spec
    from platform_defs import build_defs

    spec = load_spec(DEFAULT_SPEC)  # the file shipped in the repo parses and names known things
    assert spec["research_branches"]
    for entry in spec["research_branches"].values():
        assert all(f in FEATURES for f in entry["features"])
    assert set(spec["training_targets"]) <= set(TARGETS)

    monkeypatch.setenv("FEATURELAKE_HOME", str(lake_home))
    defs = build_defs()
    graph = defs.resolve_asset_graph()
    for name in ("research_branch", "branch_features", "branch_merge"):
        assert graph.get(AssetKey(name)).group_name == "research"
    assert graph.get(AssetKey("target_labels")).group_name == "labels"
    assert graph.get(AssetKey("branch_merge")).parent_keys == {AssetKey("branch_features")}
    job = defs.resolve_job_def("research_job")
    assert {n.name for n in job.nodes} == {"research_branch", "branch_features", "branch_quality", "branch_merge"}
    assert {n.name for n in defs.resolve_job_def("labels_job").nodes} == {"target_labels"}
    check_keys = graph.asset_check_keys
    assert {k.name for k in check_keys if k.asset_key == AssetKey("branch_features")} == {
        "null_fraction", "value_range", "distinct_count", "drift"}
    assert all(graph.get_check_spec(k).blocking for k in check_keys if k.asset_key == AssetKey("branch_features"))
    assert defs.resolve_sensor_def("research_spec_sensor") is not None
