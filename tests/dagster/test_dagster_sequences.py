"""Group main, user sequences: ``user_events`` (daily) -> ``sequence_store``, and the joined read.

The oracles are independent of featurelake's store: the day's events straight
from ``featurelake.synthetic.user_events``, and per training row the user's
events with ts < the row's ts, ordered by (ts, event id), the last N, projected.
"""
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from dagster import materialize

from backends import both_backends
from dagster_test_helpers import ROWS

DAYS = ["2026-01-01", "2026-01-02"]
EVENTS_PER_USER = 2  # per user per day: ~20k events a day over the 10k impression users
EVENT_COLUMNS = ["user_id", "ts", "item_id", "event_type", "dwell"]


def _resources(lake):
    """``lake``: an embedded lake's folder, or the LakeResource to use."""
    from resources import LakeResource

    return {"lake": lake if isinstance(lake, LakeResource) else LakeResource(home=str(lake))}


def _run(assets, lake_home, instance, key=None, store_config=None, raise_on_error=True):
    names = {a.key.to_user_string() for a in assets}
    ops = {}
    if "raw_impressions" in names:
        ops["raw_impressions"] = {"config": {"rows_per_day": ROWS}}
    if "user_events" in names:
        ops["user_events"] = {"config": {"events_per_user": EVENTS_PER_USER}}
    if "sequence_store" in names and store_config is not None:
        ops["sequence_store"] = {"config": store_config}
    return materialize(
        assets, instance=instance, partition_key=key, resources=_resources(lake_home),
        run_config={"ops": ops}, raise_on_error=raise_on_error,
    )


def _metadata(result, node):
    [mat] = result.asset_materializations_for_node(node)
    return {k: v.value for k, v in mat.metadata.items()}


def _oracle_events(day_keys) -> pa.Table:
    """The generator's events of those days: a 7-day user_events call per day, its first day kept."""
    from assets.main import START
    from assets.sequences import SPREAD_DAYS, impressions_users
    from featurelake.synthetic import user_events, user_events_schema

    parts = []
    for key in day_keys:
        day = datetime.fromisoformat(key)
        index = (day.date() - START).days
        batches = list(user_events(impressions_users(), EVENTS_PER_USER * SPREAD_DAYS, days=SPREAD_DAYS,
                                   start=day.date(), seed=index))  # seed 0: (0 << 20) | index
        t = pa.Table.from_batches(batches, schema=user_events_schema())
        parts.append(t.filter(pc.less(t["ts"], pa.scalar(day + timedelta(days=1), pa.timestamp("us")))))
    return pa.concat_tables(parts)


def _sorted_rows(table: pa.Table) -> pa.Table:
    return table.select(EVENT_COLUMNS).sort_by([(c, "ascending") for c in EVENT_COLUMNS[:3]])


@both_backends
def test_user_events_days_replaced_not_duplicated(env_resource, instance):
    from assets.main import START
    from assets.sequences import EVENTS_TABLE, user_events
    from featurelake.synthetic import impressions_for_day

    per_day = {}
    for key in DAYS:
        md = _metadata(_run([user_events], env_resource, instance, key), "user_events")
        per_day[key] = md
        assert md["mode"] == "delete+append" and md["replaced_events"] == 0
        assert md["events"] == _oracle_events([key]).num_rows > 0
    st = _resources(env_resource)["lake"].lake().sequence_table(EVENTS_TABLE)
    oracle = _oracle_events(DAYS)
    assert st.stats()["rows"] == oracle.num_rows == sum(md["events"] for md in per_day.values())

    # day 2 again: replaced, never doubled; day 1 untouched
    again = _metadata(_run([user_events], env_resource, instance, DAYS[1]), "user_events")
    assert again["replaced_events"] == again["events"] == per_day[DAYS[1]]["events"]
    assert again["table_events"] == oracle.num_rows
    got = st.read(columns=EVENT_COLUMNS)
    assert got.num_rows == oracle.num_rows
    assert _sorted_rows(got).equals(_sorted_rows(oracle).cast(got.select(EVENT_COLUMNS).schema))
    assert pc.count_distinct(st.read(columns=["event_id"]).column(0)).as_py() == oracle.num_rows

    # the events' users are the impressions' users: the join finds histories
    impressions = pa.Table.from_batches(list(impressions_for_day(1, ROWS, start=START)))
    users = set(got.column("user_id").to_pylist())
    seen = [u in users for u in impressions.column("user_id").to_pylist()]
    assert sum(seen) / len(seen) > 0.9

    # the store is built from those events into the lake's local cache (the home, or FEATURELAKE_CACHE_DIR)
    from assets.sequences import sequence_store

    md = _metadata(_run([sequence_store], env_resource, instance), "sequence_store")
    assert md["mode"] == "full" and md["events"] == oracle.num_rows
    build = st.build_for()
    assert build.build_id == md["build_id"]
    assert Path(build.path).resolve().is_relative_to(env_resource.lake().cache_dir)
    far = datetime(2026, 2, 1)
    some = got.column("user_id").to_pylist()[:5]
    hist = st.lookup(some, before=far, columns=["ts", "item_id"]).to_pylist()
    assert [len(h) for h in hist] == [pc.sum(pc.equal(got["user_id"], u)).as_py() for u in some]


