"""Entity feature tables joined at read time, against pandas.

The oracle is pandas doing the same thing the obvious way: ``merge_asof`` by key
with ``allow_exact_matches=False`` (the last version strictly before the row's
time) for as-of joins, a plain ``merge`` with each key's last version for latest
joins. Null keys, unknown keys and rows before an entity's first version get
nulls. Every comparison is row by row, on every feature, embeddings included.
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from backends import both_backends
from featurelake import Lake
from featurelake.errors import FeatureLakeError, NullKeyError, SchemaMismatchError, TableNotFoundError
from featurelake.sequences import SequenceBuildError
from featurelake.sequences.features import FeatureTable
from featurelake.synthetic import user_events_schema
from featurelake.training import TrainingReader

T0 = dt.datetime(2026, 1, 1)
DIM = 4
FEATURES = ["price", "category", "emb"]


def item_schema() -> pa.Schema:
    return pa.schema([("item_id", pa.int64()), ("updated_at", pa.timestamp("us")), ("price", pa.float32()),
                      ("category", pa.string()), ("emb", pa.list_(pa.float32(), DIM))])


def item_versions(items: int, max_versions: int, seed: int, start_min: int = 0, minutes: int = 3000,
                  first: int = 0) -> pa.Table:
    """0..max_versions versions per item at distinct minutes; some null prices, categories and embeddings."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, max_versions + 1, items)
    ids = np.repeat(np.arange(first, first + items, dtype=np.int64), counts)
    mins = np.concatenate([np.sort(rng.choice(minutes, c, replace=False)) for c in counts] or [np.array([], np.int64)])
    n = len(ids)
    order = rng.permutation(n)  # arrival order is not (key, time) order
    emb_null = rng.random(n) < 0.1
    emb = pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * DIM).astype(np.float32)), DIM,
                                            mask=pa.array(emb_null))
    price = pa.array(rng.random(n).astype(np.float32), mask=rng.random(n) < 0.1)
    cat = pa.array(rng.choice(["toys", "books", "food", None], n).tolist(), pa.string())
    ts = np.datetime64(T0, "us") + (start_min + mins).astype("timedelta64[m]")
    table = pa.table({"item_id": ids, "updated_at": pa.array(ts, pa.timestamp("us")), "price": price,
                      "category": cat, "emb": emb}, schema=item_schema())
    return table.take(pa.array(order))


