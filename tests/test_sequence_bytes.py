"""Per-event storage cost of sequence tables: Parquet encodings of the event table, the default store
groups, and the bytes per event ``seq stats`` reports, each against an oracle.

Oracles: pyarrow reading the files back (encodings round trip, the Parquet metadata says which encoding
was used), pandas selecting a user's events before a time (lookups), and the files on disk (byte counts).
"""
from __future__ import annotations

import datetime as dt
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from featurelake.writer_settings import ENCODING_PROPERTY, column_encodings
from featurelake.storage import storage_of
from test_sequences import T0, events_with_ties, make_events, oracle, random_rows


def _data_files(st) -> list[str]:
    ice = st.refresh()
    return [t.file.file_path for t in ice.scan().plan_files()]


def _encodings(st, column: str) -> set[str]:
    out: set[str] = set()
    for path in _data_files(st):
        local = storage_of(st.iceberg.io).local_path(path)
        md = pq.ParquetFile(local).metadata
        for rg in range(md.num_row_groups):
            for c in range(md.num_columns):
                col = md.row_group(rg).column(c)
                if col.path_in_schema == column:
                    out.update(col.encodings)
    return out


def _sorted(t: pa.Table) -> pa.Table:
    return t.sort_by([("user_id", "ascending"), ("ts", "ascending"), ("event_id", "ascending")])


# ----------------------------------------------------------- Parquet encodings
def test_event_table_encodings_round_trip(lake):
    st = make_events(lake)
    props = st.iceberg.metadata.properties
    assert props[f"{ENCODING_PROPERTY}ts"] == "DELTA_BINARY_PACKED"
    assert props[f"{ENCODING_PROPERTY}event_id"] == "DELTA_BINARY_PACKED"
    assert props[f"{ENCODING_PROPERTY}dwell"] == "BYTE_STREAM_SPLIT"
    events = events_with_ties(40, 60, seed=3)   # equal times, null strings, lists, a user with none
    n = events.num_rows
    dwell = events.column("dwell").to_pylist()
    dwell[::7] = [None] * len(dwell[::7])       # nulls in a byte-split column
    events = events.set_column(events.schema.get_field_index("dwell"), "dwell", pa.array(dwell, pa.float32()))
    st.append(events.slice(0, 1))               # one event
    st.append(events.slice(1))
    back = _sorted(st.read())
    assert back.num_rows == n
    assert sorted(back.column("event_id").to_pylist()) == list(range(n))
    cols = ["user_id", "ts", "item_id", "event_type", "dwell", "tags"]
    want = events.sort_by([("user_id", "ascending"), ("ts", "ascending")])
    key = lambda r: (r["user_id"], r["ts"], r["item_id"], r["event_type"] or "", -1 if r["dwell"] is None else r["dwell"], r["tags"])
    assert sorted(back.select(cols).to_pylist(), key=key) == sorted(want.select(cols).to_pylist(), key=key)
    assert "DELTA_BINARY_PACKED" in _encodings(st, "ts")
    assert "DELTA_BINARY_PACKED" in _encodings(st, "event_id")
    assert "BYTE_STREAM_SPLIT" in _encodings(st, "dwell")
    assert "PLAIN_DICTIONARY" in _encodings(st, "user_id") or "RLE_DICTIONARY" in _encodings(st, "user_id")


