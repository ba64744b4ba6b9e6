"""The searches under sequence lookups and the history cache, against numpy and pandas oracles.

* :class:`featurelake.sequences.timegrid.TimeGrid` against ``np.searchsorted``
  over each run: empty runs, one event, equal times, bursts denser than a cell
  (the binary-search fallback), queries before the first and after the last
  event, at event times, negative times, runs appended over several calls, and a
  frozen view unchanged by later appends.
* ``search.chunk_pairs`` (the distinct chunks a batch's rows need) against a Python
  set of every (user, chunk) named, on the dense line and on the sort fallback.
* ``search.count_below`` (the cut inside a chunk) against a per-query count,
  with junk in the padding slots and chunk sizes that are not whole blocks.
* the history cache's join (``layout="list_view", cache_bytes=...``) against the
  pandas oracle of ``test_sequences``: dense int keys (segment table), sparse int
  keys and string keys (sorted search), bursts of equal times, one-event users,
  users without history, null keys and times, windows and ``max_len``, several
  epochs, and a cache reset between batches.
* the join pipeline running cheap joins in the consumer's thread: same batches, in order.
"""
from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from featurelake.sequences import as_list, historycache, listview
from featurelake.sequences.join import pipelined
from featurelake.sequences.search import chunk_pairs as _pairs, count_below as _count_below
from featurelake.sequences.timegrid import TimeGrid
from test_sequences import T0, oracle

US = 1_000_000


# ------------------------------------------------------------------ time grid
def _runs(rng, n_runs: int) -> list[np.ndarray]:
    """Sorted runs of varied shapes: empty, single, all-equal, bursts, spread, negative times."""
    runs = []
    for i in range(n_runs):
        kind = i % 6
        if kind == 0:
            runs.append(np.empty(0, np.int64))
        elif kind == 1:
            runs.append(np.array([int(rng.integers(-10**6, 10**6))], np.int64))
        elif kind == 2:
            runs.append(np.full(int(rng.integers(2, 40)), int(rng.integers(0, 10**9)), np.int64))
        elif kind == 3:  # bursts: many events at a few close times, far apart
            centers = np.sort(rng.integers(0, 10**12, 4))
            runs.append(np.sort(np.repeat(centers, rng.integers(1, 30, 4))))
        elif kind == 4:
            runs.append(np.sort(rng.integers(-10**9, 10**9, int(rng.integers(1, 300)))))
        else:
            runs.append(np.sort(rng.integers(0, 50, int(rng.integers(1, 200)))))  # many ties in a narrow range
    return runs


def _queries(rng, runs: list[np.ndarray], n: int) -> tuple[np.ndarray, np.ndarray]:
    run = rng.integers(0, len(runs), n)
    q = np.empty(n, np.int64)
    for i, r in enumerate(run):
        t = runs[r]
        pick = rng.integers(0, 4)
        if not len(t) or pick == 0:
            q[i] = rng.integers(-10**12, 10**12)
        elif pick == 1:
            q[i] = t[rng.integers(0, len(t))]           # exactly an event's time
        elif pick == 2:
            q[i] = t[rng.integers(0, len(t))] + rng.integers(-2, 3)
        else:
            q[i] = t[0] - 1 if rng.integers(0, 2) else t[-1] + 1
    return run, q


