"""run_demo: a few days end to end, persistent instance, readable summary."""
import io
import os

from dagster import DagsterInstance


def test_run_demo_smoke(tmp_path, monkeypatch):
    from rich.console import Console

    from platform_defs.demo import run_demo

    monkeypatch.setenv("DAGSTER_HOME", "/nonexistent-before-demo")
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

    labels = summary["labels"]
    assert labels["rows_labelled"] == 600
    assert labels["landed_positives"] > 0
    assert labels["positives_read_back"] == labels["landed_positives"] and labels["read_back_ok"]
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
        assert inst.get_runs_count() == 2
    finally:
        inst.dispose()

    # a second demo run re-materializes the same days: still no duplicates
    again = run_demo(home, days=2, rows_per_day=300, print_report=False)
    assert again["tables"]["ml.samples"]["rows"] == 600
    assert again["labels"]["read_back_ok"] and again["labels"]["rows_labelled"] == 600


def test_summary_sections_extend():
    from platform_defs import demo

    saved = list(demo.SUMMARY_SECTIONS)
    try:
        @demo.summary_section("extra")
        def _extra(lake, context):
            return {"answer": 42, "per": {"a": {"x": 1}}}

        class FakeLake:
            def tables(self):
                return []

        summary = demo.build_summary(FakeLake(), {"home": "h"})
        assert summary["extra"]["answer"] == 42 and summary["tables"] == {}
        from rich.console import Console

        buf = io.StringIO()
        demo.print_summary(summary, Console(file=buf, width=120))
        assert "answer" in buf.getvalue()
    finally:
        demo.SUMMARY_SECTIONS[:] = saved