def test_negative_and_integer_times_round_trip(lake):
    schema = pa.schema([pa.field("user", pa.string(), nullable=False), pa.field("t", pa.int64(), nullable=False),
                        pa.field("v", pa.float64()), pa.field("eid", pa.int64(), nullable=False)])
    st = lake.create_sequence_table("ml.ints", schema, key="user", time="t", event_id="eid")
    rng = np.random.default_rng(4)
    n = 300
    t = rng.integers(-(1 << 40), 1 << 40, n)
    t[:20] = t[0]                                # equal times
    t[20] = -(1 << 62)                           # deltas of both signs and large
    t[21] = (1 << 62)
    data = pa.table({"user": pa.array(rng.choice(["a", "b", "ccc"], n)), "t": pa.array(t),
                     "v": pa.array(rng.standard_normal(n)), "eid": pa.array(rng.permutation(n).astype(np.int64))},
                    schema=schema)
    st.append(data)
    assert ENCODING_PROPERTY + "eid" not in st.iceberg.metadata.properties   # caller ids: no delta asked for
    back = st.read().sort_by("eid")
    assert back.to_pylist() == data.sort_by("eid").to_pylist()
    st.build(chunk_events=3)
    keys = ["a", "b", "ccc", "zz"] * 5
    befores = [int(x) for x in rng.integers(-(1 << 40), 1 << 40, len(keys))]
    befores[0], befores[1] = (1 << 62) + 1, -(1 << 62) + 1
    got = st.lookup(keys, before=befores, columns=["t", "v"], max_len=7).to_pylist()
    assert got == oracle(back.rename_columns(["user", "t", "v", "event_id"]), keys, befores, ["t", "v"], 7,
                         key="user", time="t")


def test_column_encodings_ignore_what_does_not_fit():
    schema = pa.schema([("t", pa.timestamp("us")), ("f", pa.float32()), ("h", pa.float16()), ("s", pa.string()),
                        ("i8", pa.int8()), ("l", pa.list_(pa.int32()))])
    props = {ENCODING_PROPERTY + k: v for k, v in {
        "t": "delta_binary_packed", "f": "BYTE_STREAM_SPLIT", "h": "BYTE_STREAM_SPLIT", "s": "DELTA_BINARY_PACKED",
        "i8": "DELTA_BINARY_PACKED", "l": "PLAIN", "nope": "PLAIN"}.items()}
    props[ENCODING_PROPERTY + "f"] = "BYTE_STREAM_SPLIT"
    props["write.parquet.compression-codec"] = "zstd"
    got = column_encodings({**props, ENCODING_PROPERTY + "s": "ROT13"}, schema)
    assert got == {"t": "DELTA_BINARY_PACKED", "f": "BYTE_STREAM_SPLIT", "l": "PLAIN"}


def test_a_bad_encoding_property_leaves_the_table_writable(lake):
    st = make_events(lake, properties={ENCODING_PROPERTY + "event_type": "DELTA_BINARY_PACKED",
                                       ENCODING_PROPERTY + "tags": "BOGUS"})
    events = events_with_ties(5, 20, seed=9)
    st.append(events)
    assert st.read().num_rows == events.num_rows


# -------------------------------------------------------- store groups + lookups
@pytest.mark.parametrize("chunk_events", [1, 4, 128])
def test_default_groups_put_fixed_columns_on_the_fixed_codec(lake, chunk_events):
    st = make_events(lake)
    events = events_with_ties(25, 3 * max(chunk_events, 4), seed=chunk_events)
    # chunk edges: users with exactly one chunk, one chunk plus one event, and one event
    extra = events_with_ties(3, 1, seed=99, first_user=100)
    st.append(events)
    st.append(extra)
    info = st.build(chunk_events=chunk_events)
    assert info.column_groups == [["item_id", "event_type", "dwell"], ["tags"]]
    assert info.to_dict()["group_codecs"] == ["fixed", "packed"]
    stored = st.read()
    rng = np.random.default_rng(chunk_events)
    keys, befores = random_rows(rng, 300, 25)
    keys += [100, 101, 102]
    befores += [T0 + dt.timedelta(days=9)] * 3
    for cols, max_len in ((["ts", "item_id", "event_type", "dwell", "tags"], 5), (["tags"], None), (["dwell"], 0)):
        assert st.lookup(keys, before=befores, columns=cols, max_len=max_len).to_pylist() == \
            oracle(stored, keys, befores, cols, max_len)
    # a read-time join sees the same lists
    rows = pa.table({"user_id": pa.array(keys, pa.int64()), "ts": pa.array(befores, pa.timestamp("us"))})
    t = lake.create_table("ml.rows", pa.schema([("rid", pa.int64())] + list(rows.schema)), primary_key="rid")
    t.append(rows.add_column(0, "rid", pa.array(np.arange(len(keys)))))
    view = st.view(key="user_id", time="ts", columns=["item_id", "tags"], max_len=6)
    got = t.read(sequences={"hist": view}).sort_by("rid").column("hist").to_pylist()
    assert got == oracle(stored, keys, befores, ["item_id", "tags"], 6)