@pytest.mark.parametrize("steps", [None, 0, 1])
def test_time_grid_matches_searchsorted(steps):
    rng = np.random.default_rng(7)
    grid = TimeGrid()
    if steps is not None:
        grid.steps = steps
    runs: list[np.ndarray] = []
    arena: list[np.ndarray] = []
    bases: list[int] = []
    size = 0
    for part in range(4):  # appended in several calls, with padding slots between runs (as in the cache's arena)
        new = _runs(rng, 30 + part)
        for t in new:
            bases.append(size)
            pad = int(rng.integers(0, 3))
            arena.append(np.concatenate([t, np.full(pad, rng.integers(-10**15, 10**15), np.int64)]))
            size += len(t) + pad
        grid.append(np.concatenate(new) if new else np.empty(0, np.int64), np.array([len(t) for t in new]))
        runs += new
        frozen = grid.frozen()
        times = np.concatenate(arena)
        run, q = _queries(rng, runs, 2000)
        base = np.array(bases, np.int64)[run]
        got = frozen.search(run, base, q, times)
        want = np.array([bases[r] + np.searchsorted(runs[r], v, side="left") for r, v in zip(run, q)])
        assert np.array_equal(got, want), part
    # a view frozen before more appends answers the same afterwards
    before = grid.frozen()
    grid.append(np.sort(rng.integers(0, 10**6, 5000)), np.array([5000]))
    assert np.array_equal(before.search(run, base, q, times), want)


def test_time_grid_of_no_runs_and_runs_of_no_events():
    grid = TimeGrid()
    grid.append(np.empty(0, np.int64), np.empty(0, np.int64))
    grid.append(np.empty(0, np.int64), np.array([0, 0, 0]))
    times = np.empty(0, np.int64)
    got = grid.search(np.array([0, 1, 2]), np.array([0, 0, 0]), np.array([-5, 0, 10**18]), times)
    assert got.tolist() == [0, 0, 0]


def test_time_grid_at_the_ends_of_int64():
    """Runs spanning most of int64 and queries at its ends: the cells are offsets in uint64, nothing wraps."""
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    runs = [np.array([lo + 1, -(2**62), 0, 2**62, hi - 1], np.int64), np.array([lo, lo, lo + 3], np.int64),
            np.array([hi - 2, hi, hi], np.int64), np.array([-5], np.int64), np.empty(0, np.int64)]
    grid = TimeGrid()
    grid.append(np.concatenate(runs), np.array([len(t) for t in runs]))
    times = np.concatenate(runs)
    bases = np.cumsum([0] + [len(t) for t in runs])[:-1]
    qs = np.array([lo, lo + 1, lo + 2, -(2**62), -1, 0, 1, 2**62, hi - 2, hi - 1, hi, -5, -4], np.int64)
    run = np.repeat(np.arange(len(runs)), len(qs))
    q = np.tile(qs, len(runs))
    got = grid.search(run, bases[run], q, times)
    want = [bases[r] + np.searchsorted(runs[r], v, side="left") for r, v in zip(run, q)]
    assert got.tolist() == [int(w) for w in want]


