"""The compiled lookup kernels (featurelake.sequences.kernels) against plain NumPy/Python oracles.

* byte planes to values: every fixed-codec column kind (int64 ids, delta-coded
  times, int8/int16/int32, float32, bools, nullable columns, dictionary codes)
  of chunks encoded by :class:`FixedCodec` itself, with one event, a full
  chunk and partly filled chunks, all rows or some, against the codec's NumPy
  ``decode_into`` and against the values encoded;
* row ranges back to back: empty rows, one event, every length, narrow
  sources into wide outputs, against a Python concatenation;
* dictionary codes to strings: nulls, the empty string, non-ASCII text,
  string and large_string offsets, bytes from a base, codes outside the
  dictionary, against a Python list of the strings.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from featurelake.sequences.codecs import FixedCodec
from featurelake.sequences.kernels import InPlace, decode_into, dictionary_words, in_place, kernels, needed_bytes

C = 16
WORDS = ["view", "", "cart", "achat-é", "ünïcode-long-value"]
SCHEMA = pa.schema([
    pa.field("t", pa.int64(), nullable=False), pa.field("item", pa.int64()), pa.field("b", pa.int8()),
    pa.field("c", pa.int16(), nullable=False), pa.field("d", pa.int32()), pa.field("f", pa.float32()),
    pa.field("flag", pa.bool_()), pa.field("kind", pa.string()),
])
NAMES = SCHEMA.names


def _events(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    null = lambda: rng.random(n) < 0.2  # noqa: E731
    return pa.table({
        "t": pa.array(np.sort(rng.integers(-(1 << 40), 1 << 40, n))),
        "item": pa.array(rng.integers(-(1 << 62), 1 << 62, n), mask=null()),
        "b": pa.array(rng.integers(-128, 128, n).astype(np.int8), mask=null()),
        "c": pa.array(rng.integers(-(1 << 15), 1 << 15, n).astype(np.int16)),
        "d": pa.array(rng.integers(-(1 << 31), 1 << 31, n).astype(np.int32), mask=null()),
        "f": pa.array(rng.standard_normal(n).astype(np.float32), mask=null()),
        "flag": pa.array(rng.random(n) < 0.5, mask=null()),
        "kind": pa.array(rng.choice(WORDS, n), mask=null()),
    }, schema=SCHEMA)


def _chunks(lengths: list[int], seed: int = 0) -> tuple[FixedCodec, list[bytes], pa.Table]:
    """Chunk values of ``lengths`` events each (one user's chunks back to back), their codec and events."""
    events = _events(sum(lengths), seed)
    codec = FixedCodec(SCHEMA, C, {"kind": sorted(WORDS)}, delta=["t"])
    enc = codec.encoder(events)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int)
    return codec, [enc(int(s), n) for s, n in zip(starts, lengths)], events


@pytest.mark.parametrize("lengths", [[1], [C], [C, C, 3], [5, C, 1, 7, C]])
def test_compiled_decode_matches_the_numpy_decode_and_the_events(lengths):
    codec, values, events = _chunks(lengths, seed=len(lengths))
    grid = codec.grid(values)
    want = codec.alloc(NAMES, len(values))
    got = codec.alloc(NAMES, len(values) + 2)  # decoded at slot 1: the first and last pairs stay untouched
    for vals, ok in got.values():
        vals.view(np.uint8)[...] = 0xAB
        if ok is not None:
            ok[...] = True
    decoded, needs = decode_into(codec, grid, NAMES, got, 1)
    assert decoded == codec.decode_into(grid, NAMES, want, 0)
    # the bytes each integer column needs: what planes_used finds (times are delta-coded: never narrowed)
    assert needs == {n: codec.planes_used(grid, n) for n in ["item", "b", "c", "d", "flag", "kind"]}
    keep = (np.arange(C)[None, :] < np.asarray(lengths)[:, None]).reshape(-1)
    for name in NAMES:
        (gv, go), (wv, wo) = got[name], want[name]
        inner = slice(C, C + len(values) * C)
        np.testing.assert_array_equal(gv[inner].view(np.uint8), wv.view(np.uint8))
        assert (gv[:C].view(np.uint8) == 0xAB).all() and (gv[-C:].view(np.uint8) == 0xAB).all()
        if wo is not None:
            np.testing.assert_array_equal(go[inner], wo)
            assert go[:C].all() and go[-C:].all()
        col = events.column(name).combine_chunks()
        arr = codec.to_arrow(name, gv[inner][keep], None if go is None else go[inner][keep])
        assert arr.equals(col), name


