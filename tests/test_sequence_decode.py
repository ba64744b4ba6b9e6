"""Decoding sequence chunks narrow and dictionary strings k values at a time.

Oracles: Arrow's own ``take`` of the dictionary (strings), the values the
codec was given (byte planes read back narrow), and the pandas oracle of
``test_sequences`` for whole lookups and joins, in both layouts:

* integer attributes whose values need 1, 2, 4 or 8 bytes in different users'
  chunks (so one batch decodes narrow and the next must widen and decode again),
  negative values (high bytes set), every integer width, bools, floats, nulls;
* dictionary strings with nulls, the empty string and non-ASCII text, of 4
  values (several codes per k-gram) and of 300 (16-bit codes, Arrow's take);
* rows of equal lengths (``max_len`` below every history: block copies) and of
  varied lengths, ``max_len`` 0 and at chunk edges, windows, empty and
  one-event histories, unknown and null keys, string keys;
* several multi-get parts per batch on one thread and on a pool of four.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from backends import both_backends
from featurelake.sequences import as_list, lookup_view
from featurelake.sequences.arguments import as_array
from featurelake.sequences.codecs import FixedCodec
from featurelake.sequences.strings import DictionaryStrings
from test_sequences import oracle

C = 16  # events per chunk

SCHEMA = pa.schema([
    ("user", pa.int64()), ("t", pa.int64()),
    ("a", pa.int64()), ("b", pa.int32()), ("c", pa.int16()), ("d", pa.int32()), ("e", pa.int8()),
    ("flag", pa.bool_()), ("f", pa.float32()), ("s4", pa.string()), ("s300", pa.string()),
])
ATTRS = [f.name for f in SCHEMA][2:]
WORDS4 = ["view", "", "cart", "achat-é"]
WORDS300 = [f"w{i:03d}" * (1 + i % 3) for i in range(299)] + ["ünïcode"]


# ----------------------------------------------------------------- strings
@pytest.mark.parametrize("words", [["a"], WORDS4, [f"v{i}" for i in range(40)], [f"v{i}" for i in range(256)], WORDS300])
@pytest.mark.parametrize("typ", [pa.string(), pa.large_string()])
def test_dictionary_strings_equal_arrows_take(words, typ):
    d = pa.array(words, typ)
    strings = DictionaryStrings(d)
    rng = np.random.default_rng(len(words))
    for n in (0, 1, 2, strings.k * 2 - 1, strings.k * 2, 101, 5000):
        for dtype in (np.uint8, np.uint16):
            if len(words) > 256 and dtype == np.uint8:
                continue
            codes = rng.integers(0, len(words), n).astype(dtype)
            for valid in (None, rng.random(n) < 0.7, np.zeros(n, bool)):
                got = strings.decode(codes, valid)
                got.validate(full=True)
                want = [None if valid is not None and not valid[i] else words[c] for i, c in enumerate(codes)]
                assert got.type == typ and got.to_pylist() == want
                assert got.equals(d.take(pa.array(codes, mask=None if valid is None else ~valid)))
    assert (strings.k > 1) == (len(words) < 64)  # small dictionaries are taken several codes at a time


# -------------------------------------------------------------- row ranges
@pytest.mark.parametrize("typ", [pa.string(), pa.large_string()])
def test_kgram_offsets_match_per_value_lengths_at_every_tail(typ):
    """The offsets gathered k at a time from the k-gram table equal the cumulated per-value lengths, for every
    count modulo k (the last k-gram padded), slices of a larger array (non-zero start), and nulls."""
    words = ["", "a", "ab", "achat-é", "purchase"]
    strings = DictionaryStrings(pa.array(words, typ))
    assert strings.k > 1
    lens = np.array([len(w.encode()) for w in words])
    ends = strings._ends()
    assert ends.shape == (strings.base ** strings.k, strings.k)
    rng = np.random.default_rng(7)
    pool = rng.integers(0, len(words), 4 * strings.k + 257).astype(np.uint8)
    for n in range(2 * strings.k, 2 * strings.k + 2 * strings.k + 1):
        for start in (0, 3):
            codes = pool[start : start + n]
            for valid in (None, rng.random(n) < 0.6):
                got = strings.decode(codes, valid)
                got.validate(full=True)
                want_lens = np.where(valid if valid is not None else True, lens[codes], 0)
                offsets = np.frombuffer(got.buffers()[1], "<i8" if typ == pa.large_string() else "<i4")[: n + 1]
                assert offsets[0] == 0 and (offsets[1:] == np.cumsum(want_lens)).all()
                want = [None if valid is not None and not valid[i] else words[c] for i, c in enumerate(codes)]
                assert got.to_pylist() == want


# ------------------------------------------------------------ narrow planes
@pytest.mark.parametrize("dtype,values,need", [
    (pa.int64(), [0, 1, 255], 1), (pa.int64(), [256, 3], 2), (pa.int64(), [70_000], 4), (pa.int64(), [1 << 40], 8),
    (pa.int64(), [-1, 5], 8), (pa.int32(), [65_535], 2), (pa.int32(), [1 << 20], 4), (pa.int32(), [-7], 4),
    (pa.int16(), [200], 1), (pa.int16(), [-200], 2), (pa.uint32(), [4_000_000_000], 4), (pa.int8(), [-1], 1),
    (pa.float32(), [1.0], 4), (pa.bool_(), [True], 1),
])
def test_planes_used_and_narrow_decode_read_back_the_values(dtype, values, need):
    schema = pa.schema([("x", dtype)])
    codec = FixedCodec(schema, 8, {})
    rng = np.random.default_rng(need)
    n = 29  # four chunks, the last one partial
    picks = np.array(values, dtype=object)[rng.integers(0, len(values), n)]
    picks[3] = values[-1]
    col = pa.array(picks.tolist(), dtype, mask=rng.random(n) < 0.2)
    enc = codec.encoder(pa.table({"x": col}))
    vals = [enc(off, min(8, n - off)) for off in range(0, n, 8)]
    grid = codec.grid(vals)
    assert codec.planes_used(grid, "x") == need
    dt = codec.narrow_dtype("x", need)
    assert dt.itemsize == min(need, codec.layout["x"][1].itemsize)
    out = codec.alloc(["x"], len(vals), dtypes={"x": dt})
    codec.decode_into(grid, ["x"], out, 0)
    got, ok = out["x"]
    keep = np.arange(len(vals) * 8) < n
    back = codec.to_arrow("x", got[keep], ok[keep])
    assert back.type == dtype and back.to_pylist() == col.to_pylist()
    assert codec.widen("x", got).dtype == codec.layout["x"][1]


def test_delta_times_keep_their_width():
    schema = pa.schema([("t", pa.int64())])
    codec = FixedCodec(schema, 8, {}, delta=["t"])
    enc = codec.encoder(pa.table({"t": pa.array(np.arange(8, dtype=np.int64))}))
    assert codec.planes_used(codec.grid([enc(0, 8)]), "t") == 8


# ------------------------------------------------------------ whole lookups
def _events(rng) -> pa.Table:
    """Users 1-39 with 0..300 events; 1 has one, 2 exactly C; a's values need 1, 2, 4 or 8 bytes by user."""
    counts = rng.integers(0, 300, 40)
    counts[0], counts[1], counts[2], counts[3] = 0, 1, C, 3 * C + 1
    user = np.repeat(np.arange(40, dtype=np.int64), counts)
    n = len(user)
    t = rng.integers(0, 5000, n)  # many equal times
    span = np.array([1 << 7, 1 << 15, 1 << 31, 1 << 62])[user % 4]
    a = (rng.random(n) * span).astype(np.int64)
    a[user == 5] = -a[user == 5] - 1  # negative values: the high bytes are set
    mask = lambda p: rng.random(n) < p  # noqa: E731
    return pa.table({
        "user": user, "t": t,
        "a": pa.array(a, mask=mask(0.1)),
        "b": pa.array(rng.integers(0, 300, n).astype(np.int32)),
        "c": pa.array(rng.integers(-3, 3, n).astype(np.int16), mask=mask(0.05)),
        "d": pa.array(rng.integers(0, 1 << 31, n).astype(np.int32)),
        "e": pa.array(rng.integers(0, 100, n).astype(np.int8)),
        "flag": pa.array(rng.random(n) < 0.5, mask=mask(0.1)),
        "f": pa.array(rng.random(n).astype(np.float32)),
        "s4": pa.array(np.array(WORDS4, dtype=object)[rng.integers(0, 4, n)].tolist(), mask=mask(0.1)),
        "s300": pa.array(np.array(WORDS300, dtype=object)[rng.integers(0, 300, n)].tolist(), mask=mask(0.1)),
    }, schema=SCHEMA)


