"""Two-level heads: lookups by `before`, `max_len` and windows at chunk and head-page edges, against pandas.

Histories long enough for a two-level head (more than HEAD_FANOUT chunks) sit
next to empty users, one-event users, a user with exactly one full chunk and
users exactly at and one past the single-level limit. Times are integers so
that `before` and window bounds can land exactly on event times, on the first
event of a chunk and on the first chunk of a head page. The oracle
(:func:`test_sequences.oracle`, pandas) is the definition: events with time <
before (and >= before - window), ordered by (time, event id), the last N.

The incremental build and the random-rows test also run on REST + S3: the events
are read from the bucket and the store is built into the lake's local cache_dir.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from backends import both_backends

from featurelake.sequences import heads as heads_module
from featurelake.sequences.store import HEAD_FANOUT
from test_sequences import events_with_ties, make_events, oracle, random_rows

C = 4  # events per chunk: a head page covers HEAD_FANOUT * C events

SCHEMA = pa.schema([("user", pa.int64()), ("t", pa.int64()), ("v", pa.int32())])


def _histories() -> dict[int, np.ndarray]:
    """user -> sorted event times (user 0 has none; it is only looked up)."""
    page = HEAD_FANOUT * C
    return {
        1: np.array([50]),                                        # one event, one chunk
        2: np.arange(C) * 10,                                     # exactly one full chunk
        3: np.arange(page) * 10,                                  # HEAD_FANOUT chunks: single-level, full
        4: np.arange(page + 1) * 10,                              # one chunk more: two-level
        5: np.arange(3 * page + 7) // 3,                          # ties across chunk and page edges
        6: np.arange(5 * page + 2) * 7 + 1000,                    # several pages, distinct times
    }


def _table(lake, hist: dict[int, np.ndarray]):
    st = lake.create_sequence_table("ml.long", SCHEMA, key="user", time="t")
    users = np.concatenate([np.full(len(t), u) for u, t in hist.items()])
    times = np.concatenate(list(hist.values()))
    rng = np.random.default_rng(3)
    order = rng.permutation(len(users))  # arrival order is not time order
    st.append(pa.table({"user": users[order], "t": times[order], "v": np.arange(len(users), dtype=np.int32)[order]},
                       schema=SCHEMA))
    return st


def _edge_queries(hist: dict[int, np.ndarray], rng) -> tuple[list, list]:
    """(key, before) rows: every chunk's first time, +-1, page edges, before the first and after the last event."""
    keys, befores = [], []
    page = HEAD_FANOUT * C
    for u, t in hist.items():
        firsts = t[::C]
        cands = set(firsts.tolist()) | set((firsts + 1).tolist()) | set((firsts - 1).tolist())
        cands |= set(t[::page].tolist()) | {int(t[0]) - 1, int(t[-1]), int(t[-1]) + 1, int(t[-1]) + 10_000}
        cands |= set(rng.choice(t, min(len(t), 20)).tolist())
        if len(cands) > 120:
            keep = set(t[::page].tolist()) | set((t[::page] + 1).tolist()) | {int(t[0]) - 1, int(t[-1]), int(t[-1]) + 1}
            cands = keep | set(rng.choice(sorted(cands - keep), 120 - len(keep), replace=False).tolist())
        for b in sorted(cands):
            keys.append(u)
            befores.append(int(b))
    keys += [0, 0, 999, None]  # empty and unknown users, a null key
    befores += [5, None, 100, 100]
    return keys, befores


