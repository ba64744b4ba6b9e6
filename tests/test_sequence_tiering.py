"""Tiered sequence builds: older chunks as cold segments on the lake's storage, read through a local cache.

Oracles: every lookup of a tiered build is compared with the pandas oracle of
tests/test_sequences.py and with the same lookup of an untiered build of the
same snapshot (identical values, only where the bytes live differs); cold
segments are listed with the backend's own client (tests/backends.py), and
remote reads counted by the SeaweedFS server's own request counters.
"""
from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from backends import both_backends
from featurelake.errors import CorruptFileError, FeatureLakeError
from test_sequences import T0, events_with_ties, make_events, oracle, random_rows

NOW = dt.timedelta(0)
ALL = ["ts", "item_id", "event_type", "dwell", "tags"]


def _cold_files(backend) -> set[str]:
    return {f for f in backend.files(".parquet") if "/sequences-cold/" in f}


def _names(backend, info) -> set[str]:
    return {backend.name_of(s["path"]) for s in info.cold_segments}


@both_backends
def test_tiered_lookups_match_the_oracle_and_the_untiered_build(backend):
    lake = backend.lake
    st = make_events(lake)
    st.append(events_with_ties(25, 160, seed=11))
    hot = st.build(chunk_events=8, column_groups=[["item_id", "event_type"], ["dwell", "tags"]])
    cold = st.build(tier_after=2)              # same layout; each user's newest 2 chunks stay local
    assert hot.tier_after == 0 and not hot.cold_segments
    assert cold.tier_after == 2 and cold.cold_segments and cold.cold_bytes > 0
    assert cold.store_bytes < hot.store_bytes / 2   # most chunks left the local store
    assert _names(backend, cold) <= _cold_files(backend)
    seg = pq.read_table(pa.BufferReader(backend.read_bytes(cold.cold_segments[0]["path"])))
    assert seg.num_rows == 1 and seg.column_names == ["values"]   # a real Parquet file (the store's policy)
    if backend.name == "s3":
        assert all(s["path"].startswith("s3://") for s in cold.cold_segments)
    stored = st.read()
    keys, befores = random_rows(np.random.default_rng(3), 250, 25)
    keys[0] = None
    cases = [
        (None, None, None),                          # whole histories: hot and cold chunks
        (["ts", "item_id"], 5, None),                # mostly the hot tail
        (["tags", "dwell"], 30, None),               # max_len crossing the tier boundary
        (["event_type"], 400, dt.timedelta(hours=6)),
        (["ts", "tags"], None, dt.timedelta(minutes=90)),
    ]
    for columns, max_len, window in cases:
        cols = columns or ALL
        want = oracle(stored, keys, befores, cols, max_len, window)
        got = st.lookup(keys, before=befores, columns=columns, max_len=max_len, window=window, build=cold.build_id)
        assert got.to_pylist() == want, (columns, max_len, window)
        assert st.lookup(keys, before=befores, columns=columns, max_len=max_len, window=window,
                         build=hot.build_id).to_pylist() == want
    # windows entirely in the cold tier: early bounds, before any user's newest chunks
    early = [T0 + dt.timedelta(minutes=int(m)) for m in np.random.default_rng(4).integers(100, 600, len(keys))]
    for max_len, window in [(None, dt.timedelta(minutes=200)), (3, None), (50, dt.timedelta(hours=2))]:
        got = st.lookup(keys, before=early, columns=ALL, max_len=max_len, window=window, build=cold.build_id)
        assert got.to_pylist() == oracle(stored, keys, early, ALL, max_len, window)


@both_backends
def test_incremental_build_references_the_cold_segments_and_serves_new_events(backend):
    lake = backend.lake
    st = make_events(lake)
    st.append(events_with_ties(20, 120, seed=5))
    b1 = st.build(chunk_events=8, tier_after=1)
    st.append(events_with_ties(20, 30, seed=6, start_min=2100, minutes=300))
    st.append(events_with_ties(5, 30, seed=7, start_min=1000, minutes=300))   # late events inside cold ranges
    b2 = st.build()
    assert b2.incremental and b2.tier_after == 1
    assert b2.cold_segments == b1.cold_segments   # the new layer is hot; the old segments are reused
    stored = st.read()
    keys, befores = random_rows(np.random.default_rng(8), 200, 20, hi_min=2500)
    for max_len in (None, 4, 40):
        got = st.lookup(keys, before=befores, columns=ALL, max_len=max_len)
        assert got.to_pylist() == oracle(stored, keys, befores, ALL, max_len)
    b3 = st.build(tier_after=3)          # another tiering: a full build with segments of its own
    assert not b3.incremental and b3.tier_after == 3 and not (_names(backend, b3) & _names(backend, b2))
    assert st.lookup(keys, before=befores, columns=ALL, max_len=40).to_pylist() == oracle(stored, keys, befores, ALL, 40)


@pytest.mark.parametrize("backend", [pytest.param("s3", marks=pytest.mark.s3)], indirect=True)
def test_second_lookup_reads_nothing_remote(seaweed, backend):
    st = make_events(backend.lake)
    st.append(events_with_ties(20, 200, seed=2))
    info = st.build(chunk_events=8, tier_after=1)
    stored = st.read()
    keys, befores = random_rows(np.random.default_rng(9), 100, 20)
    store = st.open_store()
    cache = store.reader.cache
    with seaweed.counting() as first:
        got = st.lookup(keys, before=befores, columns=ALL, max_len=60)
    assert got.to_pylist() == oracle(stored, keys, befores, ALL, 60)
    assert first["GET_RANGE"] + first["GET"] >= 1 and cache.fetches >= 1
    fetched = cache.fetches
    with seaweed.counting() as second:
        again = st.lookup(keys, before=befores, columns=ALL, max_len=60)
    assert again.to_pylist() == got.to_pylist()
    assert second["GET"] + second["GET_RANGE"] == 0 and cache.fetches == fetched
    # a fresh process would find the blocks on the local disk cache: drop the memory layer only
    cache.drop_memory()
    with seaweed.counting() as third:
        assert st.lookup(keys, before=befores, columns=ALL, max_len=60).to_pylist() == got.to_pylist()
    assert third["GET"] + third["GET_RANGE"] == 0 and cache.fetches == fetched
    assert any((Path(info.path).parent / ".cold-cache").rglob("0*"))