def _rows(rng, n: int, users=range(45)) -> tuple[list, list]:
    keys = rng.choice(list(users), n).tolist()
    befores = rng.integers(-10, 5100, n).tolist()
    keys[0], befores[1] = None, None  # a null key, a null time
    return keys, befores


CASES = [(None, None), (0, None), (1, None), (C, None), (C + 1, None), (2 * C - 1, 7 * C), (5, None), (3, 400),
         (None, 1), (4 * C, 0)]


@pytest.fixture
def widths_table(lake):
    st = lake.create_sequence_table("ml.widths", SCHEMA, key="user", time="t")
    st.append(_events(np.random.default_rng(17)))
    return st


@pytest.mark.parametrize("groups", [None, [["a", "s4", "flag"], ["b", "c", "d", "e", "f", "s300"]]])
def test_narrow_lookups_match_the_oracle_in_both_layouts(widths_table, groups):
    st = widths_table
    st.build(chunk_events=C, column_groups=groups)
    stored = st.read()
    store = st.open_store()
    assert {c.kind for c in store.codecs} == {"fixed"}
    rng = np.random.default_rng(3)
    small = [u for u in range(1, 40) if u % 4 == 0 and u != 4]  # a's values fit one byte here
    for threads, batch_keys in ((1, 512), (1, 8), (4, 8)):
        # narrow users first (the store learns 1-byte widths), then everyone (decoded again, wider), then narrow again
        for users in (small, range(45), small, range(45)):
            keys, befores = _rows(rng, 300, users)
            if users is small and batch_keys == 8:  # the widths learned from narrow users: a decodes to one byte
                store.lookup_stats(as_array(pa.array(small, pa.int64()), store.key_type), None, ["a"], None, None)
                assert store._planes[(store.group_of["a"], "a")] == 1
            k = as_array(pa.array(keys, pa.int64()), store.key_type)
            for cols in (ATTRS, ["a", "s4"], ["s300", "t", "d"], ["flag", "e", "c"]):
                for i in rng.choice(len(CASES), 3, replace=False):
                    max_len, window = CASES[i]
                    want = oracle(stored, keys, befores, cols, max_len, window, key="user", time="t")
                    got, stats = store.lookup_stats(k, befores, cols, max_len, window, threads, batch_keys)
                    got.validate(full=True)
                    assert got.to_pylist() == want, (threads, batch_keys, cols, max_len, window)
                    assert stats["events"] == sum(map(len, want))
                    view, _ = lookup_view(store, k, pa.array(befores, pa.int64()), cols, max_len, window, threads,
                                          batch_keys)
                    view.validate(full=True)
                    assert as_list(view).equals(got), (threads, batch_keys, cols, max_len, window)


