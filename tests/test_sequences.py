"""Normalized user sequences: store builds, lookups and read-time joins against a pandas oracle.

The oracle is the definition: for a row (user, time t), the user's events with
event time < t (and >= t - window), ordered by (time, event id), the last N,
projected. Every test compares featurelake's answer with it, row by row.
"""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from backends import both_backends
from featurelake import Lake
from featurelake.errors import FeatureLakeError, NullKeyError, SchemaMismatchError, TableNotFoundError
from featurelake.sequences import SequenceBuildError, SequenceTable
from featurelake.synthetic import user_events, user_events_schema, user_events_table

T0 = dt.datetime(2026, 1, 1)
US = 1_000_000


# ------------------------------------------------------------------ helpers
def events_with_ties(users: int, per_user_max: int, seed: int, start_min: int = 0, minutes: int = 2000,
                     first_user: int = 0) -> pa.Table:
    """Events on a minute grid (many equal times per user), varied history lengths, one user with none."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, per_user_max + 1, size=users)
    uid = np.repeat(np.arange(first_user, first_user + users, dtype=np.int64), counts)
    n = len(uid)
    ts = np.datetime64(T0, "us") + (start_min + rng.integers(0, minutes, n)).astype("timedelta64[m]")
    lens = rng.integers(0, 3, n)
    tags = pa.ListArray.from_arrays(
        pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)), pa.array(rng.integers(0, 9, int(lens.sum()), dtype=np.int32))
    )
    etype = pa.array(rng.choice(["view", "click", None], n).tolist(), pa.string())
    return pa.table(
        {
            "user_id": pa.array(uid),
            "ts": pa.array(ts, pa.timestamp("us")),
            "item_id": pa.array(rng.integers(0, 50, n)),
            "event_type": etype,
            "dwell": pa.array(rng.random(n).astype(np.float32)),
            "tags": tags,
        },
        schema=user_events_schema(),
    )


def oracle(events: pa.Table, keys, befores, columns, max_len=None, window=None, key="user_id", time="ts") -> list:
    """Per row: events of that key with time < before (>= before - window), last max_len, projected."""
    df = pd.DataFrame({
        "k": events.column(key).to_pylist(),
        "t": events.column(time).cast(pa.int64()).to_numpy(),
        "e": events.column("event_id").to_numpy(),
    })
    df["row"] = np.arange(len(df))
    df = df.sort_values(["k", "t", "e"], kind="stable")
    groups = {k: g for k, g in df.groupby("k", sort=False)}
    proj = events.select(columns)
    out = []
    for k, b in zip(keys, befores):
        g = groups.get(k)
        if g is None or k is None or b is None:
            out.append([])
            continue
        bt = b if isinstance(b, (int, np.integer)) else int(pd.Timestamp(b).value // 1000)
        sel = g[g["t"] < bt]
        if window is not None:
            w = window if isinstance(window, int) else int(window / dt.timedelta(microseconds=1))
            sel = sel[sel["t"] >= bt - w]
        if max_len is not None:
            sel = sel.iloc[max(0, len(sel) - max_len):] if max_len else sel.iloc[0:0]
        out.append(proj.take(pa.array(sel["row"].to_numpy(), pa.int64())).to_pylist())
    return out


def make_events(lake: Lake, name: str = "ml.events", **kw) -> SequenceTable:
    return lake.create_sequence_table(name, user_events_schema(), key="user_id", time="ts", **kw)


def random_rows(rng, n, users, lo_min=-10, hi_min=2100, extra_users=3):
    keys = rng.integers(0, users + extra_users, n).tolist()            # some users have no history
    minutes = rng.integers(lo_min, hi_min, n)
    befores = [T0 + dt.timedelta(minutes=int(m), seconds=int(s)) for m, s in zip(minutes, rng.integers(0, 2, n) * 30)]
    return keys, befores


# -------------------------------------------------------------------- tests
@pytest.mark.parametrize("chunk_events,codecs,groups", [
    (1, "auto", None),
    (7, "ipc", None),
    (7, "auto", [["item_id", "event_type"], ["dwell", "tags"]]),   # a fixed-size group and an IPC group
    (128, "auto", [["tags"], ["dwell"], ["item_id"]]),
])
def test_lookup_matches_oracle(lake, chunk_events, codecs, groups):
    st = make_events(lake)
    events = events_with_ties(30, 120, seed=chunk_events)
    st.append(events)
    info = st.build(chunk_events=chunk_events, codecs=codecs, column_groups=groups)
    kinds = info.to_dict()["group_codecs"]
    assert kinds == (["ipc"] * len(kinds) if codecs == "ipc" else kinds) and len(kinds) == len(info.column_groups)
    assert info.users == len(set(events.column("user_id").to_pylist())) and info.events == events.num_rows
    stored = st.read()
    rng = np.random.default_rng(5)
    keys, befores = random_rows(rng, 300, 30)
    keys[0] = keys[1] = keys[2] = 3   # one key repeated with different times
    keys[3] = None                     # null key: empty list
    cases = [
        (None, None, None),
        (["item_id", "ts"], 5, None),
        (["tags", "event_type"], 1, None),
        (["dwell"], 40, dt.timedelta(hours=3)),
        (["ts"], 0, None),
        (None, 1000, dt.timedelta(minutes=30)),
    ]
    for columns, max_len, window in cases:
        got = st.lookup(keys, before=befores, columns=columns, max_len=max_len, window=window)
        cols = columns or ["ts", "item_id", "event_type", "dwell", "tags"]
        assert got.type.value_type.names == cols
        assert len(got) == len(keys)
        assert got.to_pylist() == oracle(stored, keys, befores, cols, max_len, window), (columns, max_len, window)
    # no bound: the latest events
    latest = st.lookup(list(range(32)), columns=["ts", "item_id"], max_len=9)
    far = [T0 + dt.timedelta(days=999)] * 32
    assert latest.to_pylist() == oracle(stored, list(range(32)), far, ["ts", "item_id"], 9)


@both_backends
def test_join_in_read_and_batches(lake):
    st = make_events(lake)
    events = events_with_ties(40, 80, seed=11)
    st.append(events)
    st.build(chunk_events=16)
    stored = st.read()

    rng = np.random.default_rng(2)
    n = 700
    keys, befores = random_rows(rng, n, 40)
    rows = pa.table({
        "sample_id": pa.array(np.arange(n, dtype=np.int64)),
        "user_id": pa.array(keys, pa.int64()),
        "ts": pa.array(befores, pa.timestamp("us")),
        "label": pa.array(rng.integers(0, 2, n).astype(np.int32)),
    })
    samples = lake.create_table("ml.samples", rows.schema, primary_key="sample_id")
    samples.append(rows.slice(0, 350))
    samples.append(rows.slice(350))
    view = st.view(key="user_id", time="ts", columns=["ts", "item_id", "tags"], max_len=12, batch_keys=16, threads=3)

    out = samples.read(sequences={"hist": view}).sort_by("sample_id")
    assert out.column_names == ["sample_id", "user_id", "ts", "label", "hist"]
    expected = oracle(stored, out["user_id"].to_pylist(), out["ts"].to_pylist(), ["ts", "item_id", "tags"], 12)
    assert out["hist"].to_pylist() == expected
    # no leakage: every joined event is strictly before its row's time
    for row_ts, hist in zip(out["ts"].to_pylist(), out["hist"].to_pylist()):
        assert all(e["ts"] < row_ts for e in hist)

    # the read's columns may omit the key and time: they are read for the join, then dropped
    slim = samples.read(columns=["sample_id", "label"], sequences={"hist": view}).sort_by("sample_id")
    assert slim.column_names == ["sample_id", "label", "hist"]
    assert slim["hist"].to_pylist() == expected

    # streaming: small batches, keys repeated within batches, same answer
    got = list(samples.batches(columns=["sample_id"], batch_size=64, sequences={"hist": view}))
    assert all(b.schema.names == ["sample_id", "hist"] for b in got)
    streamed = pa.Table.from_batches(got).sort_by("sample_id")
    assert streamed["hist"].to_pylist() == expected
    assert view.stats["rows"] == 3 * n   # three reads so far, every row looked up once each

    # a view whose key/time columns the table lacks, and a name clash, fail clearly
    bad = st.view(key="uid", time="ts", columns=["ts"])
    with pytest.raises(SchemaMismatchError, match="uid"):
        samples.read(sequences={"hist": bad})
    with pytest.raises(SchemaMismatchError, match="clashes"):
        samples.read(sequences={"label": view})


@both_backends
def test_rebuild_after_appends_incremental(lake):
    st = make_events(lake)
    first = events_with_ties(25, 60, seed=21)
    st.append(first)
    b1 = st.build(chunk_events=8)
    rng = np.random.default_rng(9)
    keys, befores = random_rows(rng, 250, 40, hi_min=4000)

    # new events: late arrivals inside old histories, later events, and brand-new users
    more = pa.concat_tables([
        events_with_ties(25, 30, seed=22, start_min=0, minutes=2000),
        events_with_ties(10, 30, seed=23, start_min=2500, minutes=1000),
        events_with_ties(8, 20, seed=24, start_min=100, minutes=3000, first_user=30),
    ])
    st.append(more)
    with pytest.raises(SequenceBuildError, match="no sequence store build"):
        st.lookup(keys, before=befores)
    # the old build still serves the old snapshot (time travel)
    old = st.lookup(keys, before=befores, columns=["ts", "item_id"], max_len=6, snapshot_id=b1.snapshot_id)
    assert old.to_pylist() == oracle(st.read(snapshot_id=b1.snapshot_id), keys, befores, ["ts", "item_id"], 6)

    b2 = st.build()
    assert b2.incremental and b2.base_build == b1.build_id and b2.chunk_events == 8
    assert b2.new_events == more.num_rows and len(b2.layers) == 2
    stored = st.read()
    assert b2.events == stored.num_rows
    cols = ["ts", "item_id", "event_type"]
    for max_len in (None, 3, 17):
        got = st.lookup(keys, before=befores, columns=cols, max_len=max_len)
        assert got.to_pylist() == oracle(stored, keys, befores, cols, max_len), max_len

    # a full rebuild of the same snapshot agrees byte for byte in its answers
    full = st.build(incremental=False, force=True)
    assert not full.incremental and full.events == b2.events and full.chunks == b2.chunks
    again = st.lookup(keys, before=befores, columns=cols, max_len=17, build=full.build_id)
    assert again.to_pylist() == st.lookup(keys, before=befores, columns=cols, max_len=17, build=b2.build_id).to_pylist()

    # building a snapshot that already has a build reuses it; a third, incremental layer works too
    assert st.build().build_id == full.build_id
    st.append(events_with_ties(5, 10, seed=25, start_min=3900, minutes=50))
    b3 = st.build()
    assert b3.incremental and b3.affected_users <= 5
    assert st.lookup(keys, before=befores, columns=cols, max_len=4).to_pylist() == oracle(st.read(), keys, befores, cols, 4)
    # collecting the builds of expired snapshots leaves the newer ones servable (hard links, not references)
    st.expire_snapshots(dt.datetime.now(dt.timezone.utc), retain_last=1)
    lake.collect_garbage(older_than=dt.timedelta(0))
    assert [b.build_id for b in st.builds()] == [b3.build_id]
    assert st.lookup(keys[:20], before=befores[:20], columns=cols).to_pylist() == oracle(st.read(), keys[:20], befores[:20], cols)


def test_branches_and_snapshots_pick_their_build(lake):
    st = make_events(lake)
    with pytest.raises(SequenceBuildError, match="no events"):
        st.build()
    st.append(events_with_ties(10, 20, seed=31))
    main_build = st.build(chunk_events=4)
    st.create_branch("research")
    st.append(events_with_ties(5, 20, seed=32, start_min=2100, minutes=100, first_user=100), branch="research")
    with pytest.raises(SequenceBuildError, match="research"):
        st.lookup([100], branch="research")
    rb = st.build(branch="research")
    assert rb.incremental and rb.snapshot_id == st.branches()["research"]
    far = T0 + dt.timedelta(days=30)
    on_branch = st.lookup([100, 1], before=far, branch="research", columns=["item_id"])
    assert len(on_branch[0]) > 0
    on_main = st.lookup([100, 1], before=far, columns=["item_id"])
    assert len(on_main[0]) == 0 and on_main[1] == on_branch[1]
    assert st.build_for("main").build_id == main_build.build_id
    stats = st.store_stats()
    assert stats["head_built"] and len(stats["builds"]) == 2


def test_spill_build_and_column_groups(lake):
    st = make_events(lake)
    events = events_with_ties(60, 50, seed=41)
    st.append(events.slice(0, events.num_rows // 2))
    st.append(events.slice(events.num_rows // 2))
    stored = st.read()
    rng = np.random.default_rng(3)
    keys, befores = random_rows(rng, 200, 60)
    cols = ["ts", "item_id", "tags"]
    expected = oracle(stored, keys, befores, cols, 10)

    spilled = st.build(chunk_events=5, bucket_rows=300, column_groups=[["item_id", "event_type"], ["dwell", "tags"]])
    assert len(spilled.layers[0]) > 3   # one sorted file per key range
    assert spilled.column_groups == [["item_id", "event_type"], ["dwell", "tags"]]
    assert st.lookup(keys, before=befores, columns=cols, max_len=10).to_pylist() == expected
    hot = st.lookup(keys, before=befores, columns=["item_id"], max_len=10)
    hot_bytes = st.last_lookup_stats["chunk_bytes"]
    st.lookup(keys, before=befores, columns=["item_id", "tags"], max_len=10)
    assert hot_bytes < st.last_lookup_stats["chunk_bytes"]   # projection fetches fewer bytes
    assert hot.to_pylist() == oracle(stored, keys, befores, ["item_id"], 10)

    single = st.build(chunk_events=5, force=True, column_groups=[["item_id", "event_type", "dwell", "tags"]])
    assert len(single.layers[0]) == 1
    assert st.lookup(keys, before=befores, columns=cols, max_len=10, build=single.build_id).to_pylist() == expected


def test_dictionary_growth_and_overflow(lake):
    """Low-cardinality strings are dictionary-coded; new values extend the dictionary, too many force a full build."""
    schema = pa.schema([("u", pa.int64()), ("t", pa.int64()), ("kind", pa.string()), ("w", pa.float32())])
    st = lake.create_sequence_table("ml.kinds", schema, key="u", time="t")
    rng = np.random.default_rng(6)

    def events(n, kinds, t0):
        kind = rng.choice(kinds, n).tolist() if len(kinds) < n else kinds[:n]
        return pa.table({"u": rng.integers(0, 20, n), "t": t0 + rng.integers(0, 100, n),
                         "kind": kind, "w": rng.random(n).astype(np.float32)}, schema=schema)

    st.append(events(500, ["a", "b", None], 0))
    b1 = st.build(chunk_events=6)
    assert b1.to_dict()["group_codecs"] == ["fixed"]
    st.append(events(200, ["c", "a"], 50))               # a new value: the dictionary grows, old codes stay
    b2 = st.build()
    assert b2.incremental and b2.group_codecs[0]["dictionaries"]["kind"] == ["a", "b", "c"]
    keys = rng.integers(0, 22, 150).tolist()
    befores = rng.integers(0, 160, 150).tolist()
    assert st.lookup(keys, before=befores, max_len=8).to_pylist() == oracle(st.read(), keys, befores, ["t", "kind", "w"], 8, key="u", time="t")
    st.append(events(5000, [f"k{i}" for i in range(5000)], 120))   # past the dictionary limit
    b3 = st.build()
    assert not b3.incremental and b3.to_dict()["group_codecs"] == ["ipc"]
    assert st.lookup(keys, before=befores, max_len=8).to_pylist() == oracle(st.read(), keys, befores, ["t", "kind", "w"], 8, key="u", time="t")


def test_string_keys_integer_time_and_own_event_ids(lake):
    schema = pa.schema([("user", pa.string()), ("t", pa.int64()), ("event_id", pa.string()), ("v", pa.float64())])
    st = lake.create_sequence_table("ml.strs", schema, key="user", time="t")
    assert not st.synthetic_event_id
    rng = np.random.default_rng(4)
    n = 400
    users = rng.choice(["ann", "bob", "a", "ab", "é", "z" * 30], n).tolist()
    data = pa.table({"user": users, "t": rng.integers(0, 50, n), "event_id": [f"e{i:04d}" for i in range(n)],
                     "v": rng.random(n)}, schema=schema)
    st.append(data)
    st.build(chunk_events=3)
    keys = ["ann", "a", "zz", "é", "ab", None, "bob"] * 5
    befores = rng.integers(-1, 55, len(keys)).tolist()
    got = st.lookup(keys, before=befores, columns=["t", "v", "event_id"], max_len=4, window=20)
    assert got.to_pylist() == oracle(st.read(), keys, befores, ["t", "v", "event_id"], 4, 20, key="user", time="t")
    with pytest.raises(FeatureLakeError, match="timedelta"):
        st.lookup(["a"], before=[5], window=dt.timedelta(seconds=1))


def test_bad_input_writes_nothing(lake):
    st = make_events(lake)
    events = events_with_ties(5, 10, seed=51)
    with pytest.raises(NullKeyError):
        st.append(pa.table({"user_id": pa.array([1, None], pa.int64()), "ts": pa.array([T0, T0], pa.timestamp("us"))}))
    with pytest.raises(SchemaMismatchError, match="event_id"):
        st.append(events.append_column("event_id", pa.array(np.arange(events.num_rows))))
    assert st.read().num_rows == 0
    st.append(events)
    st.build()
    with pytest.raises(SchemaMismatchError, match="unknown sequence column"):
        st.lookup([1], columns=["nope"])
    with pytest.raises(FeatureLakeError, match="window"):
        st.lookup([1], window=dt.timedelta(hours=1))
    with pytest.raises(FeatureLakeError, match="before has"):
        st.lookup([1, 2], before=[T0])
    with pytest.raises(TableNotFoundError, match="not a sequence table"):
        lake.create_table("ml.plain", pa.schema([("id", pa.int64())]), primary_key="id")
        lake.sequence_table("ml.plain")
    with pytest.raises(SchemaMismatchError, match="time column"):
        lake.create_sequence_table("ml.bad", pa.schema([("u", pa.int64()), ("t", pa.string())]), key="u", time="t")
    with pytest.raises(FeatureLakeError, match="integer or string"):
        lake.create_sequence_table("ml.bad2", pa.schema([("u", pa.float64()), ("t", pa.int64())]), key="u", time="t")
    # appends assign increasing ids and keep rows sorted by (user, time) inside each file
    st.append(events)
    ids = st.read(columns=["event_id"]).column(0).to_numpy()
    assert len(set(ids)) == 2 * events.num_rows and ids.min() == 0
    again = lake.sequence_table("ml.events")
    assert again.key == "user_id" and again.time == "ts"
    ice = again.iceberg   # the declared physical order, for any writer or compactor
    assert [ice.schema().find_column_name(f.source_id) for f in ice.sort_order().fields] == ["user_id", "ts"]


def test_synthetic_user_events_are_deterministic():
    a = user_events_table(7, 33, days=4, seed=3)
    b = pa.Table.from_batches(list(user_events(7, 33, days=4, seed=3, batch_size=5)))
    assert a.equals(b)
    counts = a.group_by("user_id").aggregate([([], "count_all")])
    assert sorted(counts["count_all"].to_pylist()) == [33] * 7
    ts = a["ts"].cast(pa.int64()).to_numpy()
    assert (np.diff(ts) >= 0).all()      # a time-ordered log
    assert set(a["event_type"].to_pylist()) <= {"view", "click", "cart", "purchase"}
    with pytest.raises(ValueError):
        user_events(0, 5)
    loyal = user_events_table(4, 200, days=2, seed=3, repeat_rate=1.0, favorites=5)
    per_user = loyal.group_by("user_id").aggregate([("item_id", "count_distinct")])
    assert max(per_user["item_id_count_distinct"].to_pylist()) <= 5


def test_cli_seq_commands(lake):
    from typer.testing import CliRunner

    from featurelake.cli import app

    st = make_events(lake)
    st.append(user_events_table(6, 20, days=3, seed=8))
    home = str(lake.home)
    runner = CliRunner()
    res = runner.invoke(app, ["--home", home, "--json", "seq", "build", "ml.events", "--chunk-events", "4"])
    assert res.exit_code == 0, res.output
    built = json.loads(res.output)
    assert built["events"] == 120 and built["users"] == 6
    res = runner.invoke(app, ["--home", home, "--json", "seq", "lookup", "ml.events", "1", "2", "99",
                              "--before", "2026-01-03T12:00:00", "--columns", "ts,item_id", "--max-len", "3"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    expected = st.lookup([1, 2, 99], before=dt.datetime(2026, 1, 3, 12), columns=["ts", "item_id"], max_len=3)
    assert [len(r["events"]) for r in rows] == [len(x) for x in expected.to_pylist()]
    assert rows[0]["events"][0]["item_id"] == expected[0][0]["item_id"].as_py()
    res = runner.invoke(app, ["--home", home, "--json", "seq", "stats", "ml.events"])
    assert res.exit_code == 0 and json.loads(res.output)["head_built"] is True
    res = runner.invoke(app, ["--home", home, "seq", "lookup", "ml.events", "1", "--columns", "nope"])
    assert res.exit_code == 1
    res = runner.invoke(app, ["--home", home, "seq", "stats", "ml.events"])
    assert res.exit_code == 0 and "builds" in res.output.lower()


@both_backends
def test_compaction_keeps_the_build_in_service(lake):
    st = make_events(lake)
    for seed in (41, 42, 43):  # three appends: three small files per day to compact
        st.append(events_with_ties(10, 20, seed=seed, first_user=seed * 100))
    built = st.build()
    far = T0 + dt.timedelta(days=30)
    keys = [4100, 4200, 4300, 7]
    before = st.lookup(keys, before=far, columns=["item_id"])
    report = st.compact()
    assert not report.skipped and st.branches()["main"] != built.snapshot_id
    assert st.build_for("main").build_id == built.build_id  # same events: the build still serves
    assert st.lookup(keys, before=far, columns=["item_id"]) == before
    st.append(events_with_ties(2, 5, seed=44, first_user=9000))  # new events: a new build is needed
    with pytest.raises(SequenceBuildError):
        st.build_for("main")


def test_parallel_prefetched_join_matches_oracle(lake):
    """Many small multi-gets over 4 threads, decoded in place, joined one batch ahead of the consumer."""
    st = make_events(lake)
    events = events_with_ties(40, 200, seed=23)
    st.append(events)
    st.build(chunk_events=8, column_groups=[["item_id", "dwell"], ["event_type", "tags"]])
    stored = st.read()
    rng = np.random.default_rng(9)
    n = 600
    keys, befores = random_rows(rng, n, 40)
    rows = pa.table({"sample_id": pa.array(np.arange(n, dtype=np.int64)), "user_id": pa.array(keys, pa.int64()),
                     "ts": pa.array(befores, pa.timestamp("us"))})
    samples = lake.create_table("ml.samples", rows.schema, primary_key="sample_id")
    samples.append(rows)
    cols = ["ts", "item_id", "event_type", "tags"]
    view = st.view(key="user_id", time="ts", columns=cols, max_len=20, window=dt.timedelta(hours=20), threads=4,
                   batch_keys=4)
    got = pa.Table.from_batches(list(samples.batches(batch_size=50, sequences={"hist": view}))).sort_by("sample_id")
    expected = oracle(stored, got["user_id"].to_pylist(), got["ts"].to_pylist(), cols, 20, dt.timedelta(hours=20))
    assert got["hist"].to_pylist() == expected
    one = st.lookup(keys, before=befores, columns=cols, max_len=20, window=dt.timedelta(hours=20), threads=1)
    assert one.to_pylist() == oracle(stored, keys, befores, cols, 20, dt.timedelta(hours=20))


@pytest.mark.parametrize("threads", [1, 4])
def test_cuts_counted_in_the_pool_threads_match_oracle(lake, threads):
    """Fixed-codec lookups in many small parts (every part's rows cut by the thread that decoded its times):
    ``before``, ``max_len`` and windows, with and without the time column, against the oracle."""
    st = make_events(lake)
    st.append(events_with_ties(40, 200, seed=31))
    st.build(chunk_events=8, column_groups=[["item_id", "event_type"], ["dwell", "tags"]])
    stored = st.read()
    store = st.open_store()
    keys, befores = random_rows(np.random.default_rng(13), 300, 40)
    arr, before = pa.array(keys, pa.int64()), pa.array(befores, pa.timestamp("us"))
    for cols in (["item_id", "event_type"], ["event_type", "ts"]):
        for max_len, window in [(None, None), (5, None), (None, dt.timedelta(hours=7)), (12, dt.timedelta(hours=30))]:
            got = store.lookup(arr, before, cols, max_len, window, threads=threads, batch_keys=3)
            assert got.to_pylist() == oracle(stored, keys, befores, cols, max_len, window), (cols, max_len, window)


def test_decoded_bytes_follow_projection_and_max_len(lake):
    """A lookup decodes only the projected columns of the chunks max_len needs, and times only where rows are cut."""
    st = make_events(lake)
    st.append(events_with_ties(40, 200, seed=29))
    c = 8
    st.build(chunk_events=c, column_groups=[["item_id", "dwell"], ["event_type", "tags"]])
    keys, befores = random_rows(np.random.default_rng(4), 400, 40)

    def decoded(columns, max_len):
        st.lookup(keys, before=befores, columns=columns, max_len=max_len)
        s = st.last_lookup_stats
        # per row at most ceil(max_len / c) + 1 chunks of the projected columns (value + validity
        # byte each), plus one chunk of int64 times where the row's list is cut
        slot = sum({"item_id": 9, "dwell": 5}[col] for col in columns)
        assert s["decoded_bytes"] <= s["rows"] * (((max_len + c - 1) // c + 1) * c * slot + c * 8)
        return s["decoded_bytes"]

    short, long = decoded(["item_id"], 8), decoded(["item_id"], 64)
    assert 1.2 * short < long
    assert decoded(["item_id"], 64) < decoded(["item_id", "dwell"], 64)


@pytest.mark.s3
def test_store_of_an_s3_table_lives_in_the_cache_dir(seaweed, s3_lake, tmp_path, monkeypatch):
    """Events on S3, the store on local disk: ``cache_dir=`` or ``$FEATURELAKE_CACHE_DIR``; without
    either the build is refused before anything is written."""
    props = seaweed.catalog_properties()
    monkeypatch.delenv("FEATURELAKE_SEQUENCE_HOME", raising=False)
    monkeypatch.delenv("FEATURELAKE_CACHE_DIR", raising=False)
    st = make_events(s3_lake)
    st.append(events_with_ties(5, 10, seed=51))
    with pytest.raises(SequenceBuildError, match="FEATURELAKE_CACHE_DIR"):
        st.build()
    monkeypatch.setenv("FEATURELAKE_CACHE_DIR", str(tmp_path / "env-cache"))
    from_env = Lake.from_uri(seaweed.catalog_uri, seaweed.warehouse, **props)
    assert from_env.cache_dir == (tmp_path / "env-cache").resolve()
    given = Lake.from_uri(seaweed.catalog_uri, seaweed.warehouse, cache_dir=tmp_path / "given", **props)
    assert given.cache_dir == (tmp_path / "given").resolve()  # an explicit folder wins over the environment
    built = given.sequence_table("ml.events").build()
    root = (tmp_path / "given" / "sequences" / "ml.events").resolve()
    assert Path(built.path).resolve().parent == root and (Path(built.path) / "build.json").exists()
    later = [T0 + dt.timedelta(days=9)] * 3
    got = given.sequence_table("ml.events").lookup([0, 1, 2], before=later, columns=["ts", "item_id"])
    assert got.to_pylist() == oracle(st.read(), [0, 1, 2], later, ["ts", "item_id"])
    assert from_env.sequence_table("ml.events").builds() == []  # another cache: no build there yet
    given.drop_table("ml.events", purge=True)  # purging the table purges its store in the cache
    assert not [p for p in root.rglob("*") if p.is_file()]