# ------------------------------------------------------------- segment lookup
@pytest.mark.parametrize("dense", [True, False], ids=["segment-table", "bisect"])
def test_find_segments_matches_a_dict(dense):
    """The compiled key -> segment lookup of the history cache against a dict, keys at the ends of int64 included."""
    from featurelake.sequences.timegrid import kernels

    rng = np.random.default_rng(3)
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    if dense:  # a table over the highest keys: queries far below (lo) must not wrap into it
        low = hi - 9_999
        cached = np.unique(low + rng.integers(0, 10_000, 4_000))
    else:
        cached = np.unique(np.concatenate([rng.integers(-10**15, 10**15, 3_000), [lo, lo + 1, hi - 1, hi]]))
    cached = cached.astype(np.int64)
    segment = {int(k): int(s) for k, s in zip(cached, rng.permutation(len(cached)))}
    keys = np.sort(cached)
    ordinal = np.array([segment[int(k)] for k in keys], np.int64)
    if dense:
        table = np.full(10_000, -1, np.int64)
        table[keys - low] = ordinal
        high = hi
    else:
        low, high, table = 0, -1, np.empty(0, np.int64)
    extremes = np.array([lo, lo + 1, -1, 0, 1, hi - 10_000, hi - 9_999, hi - 1, hi], np.int64)
    kv = np.concatenate([rng.choice(cached, 2_000), rng.integers(-10**15, 10**15, 500), extremes]).astype(np.int64)
    seg = np.empty(len(kv), np.int64)
    misses = kernels().find_segments(kv, low, high, table, keys, ordinal, seg)
    want = [segment.get(int(k), -1) for k in kv]
    assert seg.tolist() == want and misses == sum(w < 0 for w in want)
    # every key cached: find_cut_rows cuts like cut_rows over the segments found; one not cached: -1, nothing cut
    hits = np.array([k for k, w in zip(kv, want) if w >= 0], np.int64)
    n_seg = len(cached)
    counts = rng.integers(0, 5, n_seg)
    starts = np.cumsum(counts) - counts
    times = np.sort(rng.integers(0, 100, int(counts.sum()))).astype(np.int64)  # so each segment's run is sorted
    grid = TimeGrid()
    grid.append(times, counts)
    before = rng.integers(-5, 105, len(hits)).astype(np.int64)
    rows = np.arange(len(hits))
    args = (grid.first, grid.shift, grid.cells, grid.off, grid.grid, grid.steps, times, before, True, 3, -1)
    want_off, want_size = np.empty(len(hits), np.int32), np.empty(len(hits), np.int32)
    want_seg = np.array([segment[int(k)] for k in hits], np.int64)
    want_events = kernels().cut_rows(want_seg, rows, starts, counts, *args, want_off, want_size)
    off, size, seg = np.empty(len(hits), np.int32), np.empty(len(hits), np.int32), np.empty(len(hits), np.int64)
    events = kernels().find_cut_rows(hits, low, high, table, keys, ordinal, seg, rows, starts, counts, *args, off, size)
    assert events == want_events and off.tolist() == want_off.tolist() and size.tolist() == want_size.tolist()
    for r, (o, z) in enumerate(zip(off, size)):  # and both are the last 3 events of the segment before the time
        s = want_seg[r]
        run = times[starts[s] : starts[s] + counts[s]]
        end = starts[s] + np.searchsorted(run, before[r], side="left")
        assert (o, o + z) == (max(starts[s], end - 3), end)
    missing = np.concatenate([hits[:5], kv[[w < 0 for w in want]][:1]])
    seg = np.empty(len(missing), np.int64)
    events = kernels().find_cut_rows(missing, low, high, table, keys, ordinal, seg, np.arange(len(missing)), starts,
                                     counts, *args[:7], before[: len(missing)], True, 3, -1, off, size)
    assert events == -1 and seg[-1] == -1 and (seg[:-1] >= 0).all()


# ------------------------------------------------------------------ pairs
@pytest.mark.parametrize("long", [False, True], ids=["dense-line", "sort-fallback"])
def test_pairs_are_the_distinct_chunks_rows_need(long):
    rng = np.random.default_rng(3)
    users = 60
    n_chunks = rng.integers(0, 10**6 if long else 12, users)
    rows = 500
    u = rng.integers(0, users, rows)
    u = u[n_chunks[u] > 0]
    first = np.array([rng.integers(0, n_chunks[x]) for x in u], np.int64)
    count = np.array([rng.integers(1, n_chunks[x] - f + 1) if not long else min(3, n_chunks[x] - f)
                      for x, f in zip(u, first)], np.int64)
    pair_user, pair_chunk, p_first = _pairs(u, first, count, n_chunks)
    want = sorted({(int(x), int(f) + j) for x, f, c in zip(u, first, count) for j in range(int(c))})
    assert list(zip(pair_user.tolist(), pair_chunk.tolist())) == want
    # each row's pairs are consecutive from its first one
    for x, f, c, p in zip(u, first, count, p_first):
        assert pair_user[p] == x and pair_chunk[p] == f
        assert pair_chunk[p + c - 1] == f + c - 1 and pair_user[p + c - 1] == x


def test_pairs_of_no_rows():
    pair_user, pair_chunk, p_first = _pairs(np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.int64),
                                            np.array([3, 0, 5]))
    assert len(pair_user) == len(pair_chunk) == len(p_first) == 0


