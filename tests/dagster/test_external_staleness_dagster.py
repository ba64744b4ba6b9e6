"""The compaction sensor enforces a table's external-reader staleness policy."""
from datetime import datetime, timedelta, timezone

import pyarrow as pa

from featurelake.synthetic import impressions_table

KEY = "sample_id"
OFF = {"min_small_files": 0, "min_update_layers": 0, "min_update_files": 0}  # only the policy can trigger


def _lake(lake_home):
    from resources import LakeResource

    return LakeResource(home=str(lake_home))


def _table(lake, name: str, properties=None):
    data = impressions_table(60, days=1)
    t = lake.create_table(name, data.schema, primary_key=KEY, properties=properties)
    t.append(data)
    t.backfill(pa.table({KEY: data[KEY].slice(0, 10), "f0": pa.array([1.0] * 10, pa.float32())}))
    return t


def test_sensor_requests_compaction_when_the_policy_is_violated(instance, lake_home):
    from platform_defs.sensors import compaction_sensor, evaluate_sensor, run_requested_compactions

    resource = _lake(lake_home)
    lake = resource.lake()
    strict = _table(lake, "ml.strict", {"external-readers.max-pending-layers": "0"})
    _table(lake, "ml.lenient")  # no policy: pending updates are allowed
    sensor_def = compaction_sensor("staleness_sensor", **OFF)
    result = evaluate_sensor(sensor_def, instance, resource, quiet=True)
    assert [r.partition_key for r in result.run_requests] == ["ml.strict|main"]
    assert "max-pending-layers=0" in result.run_requests[0].tags["featurelake/reason"]
    runs = run_requested_compactions(result, instance, resource)
    meta = runs[0]["metadata"]
    assert meta["final_for_external_readers"] is True
    assert "max-pending-layers=0" in meta["staleness_violations_before"]
    assert strict.stats()["final_for_external_readers"] is True
    again = evaluate_sensor(sensor_def, instance, resource, cursor=result.cursor, quiet=True)
    assert not again.run_requests


def test_time_bound_is_rechecked_without_new_commits(instance, lake_home):
    from platform_defs.sensors import Thresholds, plan_compactions

    lake = _lake(lake_home).lake()
    _table(lake, "ml.aging", {"external-readers.max-staleness": "1h"})
    first = plan_compactions(lake, Thresholds(**OFF))
    assert not first.requests and first.healthy["ml.aging|main"]["staleness"]["pending_update_files"] == 1
    # two hours later the same head breaks the bound, although nothing was committed
    later = plan_compactions(lake, Thresholds(**OFF), first.cursor, now=datetime.now(timezone.utc) + timedelta(hours=2))
    assert [r.table for r in later.requests] == ["ml.aging"]
    assert "max-staleness" in later.requests[0].reasons[0]