def test_compiled_decode_of_some_rows_and_narrowed_outputs():
    codec, values, _ = _chunks([C, 4, C, 9, 1], seed=7)
    grid = codec.grid(values)
    rows = np.array([1, 3, 4])
    want = codec.alloc(NAMES, len(values))
    got = codec.alloc(NAMES, len(values))
    for v, _ in want.values():
        v[...] = 0
    for v, _ in got.values():
        v[...] = 0
    codec.decode_into(grid, NAMES, want, 0, rows)
    decode_into(codec, grid, NAMES, got, 0, rows)
    for name in NAMES:
        np.testing.assert_array_equal(got[name][0].view(np.uint8), want[name][0].view(np.uint8))
    # a narrowed column (values that fit) reads only its low planes
    small = _events(40, 3).set_column(1, "item", pa.array(np.arange(40) * 1000 % 60_000, pa.int64()))
    enc = codec.encoder(small)
    vals = [enc(0, C), enc(C, C), enc(2 * C, 8)]
    g = codec.grid(vals)
    assert codec.planes_used(g, "item") == 2
    out = codec.alloc(["item"], 3, dtypes={"item": np.dtype(np.uint16)})
    assert decode_into(codec, g, ["item"], out, 0)[1] == {"item": 2}
    np.testing.assert_array_equal(out["item"][0].reshape(3, C)[:2].reshape(-1), np.arange(32) * 1000 % 60_000)
    # values that do not fit: their low bytes, and the bytes they need, for the caller to decode again
    wide = codec.grid([enc(0, C), codec.encoder(_events(C, 4))(0, C)])
    assert decode_into(codec, wide, ["item"], codec.alloc(["item"], 2, dtypes={"item": np.dtype(np.uint8)}), 0)[1] == {
        "item": codec.planes_used(wide, "item")} == {"item": 8}


@pytest.mark.parametrize("lengths", [[1], [C, C, 3], [5, C, 1, 7, C]])
@pytest.mark.parametrize("some_rows", [False, True])
def test_values_read_in_place_decode_as_their_grid(lengths, some_rows):
    """Every column kind decoded from the bytes objects themselves: byte for byte the grid's decode, needs alike."""
    codec, values, _ = _chunks(lengths, seed=11 + len(lengths))
    values = [bytes(bytearray(v)) for v in values]  # fresh objects, not the encoder's
    grid = codec.grid(values)
    at = in_place(values, codec.size)
    assert isinstance(at, InPlace) and len(at) == len(values) and at.nbytes == grid.nbytes
    rows = np.array([len(values) - 1, 0][: len(values)]) if some_rows else None
    narrow = {"item": np.dtype(np.uint16), "d": np.dtype(np.uint8)}  # too narrow: their needs are counted on a grid
    for dtypes in ({}, narrow):
        want = codec.alloc(NAMES, len(values) + 1, dtypes=dtypes)
        got = codec.alloc(NAMES, len(values) + 1, dtypes=dtypes)
        for (wv, wo), (gv, go) in zip(want.values(), got.values()):
            wv.view(np.uint8)[...] = gv.view(np.uint8)[...] = 0x5A
            if wo is not None:
                wo[...] = go[...] = True
        assert decode_into(codec, at, NAMES, got, 1, rows) == decode_into(codec, grid, NAMES, want, 1, rows)
        for name in NAMES:
            np.testing.assert_array_equal(got[name][0].view(np.uint8), want[name][0].view(np.uint8), err_msg=name)
            if want[name][1] is not None:
                np.testing.assert_array_equal(got[name][1], want[name][1], err_msg=name)


