"""What the UI shows besides runs: the sensor's description, the partitions window, sizes in MiB."""
import subprocess
import sys

from dagster import MetadataValue

from dagster_test_helpers import ROOT


def test_compaction_sensor_describes_its_thresholds_in_words():
    from platform_defs.sensors import compaction_sensor

    text = compaction_sensor(min_small_files=16, min_update_layers=4, min_update_files=0).description
    assert "off" not in text and ">=" not in text
    assert "at least 16 small files share a partition" in text
    assert "one data file carries at least 4 update layers" in text and "update files" not in text
    one = compaction_sensor(min_small_files=0, min_update_layers=0, min_update_files=1).description
    assert "at least 1 update file is live" in one and "small file" not in one
    none = compaction_sensor(min_small_files=0, min_update_layers=0, min_update_files=0).description
    assert "only when the table's external-reader staleness policy" in none


def _partitions(env: dict) -> list:
    code = ("from assets.main import daily_partitions as d; "
            "print(d.get_first_partition_key(), d.get_last_partition_key(), len(d.get_partition_keys()))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **env})
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_daily_partitions_are_the_demo_days_unless_configured():
    assert _partitions({}) == ["2026-01-01", "2026-01-03", "3"]  # the demo's three days: 100% filled
    assert _partitions({"FEATURELAKE_PARTITIONS_START": "2025-12-30", "FEATURELAKE_PARTITIONS_DAYS": "5"}) == [
        "2025-12-30", "2026-01-03", "5"]
    first, last, n = _partitions({"FEATURELAKE_PARTITIONS_DAYS": "open"})  # production: up to yesterday
    assert first == "2026-01-01" and int(n) > 3


def test_demo_refuses_days_beyond_the_partitions_and_says_what_to_set():
    import pytest

    from platform_defs.demo import demo_partition_keys

    assert demo_partition_keys() == ["2026-01-01", "2026-01-02", "2026-01-03"]
    with pytest.raises(ValueError, match="FEATURELAKE_PARTITIONS_DAYS=5"):
        demo_partition_keys(5)


def test_byte_counts_come_with_mib_and_records_become_tables():
    from assets.metadata import records_table, with_mib

    md = with_mib({"bytes_written": MetadataValue.int(3 * 2**20 + 2**19), "rows": MetadataValue.int(7),
                   "skipped": MetadataValue.bool(False)})
    assert list(md) == ["bytes_written", "bytes_written_mib", "rows", "skipped"]
    assert md["bytes_written_mib"] == MetadataValue.float(3.5)
    table = records_table({"ml.a": {"files": 2, "bytes": 2**20}, "ml.b": {"files": 0, "bytes": 0}})
    assert [c.name for c in table.schema.columns] == ["table", "files", "bytes", "bytes_mib"]
    assert [r.data for r in table.records] == [
        {"table": "ml.a", "files": 2, "bytes": 2**20, "bytes_mib": 1.0},
        {"table": "ml.b", "files": 0, "bytes": 0, "bytes_mib": 0.0}]