def test_builds_keep_their_groups(lake):
    """An older build's single group keeps serving, and the next build extends it with the same groups."""
    st = make_events(lake)
    events = events_with_ties(20, 40, seed=12)
    st.append(events.slice(0, 300))
    first = st.build(chunk_events=8, column_groups=[["item_id", "event_type", "dwell", "tags"]])
    assert first.to_dict()["group_codecs"] == ["ipc"]
    st.append(events.slice(300))
    second = st.build()
    assert second.incremental and second.column_groups == first.column_groups
    stored = st.read()
    keys, befores = random_rows(np.random.default_rng(1), 200, 20)
    cols = ["ts", "item_id", "tags"]
    assert st.lookup(keys, before=befores, columns=cols, max_len=9).to_pylist() == oracle(stored, keys, befores, cols, 9)


# ------------------------------------------------------------ bytes per event
def _disk(paths) -> int:
    seen, total = set(), 0
    for p in paths:
        s = os.stat(p)
        if s.st_ino not in seen:
            seen.add(s.st_ino)
            total += s.st_size
    return total


def test_store_stats_bytes_per_event_match_the_files(lake):
    st = make_events(lake)
    before = st.store_stats()
    assert before["components"]["total"] == 0 and before["bytes_per_event"]["total"] is None
    events = events_with_ties(30, 80, seed=21)
    st.append(events.slice(0, 500))
    st.append(events.slice(500))
    stats = st.store_stats()
    assert stats["serving_build"] is None and stats["components"]["store_build"] == 0
    info = st.build()
    stats = st.store_stats()
    n = events.num_rows
    assert stats["events"] == n and stats["serving_build"] == info.build_id
    io = storage_of(st.iceberg.io)
    data = [io.local_path(p) for p in _data_files(st)]
    root = io.local_path(st.iceberg.location())
    index = [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs if "index" in d.split(os.sep)]
    sst = [os.path.join(d, f) for d, _, fs in os.walk(info.path) for f in fs if f.endswith(".sst")]
    comp = stats["components"]
    assert comp["event_data"] == _disk(data)
    assert comp["index"] == _disk(index) > 0
    assert comp["store_build"] == info.store_bytes == _disk(sst)   # the db folder links the same files
    assert comp["total"] == comp["event_data"] + comp["event_updates"] + comp["index"] + comp["store_build"]
    for k, v in comp.items():
        assert stats["bytes_per_event"][k] == pytest.approx(v / n, abs=1e-3)
    all_files = [os.path.join(d, f) for d, _, fs in os.walk(st.store_root) for f in fs]
    assert stats["store_builds_on_disk"] == _disk(all_files)