def test_values_not_bytes_of_the_codecs_size_are_not_read_in_place():
    codec, values, _ = _chunks([C, 3])
    assert in_place(values, codec.size + 1) is None  # a wrong size: the grid's join reports it
    assert in_place([values[0], bytearray(values[1])], codec.size) is None
    assert in_place([values[0], memoryview(values[1])], codec.size) is None
    assert in_place([values[0], None], codec.size) is None
    assert in_place([], codec.size) is None
    assert in_place(values, codec.size) is not None


@pytest.mark.parametrize("seen,width,want", [(0, 8, 1), (255, 8, 1), (256, 8, 2), (65535, 4, 2), (65536, 4, 4),
                                             ((1 << 32) - 1, 8, 4), (1 << 32, 8, 8), (300, 2, 2), (7, 1, 1)])
def test_needed_bytes(seen, width, want):
    assert needed_bytes(seen, width) == want


@pytest.mark.parametrize("lengths", [[], [0], [0, 0], [1], [3, 0, 5, 1], list(range(12))])
@pytest.mark.parametrize("src_dtype,out_dtype", [(np.int64, np.int64), (np.uint16, np.int64), (np.uint8, np.int32),
                                                 (np.bool_, np.bool_), (np.float32, np.float32)])
def test_gather_copies_each_rows_range_back_to_back(lengths, src_dtype, out_dtype):
    rng = np.random.default_rng(len(lengths))
    src = (rng.integers(0, 200, 100) if src_dtype is not np.bool_ else rng.random(100) < 0.5).astype(src_dtype)
    lens = np.array(lengths, np.int64)
    starts = np.array([rng.integers(0, 100 - n + 1) for n in lengths], np.int64)
    want = np.concatenate([src[s : s + n] for s, n in zip(starts, lens)] + [np.zeros(0, src_dtype)]).astype(out_dtype)
    out = np.full(len(want) + 1, 7, out_dtype)
    sentinel = out[-1].copy()
    kernels().gather(src, starts, lens, out[: len(want)])
    np.testing.assert_array_equal(out[: len(want)], want)
    assert out[-1] == sentinel