def test_equal_length_rows_copy_blocks_and_match_the_oracle(widths_table):
    """max_len below every history: each row gets exactly max_len events (the block copy); then some rows fewer."""
    st = widths_table
    st.build(chunk_events=C)
    stored = st.read()
    store = st.open_store()
    long_users = [u for u in range(4, 40) if len(stored.filter(pa.compute.equal(stored["user"], u))) > 100]
    rng = np.random.default_rng(8)
    keys = rng.choice(long_users, 200).tolist()
    befores = [5100] * 200
    for max_len in (1, C - 1, C, C + 1, 3 * C, 100):
        got = store.lookup(as_array(pa.array(keys, pa.int64()), store.key_type), befores, ATTRS, max_len, None,
                           threads=1)
        assert set(np.diff(np.asarray(got.offsets))) == {max_len}
        assert got.to_pylist() == oracle(stored, keys, befores, ATTRS, max_len, key="user", time="t")
    keys[5], befores[6], keys[7] = 1, 0, 3  # one row shorter, one empty, one of another length: the general copy
    got = store.lookup(as_array(pa.array(keys, pa.int64()), store.key_type), befores, ATTRS, 60, None, threads=4)
    assert got.to_pylist() == oracle(stored, keys, befores, ATTRS, 60, key="user", time="t")