@both_backends
def test_gc_keeps_referenced_cold_segments_and_deletes_dead_ones(backend):
    lake = backend.lake
    st = make_events(lake)
    st.append(events_with_ties(15, 100, seed=1))
    b0 = st.build(chunk_events=8, tier_after=1)                # S0: expires -> dead, its segments too
    st.append(events_with_ties(15, 100, seed=2, start_min=2000, minutes=500))
    b1 = st.build(incremental=False)                           # S1: a full tiered build, live
    st.append(events_with_ties(15, 20, seed=3, start_min=2600, minutes=100))
    b2 = st.build()                                            # S2: incremental on b1, reads b1's segments
    assert b2.incremental and b2.cold_segments == b1.cold_segments
    before = _cold_files(backend)
    assert _names(backend, b0) | _names(backend, b1) <= before
    st.expire_snapshots(dt.datetime.now(dt.timezone.utc), retain_last=1)
    report = lake.collect_garbage(older_than=NOW)
    assert set(report.builds[st.name]) == {b0.build_id, b1.build_id}
    after = _cold_files(backend)
    assert after == _names(backend, b2)                        # b1 is gone, its segments stay: b2 reads them
    assert not (_names(backend, b0) & after)
    stored = st.read()
    keys, befores = random_rows(np.random.default_rng(1), 150, 15, hi_min=2800)
    assert st.lookup(keys, before=befores, columns=ALL, max_len=50).to_pylist() == oracle(
        stored, keys, befores, ALL, 50)
    # once no build reads them, the segments go too
    st.append(events_with_ties(15, 20, seed=4, start_min=2800, minutes=100))
    b3 = st.build(incremental=False, tier_after=0)
    assert not b3.cold_segments
    st.expire_snapshots(dt.datetime.now(dt.timezone.utc), retain_last=1)
    lake.collect_garbage(older_than=NOW)
    assert _cold_files(backend) == set()


@both_backends
def test_missing_or_damaged_cold_segment_is_a_clear_error(backend):
    lake = backend.lake
    st = make_events(lake)
    st.append(events_with_ties(10, 120, seed=4))
    info = st.build(chunk_events=8, tier_after=1)
    keys = list(range(10))
    st.lookup(keys, columns=["ts"], max_len=2)   # hot only: fine
    seg = info.cold_segments[0]["path"]
    data = backend.read_bytes(seg)
    base = info.cold_segments[0]["base"]
    cache = Path(info.path).parent / ".cold-cache"

    def forget() -> None:
        from featurelake.sequences.tiering import _CACHES

        shutil.rmtree(cache, ignore_errors=True)
        for c in _CACHES.values():
            c.clear()

    forget()
    damaged = bytearray(data)
    damaged[base + 10 : base + 20] = bytes(10)   # inside the first zstd frame
    backend.overwrite(seg, bytes(damaged))
    with pytest.raises(CorruptFileError, match="cold segment .* is damaged"):
        st.lookup(keys, columns=ALL)
    forget()
    backend.remove(seg)
    with pytest.raises(CorruptFileError, match="cold segment .* (missing|cannot be read|shorter)"):
        st.lookup(keys, columns=ALL)


def test_tier_after_must_be_a_count(lake):
    st = make_events(lake)
    st.append(events_with_ties(5, 20, seed=1))
    for bad in (-1, 1.5, "2", True):
        with pytest.raises(FeatureLakeError, match="tier_after"):
            st.build(tier_after=bad)
    assert st.builds() == []


def test_string_keys_and_ipc_groups_tier_too(lake):
    schema = pa.schema([("user", pa.string()), ("t", pa.int64()), ("event_id", pa.string()), ("v", pa.float64()),
                        ("tags", pa.list_(pa.int32()))])
    st = lake.create_sequence_table("ml.strs", schema, key="user", time="t")
    rng = np.random.default_rng(7)
    n = 1500
    users = rng.choice(["ann", "bob", "a", "ab", "é", "z" * 30, "\x01\x01\x01\x01\x01\x01x"], n).tolist()
    data = pa.table({"user": users, "t": rng.integers(0, 500, n), "event_id": [f"e{i:05d}" for i in range(n)],
                     "v": rng.random(n), "tags": [[int(x)] * int(x % 3) for x in rng.integers(0, 9, n)]}, schema=schema)
    st.append(data)
    info = st.build(chunk_events=5, codecs="ipc", tier_after=2)
    assert info.cold_segments and info.to_dict()["group_codecs"] == ["ipc"]
    keys = ["ann", "a", "zz", "é", "ab", None, "bob", "\x01\x01\x01\x01\x01\x01x"] * 6
    befores = rng.integers(-1, 520, len(keys)).tolist()
    cols = ["t", "v", "event_id", "tags"]
    for max_len, window in [(None, None), (4, None), (30, 100), (None, 40)]:
        got = st.lookup(keys, before=befores, columns=cols, max_len=max_len, window=window)
        assert got.to_pylist() == oracle(st.read(), keys, befores, cols, max_len, window, key="user", time="t")