WORDS8 = ["view", "", "cart", "achat-é", "8 bytes!"]


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string()])
@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("lengths", [[], [0], [1], [4, 0, 9, 1, 30]])
@pytest.mark.parametrize("dictionary,kernel", [(WORDS, "strings"), (WORDS8, "strings"), (WORDS8, "strings8")])
def test_strings_from_codes_match_python(typ, nulls, lengths, dictionary, kernel):
    k = kernels()
    rng = np.random.default_rng(len(lengths) + nulls)
    lens, words = dictionary_words(dictionary)
    assert words.shape == (len(dictionary), 3 if dictionary is WORDS else 1)  # WORDS' longest, 20 bytes: 3 words
    codes = rng.integers(0, len(dictionary), 64).astype(np.uint16)
    valid = rng.random(64) < 0.7 if nulls else np.zeros(0, np.bool_)
    lens_rows = np.array(lengths, np.int64)
    starts = np.array([rng.integers(0, 64 - n + 1) for n in lengths], np.int64)
    idx = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens_rows)] + [np.zeros(0, np.int64)]).astype(int)
    want = [None if nulls and not valid[i] else dictionary[codes[i]] for i in idx]
    size = k.string_bytes(codes, valid, starts, lens_rows, lens)
    assert size == sum(len(w.encode()) for w in want if w)
    base = 5  # a piece after another's bytes
    odt = np.int64 if pa.types.is_large_string(typ) else np.int32
    offsets = np.empty(len(idx) + 1, odt)
    data = np.full(base + size + 3, ord("#"), np.uint8)  # bytes of pieces before and after: untouched
    getattr(k, kernel)(codes, valid, starts, lens_rows, lens, words, base, base + size, offsets[:-1], data)
    offsets[-1] = base + size
    assert (data[:base] == ord("#")).all() and (data[base + size :] == ord("#")).all()
    data = data[: base + size]
    bitmap = None if not nulls else pa.py_buffer(np.packbits(valid[idx], bitorder="little"))
    arr = pa.Array.from_buffers(typ, len(idx), [bitmap, pa.py_buffer(offsets - base), pa.py_buffer(data[base:])])
    arr.validate(full=True)
    assert arr.to_pylist() == want


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string()])
@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_strings8_of_many_rows_sized_and_unsized_match_python(typ, nulls, seed):
    """Many rows: strings8's unchecked rows and its checked tail, and the one-pass kernel, against Python."""
    k = kernels()
    rng = np.random.default_rng(seed)
    lens, words = dictionary_words(WORDS8)
    codes = rng.integers(0, len(WORDS8), 500).astype(np.uint8)
    valid = rng.random(500) < 0.8 if nulls else np.zeros(0, np.bool_)
    lens_rows = rng.integers(0, 40, 60)
    lens_rows[rng.integers(0, 60, 10)] = 0
    starts = np.array([rng.integers(0, 500 - n + 1) for n in lens_rows], np.int64)
    idx = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lens_rows)]).astype(int)
    want = [None if nulls and not valid[i] else WORDS8[codes[i]] for i in idx]
    size = sum(len(w.encode()) for w in want if w)
    odt = np.int64 if pa.types.is_large_string(typ) else np.int32
    bitmap = None if not nulls else pa.py_buffer(np.packbits(valid[idx], bitorder="little"))
    for unsized in (False, True):
        base = 3
        offsets = np.empty(len(idx) + 1, odt)
        data = np.full(base + (8 * len(idx) if unsized else size) + 5, ord("#"), np.uint8)
        if unsized:
            assert k.strings8_unsized(codes, valid, starts, lens_rows, lens, words, base, offsets[:-1], data) == base + size
        else:
            k.strings8(codes, valid, starts, lens_rows, lens, words, base, base + size, offsets[:-1], data)
            assert (data[base + size :] == ord("#")).all()  # nothing past the piece's end
        assert (data[:base] == ord("#")).all()
        offsets[-1] = base + size
        arr = pa.Array.from_buffers(typ, len(idx), [bitmap, pa.py_buffer(offsets - base),
                                                    pa.py_buffer(data[base : base + size].copy())])
        arr.validate(full=True)
        assert arr.to_pylist() == want, unsized


def test_the_one_pass_strings_report_a_code_outside_the_dictionary():
    lens, words = dictionary_words(WORDS8)
    out, data = np.empty(3, np.int64), np.empty(24, np.uint8)
    starts, n = np.zeros(1, np.int64), np.full(1, 3, np.int64)
    bad = np.array([0, 1, 9], np.uint16)
    assert kernels().strings8_unsized(bad, np.zeros(0, np.bool_), starts, n, lens, words, 0, out, data) == -1
    # a null slot's code is never read
    assert kernels().strings8_unsized(bad, np.array([True, True, False]), starts, n, lens, words, 0, out, data) == len(
        (WORDS8[0] + WORDS8[1]).encode())


def test_a_code_outside_the_dictionary_is_reported():
    lens = np.array([1, 2], np.int64)
    one = np.ones(1, np.int64)
    assert kernels().string_bytes(np.array([0, 1, 2], np.uint16), np.zeros(0, np.bool_), np.zeros(1, np.int64),
                                  one * 3, lens) == -1
    # a null slot's code is never read
    assert kernels().string_bytes(np.array([0, 9], np.uint16), np.array([True, False]), np.zeros(1, np.int64),
                                  one * 2, lens) == 1