def _oracle_hist(events: pd.DataFrame, rows: pd.DataFrame, columns, max_len) -> list:
    by_user = {u: g for u, g in events.sort_values(["ts", "event_id"], kind="stable").groupby("user_id", sort=False)}
    out = []
    for user, ts in zip(rows["user_id"], rows["ts"]):
        g = by_user.get(user)
        if g is None:
            out.append([])
            continue
        sel = g[g["ts"] < ts].tail(max_len)
        out.append([{c: (v.to_pydatetime() if isinstance(v, pd.Timestamp) else v) for c, v in r.items()}
                    for r in sel[columns].to_dict("records")])
    return out


def _assert_joined_matches(lake, max_len=3, sample=250, seed=0):
    from assets.main import SAMPLES_TABLE
    from assets.sequences import EVENTS_TABLE

    st = lake.sequence_table(EVENTS_TABLE)
    t = lake.table(SAMPLES_TABLE)
    cols = ["ts", "item_id", "event_type"]
    view = st.view(key="user_id", time="ts", columns=cols, max_len=max_len)
    got = t.read(columns=["sample_id"], sequences={"hist": view})  # user_id, ts fetched for the join, dropped
    assert got.column_names == ["sample_id", "hist"]
    # batches give the same rows and histories as read
    streamed = pa.Table.from_batches(list(t.batches(columns=["sample_id"], batch_size=97, sequences={"hist": view})))
    assert streamed.sort_by("sample_id").equals(got.sort_by("sample_id"))

    keys = t.read(columns=["sample_id", "user_id", "ts"]).to_pandas()
    events = st.read(columns=["user_id", "ts", "event_id", *cols[1:]]).to_pandas()
    rows = keys.sample(n=min(sample, len(keys)), random_state=seed)
    want = _oracle_hist(events, rows, cols, max_len)
    by_id = dict(zip(got.column("sample_id").to_pylist(), got.column("hist").to_pylist()))
    nonempty = 0
    for sid, expected in zip(rows["sample_id"], want):
        assert by_id[sid] == expected, sid
        nonempty += bool(expected)
    assert nonempty > len(rows) // 2  # most rows do have a history
    return got


