"""The demo end to end: the real `featurelake demo` command, and run_demo with its printed summary.

The lake a demo leaves behind is checked from outside (tests/dagster/demo_oracle.py):
landing files against the generator, the table against the landing files, the
key index, the joined histories against the events table.
"""
import io
import json
import os
import subprocess

import pyarrow as pa
import pytest
from dagster import AssetCheckKey, AssetKey, DagsterInstance, DagsterRunStatus
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus

from dagster_test_helpers import ROOT, VENV_BIN
from demo_oracle import check_demo_lake


@pytest.mark.slow
def test_demo_command_on_a_small_lake(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FEATURELAKE_", "DAGSTER_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env["FEATURELAKE_DEMO_EVENTS_PER_USER"] = "2"
    proc = subprocess.run(
        [str(VENV_BIN / "featurelake"), "--home", str(home), "demo", "--days", "1", "--rows-per-day", "100", "--json"],
        capture_output=True, text=True, env=env, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["partitions"] == ["2026-01-01"] and summary["home"] == str(home.resolve())

    facts = check_demo_lake(home, days=1, rows_per_day=100)
    assert summary["tables"]["ml.samples"]["rows"] == facts["rows"] == 100
    inst = DagsterInstance.from_config(str(home / "dagster"))
    try:
        runs = inst.get_runs()
        blocked = [r for r in runs if r.tags.get("dagster/partition") == "ctr-v2"][-1:]  # attempt 1 fails its gate
        assert runs and all(r.status == DagsterRunStatus.SUCCESS for r in runs if r not in blocked)
        assert [r for r in runs if r.tags.get("dagster/partition") == "ml.samples|main"]  # the sensor's compaction
    finally:
        inst.dispose()


def test_run_demo_smoke(tmp_path, monkeypatch):
    from rich.console import Console

    from platform_defs.demo import run_demo

    monkeypatch.setenv("DAGSTER_HOME", "/nonexistent-before-demo")
    monkeypatch.setenv("FEATURELAKE_DEMO_EVENTS_PER_USER", "2")  # user_events: small days, quick builds
    home = tmp_path / "home"
    buf = io.StringIO()
    summary = run_demo(home, days=2, rows_per_day=300, console=Console(file=buf, width=200))

    assert os.environ["DAGSTER_HOME"] == "/nonexistent-before-demo"  # restored
    assert summary["partitions"] == ["2026-01-01", "2026-01-02"]
    assert all(r["success"] for r in summary["runs"])
    samples = summary["tables"]["ml.samples"]
    assert samples["rows"] == 600
    assert samples["data_files"] >= 1 and samples["bytes"] > 0 and samples["snapshots"] >= 2
    assert summary["landing"]["impressions"]["files"] == 2
    timings = summary["timings"]
    assert set(timings["per_asset_seconds"]) == {"raw_impressions", "samples", "labels"}
    assert timings["total_seconds"] > 0

    late = summary["late labels"]  # labels arriving later, upserted by key
    assert late["rows_updated"] == late["labels_arrived"] == 30 and late["rows_inserted"] == 0

    labels = summary["labels"]
    assert labels["rows_labelled"] == 600
    assert labels["landed_positives"] > 0
    facts = check_demo_lake(home, days=2, rows_per_day=300)  # the lake itself, checked from outside
    assert facts["rows"] == 600
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    landed = sum(pc.sum(pq.read_table(p, columns=["click"])["click"]).as_py() for p in (home / "landing").rglob("*.parquet"))
    assert labels["landed_positives"] == labels["positives_read_back"] == landed
    assert labels["table_update_files"] >= 2 and samples["update_files"] == labels["table_update_files"]
    assert 0 < labels["bytes_written"] < labels["table_data_bytes"]
    assert set(labels["per_day"]) == {"2026-01-01", "2026-01-02"}
    for row in labels["per_day"].values():
        assert row["rows"] == 300 and row["bytes_written"] > 0 and row["read_back"] == row["positives"]
        assert 0 < row["write_ratio"] < 1

    out = buf.getvalue()
    assert "ml.samples" in out and "600" in out and "timings" in out
    assert "labels · per_day" in out and "read_back_ok" in out

    # runs are in the persistent instance that `make ui` opens
    dagster_home = home / "dagster"
    assert (dagster_home / "dagster.yaml").exists()
    inst = DagsterInstance.from_config(str(dagster_home))
    try:
        runs = inst.get_runs()
        # the sequences section's runs: user_events + sequence_store per day, then a full rebuild
        seq_runs = [r for r in runs if r.tags.get("featurelake/demo-section") == "sequences"]
        assert len(seq_runs) == 3
        main_runs = [r for r in runs if r.tags.get("dagster/partition") in summary["partitions"]]
        assert len([r for r in main_runs if r not in seq_runs]) == 2
        # the demo ends with the compaction the sensor requested, recorded there too
        compactions = [r for r in runs if r.tags.get("dagster/partition") == "ml.samples|main"]
        research_runs = [r for r in runs if r.tags.get("dagster/partition") == "ctr-v2"]
        target_runs = [r for r in runs if r.tags.get("dagster/partition") in ("ctr", "long_dwell")]
        assert len(research_runs) == len(summary["research"]["attempts"]) == 2 and len(target_runs) == 2
        assert len(compactions) == 1
        nightly = [r for r in runs if r.job_name == "nightly_maintenance_job"]
        assert len(nightly) == 1
        assert len(runs) == 2 + len(compactions) + len(research_runs) + len(target_runs) + len(seq_runs) + 1
        # every run is a run of a named job of the code location, filed as the UI files launched runs
        assert {r.job_name for r in runs} == {"main_job", "sequence_job", "compaction_job", "research_job",
                                              "labels_job", "nightly_maintenance_job"}
        assert {r.remote_job_origin.location_name for r in runs} == {"featurelake"}
        assert {r.tags.get(".dagster/repository") for r in runs} == {"__repository__@featurelake"}
        # expiry and GC ran through Dagster: the UI shows them materialized
        for key in ("snapshot_expiry", "garbage_collection"):
            event = inst.get_latest_materialization_event(AssetKey(key))
            assert event is not None and event.run_id == nightly[0].run_id, key
        # the blocking checks of samples and labels ran and passed for both days
        for check in ("samples_keys_unique", "samples_match_landing", "labels_match_landing"):
            asset = check.split("_", 1)[0]
            records = inst.event_log_storage.get_asset_check_execution_history(
                AssetCheckKey(AssetKey(asset), check), limit=10)
            assert len(records) == 2 and all(r.status == AssetCheckExecutionRecordStatus.SUCCEEDED for r in records)
    finally:
        inst.dispose()

    # maintenance: the sensor's logic requested compaction of main, it folded the labels
    maint = summary["maintenance"]
    assert "ml.samples|main" in maint["requested"] and maint["compacted"] == "ml.samples|main"
    # main's update files when maintenance starts: the labels' (each day's commit packs its small layers
    # into one shared file), the research feature merged into main (its one commit's shared file), and
    # the late labels' own
    main_updates = summary["storage"]["main"]["update_files"]
    assert main_updates == labels["table_update_files"] + 1 + late["update_files"]
    assert maint["requested_again"] == 0 and maint["update_files_folded"] == main_updates
    grid = maint["compaction ml.samples|main"]
    assert grid["before"]["update_files"] == main_updates and grid["after"]["update_files"] == 0
    assert grid["after"]["files"] >= 1 and grid["after"]["bytes"] > 0
    # no table garbage left behind; the one thing to collect is the incremental store build the demo's
    # closing full rebuild of the same snapshot superseded (demo_sequences: incremental false, force true)
    from featurelake import Lake

    st = Lake(home).sequence_table("ml.user_events")
    serving = st.build_for("main")
    superseded = [b for b in st.builds() if b.snapshot_id == serving.snapshot_id and b.build_id != serving.build_id]
    superseded_files = sum(len(files) for b in superseded for _, _, files in os.walk(b.path))
    assert maint["gc_dry_run"]["store_builds"] == len(superseded) == 1
    assert maint["gc_dry_run"]["files"] == superseded_files and maint["gc_after_expiry"]["files"] > 0
    assert "maintenance · compaction ml.samples|main" in out and "gc_dry_run" in out

    # research: attempt 1 blocked (main unchanged), attempt 2 narrowed to the passing candidate, merged
    research = summary["research"]
    first, second = research["attempts"]
    assert not first["merged"] and first["main_before"] == first["main_after"]
    assert first["features"] == ["f0_f1_blend", "f2_norm"] and all(f.startswith("f2_norm.") for f in first["failing"])
    assert second["merged"] and second["features"] == ["f0_f1_blend"] and second["main_after"] != second["main_before"]
    assert research["candidate f0_f1_blend"]["outcome"] == "merged into main"
    assert research["candidate f0_f1_blend"]["values_on_main"] > 0
    assert research["candidate f2_norm"]["outcome"].startswith("blocked")
    assert research["candidate f2_norm"]["values_on_main"] == 0
    # two label targets on their own branches; main untouched by them
    targets = summary["training targets"]
    assert "(unchanged)" in targets["main snapshot"]
    for name in ("ctr", "long_dwell"):
        row = targets[f"target {name}"]
        assert row["branch"] == f"labels/{name}" and row["rows_labelled"] == 600
        assert 0 < row["exclusive_bytes"] < row["shared_bytes"]
    storage = summary["storage"]
    assert set(storage) == {"main", "research/ctr-v2", "labels/ctr", "labels/long_dwell"}
    assert storage["labels/ctr"]["exclusive_bytes"] > 0 and storage["research/ctr-v2"]["exclusive_bytes"] == 0
    assert "research · candidate f2_norm" in out and "storage" in out and "training targets · target ctr" in out

    # sequences: events per day into ml.user_events, store built (full, then incremental, then
    # rebuilt in full), training batches joined with histories strictly before each row
    seq = summary["sequences"]
    assert [d["build"] for d in seq["per_day"].values()] == ["full", "incremental"]
    from featurelake import Lake

    from featurelake import Lake

    st = Lake(home).sequence_table("ml.user_events")
    assert st.build_for().snapshot_id == st.stats()["snapshot_id"]  # the store serves the head
    assert seq["events"] == seq["table_events"] == st.stats()["rows"] > 0
    assert seq["events"] == sum(d["events"] for d in seq["per_day"].values()) and seq["events_replaced"] == 0
    assert seq["rows"] == 600 and seq["events_joined"] > 0
    assert 0 < seq["longest_history"] <= seq["max_len"] == 64
    assert seq["rows_per_second"] > 0 and seq["store_bytes"] > 0 and seq["denormalized_bytes"] > 0
    assert "sequences · per_day" in out and "violations" in out

    # a second demo run re-materializes the same days: still no duplicates
    again = run_demo(home, days=2, rows_per_day=300, print_report=False)
    assert again["tables"]["ml.samples"]["rows"] == 600
    assert again["sequences"]["table_events"] == seq["table_events"] == again["sequences"]["events_replaced"]
    assert again["labels"]["rows_labelled"] == 600
    check_demo_lake(home, days=2, rows_per_day=300)


def test_summary_sections_extend(tmp_path):
    from rich.console import Console

    from featurelake import Lake
    from platform_defs import demo

    saved = list(demo.SUMMARY_SECTIONS)
    try:
        @demo.summary_section("extra")
        def _extra(lake, context):
            return {"tables_seen": len(lake.tables()), "per": {"a": {"x": 1}}}

        demo.summary_section("extra")(_extra)  # registering a name again replaces it
        assert [n for n, _ in demo.SUMMARY_SECTIONS].count("extra") == 1
        lake = Lake(tmp_path / "lake")
        lake.create_table("ml.t", pa.schema([pa.field("k", pa.int64(), nullable=False)]), primary_key="k")
        summary = demo.build_summary(lake, {"home": "h"})
        # an empty table: the demo's own sections have nothing to say and are left out
        assert list(summary) == ["home", "tables", "extra"]
        assert summary["extra"] == {"tables_seen": 1, "per": {"a": {"x": 1}}}
        assert summary["tables"]["ml.t"]["rows"] == 0
        buf = io.StringIO()
        demo.print_summary(summary, Console(file=buf, width=120))
        out = buf.getvalue()
        assert "tables_seen" in out and "extra · per" in out and "ml.t" in out
    finally:
        demo.SUMMARY_SECTIONS[:] = saved
