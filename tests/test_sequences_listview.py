"""List-view joins (``layout="list_view"``) and the cross-batch history cache, against the list join and pandas.

The list layout and the pandas oracle (:func:`test_sequences.oracle`) are the
definition: a list view turned into a list (:func:`as_list`) must equal the
list join exactly (type and values), for projections over fixed-size, IPC
and mixed column groups, ``max_len`` (None, 0, short, longer than
histories), windows, ``before`` equal to event times (minute grid), null
and unknown keys, null times, users repeated in a batch and across batches.
"""
from __future__ import annotations

import datetime as dt
import io

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from backends import both_backends
from featurelake.errors import FeatureLakeError
from featurelake.sequences import as_list, lookup_view
from featurelake.sequences.arguments import as_array
from test_sequences import T0, events_with_ties, make_events, oracle, random_rows

BUILDS = [
    (7, "auto", [["item_id", "event_type"], ["dwell", "tags"]]),   # a fixed-size group and an IPC group
    (1, "auto", None),
    (5, "ipc", None),
]
CASES = [(None, None), (0, None), (3, None), (500, None), (4, dt.timedelta(minutes=90)), (None, dt.timedelta(0)),
         (None, dt.timedelta(minutes=1))]


def _rows(rng, n: int, users: int) -> tuple[list, list]:
    keys, befores = random_rows(rng, n, users)
    keys[0] = None           # a null key
    befores[1] = None        # a null time
    keys[2] = 10_000         # an unknown user
    return keys, befores


@pytest.mark.parametrize("chunk_events,codecs,groups", BUILDS)
def test_list_view_lookup_equals_list_and_oracle(lake, chunk_events, codecs, groups):
    st = make_events(lake)
    st.append(events_with_ties(30, 120, seed=chunk_events))
    st.build(chunk_events=chunk_events, codecs=codecs, column_groups=groups)
    stored = st.read()
    store = st.open_store()
    keys, befores = _rows(np.random.default_rng(chunk_events), 400, 30)
    k = as_array(pa.array(keys, pa.int64()), store.key_type)
    b = pa.array(befores, pa.timestamp("us"))
    for cols in (["item_id", "event_type"], ["ts", "dwell", "tags", "event_type"], ["tags"]):
        for max_len, window in CASES:
            ref = store.lookup(k, b, cols, max_len, window)
            got, stats = lookup_view(store, k, b, cols, max_len, window, 3, 16)
            got.validate(full=True)
            assert pa.types.is_list_view(got.type)
            assert as_list(got).equals(ref), (cols, max_len, window)
            assert stats["events"] == len(ref.values)
            assert ref.to_pylist() == oracle(stored, keys, befores, cols, max_len, window)


def _samples(lake, rng, n: int, users: int):
    keys, befores = random_rows(rng, n, users)
    keys[5] = None
    rows = pa.table({"sample_id": pa.array(np.arange(n, dtype=np.int64)), "user_id": pa.array(keys, pa.int64()),
                     "ts": pa.array(befores, pa.timestamp("us"))})
    samples = lake.create_table("ml.samples", rows.schema, primary_key="sample_id")
    samples.append(rows)
    return samples


@both_backends
def test_cached_list_view_join_across_batches(lake):
    """Users repeat within and across batches; the second epoch fetches nothing; every variant equals the list join."""
    st = make_events(lake)
    st.append(events_with_ties(25, 150, seed=5))
    st.build(chunk_events=8, column_groups=[["item_id", "event_type", "dwell"], ["tags"]])
    stored = st.read()
    samples = _samples(lake, np.random.default_rng(4), 600, 25)
    cols = ["ts", "item_id", "event_type", "dwell"]
    for max_len, window in [(10, None), (None, None), (6, dt.timedelta(hours=5))]:
        kw = dict(key="user_id", time="ts", columns=cols, max_len=max_len, window=window, threads=2, batch_keys=8)
        plain = st.view(**kw)
        flat = st.view(layout="list_view", **kw)
        cached = st.view(layout="list_view", cache_bytes=1 << 24, **kw)
        searched = st.view(layout="list_view", cache_bytes=1 << 24, **kw)
        searched.cache.grid.steps = 0  # no steps inside a time-grid cell: every row's cut is a binary search
        ref = list(samples.batches(batch_size=64, sequences={"hist": plain}))
        distinct = len({k for b in ref for k in b.column("user_id").to_pylist() if k is not None})
        for epoch in range(2):
            for view in (flat, cached, searched):
                got = list(samples.batches(batch_size=64, sequences={"hist": view}))
                assert len(got) == len(ref)
                for g, r in zip(got, ref):
                    assert g.column("hist").type == view.type
                    assert g.column("sample_id").equals(r.column("sample_id"))
                    assert as_list(g.column("hist")).equals(r.column("hist")), (max_len, window, epoch)
            # each user (known or not) fetched once: the second epoch is all hits
            assert cached.stats["cache_misses"] == distinct and cached.stats["cache_hits"] > epoch * 500
        table = pa.Table.from_batches(ref)
        expected = oracle(stored, table["user_id"].to_pylist(), table["ts"].to_pylist(), cols, max_len, window)
        assert table["hist"].to_pylist() == expected
        assert cached.cache.resets == 0