def test_cli_seq_stats_shows_bytes_per_event(lake):
    from typer.testing import CliRunner

    from featurelake.cli import app

    st = make_events(lake)
    st.append(events_with_ties(8, 30, seed=2))
    st.build()
    home = str(lake.home)
    runner = CliRunner()
    res = runner.invoke(app, ["--home", home, "--json", "seq", "stats", "ml.events"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    want = st.store_stats()
    assert got["components"] == want["components"] and got["bytes_per_event"] == want["bytes_per_event"]
    res = runner.invoke(app, ["--home", home, "seq", "stats", "ml.events"])
    assert res.exit_code == 0, res.output
    assert "Bytes per event" in res.output and "store_build" in res.output and "event_data" in res.output


# ------------------------------------------------------------ the packed codec
def _packed_table(n: int, seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    ts = np.sort(rng.integers(-(1 << 45), 1 << 45, n))
    if n > 3:
        ts[1:3] = ts[0]                                           # equal times
    lists = [None if i % 7 == 3 else [None if (i + j) % 5 == 0 else int(x) for j, x in enumerate(rng.integers(-9, 9, i % 4))]
             for i in range(n)]
    return pa.table({
        "ts": pa.array(ts.astype("datetime64[us]"), pa.timestamp("us")),
        "small": pa.array([None if i % 4 == 1 else int(v) for i, v in enumerate(rng.integers(-128, 128, n))], pa.int8()),
        "flag": pa.array([None if i % 6 == 0 else bool(i % 2) for i in range(n)], pa.bool_()),
        "x": pa.array(rng.standard_normal(n)),
        "day": pa.array(rng.integers(0, 30_000, n).astype(np.int32), pa.date32()),
        "tags": pa.array(lists, pa.list_(pa.int32())),
        "big": pa.array([[int(v) for v in rng.integers(-(1 << 62), 1 << 62, i % 3)] for i in range(n)],
                        pa.large_list(pa.field("item", pa.int64(), nullable=False))),
    }, schema=pa.schema([
        pa.field("ts", pa.timestamp("us"), nullable=False), pa.field("small", pa.int8()), pa.field("flag", pa.bool_()),
        pa.field("x", pa.float64(), nullable=False), pa.field("day", pa.date32()), pa.field("tags", pa.list_(pa.int32())),
        pa.field("big", pa.large_list(pa.field("item", pa.int64(), nullable=False)), nullable=False),
    ]))


@pytest.mark.parametrize("n,cuts", [
    (1, [0, 1]),                       # one event
    (10, [0, 0, 10]),                  # an empty value, then all
    (64, [0, 1, 2, 32, 33, 64]),       # single events and chunk edges
    (300, list(range(0, 300, 128)) + [300]),
])
def test_packed_codec_round_trip(n, cuts):
    from featurelake.sequences.packed import PackedCodec

    t = _packed_table(n, seed=n)
    cd = PackedCodec.plan(t.schema, delta=["ts"])
    assert cd is not None and cd.delta == ["ts"]
    enc = cd.encoder(t)
    values = [enc(a, b - a) for a, b in zip(cuts[:-1], cuts[1:])]
    back = cd.decode(values)
    assert back.schema == t.schema
    assert back.to_pylist() == t.to_pylist()
    # any subset of values decodes to the same events (a lookup fetches only some chunks)
    assert cd.decode(values[-1:]).to_pylist() == t.slice(cuts[-2]).to_pylist()
    assert cd.decode([]).num_rows == 0


def test_packed_codec_extreme_time_deltas():
    from featurelake.sequences.packed import PackedCodec

    schema = pa.schema([pa.field("t", pa.int64(), nullable=False)])
    t = pa.table({"t": pa.array([-(1 << 63), -(1 << 63), 0, (1 << 63) - 1, (1 << 63) - 1], pa.int64())}, schema=schema)
    cd = PackedCodec.plan(schema, delta=["t"])
    enc = cd.encoder(t)
    assert cd.decode([enc(0, 5), enc(1, 3), enc(4, 1)]).column("t").to_pylist() == \
        t.column("t").to_pylist() + t.column("t").to_pylist()[1:4] + t.column("t").to_pylist()[4:]


def test_packed_codec_plans_only_what_it_can_store_and_refuses_damage():
    from featurelake.errors import CorruptFileError
    from featurelake.sequences.packed import PackedCodec

    assert PackedCodec.plan(pa.schema([("s", pa.string())])) is None
    assert PackedCodec.plan(pa.schema([("l", pa.list_(pa.string()))])) is None
    assert PackedCodec.plan(pa.schema([("st", pa.struct([("a", pa.int32())]))])) is None
    assert PackedCodec.plan(pa.schema([("ll", pa.list_(pa.list_(pa.int32())))])) is None
    t = _packed_table(20, seed=1)
    cd = PackedCodec.plan(t.schema, delta=["ts"])
    value = cd.encoder(t)(0, 20)
    for bad in (value[:-1], value + b"\x00", value[:6], b""):
        with pytest.raises(CorruptFileError):
            cd.decode([bad])


# ------------------------------------------------------- RocksDB compression
def test_store_compression_options_and_older_builds(lake):
    from featurelake.errors import CorruptFileError, FeatureLakeError
    from featurelake.sequences.codecs import codec_from_dict
    from featurelake.sequences.store import RocksDBBackend, backend_from_dict

    st = make_events(lake)
    events = events_with_ties(30, 80, seed=17)
    st.append(events.slice(0, 700))
    # a build as made before the zstd options existed records none of them
    old = st.build(chunk_events=16, backend=RocksDBBackend(zstd_level=None, zstd_dict_bytes=0))
    assert old.store == {"backend": "rocksdb", "compression": "zstd", "block_size": 16384}
    assert backend_from_dict(old.store).describe() == old.store
    st.append(events.slice(700))
    ext = st.build()                                    # extends it with the same settings
    assert ext.incremental and ext.store == old.store and ext.base_build == old.build_id
    assert st.build(force=True, incremental=False).store == old.store   # later builds keep the table's settings
    fresh = st.build(force=True, incremental=False, backend=RocksDBBackend())   # the defaults, when asked for
    assert fresh.store["zstd_level"] == RocksDBBackend.DEFAULT_ZSTD_LEVEL
    assert fresh.store["zstd_dict_bytes"] == RocksDBBackend.DEFAULT_ZSTD_DICT_BYTES
    stored = st.read()
    keys, befores = random_rows(np.random.default_rng(2), 200, 30)
    cols = ["ts", "item_id", "event_type", "tags"]
    want = oracle(stored, keys, befores, cols, 12)
    for b in (ext, fresh):
        assert st.lookup(keys, before=befores, columns=cols, max_len=12, build=b.build_id).to_pylist() == want
    assert RocksDBBackend(compression="lz4").describe() == {"backend": "rocksdb", "compression": "lz4", "block_size": 16384}
    for bad in ({"zstd_level": 99}, {"zstd_level": "9"}, {"zstd_dict_bytes": -1}):
        with pytest.raises(FeatureLakeError):
            RocksDBBackend(**bad)
    with pytest.raises(CorruptFileError, match="newer featurelake"):
        codec_from_dict({"kind": "zigzag"}, pa.schema([("a", pa.int64())]), 8)


def test_other_readers_decode_the_event_encodings(lake):
    """DuckDB (an independent Parquet reader) reads the delta-packed and byte-split columns as pyarrow does."""
    duckdb = pytest.importorskip("duckdb")
    st = make_events(lake)
    events = events_with_ties(20, 50, seed=5)
    st.append(events)
    files = [storage_of(st.iceberg.io).local_path(p) for p in _data_files(st)]
    assert "DELTA_BINARY_PACKED" in _encodings(st, "item_id") and "BYTE_STREAM_SPLIT" in _encodings(st, "dwell")
    cols = "user_id, ts, item_id, event_type, dwell, tags, event_id"
    got = duckdb.connect().sql(f"select {cols} from read_parquet({files!r}) order by event_id").to_arrow_table()
    want = pa.concat_tables([pq.read_table(f) for f in files]).sort_by("event_id")
    assert got.to_pylist() == want.select([c.strip() for c in cols.split(",")]).to_pylist()