def test_count_below_matches_the_numpy_search():
    from featurelake.sequences.search import count_below

    rng = np.random.default_rng(11)
    for c in (1, 5, 16, 128):
        times = np.sort(rng.integers(-50, 50, (40, c)), axis=1)
        counts = rng.integers(0, c + 1, 40)
        counts[:3] = [0, 1, c]
        pairs = rng.integers(0, 40, 300)
        bound = rng.integers(-60, 60, 300)
        bound[:2] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max]
        want = [int(np.sum(times[p, : counts[p]] < b)) for p, b in zip(pairs, bound)]
        assert kernels().count_below(times, counts, pairs, bound).tolist() == want
        assert count_below(times, counts, pairs, bound).tolist() == want


def test_run_counts_match_a_search_of_each_run():
    rng = np.random.default_rng(5)
    lens = rng.integers(0, 12, 50)
    lens[:3] = [0, 1, 11]
    start = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
    pool = np.concatenate([np.sort(rng.integers(-100, 100, n)) for n in lens]).astype(np.int64)
    q_run = rng.integers(0, 50, 400).astype(np.int64)
    q = rng.integers(-120, 120, 400).astype(np.int64)
    q[:2] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max]
    want = [int(np.searchsorted(pool[start[r] : start[r + 1]], v, side="left")) for r, v in zip(q_run, q)]
    assert kernels().run_counts(pool, start, q_run, q).tolist() == want


def _part_case(lengths, seed, dtypes):
    """Chunks, their pools decoded by the codec's NumPy decode (the oracle) and an untouched copy to decode into."""
    codec, values, _ = _chunks(lengths, seed=seed)
    values = [bytes(bytearray(v)) for v in values]
    pools = [codec.alloc(NAMES, len(values) + 2, dtypes=dtypes) for _ in range(2)]
    for pool in pools:
        for vals, ok in pool.values():
            vals.view(np.uint8)[...] = 0x3C
            if ok is not None:
                ok[...] = True
    return codec, values, pools