def training_rows(versions: pa.Table, n: int, items: int, seed: int, key: str = "item") -> pa.Table:
    """Rows on known, unknown and null keys, at random times and exactly at version times."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(-2, items + 3, n).astype(object)
    keys[rng.random(n) < 0.05] = None
    ts = np.datetime64(T0, "us") + rng.integers(-100 * 60, 3200 * 60, n).astype("timedelta64[s]")
    exact = rng.random(n) < 0.3  # some rows exactly at a version's time: that version must not be seen
    pick = rng.integers(0, max(1, versions.num_rows), n)
    vk = versions.column("item_id").to_numpy()
    vt = versions.column("updated_at").cast(pa.int64()).to_numpy().astype("datetime64[us]")
    if versions.num_rows:
        keys[exact] = vk[pick[exact]]
        ts[exact] = vt[pick[exact]]
    return pa.table({"sid": np.arange(n, dtype=np.int64), key: pa.array(list(keys), pa.int64()),
                     "ts": pa.array(ts, pa.timestamp("us")), "label": pa.array(rng.integers(0, 2, n).astype(np.int32))})


def _pylist(series: pd.Series) -> list:
    out = []
    for v in series:
        if v is None or v is pd.NaT or (isinstance(v, float) and np.isnan(v)):
            out.append(None)
        elif isinstance(v, pd.Timestamp):
            out.append(v.to_pydatetime())
        elif isinstance(v, np.ndarray):
            out.append([float(x) for x in v])
        elif isinstance(v, list):
            out.append([float(x) for x in v])
        elif isinstance(v, (np.floating, float)):
            out.append(float(v))
        else:
            out.append(v)
    return out


def oracle(versions: pa.Table, rows: pa.Table, key: str, as_of: str | None, columns=FEATURES) -> dict[str, list]:
    """Per row (in ``sid`` order): pandas merge_asof (strictly before) or a merge with the latest version."""
    v = pd.DataFrame({"item_id": versions.column("item_id").to_pylist(),
                      "vt": versions.column("updated_at").cast(pa.int64()).to_numpy(),
                      **{c: versions.column(c).to_pylist() for c in columns if c != "updated_at"},
                      "updated_at": versions.column("updated_at").to_pylist()})
    r = pd.DataFrame({"sid": rows.column("sid").to_numpy(), "k": rows.column(key).to_pylist(),
                      "t": rows.column("ts").cast(pa.int64()).to_numpy()})
    known = r[r["k"].notna()].astype({"k": np.int64})
    if as_of is not None:
        m = pd.merge_asof(known.sort_values("t"), v.sort_values("vt"), left_on="t", right_on="vt", left_by="k",
                          right_by="item_id", allow_exact_matches=False, direction="backward")
    else:
        latest = v.sort_values("vt", kind="stable").drop_duplicates("item_id", keep="last")
        m = known.merge(latest, left_on="k", right_on="item_id", how="left")
    full = r[["sid"]].merge(m, on="sid", how="left").sort_values("sid")
    return {c: _pylist(full[c].astype(object)) for c in columns}


def ours(table: pa.Table, name: str, columns=FEATURES) -> dict[str, list]:
    table = table.sort_by("sid")
    out = {}
    for c in columns:
        col = table.column(f"{name}.{c}")
        out[c] = [([float(x) for x in v] if isinstance(v, list) else (float(v) if isinstance(v, float) else v))
                  for v in col.to_pylist()]
    return out


def make_items(lake: Lake, name: str = "ml.items", time: str | None = "updated_at") -> FeatureTable:
    return lake.create_feature_table(name, item_schema(), key="item_id", time=time)


def make_samples(lake: Lake, rows: pa.Table, name: str = "ml.samples"):
    t = lake.create_table(name, rows.schema, primary_key="sid")
    t.append(rows)
    return t


# -------------------------------------------------------------------- tests
@both_backends
def test_as_of_join_matches_merge_asof(lake):
    ft = make_items(lake)
    first = item_versions(60, 6, seed=1)
    ft.append(first.slice(0, first.num_rows // 2))
    ft.append(first.slice(first.num_rows // 2))           # two appends: versions of one item in both
    info = ft.build()
    assert info.events == first.num_rows and info.chunk_events == 8
    assert [k for k in info.to_dict()["group_codecs"]] == ["fixed", "packed"]   # scalars fixed-size, embeddings byte-plane packed
    rows = training_rows(first, 800, 60, seed=2)
    samples = make_samples(lake, rows)
    view = ft.view(key_column="item", as_of="ts", columns=FEATURES + ["updated_at"])
    want = oracle(first, rows, "item", "ts", FEATURES + ["updated_at"])
    got = samples.read(columns=["sid", "label"], features={"item": view})
    assert got.column_names == ["sid", "label", "item.price", "item.category", "item.emb", "item.updated_at"]
    assert got.schema.field("item.emb").type == pa.list_(pa.float32(), DIM)
    assert ours(got, "item", FEATURES + ["updated_at"]) == want
    assert sum(v is not None for v in want["price"]) > 100 and sum(v is None for v in want["emb"]) > 100
    streamed = pa.Table.from_batches(list(samples.batches(columns=["sid"], batch_size=97, features={"item": view})))
    assert ours(streamed, "item", FEATURES + ["updated_at"]) == want

    # more versions, an incremental build: the new view sees them, the old one keeps its build
    more = item_versions(70, 3, seed=3, start_min=1500)
    ft.append(more)
    info2 = ft.build()
    assert info2.incremental and info2.events == first.num_rows + more.num_rows
    both = pa.concat_tables([first, more])
    got2 = samples.read(columns=["sid"], features={"item": ft.view(key_column="item", as_of="ts")})
    assert ours(got2, "item") == oracle(both, rows, "item", "ts")
    assert ours(samples.read(columns=["sid"], features={"item": view}), "item", FEATURES + ["updated_at"]) == want


@pytest.mark.parametrize("options", [{}, {"chunk_events": 1}, {"chunk_events": 5, "codecs": "ipc"}])
def test_many_versions_per_entity_across_chunk_edges(lake, options):
    ft = make_items(lake)
    versions = item_versions(12, 40, seed=23)                  # up to 40 versions: several chunks per item
    ft.append(versions)
    info = ft.build(**options)
    assert info.chunks > info.users
    rows = training_rows(versions, 700, 12, seed=24)           # 30% of the rows exactly at a version's time
    samples = make_samples(lake, rows)
    for as_of in ("ts", None):
        got = samples.read(features={"item": ft.view(key_column="item", as_of=as_of)})
        assert ours(got, "item") == oracle(versions, rows, "item", as_of)


def test_latest_join_matches_merge(lake):
    ft = make_items(lake)
    versions = item_versions(50, 5, seed=4)
    ft.append(versions)
    ft.build()
    rows = training_rows(versions, 400, 50, seed=5, key="item_id")
    samples = make_samples(lake, rows)
    got = samples.read(features={"it": ft.view(columns=["emb", "price"])})   # key_column defaults to the key's name
    assert got.column_names[-2:] == ["it.emb", "it.price"]
    assert ours(got, "it", ["emb", "price"]) == oracle(versions, rows, "item_id", None, ["emb", "price"])
    df = samples.to_pandas(columns=["sid"], features={"it": ft.view(columns=["price"])}).sort_values("sid")
    assert _pylist(df["it.price"].astype(object)) == oracle(versions, rows, "item_id", None, ["price"])["price"]
    # the direct lookup answers the same, one row per key
    keys = [3, None, 999, 7, 3]
    direct = ft.lookup(keys, columns=["price"])
    by_key = oracle(versions, pa.table({"sid": np.arange(5), "item_id": pa.array(keys, pa.int64()),
                                        "ts": pa.array([T0] * 5, pa.timestamp("us"))}), "item_id", None, ["price"])
    assert [None if v is None else float(v) for v in direct.column("price").to_pylist()] == by_key["price"]


def test_unversioned_table_keeps_the_last_append_per_key(lake):
    schema = pa.schema([("author", pa.string()), ("followers", pa.int64()), ("vec", pa.list_(pa.float64(), 2))])
    ft = lake.create_feature_table("ml.authors", schema, key="author")
    assert not ft.versioned and ft.features == ["followers", "vec"]
    rng = np.random.default_rng(6)
    appended = []
    for step in range(3):
        names = [f"a{i}" for i in rng.choice(30, 20, replace=False)]
        batch = pa.table({"author": names, "followers": rng.integers(0, 1000, 20),
                          "vec": pa.FixedSizeListArray.from_arrays(pa.array(rng.random(40)), 2)}, schema=schema)
        ft.append(batch)
        appended.append(batch.to_pandas())
    ft.build()
    latest = pd.concat(appended).drop_duplicates("author", keep="last").set_index("author")
    keys = [f"a{i}" for i in range(33)] + [None]
    got = ft.lookup(keys)
    want_f = [int(latest.loc[k, "followers"]) if k in latest.index else None for k in keys]
    want_v = [list(latest.loc[k, "vec"]) if k in latest.index else None for k in keys]
    assert got.column("followers").to_pylist() == want_f
    assert got.column("vec").to_pylist() == want_v
    with pytest.raises(FeatureLakeError, match="as_of"):
        ft.view(as_of="ts")
    with pytest.raises(SchemaMismatchError, match="feature_version"):
        ft.append(pa.table({"author": ["x"], "followers": [1], "feature_version": [5]}))


def test_ties_later_append_wins_and_exact_time_is_excluded(lake):
    ft = make_items(lake)
    row = {"item_id": [1], "updated_at": [T0], "category": ["a"], "emb": [[0.0] * DIM]}
    ft.append(pa.table({**row, "price": pa.array([1.0], pa.float32())}))
    ft.append(pa.table({**row, "price": pa.array([2.0], pa.float32())}))   # same key, same time
    ft.append(pa.table({**row, "updated_at": [T0 + dt.timedelta(hours=1)], "price": pa.array([3.0], pa.float32())}))
    ft.build()
    at = [T0, T0 + dt.timedelta(microseconds=1), T0 + dt.timedelta(hours=1), T0 + dt.timedelta(hours=2)]
    got = ft.lookup([1, 1, 1, 1], as_of=pa.array(at, pa.timestamp("us")), columns=["price"])
    assert got.column("price").to_pylist() == [None, 2.0, 2.0, 3.0]
    # a coarser as_of unit is rounded up, never letting the version at that instant in
    ms = pa.array([T0 + dt.timedelta(hours=1)], pa.timestamp("ms"))
    assert ft.lookup([1], as_of=ms, columns=["price"]).column("price").to_pylist() == [2.0]


def test_integer_times_and_string_keys(lake):
    schema = pa.schema([("ad", pa.string()), ("day", pa.int32()), ("bid", pa.float64())])
    ft = lake.create_feature_table("ml.ads", schema, key="ad", time="day")
    rng = np.random.default_rng(7)
    n = 300
    ads = [f"ad{i}" for i in rng.integers(0, 40, n)]
    days = rng.integers(0, 100, n).astype(np.int32)
    versions = pa.table({"ad": ads, "day": days, "bid": rng.random(n)}, schema=schema)
    versions = pa.Table.from_pandas(versions.to_pandas().drop_duplicates(["ad", "day"]), schema=schema, preserve_index=False)
    ft.append(versions)
    ft.build()
    rows = pa.table({"sid": np.arange(200, dtype=np.int64), "ad_id": [f"ad{i}" for i in rng.integers(0, 45, 200)],
                     "day": rng.integers(-5, 110, 200)})
    samples = make_samples(lake, rows)
    got = samples.read(features={"ad": ft.view(key_column="ad_id", as_of="day")}).sort_by("sid")
    v = versions.to_pandas().astype({"day": np.int64}).sort_values("day")
    r = rows.to_pandas().sort_values("day")
    m = pd.merge_asof(r, v.rename(columns={"day": "vday"}), left_on="day", right_on="vday", left_by="ad_id",
                      right_by="ad", allow_exact_matches=False).sort_values("sid")
    assert got.column("ad.bid").to_pylist() == _pylist(m["bid"].astype(object))


def test_branches_and_snapshots(lake):
    ft = make_items(lake)
    main_versions = item_versions(40, 4, seed=8)
    ft.append(main_versions)
    first_snapshot = ft.iceberg.current_snapshot().snapshot_id
    ft.build()
    ft.create_branch("dev")
    dev_more = item_versions(40, 4, seed=9, start_min=1000)
    ft.append(dev_more, branch="dev")
    main_more = item_versions(20, 2, seed=10, start_min=2000)
    ft.append(main_more)
    with pytest.raises(SequenceBuildError, match="feature table ml.items"):
        ft.view(branch="dev")                                  # no build reflects the dev head yet
    ft.build(branch="dev")
    ft.build()
    rows = training_rows(pa.concat_tables([main_versions, dev_more]), 500, 40, seed=11)
    samples = make_samples(lake, rows)
    cases = [
        (ft.view(key_column="item", as_of="ts", branch="dev"), pa.concat_tables([main_versions, dev_more])),
        (ft.view(key_column="item", as_of="ts"), pa.concat_tables([main_versions, main_more])),
        (ft.view(key_column="item", as_of="ts", snapshot_id=first_snapshot), main_versions),
    ]
    for view, versions in cases:
        assert ours(samples.read(features={"item": view}), "item") == oracle(versions, rows, "item", "ts")
    # the training table's own branch is read, features from the view's build
    samples.create_branch("exp")
    samples.append(training_rows(main_versions, 50, 40, seed=12).set_column(0, "sid", pa.array(np.arange(1000, 1050))),
                   branch="exp")
    got = samples.read(branch="exp", features={"item": cases[0][0]})
    assert got.num_rows == 550
    exp_rows = samples.read(branch="exp")
    assert ours(got, "item") == oracle(cases[0][1], exp_rows, "item", "ts")


def test_sequence_and_feature_views_together(lake):
    st = lake.create_sequence_table("ml.events", user_events_schema(), key="user_id", time="ts")
    rng = np.random.default_rng(13)
    n = 3000
    events = pa.table({
        "user_id": rng.integers(0, 30, n), "ts": pa.array(np.datetime64(T0, "us") + rng.integers(0, 3000, n).astype("timedelta64[m]")),
        "item_id": rng.integers(0, 50, n), "event_type": pa.array(rng.choice(["view", "click"], n).tolist()),
        "dwell": pa.array(rng.random(n).astype(np.float32)), "tags": pa.array([[1]] * n, pa.list_(pa.int32())),
    }, schema=user_events_schema())
    st.append(events)
    st.build()
    ft = make_items(lake)
    versions = item_versions(50, 5, seed=14)
    ft.append(versions)
    ft.build()
    rows = training_rows(versions, 600, 50, seed=15)
    rows = rows.append_column("user_id", pa.array(rng.integers(0, 32, rows.num_rows)))
    samples = make_samples(lake, rows)
    seq = st.view(key="user_id", time="ts", columns=["item_id"], max_len=16)
    feat = ft.view(key_column="item", as_of="ts")
    got = samples.read(columns=["sid"], sequences={"hist": seq}, features={"item": feat})
    assert got.column_names == ["sid", "hist", "item.price", "item.category", "item.emb"]
    got = got.sort_by("sid")
    want_hist = st.lookup(rows.column("user_id"), rows.column("ts"), columns=["item_id"], max_len=16)
    assert got.column("hist").to_pylist() == want_hist.to_pylist()
    assert ours(got, "item") == oracle(versions, rows, "item", "ts")
    batches = list(samples.batches(columns=["sid", "label"], batch_size=128, sequences={"hist": seq},
                                   features={"item": feat}))
    assert all(b.schema.names == ["sid", "label", "hist", "item.price", "item.category", "item.emb"] for b in batches)
    streamed = pa.Table.from_batches(batches).sort_by("sid")
    assert streamed.column("hist").to_pylist() == want_hist.to_pylist()
    assert ours(streamed, "item") == oracle(versions, rows, "item", "ts")
    # the training reader joins both too
    reader = TrainingReader(samples, columns=["sid"], batch_size=100, shuffle=True, sequences={"hist": seq},
                            features={"item": feat})
    trained = pa.Table.from_batches(list(reader)).sort_by("sid")
    assert trained.column_names == ["sid", "hist", "item.price", "item.category", "item.emb"]
    assert trained.column("hist").to_pylist() == want_hist.to_pylist()
    assert ours(trained, "item") == oracle(versions, rows, "item", "ts")
    # as a spawned data-loader worker gets it: pickled without the catalog, the views reopened from their builds
    import pickle

    reader.set_epoch(0)
    shipped = pickle.loads(pickle.dumps(reader))
    assert shipped.table is None
    assert pa.Table.from_batches(list(shipped)).sort_by("sid").equals(trained)
    with pytest.raises(SchemaMismatchError, match="clash"):
        samples.read(sequences={"item.price": seq}, features={"item": feat})


def test_embeddings_are_fixed_size_lists_zero_copy_to_numpy(lake):
    ft = make_items(lake)
    versions = item_versions(30, 3, seed=16)
    ft.append(versions)
    ft.build()
    rows = training_rows(versions, 300, 30, seed=17)
    samples = make_samples(lake, rows)
    want = oracle(versions, rows, "item", "ts", ["emb"])["emb"]
    seen_nulls = seen_full = False
    for batch in samples.batches(columns=["sid"], batch_size=64, features={"item": ft.view(key_column="item", as_of="ts",
                                                                                            columns=["emb"])}):
        col = batch.column("item.emb")
        assert isinstance(col, pa.FixedSizeListArray) and col.type.list_size == DIM
        mat = col.values.to_numpy(zero_copy_only=True).reshape(-1, DIM)   # raises if a copy were needed
        assert mat.shape == (batch.num_rows, DIM) and mat.dtype == np.float32
        assert mat.ctypes.data == col.values.buffers()[1].address + col.values.offset * 4   # a view of Arrow's buffer
        valid = col.is_valid().to_numpy(zero_copy_only=False)
        seen_nulls |= not valid.all()
        seen_full |= bool(valid.all())
        for sid, row, ok in zip(batch.column("sid").to_pylist(), mat, valid):
            assert (want[sid] is None) == (not ok)
            if ok:
                assert [float(x) for x in row] == want[sid]
    assert seen_nulls


def test_bad_input_is_refused_with_clear_errors(lake):
    with pytest.raises(SchemaMismatchError, match="key column 'nope'"):
        lake.create_feature_table("ml.bad", item_schema(), key="nope")
    with pytest.raises(SchemaMismatchError, match="integer or string"):
        lake.create_feature_table("ml.bad", pa.schema([("k", pa.float64()), ("x", pa.int32())]), key="k")
    with pytest.raises(SchemaMismatchError, match="timestamp or integer"):
        lake.create_feature_table("ml.bad", pa.schema([("k", pa.int64()), ("t", pa.string()), ("x", pa.int32())]),
                                  key="k", time="t")
    with pytest.raises(SchemaMismatchError, match="at least one feature"):
        lake.create_feature_table("ml.bad", pa.schema([("k", pa.int64()), ("t", pa.int64())]), key="k", time="t")
    with pytest.raises(SchemaMismatchError, match="reserved"):
        lake.create_feature_table("ml.bad", pa.schema([("k", pa.int64()), ("feature_version", pa.int64())]), key="k")
    assert "ml.bad" not in lake.tables()

    ft = make_items(lake)
    plain = lake.create_table("ml.plain", pa.schema([("id", pa.int64())]), primary_key="id")
    with pytest.raises(TableNotFoundError, match="not a feature table"):
        lake.feature_table("ml.plain")
    lake.create_sequence_table("ml.events", user_events_schema(), key="user_id", time="ts")
    with pytest.raises(TableNotFoundError, match="not a feature table"):
        lake.feature_table("ml.events")
    assert isinstance(lake.feature_table("ml.items"), FeatureTable)
    with pytest.raises(SequenceBuildError, match="no events yet"):
        ft.view()                                                 # nothing appended, nothing built

    good = item_versions(10, 2, seed=18)
    bad_inputs = [
        (SchemaMismatchError, "dimension 4, the data 3",
         good.set_column(4, "emb", pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(3 * good.num_rows, np.float32)), 3))),
        (SchemaMismatchError, "do not hold 4 numbers",
         good.set_column(4, "emb", pa.array([[1.0, 2.0]] * good.num_rows, pa.list_(pa.float32())))),
        (SchemaMismatchError, "must be a list", good.set_column(4, "emb", pa.array(["x"] * good.num_rows))),
        (NullKeyError, "null", good.set_column(0, "item_id", pa.nulls(good.num_rows, pa.int64()))),
        (SchemaMismatchError, "updated_at", good.drop_columns(["updated_at"])),
    ]
    files_before = sorted(p for p in Path(lake.home).rglob("*") if p.is_file() and p.suffix != ".db")
    for err, match, data in bad_inputs:
        with pytest.raises(err, match=match):
            ft.append(data)
    assert ft.iceberg.refresh().current_snapshot() is None          # nothing was written
    assert sorted(p for p in Path(lake.home).rglob("*") if p.is_file() and p.suffix != ".db") == files_before
    ft.append(good)
    with pytest.raises(SequenceBuildError, match="feature table ml.items.*build"):
        ft.view()                                                 # appended, not built
    ft.build()
    with pytest.raises(SchemaMismatchError, match="unknown feature column"):
        ft.view(columns=["price", "nope"])
    with pytest.raises(SchemaMismatchError, match="unknown feature column"):
        ft.view(columns=["feature_row_id"])

    rows = training_rows(good, 20, 10, seed=19)
    samples = make_samples(lake, rows.append_column("item_name", pa.array([str(i) for i in range(20)])))
    cases = [
        (ft.view(key_column="nope", as_of="ts"), "no column"),
        (ft.view(key_column="item", as_of="nope"), "no column"),
        (ft.view(key_column="item_name", as_of="ts"), "keyed by integers"),
        (ft.view(key_column="item", as_of="label"), "as_of column 'label' is int32"),
    ]
    for view, match in cases:
        with pytest.raises(SchemaMismatchError, match=match):
            samples.read(features={"item": view})
        with pytest.raises(SchemaMismatchError, match=match):
            samples.batches(features={"item": view})              # checked before the first batch
        with pytest.raises(SchemaMismatchError, match=match):
            TrainingReader(samples, features={"item": view})
    with pytest.raises(FeatureLakeError, match="must be a view from FeatureTable.view"):
        samples.read(features={"item": "item_features"})
    with pytest.raises(SchemaMismatchError, match="clash"):
        TrainingReader(samples, features={"item": ft.view(key_column="item", as_of="ts")}, weight_column="item.price")
    assert plain.read().num_rows == 0


def test_garbage_collection_keeps_the_live_feature_build_and_collects_dead_ones(tmp_path):
    """A lake without a home keeps feature builds under the table folder, like sequence builds."""
    from datetime import timezone

    lake = Lake.from_uri(f"sqlite:///{tmp_path / 'catalog.db'}", str(tmp_path / "warehouse"))
    ft = make_items(lake)
    v1 = item_versions(20, 3, seed=20)
    ft.append(v1)
    first = ft.build()
    v2 = item_versions(20, 3, seed=21, start_min=1000)
    ft.append(v2)
    second = ft.build()
    assert str(tmp_path / "warehouse") in first.path
    ft.expire_snapshots(dt.datetime.now(timezone.utc), retain_last=1)   # the first build's snapshot is gone
    report = lake.collect_garbage(older_than=dt.timedelta(0))
    assert any(first.build_id in f for f in report.files) and not any(second.build_id in f for f in report.files)
    ft = lake.feature_table("ml.items")
    assert [b.build_id for b in ft.builds()] == [second.build_id]
    rows = training_rows(pa.concat_tables([v1, v2]), 200, 20, seed=22)
    samples = make_samples(lake, rows)
    got = samples.read(features={"item": ft.view(key_column="item", as_of="ts")})
    assert ours(got, "item") == oracle(pa.concat_tables([v1, v2]), rows, "item", "ts")


def test_a_feature_added_by_backfill_is_served_after_the_next_build(lake):
    ft = make_items(lake)
    versions = item_versions(15, 4, seed=25)
    ft.append(versions)
    ft.build()
    stored = ft.read(columns=["feature_row_id", "item_id", "updated_at"])
    rating = pa.array(np.arange(stored.num_rows, dtype=np.float64) / 10)
    ft.backfill(pa.table({"feature_row_id": stored.column("feature_row_id"), "rating": rating}))
    assert ft.features == FEATURES + ["rating"]
    with pytest.raises(SequenceBuildError):
        ft.view(columns=["rating"])                       # the head changed: build first
    info = ft.build()
    assert not info.incremental and info.column_groups == [["price", "category", "rating"], ["emb"]]
    with_rating = ft.read()                                   # the versions with their ratings merged in
    rows = training_rows(versions, 300, 15, seed=26)
    samples = make_samples(lake, rows)
    got = samples.read(features={"item": ft.view(key_column="item", as_of="ts", columns=["rating", "emb"])})
    assert ours(got, "item", ["rating", "emb"]) == oracle(with_rating, rows, "item", "ts", ["rating", "emb"])