def test_small_cache_is_dropped_and_refilled(lake):
    st = make_events(lake)
    st.append(events_with_ties(40, 100, seed=8))
    st.build(chunk_events=4, column_groups=[["item_id", "event_type"], ["dwell", "tags"]])
    samples = _samples(lake, np.random.default_rng(8), 500, 40)
    kw = dict(key="user_id", time="ts", columns=["item_id", "event_type"], max_len=7)
    ref = samples.read(sequences={"hist": st.view(**kw)}, columns=["sample_id"]).sort_by("sample_id")
    view = st.view(layout="list_view", cache_bytes=6_000, **kw)  # room for a few users: resets on most batches
    for _ in range(2):
        got = pa.Table.from_batches(list(samples.batches(batch_size=40, columns=["sample_id"], sequences={"hist": view})))
        assert as_list(got["hist"]).equals(ref["hist"])
    assert view.cache.resets > 2
    # the join of read() concatenates list views: same values
    got = samples.read(sequences={"hist": view}, columns=["sample_id"]).sort_by("sample_id")
    assert as_list(got["hist"]).equals(ref["hist"])


def test_list_view_columns_work_with_pyarrow(lake):
    """Slicing, concatenation, pandas, IPC and as_list on slices and nulls of a joined list-view column."""
    st = make_events(lake)
    st.append(events_with_ties(10, 60, seed=3))
    st.build(chunk_events=8)
    samples = _samples(lake, np.random.default_rng(3), 120, 10)
    kw = dict(key="user_id", time="ts", columns=["ts", "item_id", "event_type"], max_len=5)
    ref = samples.read(sequences={"hist": st.view(**kw)}).sort_by("sample_id")
    view = st.view(layout="list_view", cache_bytes=1 << 20, **kw)
    got = pa.Table.from_batches(list(samples.batches(batch_size=32, sequences={"hist": view}))).sort_by("sample_id")
    col = got["hist"]
    assert col.to_pylist() == ref["hist"].to_pylist()
    assert as_list(col.slice(7, 50)).to_pylist() == ref["hist"].slice(7, 50).to_pylist()
    assert [list(x) for x in got.to_pandas()["hist"]] == [list(x) for x in ref.to_pandas()["hist"]]
    sink = io.BytesIO()
    with ipc.new_stream(sink, got.schema) as w:
        w.write_table(got)
    back = ipc.open_stream(sink.getvalue()).read_all()
    assert back["hist"].to_pylist() == ref["hist"].to_pylist()
    one = col.combine_chunks()
    nulled = pa.ListViewArray.from_arrays(one.offsets, one.sizes, one.values, mask=pa.array(np.arange(len(one)) % 3 == 0))
    assert as_list(nulled).to_pylist() == [None if i % 3 == 0 else v for i, v in enumerate(ref["hist"].to_pylist())]


def test_layout_errors(lake):
    st = make_events(lake)
    st.append(events_with_ties(5, 20, seed=2))
    st.build(chunk_events=4, codecs="ipc")
    with pytest.raises(FeatureLakeError, match="layout"):
        st.view(key="user_id", time="ts", layout="lists")
    with pytest.raises(FeatureLakeError, match="list_view"):
        st.view(key="user_id", time="ts", cache_bytes=1 << 20)
    with pytest.raises(FeatureLakeError, match="fixed-size"):
        st.view(key="user_id", time="ts", columns=["item_id"], layout="list_view", cache_bytes=1 << 20)
    with pytest.raises(FeatureLakeError, match="cache_bytes"):
        st.build(chunk_events=4, force=True)
        st.view(key="user_id", time="ts", columns=["item_id"], layout="list_view", cache_bytes=0)
    view = st.view(key="user_id", time="ts", columns=["item_id"], layout="list_view", window=dt.timedelta(hours=1))
    assert view.join(pa.array([1, 2]), pa.array([T0, None], pa.timestamp("us"))).to_pylist()[1] == []