@both_backends
def test_narrow_join_with_string_keys_matches_the_oracle(lake):
    """String keys, through ``batches(sequences=...)`` in both layouts, on the embedded lake and on S3."""
    schema = pa.schema([pa.field("user", pa.string())] + list(SCHEMA)[1:])
    events = _events(np.random.default_rng(23))
    events = events.set_column(0, "user", pa.array([f"u{u}" for u in events["user"].to_pylist()]))
    st = lake.create_sequence_table("ml.skeys", schema, key="user", time="t")
    st.append(events.cast(schema))
    st.build(chunk_events=C)
    stored = st.read()
    rng = np.random.default_rng(5)
    keys, befores = _rows(rng, 500)
    keys = [None if k is None else f"u{k}" for k in keys]
    rows = pa.table({"rid": np.arange(500), "user": pa.array(keys, pa.string()),
                     "t": pa.array(befores, pa.int64())})
    samples = lake.create_table("ml.sk_rows", rows.schema, primary_key="rid")
    samples.append(rows)
    cols = ["a", "s4", "s300", "flag"]
    want = oracle(stored, keys, befores, cols, 2 * C, key="user", time="t")
    for layout in ("list", "list_view"):
        view = st.view(key="user", time="t", columns=cols, max_len=2 * C, layout=layout, batch_keys=16)
        got = pa.Table.from_batches(list(samples.batches(batch_size=128, sequences={"hist": view}))).sort_by("rid")
        assert as_list(got["hist"].combine_chunks()).to_pylist() == want, layout


@pytest.mark.parametrize("threads", [1, 4])
def test_a_part_wider_than_the_parts_before_it_widens_the_pool(lake, threads):
    """Users are fetched in key order: the first parts hold 1-byte values, a later one 8-byte values."""
    rng = np.random.default_rng(31)
    counts = rng.integers(C, 6 * C, 30)
    user = np.repeat(np.arange(30, dtype=np.int64), counts)
    a = rng.integers(0, 200, len(user))
    wide = user >= 24
    a[wide] = rng.integers(1 << 40, 1 << 50, int(wide.sum()))
    schema = pa.schema([("user", pa.int64()), ("t", pa.int64()), ("a", pa.int64()), ("s4", pa.string())])
    st = lake.create_sequence_table("ml.widen", schema, key="user", time="t")
    st.append(pa.table({"user": user, "t": rng.integers(0, 1000, len(user)), "a": a,
                        "s4": np.array(WORDS4, dtype=object)[rng.integers(0, 4, len(user))].tolist()}, schema=schema))
    st.build(chunk_events=C)
    stored = st.read()
    store = st.open_store()
    narrow_keys = as_array(pa.array(np.arange(24), pa.int64()), store.key_type)
    store.lookup_stats(narrow_keys, None, ["a"], None, None, threads, 8)  # learns: a needs one byte
    assert store._planes[(0, "a")] == 1
    keys = list(range(30)) * 3
    befores = rng.integers(0, 1100, len(keys)).tolist()
    got, _ = store.lookup_stats(as_array(pa.array(keys, pa.int64()), store.key_type), befores, ["a", "s4"], 2 * C,
                                None, threads, 8)
    assert store._planes[(0, "a")] == 8
    assert got.to_pylist() == oracle(stored, keys, befores, ["a", "s4"], 2 * C, key="user", time="t")


def test_four_threads_looking_up_at_once_match_the_serial_oracle(widths_table):
    """Four callers share one store (its learned widths, each thread's scratch buffers, the multi-get pool), each
    with threads=4 and several parts a batch, windows and max_len at chunk edges: each equals the pandas oracle."""
    from concurrent.futures import ThreadPoolExecutor

    st = widths_table
    st.build(chunk_events=C)
    stored = st.read()
    store = st.open_store()
    rng = np.random.default_rng(31)
    jobs = []
    for i in range(16):
        keys, befores = _rows(rng, 200)
        max_len, window = CASES[i % len(CASES)]
        jobs.append((keys, befores, ATTRS if i % 2 else ["s4", "a", "t"], max_len, window))
    wants = [oracle(stored, k, b, cols, ml, w, key="user", time="t") for k, b, cols, ml, w in jobs]

    def run(job):
        keys, befores, cols, max_len, window = job
        got, _ = store.lookup_stats(as_array(pa.array(keys, pa.int64()), store.key_type), befores, cols, max_len,
                                    window, 4, 8)
        got.validate(full=True)
        return got.to_pylist()

    for _ in range(2):
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(run, jobs)) == wants