@pytest.mark.parametrize("lengths", [[1], [C, C, 3], [5, C, 1, 7, C, C, 2]])
@pytest.mark.parametrize("narrow", [False, True])
@pytest.mark.parametrize("cut_only", [False, True])
def test_a_part_decoded_in_one_call_matches_the_numpy_decode_and_counts_its_cuts(lengths, narrow, cut_only):
    """PartDecoder: columns for every value, the time column for the masked values only (or, ``cut_only``, not
    written at all), each query's count of times below its bound and the validity flags set, against
    FixedCodec.decode_into (NumPy) and a per-query count of the decoded times."""
    from featurelake.sequences.kernels import PartDecoder

    dtypes = {"item": np.dtype(np.uint16), "d": np.dtype(np.uint8), "kind": np.dtype(np.uint8)} if narrow else {}
    codec, values, (want, got) = _part_case(lengths, 20 + len(lengths), dtypes)
    full = [n for n in NAMES if n != "t"]
    rng = np.random.default_rng(len(lengths))
    first = 1  # the part fills pool rows 1 .. len(values): rows 0 and the last stay untouched
    mask = np.zeros(len(values) + 2, bool)
    mask[first:first + len(values)] = rng.random(len(values)) < 0.6
    mask[first + len(values) - 1] = True
    grid = codec.grid(values)
    decoded = codec.decode_into(grid, full, want, first)
    rows = np.flatnonzero(mask[first:first + len(values)])
    decoded += codec.decode_into(grid, ["t"], want, first, rows)
    # queries on the part's pairs (and one outside it, left alone), in pair order as the lookup sorts them
    counts = np.zeros(len(values) + 2, np.int64)
    counts[first:first + len(values)] = lengths
    q_pairs = np.concatenate([first + rows[rng.integers(0, len(rows), 30)], [0]]).astype(np.int64)
    times = got["t"][0].view(np.int64).reshape(-1, C)
    t_events = want["t"][0].view(np.int64).reshape(-1, C)
    bounds = np.array([int(t_events[p, rng.integers(0, max(counts[p], 1))]) + int(rng.integers(-1, 2)) for p in q_pairs])
    bounds[:2] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max]
    order = np.argsort(q_pairs, kind="stable")
    below = np.full(len(q_pairs), -7, np.int64)
    dec = PartDecoder(codec, full, (["t"], mask), got, (times, counts, q_pairs, order, q_pairs[order], bounds, below),
                      "t" if cut_only else None)
    d, needs, at, nset = dec.decode(values, first)
    assert d == decoded and isinstance(at, InPlace) and at.nbytes == grid.nbytes
    assert needs == {n: codec.planes_used(grid, n) for n in ["item", "b", "c", "d", "flag", "kind"]}
    assert nset == {n: int(np.count_nonzero(want[n][1][first * C:(first + len(values)) * C]))
                    for n in full if want[n][1] is not None}
    written = np.zeros_like(mask) if cut_only else mask
    for name in NAMES:
        keep = slice(None) if name != "t" else np.repeat(written, C)  # unmasked time rows: not written
        np.testing.assert_array_equal(got[name][0].view(np.uint8).reshape(-1, got[name][0].itemsize)[keep],
                                      want[name][0].view(np.uint8).reshape(-1, want[name][0].itemsize)[keep], err_msg=name)
        if want[name][1] is not None:
            np.testing.assert_array_equal(got[name][1][keep], want[name][1][keep], err_msg=name)
    assert (got["t"][0].view(np.uint8).reshape(-1, 8)[~np.repeat(written, C)] == 0x3C).all()
    oracle = [int(np.sum(t_events[p, : counts[p]] < b)) for p, b in zip(q_pairs, bounds)]
    assert below[:-1].tolist() == oracle[:-1] and below[-1] == -7


def test_a_part_not_all_bytes_of_the_codecs_size_is_left_to_the_grid():
    from featurelake.sequences.kernels import PartDecoder

    codec, values, (_, got) = _part_case([C, 3], 5, {})
    before = {n: got[n][0].copy() for n in NAMES}
    dec = PartDecoder(codec, NAMES, None, got)
    for bad in ([values[0], bytearray(values[1])], [values[0], values[1][:-1]], [values[0], None], []):
        assert dec.decode(bad, 0) is None
    for n in NAMES:  # nothing written
        np.testing.assert_array_equal(got[n][0], before[n])
    assert dec.decode(values, 0) is not None


@pytest.mark.parametrize("lengths", [[1], [C, C, 3]])
def test_a_part_decodes_alike_from_a_list_and_from_other_sequences(lengths):
    """A list's values are found through its own item array, other sequences' through their ids: the same bytes."""
    from featurelake.sequences.kernels import PartDecoder

    codec, values, _ = _chunks(lengths, seed=5)
    want = codec.decode_padded(values, NAMES)  # the NumPy decode (the oracle)
    assert in_place(tuple(values), codec.size) is not None and in_place(values, codec.size) is not None

    class Values(list):
        pass

    for seq in (list(values), tuple(values), Values(values)):  # (a list subclass: through its ids too)
        got = codec.alloc(NAMES, len(values))
        assert PartDecoder(codec, NAMES, None, got).decode(seq, 0) is not None, type(seq)
        for name in NAMES:
            np.testing.assert_array_equal(got[name][0], want[name][0], err_msg=f"{name} {type(seq)}")
            if want[name][1] is not None:
                np.testing.assert_array_equal(got[name][1], want[name][1], err_msg=f"{name} {type(seq)}")
