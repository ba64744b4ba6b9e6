"""What other engines see: the merge-on-read marker, pending-update counts in snapshot summaries,
stats for external readers, and the bounded-staleness policy."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from featurelake.errors import InvalidArgumentError
from featurelake.health import branch_staleness, clear_caches
from featurelake.schema import MERGE_ON_READ_PROPERTY
from featurelake.state import PENDING_FILES_KEY, PENDING_LAYERS_KEY
from featurelake.synthetic import impressions_table

KEY = "sample_id"


@pytest.fixture(autouse=True)
def _cold():
    clear_caches()
    yield
    clear_caches()


def _table(lake, properties=None, rows: int = 200):
    data = impressions_table(rows, days=2)
    t = lake.create_table("ml.samples", data.schema, primary_key=KEY, partition_by=["day(ts)"], properties=properties)
    t.append(data)
    return t, data


def _summary(t, branch: str = "main") -> dict[str, str]:
    ice = t.iceberg
    return ice.metadata.snapshot_by_id(ice.metadata.refs[branch].snapshot_id).summary.additional_properties


def test_marker_and_pending_counts_in_every_platform_summary(lake):
    t, data = _table(lake)
    assert t.iceberg.metadata.properties[MERGE_ON_READ_PROPERTY] == "true"
    assert _summary(t)[PENDING_FILES_KEY] == "0" and _summary(t)[PENDING_LAYERS_KEY] == "0"

    keys = data[KEY].slice(0, 50)
    t.backfill(pa.table({KEY: keys, "f0": pa.array([1.0] * 50, pa.float32())}))
    t.backfill(pa.table({KEY: keys.slice(0, 10), "f0": pa.array([2.0] * 10, pa.float32())}))
    t.upsert(pa.table({KEY: keys.slice(0, 5), "click": pa.array([1] * 5, pa.int32())}))
    stats = t.stats()
    s = _summary(t)
    assert int(s[PENDING_FILES_KEY]) == stats["update_files"] > 0
    assert int(s[PENDING_LAYERS_KEY]) == stats["max_update_layers"] == 3
    # values are strings: pyiceberg's own inspection of the snapshots keeps working
    assert t.iceberg.inspect.snapshots().num_rows == len(t.snapshots())

    t.append(impressions_table(10, days=1, seed=9).set_column(0, KEY, pa.array(range(10**9, 10**9 + 10), pa.int64())))
    assert _summary(t)[PENDING_FILES_KEY] == s[PENDING_FILES_KEY]  # an append carries them forward
    t.compact()
    assert _summary(t)[PENDING_FILES_KEY] == "0" and _summary(t)[PENDING_LAYERS_KEY] == "0"


def test_stats_say_whether_external_readers_see_final_values(lake):
    t, data = _table(lake)
    first = t.stats()
    assert first["final_for_external_readers"] is True
    assert first["metadata_location"] == t.iceberg.metadata_location
    t.backfill(pa.table({KEY: data[KEY].slice(0, 20), "f1": pa.array([7.0] * 20, pa.float32())}))
    stale = t.stats()
    assert stale["final_for_external_readers"] is False
    # and it is true: plain pyiceberg still reads the old values
    plain = t.iceberg.scan(row_filter=f"{KEY} < {data[KEY][20].as_py()}").to_arrow()
    merged = t.read(filter=f"{KEY} < {data[KEY][20].as_py()}")
    assert pc.sum(pc.equal(plain["f1"], 7.0)).as_py() in (0, None) and pc.all(pc.equal(merged["f1"], 7.0)).as_py()
    t.compact()
    assert t.stats()["final_for_external_readers"] is True


def test_staleness_policy_layers_and_age(lake):
    t, data = _table(lake, {"external-readers.max-pending-layers": "1", "external-readers.max-staleness": "1h"})
    fresh = branch_staleness(t)
    assert fresh["final_for_external_readers"] and fresh["violations"] == [] and fresh["stale_seconds"] == 0
    assert fresh["policy"] == {"max_pending_layers": 1, "max_staleness_seconds": 3600.0}

    keys = data[KEY].slice(0, 10)
    t.backfill(pa.table({KEY: keys, "f2": pa.array([1.0] * 10, pa.float32())}))
    one = branch_staleness(t)
    assert one["pending_update_layers"] == 1 and one["violations"] == []  # within both bounds
    later = branch_staleness(t, now=datetime.now(timezone.utc) + timedelta(hours=2))
    assert later["stale_seconds"] > 3600 and len(later["violations"]) == 1 and "max-staleness" in later["violations"][0]

    t.backfill(pa.table({KEY: keys, "f2": pa.array([2.0] * 10, pa.float32())}))
    two = branch_staleness(t)
    assert two["pending_update_layers"] == 2 and "max-pending-layers=1" in two["violations"][0]
    t.compact()
    assert branch_staleness(t, now=datetime.now(timezone.utc) + timedelta(days=9))["violations"] == []


def test_bad_policy_is_refused_at_create(lake):
    data = impressions_table(5, days=1)
    for props in ({"external-readers.max-pending-layers": "-1"}, {"external-readers.max-staleness": "soon"}):
        with pytest.raises(InvalidArgumentError) as e:
            lake.create_table("ml.bad", data.schema, primary_key=KEY, properties=props)
        assert "external-readers.max-" in str(e.value)
        assert not lake.table_exists("ml.bad")