def test_sequence_store_builds_and_joined_read_matches_oracle(lake_home, instance):
    from assets.main import main_assets
    from assets.sequences import EVENTS_TABLE, sequence_assets

    lake = _resources(lake_home)["lake"].lake()
    modes = []
    for key in DAYS:  # what main_job runs per day: features, labels, events, then the store build
        result = _run([*main_assets, *sequence_assets], lake_home, instance, key)
        md = _metadata(result, "sequence_store")
        st = lake.sequence_table(EVENTS_TABLE)
        head = st.stats()
        assert md["snapshot_id"] == md["head_snapshot_id"] == str(head["snapshot_id"])
        assert md["events"] == head["rows"] and md["users"] > 0
        assert md["bytes"] > 0 and md["store_bytes"] >= md["bytes"] and 0 < md["build_seconds"] < 60
        assert st.build_for().build_id == md["build_id"]
        modes.append(md["mode"])
    assert modes == ["full", "incremental"]

    # nothing new: the head's build is reused, not rebuilt
    again = _metadata(_run([sequence_assets[1]], lake_home, instance), "sequence_store")
    assert again["mode"] == "reused" and again["build_id"] == md["build_id"]

    got = _assert_joined_matches(lake)
    assert got.num_rows == 2 * ROWS
    hist = got.column("hist")
    assert pc.max(pc.list_value_length(hist)).as_py() <= 3

    # day 1 re-materialized: the store is rebuilt for the new head, the join still matches
    _run([sequence_assets[0]], lake_home, instance, DAYS[0])
    md = _metadata(_run([sequence_assets[1]], lake_home, instance), "sequence_store")
    st = lake.sequence_table(EVENTS_TABLE)
    assert md["mode"] in ("full", "incremental") and md["snapshot_id"] == str(st.stats()["snapshot_id"])
    assert md["events"] == _oracle_events(DAYS).num_rows
    assert len(st.builds()) == 3  # nothing deleted by the asset: garbage collection frees dead builds
    _assert_joined_matches(lake, max_len=2, sample=150, seed=1)


def test_sequence_job_and_failures(lake_home, instance):
    from assets.sequences import EVENTS_TABLE, sequence_store
    from platform_defs import build_defs

    # no events yet: a clear failure, nothing built
    result = _run([sequence_store], lake_home, instance, raise_on_error=False)
    assert not result.success
    from dagster import DagsterEventType

    failures = [e for e in result.all_events if e.event_type == DagsterEventType.STEP_FAILURE]
    assert "materialize user_events first" in str(failures[0].event_specific_data.error.message)
    assert not _resources(lake_home)["lake"].lake().table_exists(EVENTS_TABLE)  # nothing created

    from assets.sequences import user_events

    _run([user_events], lake_home, instance, DAYS[0])
    defs = build_defs({"FEATURELAKE_HOME": str(lake_home)})
    job = defs.resolve_job_def("sequence_job")
    assert {n.name for n in job.nodes} == {"sequence_store"}
    res = job.execute_in_process(instance=instance, resources=_resources(lake_home))
    assert res.success
    md = _metadata(res, "sequence_store")
    assert md["mode"] == "full" and md["column_groups"] == "item_id, event_type | dwell, tags"
    # a full rebuild on request, three times: the asset keeps every build, garbage collection
    # then deletes the superseded builds of the head (same layout), keeping the newest
    for _ in range(3):
        res = job.execute_in_process(
            instance=instance, resources=_resources(lake_home),
            run_config={"ops": {"sequence_store": {"config": {"incremental": False, "force": True}}}},
        )
    md = _metadata(res, "sequence_store")
    assert md["mode"] == "full" and md["builds"] == 4
    lk = _resources(lake_home)["lake"].lake()
    report = lk.collect_garbage(older_than=timedelta(0))
    assert len(report.builds["ml.user_events"]) == 3 and md["build_id"] not in report.builds["ml.user_events"]
    st = lk.sequence_table("ml.user_events")
    assert [b.build_id for b in st.builds()] == [md["build_id"]] and st.build_for().build_id == md["build_id"]


@pytest.mark.parametrize("index", [0, 3])
def test_day_events_stay_in_their_day(index):
    from assets.main import START
    from assets.sequences import day_events

    a = day_events(index, 500, 4)
    b = day_events(index, 500, 4)
    assert a.equals(b) and a.num_rows > 0
    lo = datetime.combine(START + timedelta(days=index), datetime.min.time())
    bounds = pc.min_max(a["ts"]).as_py()
    assert lo <= bounds["min"] and bounds["max"] < lo + timedelta(days=1)
    assert set(a["user_id"].to_pylist()) <= set(range(500))
    counts = np.bincount(a["user_id"].to_numpy(), minlength=500)
    assert counts.std() > 0  # a binomial number per user, not the same count
    assert not a.select(["item_id"]).equals(day_events(index + 1, 500, 4).select(["item_id"]))
