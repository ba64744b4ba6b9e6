"""The framework-free training reader: sharding, shuffle, batches, sampling and resume against oracles.

The oracle is ``t.read``: the set (and values) of the rows of the snapshot.
Tables are small (a few thousand rows in several files with several row groups
each, one update layer) so the whole file runs in a few seconds.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from backends import both_backends
from featurelake import Lake
from featurelake.errors import FeatureLakeError, SchemaMismatchError
from featurelake.training import TrainingReader, shuffle_quality

FILES = 7
ROW_GROUP = 300  # rows per Parquet row group: each file has several


@pytest.fixture(scope="module")
def samples(tmp_path_factory):
    """Read-only for the tests that share it (module scope keeps the file fast)."""
    return make_samples(Lake(tmp_path_factory.mktemp("training") / "lake"))


def make_samples(lake):
    """7 files of 700..1300 rows in 300-row groups; ``x`` backfilled on 10% of rows (an update layer)."""
    schema = pa.schema([
        pa.field("k", pa.int64(), nullable=False),
        pa.field("x", pa.float64()),
        pa.field("label", pa.int32()),
        pa.field("tags", pa.list_(pa.int32())),
    ])
    t = lake.create_table("ml.samples", schema, primary_key="k",
                          properties={"write.parquet.row-group-limit": str(ROW_GROUP)})
    rng = np.random.default_rng(0)
    for i in range(FILES):
        n = 700 + 100 * i
        k = np.arange(i * 100_000, i * 100_000 + n, dtype=np.int64)
        lens = rng.integers(0, 4, n)
        tags = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)),
                                        pa.array(rng.integers(0, 100, int(lens.sum()), dtype=np.int32)))
        t.append(pa.table({"k": k, "x": k.astype(np.float64), "label": (rng.random(n) < 0.2).astype(np.int32),
                           "tags": tags}, schema=schema))
    all_k = t.read(columns=["k"]).column("k").to_numpy()
    upd = rng.choice(all_k, size=len(all_k) // 10, replace=False)
    t.backfill(pa.table({"k": upd, "x": -upd.astype(np.float64)}))
    return t


def keys_of(batches) -> list[int]:
    return [k for b in batches for k in b.column("k").to_pylist()]


def test_units_are_row_groups(samples):
    r = TrainingReader(samples)
    assert len(r.tasks) == FILES
    assert len(r.units) == sum(math.ceil((700 + 100 * i) / ROW_GROUP) for i in range(FILES))
    assert r.num_rows == samples.read(columns=["k"]).num_rows


@both_backends
def test_row_ranges_read_whole_groups_or_streamed(lake):
    """``read_range`` (what the reader decodes units with) gives exactly rows [start, stop) and their positions,
    whether the overlapping row groups are read in one call (they fit ``batch_size``) or streamed.

    The file is over 1 MB so that on S3 it is read through the ranged-GET path, not fetched whole.
    """
    n, group = 100_000, 40_000
    rng = np.random.default_rng(3)
    data = pa.table({"k": np.arange(n, dtype=np.int64), **{f"x{i}": rng.standard_normal(n) for i in range(3)}})
    t = lake.create_table("ml.ranges", data.schema, primary_key="k",
                          properties={"write.parquet.row-group-limit": str(group)})
    t.append(data)
    scan = t.scan(["k", "x1"])
    (task,) = scan.tasks()
    assert task.file.file_size_in_bytes > 1 << 20
    for start, stop in [(0, n), (39_990, 40_010), (100, 200), (35_000, 85_000), (80_000, n), (n - 1, n)]:
        for batch_size in (1 << 20, 7_000):  # the overlapping groups fit one batch / are streamed
            chunks = list(scan.read_range(task, start, stop, batch_size=batch_size))
            got = pa.Table.from_batches([b for b, _, _ in chunks])
            want = data.slice(start, stop - start)
            for name in ("k", "x1"):
                assert got.column(name).to_numpy().tolist() == want.column(name).to_numpy().tolist(), (start, stop, batch_size)
            assert np.concatenate([p for _, p, _ in chunks]).tolist() == list(range(start, stop))
            ends = [e for _, _, e in chunks]
            assert ends == sorted(ends) and ends[-1] == stop
            assert all(b.num_rows <= batch_size for b, _, _ in chunks)


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
@pytest.mark.parametrize("loader_workers", [0, 1, 2])
def test_sharding_reads_every_row_once(samples, world_size, loader_workers):
    """Every (rank, worker) pair together reads each row exactly once, with merged values; shares balanced."""
    oracle = samples.read(columns=["k", "x"]).sort_by("k")
    workers = max(1, loader_workers)  # 0 data-loader workers: the main process reads, as worker 0 of 1
    got, rows, batches = [], [], []
    for rank in range(world_size):
        for w in range(workers):
            r = TrainingReader(samples, columns=["k", "x"], batch_size=64, seed=3, rank=rank, world_size=world_size,
                               worker_id=w, num_workers=workers, shuffle_buffer=256, interleave=3)
            out = list(r)
            assert all(b.num_rows == 64 for b in out[:-1]) and 0 < out[-1].num_rows <= 64
            assert sum(b.num_rows for b in out) == r.shard_rows()
            got.extend(out)
            rows.append(r.shard_rows())
            batches.append(len(out))
    table = pa.Table.from_batches(got).sort_by("k")
    assert table.equals(oracle)  # no row lost or repeated, update layer applied
    assert max(rows) - min(rows) <= 1
    assert max(batches) - min(batches) <= 1


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
@pytest.mark.parametrize("loader_workers", [0, 1, 2])
def test_even_batches_give_every_rank_the_same_count_and_account_for_dropped_rows(samples, world_size, loader_workers):
    """DDP: with even_batches every worker of every rank yields the same number of full batches; no row
    repeats, and exactly the rows dropped (the tail of each worker's shuffled share) are missing."""
    oracle = samples.read(columns=["k", "x"]).sort_by("k")
    workers = max(1, loader_workers)
    kw = dict(columns=["k", "x"], batch_size=64, seed=5, epoch=2, world_size=world_size, num_workers=workers,
              shuffle_buffer=256, interleave=3)
    expected_batches = (oracle.num_rows // (world_size * workers)) // 64
    got, dropped, counts = [], 0, []
    for rank in range(world_size):
        for w in range(workers):
            even = TrainingReader(samples, rank=rank, worker_id=w, even_batches=True, **kw)
            out = list(even)
            counts.append(len(out))
            assert all(b.num_rows == 64 for b in out)
            # the same stream as without even_batches, cut after the common batch count
            full = keys_of(TrainingReader(samples, rank=rank, worker_id=w, **kw))
            assert keys_of(out) == full[: 64 * expected_batches]
            assert even.dropped_rows() == len(full) - 64 * expected_batches < 64 + 1
            dropped += even.dropped_rows()
            got.extend(out)
    assert counts == [expected_batches] * (world_size * workers)
    table = pa.Table.from_batches(got)
    keys = table.column("k").to_numpy()
    assert len(np.unique(keys)) == len(keys)  # nothing repeated
    assert len(keys) + dropped == oracle.num_rows  # the missing rows are exactly the dropped ones
    picked = oracle.filter(pc.is_in(oracle.column("k"), pa.array(keys)))
    assert table.sort_by("k").equals(picked)  # with their merged values


def test_even_batches_refuse_row_counts_known_only_after_reading(samples):
    for kw in ({"filter": "x > 0"}, {"sample": 0.5}, {"label_column": "label", "label_rates": {0: 0.5}}):
        with pytest.raises(FeatureLakeError, match="even_batches"):
            TrainingReader(samples, even_batches=True, **kw)


def test_shuffle_is_deterministic_per_seed_and_epoch(samples):
    def order(**kw):
        return keys_of(TrainingReader(samples, columns=["k"], batch_size=100, shuffle_buffer=512, **kw))

    first = order(seed=1, epoch=0)
    assert first == order(seed=1, epoch=0)
    assert first == order(seed=1, epoch=0, prefetch=0) == order(seed=1, epoch=0, prefetch=3)  # reading ahead or not changes nothing
    assert sorted(first) == sorted(order(seed=1, epoch=1))
    assert first != order(seed=1, epoch=1)
    assert first != order(seed=2, epoch=0)
    r = TrainingReader(samples, columns=["k"], batch_size=100, shuffle_buffer=512, seed=1)
    assert keys_of(r) == first
    assert keys_of(r) == order(seed=1, epoch=1)  # iterating again runs the next epoch
    r.set_epoch(0)
    assert keys_of(r) == first
    # unshuffled: the planned files one after another, each in row order
    plain = np.array(keys_of(TrainingReader(samples, columns=["k"], batch_size=100, shuffle=False)))
    file_of = plain // 100_000
    assert (np.diff(file_of) != 0).sum() == FILES - 1
    assert ((np.diff(plain) == 1) | (np.diff(file_of) != 0)).all()


def test_shuffle_mixes_files_and_quality_is_measured(samples):
    """The reader mixes rows of several files per batch; shuffle_quality reports it next to a full permutation."""
    shuffled = list(TrainingReader(samples, columns=["k"], batch_size=100, with_locator=True, interleave=4, shuffle_buffer=800))
    plain = list(TrainingReader(samples, columns=["k"], batch_size=100, with_locator=True, shuffle=False))
    q, p = shuffle_quality(shuffled, "k"), shuffle_quality(plain, "k")
    in_key_order = samples.read(columns=["k"], with_locator=True).sort_by("k").to_batches(max_chunksize=100)
    assert shuffle_quality(in_key_order, "k")["reader"] == {"position_key_correlation": 1.0, "distinct_sources_per_batch": 1.0}
    assert p["reader"]["distinct_sources_per_batch"] < 1.2  # only batches that straddle two files
    assert q["reader"]["distinct_sources_per_batch"] >= 2.5  # up to 4 row groups from different files
    assert abs(q["random"]["position_key_correlation"]) < 0.1
    assert q["random"]["distinct_sources_per_batch"] > 6  # nearly all 7 files in every batch of 100
    # inside a batch the keys are not a contiguous block
    spans = [max(b.column("k").to_pylist()) - min(b.column("k").to_pylist()) for b in shuffled[:-1]]
    assert min(spans) > 1000


def test_fixed_batch_sizes_and_drop_last(samples):
    n = samples.read(columns=["k"]).num_rows
    kept = list(TrainingReader(samples, columns=["k"], batch_size=333))
    assert [b.num_rows for b in kept] == [333] * (n // 333) + [n % 333]
    dropped = list(TrainingReader(samples, columns=["k"], batch_size=333, drop_last=True))
    assert [b.num_rows for b in dropped] == [333] * (n // 333)


def test_uniform_sampling_rate_and_determinism(samples):
    n = samples.read(columns=["k"]).num_rows
    rate = 0.3
    kept = keys_of(TrainingReader(samples, columns=["k"], sample=rate, seed=5))
    sd = math.sqrt(n * rate * (1 - rate))
    assert abs(len(kept) - n * rate) < 4 * sd
    # the same rows whatever the epoch, sharding or batch size; another seed picks others
    again = [k for r in range(3) for k in keys_of(TrainingReader(samples, columns=["k"], sample=rate, seed=5, epoch=2,
                                                                 rank=r, world_size=3, batch_size=7))]
    assert sorted(again) == sorted(kept)
    assert set(keys_of(TrainingReader(samples, columns=["k"], sample=rate, seed=6))) != set(kept)


def test_label_rates_keep_negatives_with_weights(samples):
    oracle = samples.read(columns=["k", "label"]).to_pandas()
    out = pa.Table.from_batches(list(TrainingReader(samples, columns=["k"], label_column="label", label_rates={0: 0.1},
                                                    weight_column="weight", seed=9))).to_pandas()
    assert list(out.columns) == ["k", "weight"]  # the label column was read for sampling only
    merged = out.merge(oracle, on="k", how="left")
    pos = oracle[oracle.label == 1]
    neg = oracle[oracle.label == 0]
    assert set(merged[merged.label == 1].k) == set(pos.k)  # every positive kept
    kept_neg = (merged.label == 0).sum()
    sd = math.sqrt(len(neg) * 0.1 * 0.9)
    assert abs(kept_neg - 0.1 * len(neg)) < 4 * sd
    assert (merged[merged.label == 0].weight == np.float32(10.0)).all()
    assert (merged[merged.label == 1].weight == 1.0).all()
    assert out.weight.dtype == np.float32


@pytest.mark.parametrize("case", ["plain", "filtered-sampled", "unshuffled", "sharded", "even"])
def test_resume_at_random_point_gives_exactly_the_rest(samples, case):
    kw = {"columns": ["k", "x"], "batch_size": 50, "seed": 4, "shuffle_buffer": 400, "interleave": 3}
    if case == "filtered-sampled":
        kw.update(filter="x > 0", sample=0.5)
    if case == "unshuffled":
        kw.update(shuffle=False, shuffle_buffer=128)
    if case == "sharded":
        kw.update(rank=1, world_size=3, worker_id=1, num_workers=2, prefetch=0)
    if case == "even":
        kw.update(rank=2, world_size=3, worker_id=0, num_workers=2, even_batches=True)
    full = keys_of(TrainingReader(samples, **kw))
    rng = np.random.default_rng(len(case))
    for stop in [0, int(rng.integers(1, len(full) // 50)), len(full) // 50 - 1]:
        first = TrainingReader(samples, **kw)
        it = iter(first)
        head = [next(it) for _ in range(stop)]
        state = json.loads(json.dumps(first.state_dict()))  # the state is plain data
        del it  # killed: the rest is never read
        resumed = TrainingReader(samples, **kw)
        resumed.load_state_dict(state)
        resumed.set_epoch(0)  # a training loop calls this each epoch: same epoch keeps the position
        assert keys_of(head) + keys_of(resumed) == full, stop
    # resuming a finished epoch goes on with the next one
    done = TrainingReader(samples, **kw)
    list(done)
    nxt = TrainingReader(samples, **kw)
    nxt.load_state_dict(done.state_dict())
    assert keys_of(nxt) == keys_of(TrainingReader(samples, **kw, epoch=1))


def test_state_from_another_layout_is_refused(samples):
    r = TrainingReader(samples, batch_size=10, world_size=2)
    state = r.state_dict()
    with pytest.raises(FeatureLakeError, match="world_size"):
        TrainingReader(samples, batch_size=10, world_size=3).load_state_dict(state)
    with pytest.raises(FeatureLakeError, match="batch_size"):
        TrainingReader(samples, batch_size=11, world_size=2).load_state_dict(state)
    with pytest.raises(FeatureLakeError, match="not a TrainingReader state"):
        r.load_state_dict({"epoch": 1})
    # a state of the version before the SplitMix64 shuffle: its windows were permuted differently
    with pytest.raises(FeatureLakeError, match="orders rows differently"):
        r.load_state_dict({**state, "version": 1})


@both_backends
def test_snapshot_is_fixed_at_construction_with_filters_and_branches(lake):
    samples = make_samples(lake)
    before = samples.read(columns=["k"], filter="label = 1").column("k").to_pylist()
    r = TrainingReader(samples, columns=["k"], filter="label = 1")
    samples.append(pa.table({"k": pa.array([10**9], pa.int64()), "x": [1.0], "label": pa.array([1], pa.int32()),
                             "tags": pa.array([[1]], pa.list_(pa.int32()))}))
    assert sorted(keys_of(r)) == sorted(before)  # the write after construction is not seen
    assert 10**9 in keys_of(TrainingReader(samples, columns=["k"], filter="label = 1"))
    # a branch and a snapshot id
    samples.create_branch("research")
    samples.backfill(pa.table({"k": pa.array(before[:5], pa.int64()), "x": [1e6] * 5}), branch="research")
    on_branch = pa.Table.from_batches(list(TrainingReader(samples, columns=["k", "x"], branch="research", filter="x = 1000000.0")))
    assert sorted(on_branch.column("k").to_pylist()) == sorted(before[:5])
    assert not list(TrainingReader(samples, columns=["k"], filter="x = 1000000.0"))
    old = samples.snapshots()[-1]["snapshot_id"]  # newest first: the first append
    first_file = keys_of(TrainingReader(samples, columns=["k"], snapshot_id=old, shuffle=False))
    assert first_file == list(range(700))


def test_list_columns_and_locator_pass_through(samples):
    oracle = samples.read(columns=["k", "tags"]).sort_by("k")
    out = pa.Table.from_batches(list(TrainingReader(samples, columns=["k", "tags"], with_locator=True)))
    assert out.column_names == ["k", "tags", "_file", "_pos"]
    assert out.select(["k", "tags"]).sort_by("k").equals(oracle)


@both_backends
def test_sequence_join(lake):
    from featurelake.synthetic import user_events_schema

    rng = np.random.default_rng(1)
    ev = 600
    events = pa.table({
        "user_id": pa.array(rng.integers(0, 30, ev)),
        "ts": pa.array(np.datetime64("2026-01-01", "us") + rng.integers(0, 10**9, ev).astype("timedelta64[us]")),
        "item_id": pa.array(rng.integers(0, 50, ev)),
        "event_type": pa.array(["view"] * ev),
        "dwell": pa.array(rng.random(ev).astype(np.float32)),
        "tags": pa.array([[1]] * ev, pa.list_(pa.int32())),
    }, schema=user_events_schema())
    st = lake.create_sequence_table("ml.events", user_events_schema(), key="user_id", time="ts")
    st.append(events)
    st.build()
    n = 400
    rows = pa.table({"sample_id": pa.array(np.arange(n, dtype=np.int64)), "user_id": pa.array(rng.integers(0, 32, n)),
                     "ts": pa.array(np.datetime64("2026-01-01", "us") + rng.integers(0, 10**9, n).astype("timedelta64[us]"))})
    t = lake.create_table("ml.rows", rows.schema, primary_key="sample_id")
    t.append(rows.slice(0, 200))
    t.append(rows.slice(200))
    view = st.view(key="user_id", time="ts", columns=["ts", "item_id"], max_len=5)
    oracle = t.read(columns=["sample_id"], sequences={"hist": view}).sort_by("sample_id")
    r = TrainingReader(t, columns=["sample_id"], batch_size=64, sequences={"hist": view}, shuffle_buffer=100)
    it = iter(r)
    head = [next(it), next(it)]
    state = r.state_dict()
    del it
    rest = TrainingReader(t, columns=["sample_id"], batch_size=64, sequences={"hist": view}, shuffle_buffer=100)
    rest.load_state_dict(state)
    got = pa.Table.from_batches(head + list(rest))
    assert got.column_names == ["sample_id", "hist"]
    assert got.sort_by("sample_id").equals(oracle)
    # a spawned data-loader worker's copy (pickled: no catalog) reads the same batches, resumable alike
    import pickle

    fresh = TrainingReader(t, columns=["sample_id"], batch_size=64, sequences={"hist": view}, shuffle_buffer=100, seed=4)
    shipped = pickle.loads(pickle.dumps(fresh))
    assert shipped.table is None
    assert [b.to_pydict() for b in shipped] == [b.to_pydict() for b in fresh]
    shipped.set_epoch(1)
    it = iter(shipped)
    head = [next(it)]
    again = pickle.loads(pickle.dumps(fresh))
    again.load_state_dict(shipped.state_dict())
    assert pa.Table.from_batches(head + list(again)).sort_by("sample_id").equals(oracle)


@pytest.mark.parametrize("kw,error", [
    ({"batch_size": 0}, FeatureLakeError),
    ({"rank": 2, "world_size": 2}, FeatureLakeError),
    ({"sample": 1.5}, FeatureLakeError),
    ({"label_rates": {0: 0.1}}, FeatureLakeError),  # no label column named
    ({"label_rates": {0: 0.0}, "label_column": "label"}, FeatureLakeError),
    ({"label_rates": {0: 0.5}, "label_column": "nope"}, SchemaMismatchError),
    ({"weight_column": "x"}, SchemaMismatchError),
    ({"columns": ["nope"]}, SchemaMismatchError),
    ({"worker_id": 2, "num_workers": 2}, FeatureLakeError),
    ({"prefetch": -1}, FeatureLakeError),
    ({"decode_threads": -1}, FeatureLakeError),
])
def test_bad_arguments_are_refused(samples, kw, error):
    with pytest.raises(error):
        TrainingReader(samples, **kw)


def test_empty_table_and_filter_that_prunes_everything(lake, samples):
    empty = lake.create_table("ml.empty", pa.schema([pa.field("k", pa.int64(), nullable=False)]), primary_key="k")
    r = TrainingReader(empty, batch_size=10, world_size=2, rank=1)
    assert list(r) == [] and r.num_rows == 0 and r.state_dict()["finished"]
    assert list(TrainingReader(samples, filter="k < 0")) == []


# ------------------------------------------------------------ reading ahead
SERIAL = {"prefetch": 0, "decode_threads": 0}  # everything on the consumer's thread: the reference order


@pytest.mark.parametrize("kw", [{}, {"filter": "x > 0", "sample": 0.5}, {"rank": 1, "world_size": 2, "interleave": 2}])
def test_decode_ahead_and_prefetch_change_nothing(samples, kw):
    """The order of a reader that decodes ahead on threads and permutes windows on others is the serial one."""
    base = {"columns": ["k", "x"], "batch_size": 70, "seed": 8, "shuffle_buffer": 600, "interleave": 3, **kw}
    serial = keys_of(TrainingReader(samples, **base, **SERIAL))
    assert keys_of(TrainingReader(samples, **base)) == serial
    assert keys_of(TrainingReader(samples, **base, prefetch=4, decode_threads=1)) == serial
    assert keys_of(TrainingReader(samples, **base, prefetch=0)) == serial  # decode-ahead without window prefetch
    assert keys_of(TrainingReader(samples, **base, decode_threads=0)) == serial  # prefetch without decode-ahead


def test_resume_with_reading_ahead_gives_exactly_the_rest(samples):
    """Resumed at random points with decode-ahead and prefetch on: exactly the rows the serial oracle has left."""
    kw = {"columns": ["k", "x"], "batch_size": 40, "seed": 11, "shuffle_buffer": 500, "interleave": 4}
    oracle = keys_of(TrainingReader(samples, **kw, **SERIAL))
    rng = np.random.default_rng(7)
    for stop in sorted(rng.choice(np.arange(1, len(oracle) // 40), size=4, replace=False)):
        first = TrainingReader(samples, **kw, prefetch=3)
        it = iter(first)
        head = [next(it) for _ in range(int(stop))]
        state = first.state_dict()
        it.close()
        resumed = TrainingReader(samples, **kw, prefetch=3)
        resumed.load_state_dict(state)
        rest = keys_of(resumed)
        assert keys_of(head) == oracle[: 40 * int(stop)]
        assert rest == oracle[40 * int(stop):], stop


def test_closing_mid_epoch_stops_reading_ahead(samples):
    """An iterator closed after one batch leaves no decode or window queued, and nothing is decoded after."""
    r = TrainingReader(samples, columns=["k", "x"], batch_size=20, shuffle_buffer=300, interleave=3, prefetch=3)
    decoded = []
    real = r.scan.read_range

    def counting(*a, **k):
        for chunk in real(*a, **k):
            decoded.append(chunk[0].num_rows)
            yield chunk

    r.scan.read_range = counting
    it = iter(r)
    first = next(it)
    it.close()
    pools = dict(r._pools_)
    assert set(pools) == {"train", "work"}
    for pool in pools.values():  # the reader's threads stay (for the next epoch), idle: a task runs at once
        assert pool.submit(lambda: 1).result(timeout=5) == 1
    seen = len(decoded)
    import time

    time.sleep(0.2)
    assert len(decoded) == seen < len(r.units)  # stopped early: not every unit was decoded
    # the position is the first batch's: the rest is read by the next iteration, with the same threads
    rest = keys_of(r)
    assert r._pools_ == pools
    full = keys_of(TrainingReader(samples, columns=["k", "x"], batch_size=20, shuffle_buffer=300, interleave=3, **SERIAL))
    assert keys_of([first]) + rest == full
    r.close()
    assert r._pools_ == {} and all(p._shutdown for p in pools.values())
    # a closed reader starts new threads if iterated again (the next epoch)
    nxt = TrainingReader(samples, columns=["k", "x"], batch_size=20, shuffle_buffer=300, interleave=3, epoch=1, **SERIAL)
    assert keys_of(r) == keys_of(nxt)
    r.close()


def test_reader_threads_live_for_the_reader_and_do_not_travel(samples):
    import copy
    import threading

    r = TrainingReader(samples, columns=["k"], batch_size=50, shuffle_buffer=400)
    epoch0 = keys_of(r)
    pools = dict(r._pools_)
    before = {t.ident for t in threading.enumerate() if t.name.startswith("featurelake-")}
    epoch1 = keys_of(r)  # the next epoch: the same threads, none started
    assert r._pools_ == pools
    assert {t.ident for t in threading.enumerate() if t.name.startswith("featurelake-")} <= before | {None}
    twin = copy.copy(r)  # copied state (as a data-loader worker gets it): no threads travel, it starts its own
    assert twin._pools_ == {} and r._pools_ == pools
    twin.set_epoch(0)
    assert keys_of(twin) == epoch0 and epoch1 != epoch0
    assert all(twin._pools_[k] is not pools[k] for k in pools)
    twin.close()
    r.close()


def test_units_larger_than_a_decode_chunk(lake):
    """A row group of 150,000 rows decodes in several chunks, each decoded ahead while the last is used."""
    n = 150_000
    data = pa.table({"k": np.arange(n, dtype=np.int64), "v": np.arange(n, dtype=np.float32)})
    t = lake.create_table("ml.big", data.schema, primary_key="k", properties={"write.parquet.row-group-limit": str(n)})
    t.append(data.slice(0, n // 2))
    t.append(data.slice(n // 2))
    kw = dict(batch_size=4096, seed=2, shuffle_buffer=16_384, interleave=2)
    r = TrainingReader(t, **kw)
    assert [u.rows for u in r.units] == [n // 2, n // 2]  # each more than one chunk (65,536 rows)
    got = pa.Table.from_batches(list(r))
    assert sorted(got.column("k").to_pylist()) == list(range(n))
    assert (got.column("v").to_numpy() == got.column("k").to_numpy().astype(np.float32)).all()
    serial = TrainingReader(t, **kw, **SERIAL)
    assert pa.Table.from_batches(list(serial)).column("k").to_pylist() == got.column("k").to_pylist()


def test_window_permutation_is_a_fixed_uniform_permutation():
    from featurelake.shuffle import window_permutation

    for n, dtype in [(1, np.uint16), (1000, np.uint16), (1 << 16, np.uint16), ((1 << 16) + 1, np.uint32)]:
        p = window_permutation(3, 1, 0, 5, n)
        assert p.dtype == dtype and np.array_equal(np.sort(p), np.arange(n))
        assert np.array_equal(p, window_permutation(3, 1, 0, 5, n))
    assert not np.array_equal(window_permutation(3, 1, 0, 5, 1000), window_permutation(3, 1, 0, 6, 1000))
    # uniform: each source row lands in each quarter of the window about equally often
    hits = np.zeros((8, 4))
    for w in range(400):
        p = window_permutation(1, 0, 0, w, 8).astype(np.int64)
        hits[p, np.arange(8) // 2] += 1
    assert np.abs(hits / 400 - 0.25).max() < 0.1


def _child_keys(reader, out) -> None:
    reader.set_worker(1, 2)
    out.put(keys_of(reader))


def test_forked_worker_starts_its_own_threads(samples):
    """A reader whose threads are running, forked (as DataLoader workers are): the child reads its share."""
    import multiprocessing as mp

    r = TrainingReader(samples, columns=["k"], batch_size=50, shuffle_buffer=400)
    keys_of(r)  # the parent's threads exist now
    r.set_epoch(0)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_child_keys, args=(r, out))
    child.start()
    got = out.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert got == keys_of(TrainingReader(samples, columns=["k"], batch_size=50, shuffle_buffer=400, worker_id=1,
                                         num_workers=2, **SERIAL))
    r.close()


@pytest.mark.parametrize("kw", [{}, {"rank": 2, "world_size": 3, "epoch": 4}])
def test_order_matches_an_oracle_built_from_the_plan(samples, kw):
    """The stream, read with every thread on, is the plan applied the obvious way: each window's source rows
    (its pieces, laid end to end, looked up in ``t.read``) in the order of that window's permutation."""
    from featurelake.shuffle import window_permutation, windows

    r = TrainingReader(samples, columns=["k"], batch_size=64, seed=5, shuffle_buffer=500, interleave=3, **kw)
    located = samples.read(columns=["k"], with_locator=True).to_pydict()
    key_at = {(f, p): k for f, p, k in zip(located["_file"], located["_pos"], located["k"])}
    units = r.shard_units()
    g, _ = r.global_worker
    expected: list[int] = []
    for w, window in enumerate(windows(units, 3, 500)):
        rows = [key_at[(r.tasks[units[p.slot].task].file.file_path, pos)] for p in window for pos in range(p.start, p.stop)]
        expected.extend(rows[i] for i in window_permutation(5, r.epoch, g, w, len(rows)))
    assert keys_of(r) == expected


def test_a_decode_error_reaches_the_consumer_and_the_reader_recovers(samples):
    """An error raised while decoding ahead (on a reader thread) is raised by the iterator; the threads stay
    usable and a later epoch reads everything."""
    kw = {"columns": ["k"], "batch_size": 30, "shuffle_buffer": 300, "interleave": 3}
    r = TrainingReader(samples, prefetch=3, **kw)
    real = r.scan.read_range
    calls = []

    def failing(*a, **k):
        calls.append(1)
        if len(calls) == 5:
            raise OSError("disk on fire")
        yield from real(*a, **k)

    r.scan.read_range = failing
    with pytest.raises(OSError, match="disk on fire"):
        keys_of(r)
    r.scan.read_range = real
    r.set_epoch(1)
    assert keys_of(r) == keys_of(TrainingReader(samples, epoch=1, **kw, **SERIAL))
    r.close()


def test_window_permutation_is_fisher_yates_over_splitmix64():
    """Oracle: the textbook Fisher-Yates loop in Python over SplitMix64 draws from the same SeedSequence start."""
    from featurelake.shuffle import window_permutation

    mask = (1 << 64) - 1
    for n in (1, 2, 7, 1000, 70_000):
        x = int(np.random.SeedSequence([9, 2, 1, 4]).generate_state(1, np.uint64)[0])
        expected = list(range(n))
        for i in range(n - 1, 0, -1):
            x = (x + 0x9E3779B97F4A7C15) & mask
            z = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & mask
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
            z ^= z >> 31
            j = ((z >> 32) * (i + 1)) >> 32
            expected[i], expected[j] = expected[j], expected[i]
        assert window_permutation(9, 2, 1, 4, n).tolist() == expected


def test_stats_count_what_was_handed_out_and_the_time_waited(samples):
    """Rows and batches against the batches received; the waiting time against the test's own clock."""
    import time

    reader = TrainingReader(samples, columns=["k"], batch_size=64, seed=3)
    assert reader.stats().rows == 0 and reader.stats().first_batch_s is None
    pause, got = 0.002, []
    t0 = time.perf_counter()
    for b in reader:
        got.append(b.num_rows)
        time.sleep(pause)  # the consumer's own work: not waiting
    wall = time.perf_counter() - t0
    st = reader.stats()
    assert (st.epoch, st.batches, st.rows) == (0, len(got), sum(got)) and st.rows == samples.read(columns=["k"]).num_rows
    assert 0 < st.first_batch_s <= st.waited_s
    # the sleeps lie between the first request and the last batch, outside the iterator
    assert st.waited_s + pause * (len(got) - 1) <= st.elapsed_s + 1e-6 <= wall + 1e-6
    assert 0 < st.waiting_share < 1
    reader.set_epoch(1)
    assert reader.stats().rows == 0 and reader.stats().epoch == 1
    it = iter(reader)
    head = [next(it) for _ in range(3)]
    state = reader.state_dict()
    del it
    resumed = TrainingReader(samples, columns=["k"], batch_size=64, seed=3)
    resumed.load_state_dict(state)
    rest = list(resumed)
    st = resumed.stats()  # counts this process's rows; batches go on from the saved position
    assert st.rows == sum(b.num_rows for b in rest) and st.batches == len(head) + len(rest)