# ------------------------------------------------------------------ count below
@pytest.mark.parametrize("c", [128, 32, 16, 7, 1])
def test_count_below_counts_events_under_the_bound(c):
    rng = np.random.default_rng(c)
    n_pairs = 300
    counts = rng.integers(1, c + 1, n_pairs)
    times = np.sort(rng.integers(0, 40, (n_pairs, c)), axis=1)   # many ties
    junk = np.arange(c)[None, :] >= counts[:, None]
    times[junk] = rng.integers(-10**9, 10**9, int(junk.sum()))    # padding slots hold anything
    pairs = rng.integers(0, n_pairs, 1000)
    bound = rng.integers(-2, 43, 1000)
    got = _count_below(times, counts, pairs, bound)
    want = [int((times[p, : counts[p]] < b).sum()) for p, b in zip(pairs, bound)]
    assert got.tolist() == want


# ------------------------------------------------------------------ the cache's join
def _events(key_of, users: int, seed: int) -> pa.Table:
    """Events with bursts of equal times, one-event users and users without events; ``key_of(i)`` names user i."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(users):
        kind = i % 5
        if kind == 0:
            continue                                                   # no history
        if kind == 1:
            ts = [int(rng.integers(0, 3000))]                          # one event
        elif kind == 2:
            ts = [int(rng.integers(0, 3000))] * int(rng.integers(2, 60))  # a burst at one time
        else:
            ts = sorted(rng.integers(0, 3000, int(rng.integers(1, 400))).tolist())
        rows += [(key_of(i), t) for t in ts]
    n = len(rows)
    item = rng.integers(0, 1000, n)
    return pa.table({
        "user_id": pa.array([r[0] for r in rows]),
        "ts": pa.array([np.datetime64(T0, "us") + np.timedelta64(r[1], "m") for r in rows], pa.timestamp("us")),
        "item_id": pa.array(item, pa.int64(), mask=rng.random(n) < 0.05),
        "event_type": pa.array(rng.choice(["view", "click", "cart"], n).tolist()),
        "dwell": pa.array(rng.random(n).astype(np.float32)),
    })


@pytest.mark.parametrize("keys,copy", [("dense", "block"), ("sparse", "block"), ("string", "block"), ("dense", "gather")])
def test_cached_join_matches_the_oracle(lake, keys, copy, monkeypatch):
    if copy == "gather":  # histories copied event by event into the arena, never as whole pools
        monkeypatch.setattr(historycache, "BLOCK_SLACK", -1e12)
    key_of = {"dense": lambda i: i, "sparse": lambda i: i * 1_000_003 - 5 * 10**8, "string": lambda i: f"u{i:04d}"}[keys]
    key_type = pa.string() if keys == "string" else pa.int64()
    schema = pa.schema([pa.field("user_id", key_type, nullable=False), pa.field("ts", pa.timestamp("us"), nullable=False),
                        pa.field("item_id", pa.int64()), pa.field("event_type", pa.string()), pa.field("dwell", pa.float32())])
    st = lake.create_sequence_table("ml.ev", schema, key="user_id", time="ts")
    st.append(_events(key_of, 40, seed=11).cast(schema))
    st.build(chunk_events=16)
    stored = st.read()
    rng = np.random.default_rng(5)
    n = 900
    users = rng.integers(0, 44, n)                                     # a few unknown users
    row_keys = [key_of(int(u)) for u in users]
    minutes = rng.integers(-20, 3050, n)
    befores = [T0 + dt.timedelta(minutes=int(m)) for m in minutes]
    row_keys[3] = None
    befores[4] = None
    rows = pa.table({"sample_id": pa.array(np.arange(n, dtype=np.int64)), "user_id": pa.array(row_keys, key_type),
                     "ts": pa.array(befores, pa.timestamp("us"))})
    samples = lake.create_table("ml.rows", rows.schema, primary_key="sample_id")
    samples.append(rows)
    cols = ["ts", "item_id", "event_type"]
    for max_len, window in [(None, None), (5, None), (20, dt.timedelta(minutes=400)), (0, None),
                            (None, dt.timedelta(0))]:
        kw = dict(key="user_id", time="ts", columns=cols, max_len=max_len, window=window, threads=2, batch_keys=8)
        cached = st.view(layout="list_view", cache_bytes=1 << 24, **kw)
        small = st.view(layout="list_view", cache_bytes=4_000, **kw)  # dropped and refilled between batches
        want = oracle(stored, row_keys, befores, cols, max_len, window)
        for epoch in range(2):
            for view in (cached, small):
                got = pa.Table.from_batches(list(samples.batches(batch_size=70, sequences={"hist": view})))
                assert got["sample_id"].to_pylist() == list(range(n))
                hist = got["hist"]
                for chunk in hist.chunks:
                    chunk.validate(full=True)
                assert as_list(hist).to_pylist() == want, (keys, max_len, window, epoch)
        assert cached.cache.resets == 0 and small.cache.resets > 0
        assert (cached.cache.direct is not None) == (keys == "dense")


def test_cached_cut_edges_match_the_oracle(lake):
    """Edges of a row's cut: an absent user, no event before the time, exactly ``max_len`` events before it, a window
    cutting inside a burst, a time equal to event times; a cache large enough and one reset on every batch."""
    schema = pa.schema([pa.field("user_id", pa.int64(), nullable=False), pa.field("ts", pa.timestamp("us"), nullable=False),
                        pa.field("item_id", pa.int64())])
    st = lake.create_sequence_table("ml.edges", schema, key="user_id", time="ts")
    minutes = {1: [10, 20, 30, 40, 50], 2: [100] * 9 + [101, 102], 3: [7]}
    events = [(u, m) for u, ms in minutes.items() for m in ms]
    st.append(pa.table({"user_id": pa.array([u for u, _ in events], pa.int64()),
                        "ts": pa.array([T0 + dt.timedelta(minutes=m) for _, m in events], pa.timestamp("us")),
                        "item_id": pa.array(np.arange(len(events), dtype=np.int64))}, schema=schema))
    st.build(chunk_events=4)
    stored = st.read()
    cases = [(99, 60), (1, 5), (1, 10), (1, 11), (1, 50), (1, 51), (1, 10**4), (2, 100), (2, 101), (2, 103),
             (3, 7), (3, 8), (1, 45), (2, 102)]
    keys = [k for k, _ in cases]
    befores = [T0 + dt.timedelta(minutes=m) for _, m in cases]
    for max_len, window in [(5, None), (4, None), (6, None), (None, dt.timedelta(minutes=20)),
                            (2, dt.timedelta(minutes=1)), (0, dt.timedelta(minutes=5)), (None, None)]:
        want = oracle(stored, keys, befores, ["ts", "item_id"], max_len, window)
        for cache_bytes in (1 << 20, 300):
            view = st.view(key="user_id", time="ts", columns=["ts", "item_id"], max_len=max_len, window=window,
                           layout="list_view", cache_bytes=cache_bytes)
            for part in (slice(0, 7), slice(7, None), slice(None)):  # two batches, then all rows in one
                got = view.join(pa.array(keys[part], pa.int64()), pa.array(befores[part], pa.timestamp("us")))
                got.validate(full=True)
                assert as_list(got).to_pylist() == want[part], (max_len, window, cache_bytes, part)
            if cache_bytes == 300:
                assert view.cache.resets > 0


def test_cheap_items_run_in_the_callers_thread_in_order():
    import threading

    main = threading.get_ident()
    ran_in = []

    def fn(i):
        ran_in.append(threading.get_ident())
        if i in (0, 5):  # slow items send the next ones to the workers
            import time

            time.sleep(0.01)
        return pa.table({"i": [i], "x": [0]})

    out = list(pipelined(iter(range(12)), fn, drop=["x"], prefetch=2, workers=2, inline_below_s=0.005))
    assert [t["i"][0].as_py() for t in out] == list(range(12))
    assert all(t.column_names == ["i"] for t in out)
    assert main in ran_in and any(r != main for r in ran_in)
    # known to be cheap before the first item (a view warm from the last epoch): no worker at all
    ran_in.clear()
    before = {t.name for t in threading.enumerate()}
    out = list(pipelined(iter([1, 2, 3]), fn, prefetch=2, workers=2, inline_below_s=0.005, first_cost_s=0.0,
                         name="t-cheap"))
    assert [t["i"][0].as_py() for t in out] == [1, 2, 3] and set(ran_in) == {main}
    assert not any(t.name.startswith("t-cheap") for t in threading.enumerate() if t.name not in before)


def test_one_slow_item_keeps_cheap_items_in_the_callers_thread():
    """A single slow call among cheap ones (a descheduled join) does not hand items to workers; two in a row do."""
    import threading
    import time

    main = threading.get_ident()

    def run(slow: set[int]) -> list[bool]:
        ran_in: dict[int, int] = {}

        def fn(i):
            ran_in[i] = threading.get_ident()
            if i in slow:
                time.sleep(0.01)
            return pa.table({"i": [i]})

        out = list(pipelined(iter(range(10)), fn, prefetch=2, workers=2, inline_below_s=0.005, first_cost_s=0.0))
        assert [t["i"][0].as_py() for t in out] == list(range(10))
        return [ran_in[i] == main for i in range(10)]

    assert all(run({3}))
    in_caller = run({3, 4})
    assert in_caller[:5] == [True] * 5 and not in_caller[5]  # after two slow calls the next goes to a worker


def test_a_warm_view_starts_its_next_epoch_inline(lake):
    st = lake.create_sequence_table("ml.ev", pa.schema([pa.field("user_id", pa.int64(), nullable=False),
                                                        pa.field("ts", pa.timestamp("us"), nullable=False),
                                                        pa.field("item_id", pa.int64())]), key="user_id", time="ts")
    n = 3000
    rng = np.random.default_rng(1)
    st.append(pa.table({"user_id": pa.array(rng.integers(0, 50, n)), "ts": pa.array(
        np.datetime64(T0, "us") + rng.integers(0, 10**9, n).astype("timedelta64[us]")), "item_id": pa.array(rng.integers(0, 9, n))}))
    st.build()
    rows = pa.table({"sample_id": pa.array(np.arange(200, dtype=np.int64)), "user_id": pa.array(rng.integers(0, 50, 200)),
                     "ts": pa.array(np.full(200, np.datetime64(T0, "us") + np.timedelta64(10**9, "us")))})
    samples = lake.create_table("ml.rows", rows.schema, primary_key="sample_id")
    samples.append(rows)
    view = st.view(key="user_id", time="ts", columns=["item_id"], max_len=5, layout="list_view", cache_bytes=1 << 20)
    assert view.last_join_s == float("inf")
    first = list(samples.batches(batch_size=50, sequences={"hist": view}))
    assert view.last_join_s < 1.0
    again = list(samples.batches(batch_size=50, sequences={"hist": view}))
    assert [as_list(b["hist"]).to_pylist() for b in again] == [as_list(b["hist"]).to_pylist() for b in first]



# ------------------------------------------------------------------ head cache
@pytest.mark.parametrize("layout", ["list", "list_view"])
def test_views_read_each_head_once_and_answer_as_the_store(lake, layout):
    """A view keeps the heads it read: the second epoch reads none; a tiny bound (cleared often) answers the same."""
    from featurelake.sequences.heads import HeadCache

    schema = pa.schema([pa.field("user_id", pa.int64(), nullable=False), pa.field("ts", pa.timestamp("us"), nullable=False),
                        pa.field("item_id", pa.int64()), pa.field("event_type", pa.string()), pa.field("dwell", pa.float32())])
    st = lake.create_sequence_table("ml.ev", schema, key="user_id", time="ts")
    st.append(_events(lambda i: i, 30, seed=2).cast(schema))
    st.build(chunk_events=4)  # users past 64 chunks have two-level heads: their pages are read as before
    stored = st.read()
    rng = np.random.default_rng(9)
    n = 400
    keys = rng.integers(0, 34, n).tolist()                              # users 30..33 have no head
    befores = [T0 + dt.timedelta(minutes=int(m)) for m in rng.integers(0, 3050, n)]
    rows = pa.table({"sample_id": pa.array(np.arange(n, dtype=np.int64)), "user_id": pa.array(keys, pa.int64()),
                     "ts": pa.array(befores, pa.timestamp("us"))})
    samples = lake.create_table("ml.rows", rows.schema, primary_key="sample_id")
    samples.append(rows)
    cols = ["ts", "item_id"]
    want = oracle(stored, keys, befores, cols, 9, dt.timedelta(minutes=700))
    view = st.view(key="user_id", time="ts", columns=cols, max_len=9, window=dt.timedelta(minutes=700), layout=layout,
                   threads=2, batch_keys=8)
    tiny = st.view(key="user_id", time="ts", columns=cols, max_len=9, window=dt.timedelta(minutes=700), layout=layout)
    tiny.store.head_cache = HeadCache(max_bytes=300)
    assert st.open_store().head_cache is None  # plain stores (store.lookup) read their heads every time
    heads = []
    for epoch in range(2):
        for v in (view, tiny):
            got = pa.Table.from_batches(list(samples.batches(batch_size=50, sequences={"hist": v})))
            assert as_list(got["hist"]).to_pylist() == want, (layout, epoch)
        heads.append(view.stats["head_bytes"])
    assert heads[0] > 0 and heads[1] == heads[0]  # the second epoch read no head
    assert tiny.stats["head_bytes"] > heads[0]     # cleared and read again


@pytest.mark.parametrize("entry", [1, 2, 3, 4])
def test_a_reset_by_another_worker_between_finding_and_reading_is_seen(lake, entry):
    """The other join worker drops and refills the arena at the ``entry``-th time this batch takes the cache's lock.

    The batch (cached users and one not cached) takes it to snapshot the arena
    (1), to find its users (2), to append what it fetched (3) and to read the
    arena (4): wherever the reset falls, its users are found again and the
    answer is the oracle's.
    """
    import threading

    schema = pa.schema([pa.field("user_id", pa.int64(), nullable=False), pa.field("ts", pa.timestamp("us"), nullable=False),
                        pa.field("item_id", pa.int64()), pa.field("event_type", pa.string()), pa.field("dwell", pa.float32())])
    st = lake.create_sequence_table("ml.ev", schema, key="user_id", time="ts")
    st.append(_events(lambda i: i, 40, seed=4).cast(schema))
    st.build(chunk_events=8)
    stored = st.read()
    view = st.view(key="user_id", time="ts", columns=["item_id"], max_len=6, layout="list_view", cache_bytes=1 << 24)
    cache = view.cache
    cached = pa.array(list(range(0, 20)), pa.int64())
    mine = pa.array(list(range(0, 20)) + [45], pa.int64())  # user 45 has no history: fetched, cached empty
    others = pa.array(list(range(20, 40)), pa.int64())
    when = pa.array([T0 + dt.timedelta(minutes=2000)] * 21, pa.timestamp("us"))
    view.join(cached, when[:20])  # all of this batch's users but one are cached now

    class ResetBetween:
        """The cache's lock; its second entry in a join first lets "another worker" reset and refill the arena."""

        def __init__(self):
            self.inner = threading.Lock()
            self.entries = 0

        def __enter__(self):
            self.entries += 1
            if self.entries == entry:
                cache._reset()
                cache._append(*_fetched(cache, others))
            return self.inner.__enter__()

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

    def _fetched(c, keys):
        n, src, pools = c._fetch(keys, 1, 64, listview._new_stats(len(keys)))
        return np.asarray(keys.to_numpy()), (n, src, pools)

    cache.lock = ResetBetween()
    got = view.join(mine, when)
    assert cache.resets == 1
    assert as_list(got).to_pylist() == oracle(stored, mine.to_pylist(), when.to_pylist(), ["item_id"], 6)