@pytest.mark.parametrize("matrix", [True, False])
def test_two_level_lookup_edges_match_oracle(lake, monkeypatch, matrix):
    if not matrix:  # large batches search the top levels run by run instead of as one padded matrix
        monkeypatch.setattr(heads_module, "MATRIX_CELLS", 0)
    hist = _histories()
    st = _table(lake, hist)
    info = st.build(chunk_events=C)
    assert info.chunks == sum(-(-len(t) // C) for t in hist.values())
    stored = st.read()
    rng = np.random.default_rng(11)
    keys, befores = _edge_queries(hist, rng)
    page = HEAD_FANOUT * C
    lens = [None, 0, 1, C - 1, C, C + 1, 2 * C, page, page + 1]
    for max_len in lens:
        got = st.lookup(keys, before=befores, columns=["t", "v"], max_len=max_len)
        assert got.to_pylist() == oracle(stored, keys, befores, ["t", "v"], max_len, key="user", time="t"), max_len
    # windows: empty, one unit, straddling chunks and pages, exactly a chunk's and a page's time span
    for window, max_len in [(0, None), (1, None), (35, None), (7 * C, None), (7 * page, 5), (7 * page + 1, None),
                            (10**9, C), (3 * C - 1, 2)]:
        got = st.lookup(keys, before=befores, columns=["v", "t"], max_len=max_len, window=window)
        assert got.to_pylist() == oracle(stored, keys, befores, ["v", "t"], max_len, window, key="user", time="t"), (
            window, max_len)
    # no bound: the latest events, single- and two-level users alike
    got = st.lookup(list(hist) + [0], columns=["t"], max_len=C + 3)
    assert got.to_pylist() == oracle(stored, list(hist) + [0], [10**12] * (len(hist) + 1), ["t"], C + 3,
                                     key="user", time="t")


def test_two_level_head_reads_stay_small(lake):
    """A lookup of a long history reads the short top level and one page, not every chunk's first time."""
    hist = {7: np.arange(40 * HEAD_FANOUT * C) * 3, 8: np.arange(C * 3) * 3}
    st = _table(lake, hist)
    st.build(chunk_events=C)
    n_chunks = 40 * HEAD_FANOUT
    t = hist[7]
    befores = [int(t[len(t) // 2]), int(t[-1]) + 1, int(t[HEAD_FANOUT * C])]
    for b in befores:
        got = st.lookup([7], before=[b], columns=["t"], max_len=2 * C)
        assert got.to_pylist() == [[{"t": int(x)} for x in t[t < b][-2 * C:]]]
        head = st.last_lookup_stats["head_bytes"]
        assert head <= (2 + n_chunks // HEAD_FANOUT + HEAD_FANOUT) * 8 < n_chunks * 8
        assert st.last_lookup_stats["chunk_values"] <= 3 * 1  # one group: at most three chunks for 2*C events
    # a window reaching into an earlier page fetches that page too, in the same round
    b = int(t[5 * HEAD_FANOUT * C + 3])
    got = st.lookup([7, 7], before=[b, b], columns=["t"], window=3 * HEAD_FANOUT * C + 2)
    want = [{"t": int(x)} for x in t[(t < b) & (t >= b - 3 * HEAD_FANOUT * C - 2)]]
    assert got.to_pylist() == [want, want]
    assert st.last_lookup_stats["head_bytes"] <= (2 + n_chunks // HEAD_FANOUT + 2 * HEAD_FANOUT) * 8


@both_backends
def test_incremental_build_over_two_level_heads(lake):
    """Appends into and after long histories (and a user growing past the single-level limit) extend the pages."""
    page = HEAD_FANOUT * C
    hist = {1: np.arange(page - 2) * 10, 2: np.arange(3 * page + 5) * 10, 3: np.arange(5)}
    st = _table(lake, hist)
    b1 = st.build(chunk_events=C)
    more = {
        1: np.arange(10) * 10 + 5,                       # user 1 grows past HEAD_FANOUT chunks (late arrivals)
        2: np.concatenate([np.arange(4) * 10 + 2 * page * 10 + 3, np.arange(30) * 10 + 3 * page * 10 + 100]),
        9: np.arange(page + 3) * 2,                      # a new user with a two-level head
    }
    users = np.concatenate([np.full(len(t), u) for u, t in more.items()])
    st.append(pa.table({"user": users, "t": np.concatenate(list(more.values())),
                        "v": np.arange(len(users), dtype=np.int32) + 10**6}, schema=SCHEMA))
    b2 = st.build()
    assert b2.incremental and b2.base_build == b1.build_id
    stored = st.read()
    full = {u: np.sort(np.concatenate([hist.get(u, []), more.get(u, [])])).astype(np.int64) for u in (1, 2, 3, 9)}
    keys, befores = _edge_queries(full, np.random.default_rng(2))
    for max_len, window in [(None, None), (C + 1, None), (3, 40), (None, 7 * page)]:
        got = st.lookup(keys, before=befores, columns=["t", "v"], max_len=max_len, window=window)
        assert got.to_pylist() == oracle(stored, keys, befores, ["t", "v"], max_len, window, key="user", time="t")
    rebuilt = st.build(incremental=False, force=True)
    assert rebuilt.chunks == b2.chunks and rebuilt.events == b2.events
    a = st.lookup(keys, before=befores, columns=["t", "v"], max_len=9, build=b2.build_id)
    b = st.lookup(keys, before=befores, columns=["t", "v"], max_len=9, build=rebuilt.build_id)
    assert a.to_pylist() == b.to_pylist()


@pytest.mark.parametrize(
    "backend, threads",
    [("local", 1), ("local", 4), pytest.param("s3", 4, marks=pytest.mark.s3)],
    ids=["local-1", "local-4", "s3-4"],
    indirect=["backend"],
)
def test_random_rows_with_timestamp_times_and_long_users(lake, threads):
    """Random (user, time) rows over users with short and two-level histories, timestamps with ties."""
    st = make_events(lake, "ml.mixed")
    st.append(pa.concat_tables([events_with_ties(20, 40, seed=31),
                                events_with_ties(3, 2000, seed=32, first_user=20, minutes=900)]))
    st.build(chunk_events=C)
    stored = st.read()
    keys, befores = random_rows(np.random.default_rng(8), 300, 23, hi_min=950)
    import datetime as dt

    for max_len, window in [(None, None), (17, None), (None, dt.timedelta(minutes=40)), (5, dt.timedelta(hours=5))]:
        got = st.lookup(keys, before=befores, columns=["ts", "item_id", "tags"], max_len=max_len, window=window,
                        threads=threads)
        assert got.to_pylist() == oracle(stored, keys, befores, ["ts", "item_id", "tags"], max_len, window)


def test_string_keys_with_two_level_heads(lake):
    schema = pa.schema([("user", pa.string()), ("t", pa.int64()), ("v", pa.float64())])
    st = lake.create_sequence_table("ml.strlong", schema, key="user", time="t")
    rng = np.random.default_rng(6)
    n = 2 * (HEAD_FANOUT * C + 50)
    users = rng.choice(["ann", "é", "bob-with-a-long-name"], n).tolist()
    st.append(pa.table({"user": users, "t": rng.integers(0, n // 3, n), "v": rng.random(n)}, schema=schema))
    st.build(chunk_events=C)
    stored = st.read()
    keys = ["ann", "é", "nobody", "bob-with-a-long-name", None] * 12
    befores = rng.integers(-1, n // 3 + 2, len(keys)).tolist()
    for max_len, window in [(None, None), (C, None), (None, 25), (2 * C + 1, 200)]:
        got = st.lookup(keys, before=befores, columns=["t", "v"], max_len=max_len, window=window)
        assert got.to_pylist() == oracle(stored, keys, befores, ["t", "v"], max_len, window, key="user", time="t")


# ------------------------------------------------- decode and assembly paths
KINDS = pa.schema([("user", pa.int64()), ("t", pa.int64()), ("v", pa.int32()), ("kind", pa.string()),
                   ("w", pa.float64())])


def _kinds_table(lake, hist: dict[int, np.ndarray], nulls: bool, words=("view", "click", "", "purchase-é")):
    """Fixed-codec events (int, dictionary string of ``words``, float), with or without null values."""
    st = lake.create_sequence_table("ml.kinds", KINDS, key="user", time="t")
    users = np.concatenate([np.full(len(t), u) for u, t in hist.items()])
    times = np.concatenate(list(hist.values()))
    n = len(users)
    rng = np.random.default_rng(5)
    v = pa.array(rng.integers(-(1 << 30), 1 << 30, n).astype(np.int32), mask=(rng.random(n) < 0.1) if nulls else None)
    kind = pa.array(rng.choice(list(words), n), mask=(rng.random(n) < 0.1) if nulls else None)
    order = rng.permutation(n)
    st.append(pa.table({"user": users[order], "t": times[order], "v": v.take(pa.array(order)),
                        "kind": kind.take(pa.array(order)), "w": rng.random(n)[order]}, schema=KINDS))
    return st


@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("words", [("view", "click", "", "purchase-é"), ("view", "click", "", "buy-é")])
def test_parallel_assembly_and_validity_match_oracle(lake, monkeypatch, nulls, words):
    """Row ranges gathered side by side (dictionary strings decoded per range and concatenated; strings of up to
    8 bytes and longer ones), validity gathered only when a fetched event is null, in the list and list-view
    layouts, at chunk edges."""
    from featurelake.sequences import assemble as assemble_module
    from featurelake.sequences.listview import as_list, lookup_view

    monkeypatch.setattr(assemble_module, "PARALLEL_EVENTS", 0)  # every lookup takes the side-by-side path
    hist = {1: np.array([50]), 2: np.arange(C) * 10, 3: np.arange(7 * C + 1) * 10, 4: np.arange(3 * C + 2) // 3,
            5: np.arange(40 * C + 3) * 7 + 1000}
    st = _kinds_table(lake, hist, nulls, words)
    info = st.build(chunk_events=C)
    assert [c["kind"] for c in info.group_codecs] == ["fixed"] * len(info.group_codecs)
    assert any("kind" in c.get("dictionaries", {}) for c in info.group_codecs)
    stored = st.read()
    keys, befores = _edge_queries(hist, np.random.default_rng(12))
    store = st.open_store()
    # with other columns, strings of up to 8 bytes are written whole by one task beside their pieces; alone, in pieces
    for cols in (["v", "kind", "w", "t"], ["kind"], ["kind", "v"]):
        for threads in (1, 4):
            for max_len in (None, 0, 1, C, 2 * C + 1, 30):
                want = oracle(stored, keys, befores, cols, max_len, key="user", time="t")
                got = st.lookup(keys, before=befores, columns=cols, max_len=max_len, threads=threads)
                assert got.to_pylist() == want, (cols, threads, max_len)
                view, _ = lookup_view(store, pa.array(keys, pa.int64()), pa.array(befores, pa.int64()), cols, max_len,
                                      None, threads, 512)
                assert as_list(view).to_pylist() == want, (cols, threads, max_len)
    # only empty histories: unknown users, a null key, before the first event
    got = st.lookup([0, None, 1, 2], before=[100, 100, 50, 0], columns=cols, threads=4)
    assert got.to_pylist() == [[], [], [], []]


def test_ranges_and_bisect_match_numpy():
    from featurelake.sequences.gather import ranges as _ranges
    from featurelake.sequences.search import bisect_left

    rng = np.random.default_rng(4)
    for _ in range(50):
        n = int(rng.integers(0, 30))
        starts = rng.integers(0, 1000, n)
        lengths = rng.integers(0, 5, n) * rng.integers(0, 2, n)  # many empty
        want = np.concatenate([np.arange(s, s + k) for s, k in zip(starts, lengths)] + [np.zeros(0, np.int64)])
        assert np.array_equal(_ranges(starts, lengths, int(lengths.sum())), want)
        values = np.sort(rng.integers(0, 50, 200))
        lo = rng.integers(0, 200, n)
        hi = np.minimum(200, lo + rng.integers(0, 40, n))
        q = rng.integers(-5, 55, n)
        want = [a + np.searchsorted(values[a:b], x, side="left") for a, b, x in zip(lo, hi, q)]
        assert bisect_left(values, lo, hi, q).tolist() == want
