"""The sequence store: a narrow key-value interface, its key layout, and RocksDB behind it.

Why a narrow interface: Meta serves user sequences from a distributed
key-value store; featurelake embeds RocksDB (through rocksdict) so a laptop,
a test and a training job need no server. Everything the sequence layer asks
of a store fits in three verbs, so another store can replace RocksDB by
implementing :class:`StoreBackend`:

* ``writer(path)`` -- write one immutable *sorted file* (keys strictly
  ascending), the offline build's output;
* ``assemble(db_dir, layers)`` -- bulk-load layers of sorted files into a
  servable store, later layers shadowing earlier ones (an incremental build
  is the previous build's layers plus one new layer);
* ``open(db_dir)`` -- a reader whose one operation is ``multi_get(keys)``.

There are no per-row puts and no background compaction: RocksDB's
``SstFileWriter`` writes the files, ``ingest_external_file`` links them in
(the first layer lands on the bottom level, so a read is one IO), and
automatic compactions are off. Layers are hard-linked from the build that
wrote them, so an incremental build copies nothing.

Key layout (bytewise order = the order the build writes in):

* user prefix: int keys are 8 bytes big-endian with the sign bit flipped
  (numeric order); string keys are their UTF-8 bytes plus a ``0x00``
  terminator (prefix-free, lexicographic order; NUL is not allowed in keys);
* ``prefix + 0x00`` -- the user's *head*: event count, last event time and
  the first event time of every chunk (int64 little-endian);
* ``prefix + 0x01 + chunk (u32 BE) + group (u8)`` -- one chunk of events of
  one column group, in the group's codec: ``fixed`` or ``ipc`` (below) or
  ``packed`` (:mod:`featurelake.sequences.packed`).
"""
from __future__ import annotations

import json
import os
import shutil
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from pathlib import Path
from typing import Iterable, Protocol, Sequence

import numpy as np
import pyarrow as pa

from featurelake.errors import CorruptFileError, FeatureLakeError

HEAD_TAG = 0x00
CHUNK_TAG = 0x01
PAGE_TAG = 0x02   # head pages of a two-level head (see featurelake.sequences.layout)
HEAD_FANOUT = 64  # chunks per head page: a user with more chunks gets a two-level head
INT_PREFIX = 8
_SIGN = np.uint64(1 << 63)
_CHUNK_KEY = np.dtype([("u", ">u8"), ("t", "u1"), ("c", ">u4"), ("g", "u1")])
_HEAD_KEY = np.dtype([("u", ">u8"), ("t", "u1")])
_PAGE_KEY = np.dtype([("u", ">u8"), ("t", "u1"), ("p", ">u4")])


# --------------------------------------------------------------------- keys
class KeyCodec:
    """Encodes user keys (int or string) into order-preserving byte prefixes.

    Integer keys of any width are handled as int64; strings as UTF-8. Key
    construction is vectorized for integers (numpy structured arrays), a
    Python loop for strings.
    """

    def __init__(self, kind: str) -> None:
        if kind not in ("int", "string"):
            raise FeatureLakeError(f"sequence keys must be integers or strings, not {kind}")
        self.kind = kind

    @classmethod
    def for_type(cls, t: pa.DataType) -> "KeyCodec":
        if pa.types.is_integer(t):
            return cls("int")
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
            return cls("string")
        raise FeatureLakeError(f"a sequence key column must be an integer or string column, not {t}")

    # numpy-friendly views of the keys -------------------------------------
    def values(self, keys: pa.Array) -> np.ndarray:
        """Key values as int64 (ints) or an object array of str (strings); nulls must be removed."""
        if self.kind == "int":
            if pa.types.is_uint64(keys.type) and len(keys) and pa.compute.max(keys).as_py() >= 1 << 63:
                raise FeatureLakeError("uint64 sequence keys above 2**63-1 are not supported")
            return keys.cast(pa.int64()).to_numpy(zero_copy_only=False)
        out = np.asarray(keys.cast(pa.string()).to_pylist(), dtype=object)
        if any("\x00" in s for s in out):
            raise FeatureLakeError("string sequence keys may not contain NUL characters")
        return out

    def prefix(self, value) -> bytes:
        if self.kind == "int":
            return (np.uint64(np.int64(value).view(np.uint64)) ^ _SIGN).item().to_bytes(8, "big")
        return str(value).encode() + b"\x00"

    def head_keys(self, users: np.ndarray) -> list[bytes]:
        if self.kind == "int":
            arr = np.empty(len(users), dtype=_HEAD_KEY)
            arr["u"] = users.astype(np.int64).view(np.uint64) ^ _SIGN
            arr["t"] = HEAD_TAG
            return _split(arr.tobytes(), _HEAD_KEY.itemsize)
        return [self.prefix(u) + b"\x00" for u in users]

    def page_keys(self, users: np.ndarray, pages: np.ndarray) -> list[bytes]:
        """Keys of (user, head page) pairs."""
        if self.kind == "int":
            arr = np.empty(len(users), dtype=_PAGE_KEY)
            arr["u"] = users.astype(np.int64).view(np.uint64) ^ _SIGN
            arr["t"] = PAGE_TAG
            arr["p"] = pages.astype(np.uint32)
            return _split(arr.tobytes(), _PAGE_KEY.itemsize)
        return [self.page_key(u, int(p)) for u, p in zip(users, pages)]

    def chunk_keys(self, users: np.ndarray, chunks: np.ndarray, groups: Sequence[int]) -> list[bytes]:
        """Keys of (user, chunk) pairs for each group, group varying fastest."""
        g = len(groups)
        if self.kind == "int":
            arr = np.empty(len(users) * g, dtype=_CHUNK_KEY)
            arr["u"] = np.repeat(users.astype(np.int64).view(np.uint64) ^ _SIGN, g)
            arr["t"] = CHUNK_TAG
            arr["c"] = np.repeat(chunks.astype(np.uint32), g)
            arr["g"] = np.tile(np.asarray(groups, dtype=np.uint8), len(users))
            return _split(arr.tobytes(), _CHUNK_KEY.itemsize)
        out = []
        for u, c in zip(users, chunks):
            p = self.prefix(u) + b"\x01" + int(c).to_bytes(4, "big")
            out.extend(p + bytes([gi]) for gi in groups)
        return out

    def head_key(self, user) -> bytes:
        return self.prefix(user) + b"\x00"

    def page_key(self, user, page: int) -> bytes:
        return self.prefix(user) + bytes([PAGE_TAG]) + int(page).to_bytes(4, "big")

    def chunk_key(self, user, chunk: int, group: int) -> bytes:
        return self.prefix(user) + b"\x01" + int(chunk).to_bytes(4, "big") + bytes([group])


def _split(buf: bytes, width: int) -> list[bytes]:
    return [buf[i : i + width] for i in range(0, len(buf), width)]


# ------------------------------------------------------------- the interface
class SortedFileWriter(Protocol):
    """Writes one immutable sorted file; keys must be strictly ascending."""

    def put(self, key: bytes, value: bytes) -> None: ...

    def finish(self) -> int:
        """Close the file; returns its size in bytes."""
        ...


class StoreReader(Protocol):
    """A servable store: batched point reads only."""

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]: ...

    def close(self) -> None: ...


class StoreBackend(ABC):
    """What the sequence layer needs from a key-value store (see the module docstring)."""

    name: str = "?"

    @abstractmethod
    def writer(self, path: str) -> SortedFileWriter: ...

    @abstractmethod
    def assemble(self, db_dir: str, layers: Sequence[Sequence[str]]) -> None:
        """Bulk-load ``layers`` of sorted files into a new store at ``db_dir``; later layers win."""

    @abstractmethod
    def open(self, db_dir: str) -> StoreReader: ...

    def describe(self) -> dict:
        return {"backend": self.name}


# ------------------------------------------------------------------ RocksDB
class _RocksWriter:
    def __init__(self, path: str, options) -> None:
        from rocksdict import SstFileWriter

        self.path = path
        self._w = SstFileWriter(options=options)
        self._w.open(path)
        self._n = 0

    def put(self, key: bytes, value: bytes) -> None:
        self._w[key] = value
        self._n += 1

    def finish(self) -> int:
        if self._n == 0:  # RocksDB refuses to finish an empty file
            return 0
        self._w.finish()
        return os.path.getsize(self.path)


class _RocksReader:
    def __init__(self, db) -> None:
        self._db = db
        self._lock = threading.Lock()

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        return self._db[keys]  # RocksDB MultiGet; releases the GIL

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None


class RocksDBBackend(StoreBackend):
    """The embedded default: SST files bulk-loaded into RocksDB through rocksdict.

    ``compression`` is ``lz4`` (CPU-bound serving) or ``zstd`` (IO- or
    space-bound); ``block_size`` trades read amplification against index
    size; ``cache_mb`` is the block cache of each open store.

    ``zstd_level`` and ``zstd_dict_bytes``: a dictionary trained per file lets
    each block start from what the file's blocks share. Measured on 400K
    synthetic events (bytes an event / build CPU s): no dictionary, level 3
    14.1 / 0.2; dictionary at level 3, 9 (default), 15: 13.5 / 0.3, 13.4 /
    0.5, 13.0 / 1.0; warm lookups alike (cached blocks are uncompressed).
    ``None``/0: RocksDB's defaults, as recorded by builds made before these.
    """

    name = "rocksdb"
    DEFAULT_ZSTD_LEVEL = 9
    DEFAULT_ZSTD_DICT_BYTES = 16 * 1024

    def __init__(self, compression: str = "zstd", block_size: int = 16 * 1024, cache_mb: int = 256, bloom_bits: int = 10,
                 zstd_level: int | None = DEFAULT_ZSTD_LEVEL, zstd_dict_bytes: int = DEFAULT_ZSTD_DICT_BYTES) -> None:
        if compression not in ("lz4", "zstd", "none"):
            raise FeatureLakeError(f"compression must be lz4, zstd or none, not {compression!r}")
        if zstd_level is not None and not (isinstance(zstd_level, int) and -7 <= zstd_level <= 22):
            raise FeatureLakeError(f"zstd_level must be an int between -7 and 22 or None, not {zstd_level!r}")
        if not (isinstance(zstd_dict_bytes, int) and 0 <= zstd_dict_bytes <= 1 << 20):
            raise FeatureLakeError(f"zstd_dict_bytes must be an int between 0 and 2**20, not {zstd_dict_bytes!r}")
        self.compression = compression
        self.block_size = int(block_size)
        self.cache_mb = int(cache_mb)
        self.bloom_bits = int(bloom_bits)
        zstd = compression == "zstd"
        self.zstd_level = zstd_level if zstd else None
        self.zstd_dict_bytes = int(zstd_dict_bytes) if zstd else 0

    def describe(self) -> dict:
        out = {"backend": self.name, "compression": self.compression, "block_size": self.block_size}
        if self.zstd_level is not None:
            out["zstd_level"] = self.zstd_level
        if self.zstd_dict_bytes:
            out["zstd_dict_bytes"] = self.zstd_dict_bytes
        return out

    def _options(self, for_read: bool = False):
        from rocksdict import BlockBasedOptions, Cache, DBCompressionType, Options

        opt = Options(raw_mode=True)
        opt.set_disable_auto_compactions(True)
        table = BlockBasedOptions()
        table.set_block_size(self.block_size)
        table.set_bloom_filter(self.bloom_bits, False)
        if for_read:
            table.set_block_cache(Cache(self.cache_mb << 20))
            opt.set_max_open_files(-1)
        opt.set_block_based_table_factory(table)
        opt.set_compression_type(
            {"lz4": DBCompressionType.lz4, "zstd": DBCompressionType.zstd, "none": DBCompressionType.none}[self.compression]()
        )
        if not for_read and (self.zstd_level is not None or self.zstd_dict_bytes):
            # (window bits, level, strategy, dictionary bytes); 32767 is RocksDB's "library default" level
            opt.set_compression_options(-14, 32767 if self.zstd_level is None else self.zstd_level, 0, self.zstd_dict_bytes)
            if self.zstd_dict_bytes:
                opt.set_zstd_max_train_bytes(self.zstd_dict_bytes * 100)
        return opt

    def writer(self, path: str) -> SortedFileWriter:
        return _RocksWriter(path, self._options())

    def assemble(self, db_dir: str, layers: Sequence[Sequence[str]]) -> None:
        from rocksdict import IngestExternalFileOptions, Rdict

        stage = Path(f"{db_dir}.stage")
        stage.mkdir(parents=True, exist_ok=True)
        db = Rdict(db_dir, self._options())
        try:
            for i, layer in enumerate(layers):
                links = []
                for j, src in enumerate(p for p in layer if os.path.getsize(p) > 0):
                    dst = stage / f"{i:04d}-{j:05d}.sst"
                    _link_or_copy(src, str(dst))
                    links.append(str(dst))
                if not links:
                    continue
                ingest = IngestExternalFileOptions()
                ingest.set_move_files(True)  # link into the db; the staged link is removed
                db.ingest_external_file(links, ingest)
        finally:
            db.close()
            shutil.rmtree(stage, ignore_errors=True)

    def open(self, db_dir: str) -> StoreReader:
        from rocksdict import AccessType, Rdict

        opt = self._options(for_read=True)
        try:
            # column_families must be given: otherwise rocksdict takes the default family's table
            # options (block cache, bloom filter) from the stored OPTIONS file and the cache set here
            # is silently ignored (8 MiB instead of cache_mb; measured, rocksdict 0.3.29).
            db = Rdict(db_dir, opt, column_families={"default": opt}, access_type=AccessType.read_only())
        except Exception as e:  # rocksdict raises a plain Exception
            raise CorruptFileError(f"cannot open sequence store {db_dir}: {e}", db_dir) from e
        return _RocksReader(db)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not supported: copy
        shutil.copyfile(src, dst)


def backend_from_dict(d: dict) -> StoreBackend:
    """The backend a build was written with (its ``build.json`` ``store`` entry)."""
    kind = d.get("backend", "rocksdb")
    if kind != "rocksdb":
        raise FeatureLakeError(f"unknown sequence store backend {kind!r}")
    return RocksDBBackend(compression=d.get("compression", "zstd"), block_size=int(d.get("block_size", 16384)),
                          zstd_level=d.get("zstd_level"), zstd_dict_bytes=int(d.get("zstd_dict_bytes", 0)))


# ------------------------------------------------------------ reader cache
class _ReaderCache:
    """Open stores by folder: opening RocksDB costs milliseconds, a lookup microseconds."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self.items: OrderedDict[str, StoreReader] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, db_dir: str, backend: StoreBackend) -> StoreReader:
        with self.lock:
            reader = self.items.get(db_dir)
            if reader is not None:
                self.items.move_to_end(db_dir)
                return reader
            reader = backend.open(db_dir)
            self.items[db_dir] = reader
            while len(self.items) > self.size:
                # Dropped, not closed: a view in another thread may still read it;
                # the handle closes when its last user lets go.
                self.items.popitem(last=False)
            return reader

    def drop(self, db_dir: str) -> None:
        with self.lock:
            reader = self.items.pop(db_dir, None)
        if reader is not None:
            reader.close()


READERS = _ReaderCache()


def write_json_atomic(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, sort_keys=True))
    os.replace(tmp, path)


def dir_bytes(paths: Iterable[str]) -> int:
    total = 0
    for p in paths:
        try:
            total += os.path.getsize(p)
        except OSError:
            pass
    return total


# ------------------------------------------------------------ chunk codecs
#
# A chunk value holds one column group's events of one (user, chunk). Two
# encodings, chosen per group at build time and recorded in the build:
#
# * ``ipc``: an Arrow RecordBatch IPC message (any types, nested included;
#   the schema is stored once per build). Decoding costs ~5 us per message.
# * ``fixed``: for groups of fixed-width columns (ints, floats, timestamps,
#   dates, bools) and low-cardinality strings (dictionary codes, the
#   dictionary kept in the build record): every column padded to
#   ``chunk_events`` values, column after column, then one validity byte per
#   value for nullable columns. Every value of a group has the same size, so
#   a whole batch of values decodes with one ``join`` and numpy views -- no
#   per-value work. Padding is zeros, which RocksDB's compression erases.
#   Multi-byte columns are byte-shuffled (byte planes, as Blosc does) and the
#   time column is delta-coded first: zstd then stores sorted timestamps in
#   ~4.7 instead of ~6.8 bytes (measured); undoing both is a vectorized
#   transpose and cumsum over the whole batch.

DICT_MAX = 4096


def fixed_dtype(t: pa.DataType) -> np.dtype | None:
    """The numpy dtype a fixed-width Arrow type is stored as, or None."""
    if pa.types.is_boolean(t):
        return np.dtype(np.uint8)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return np.dtype(t.to_pandas_dtype())
    if pa.types.is_timestamp(t) or pa.types.is_date64(t) or pa.types.is_duration(t):
        return np.dtype(np.int64)
    if pa.types.is_date32(t) or pa.types.is_time32(t):
        return np.dtype(np.int32)
    if pa.types.is_time64(t):
        return np.dtype(np.int64)
    return None


def is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


class IpcCodec:
    kind = "ipc"

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def to_dict(self) -> dict:
        return {"kind": self.kind}

    def encoder(self, tbl: pa.Table):
        """A function (offset, length) -> value over ``tbl`` (already in the group's schema)."""
        part = tbl.combine_chunks()
        batch = part.to_batches()[0] if part.num_rows else None
        return lambda off, ln: batch.slice(off, ln).serialize().to_pybytes()

    def decode(self, values: list[bytes], counts: np.ndarray, chunk_events: int) -> pa.Table:
        batches = [pa.ipc.read_record_batch(pa.py_buffer(v), self.schema) for v in values]
        return pa.Table.from_batches(batches, schema=self.schema)


class FixedCodec:
    kind = "fixed"

    def __init__(self, schema: pa.Schema, chunk_events: int, dictionaries: dict[str, list[str]],
                 delta: Sequence[str] = ()) -> None:
        self.schema = schema
        self.c = int(chunk_events)
        self.delta = [d for d in delta if d in schema.names and fixed_dtype(schema.field(d).type) is not None
                      and np.issubdtype(fixed_dtype(schema.field(d).type), np.signedinteger)]
        self.dictionaries = {k: list(v) for k, v in dictionaries.items()}
        self._dict_arrays = {k: pa.array(v, type=schema.field(k).type) for k, v in self.dictionaries.items()}
        self.layout: dict[str, tuple[int, np.dtype, int | None]] = {}  # name -> (offset, dtype, validity offset)
        off = 0
        for f in schema:
            dt = np.dtype(np.uint16) if f.name in self.dictionaries else fixed_dtype(f.type)
            if dt is None:
                raise FeatureLakeError(f"column {f.name} ({f.type}) cannot use the fixed chunk codec")
            self.layout[f.name] = (off, dt, None)
            off += self.c * dt.itemsize
        for f in schema:
            if f.nullable:
                o, dt, _ = self.layout[f.name]
                self.layout[f.name] = (o, dt, off)
                off += self.c
        self.size = off

    @classmethod
    def plan(cls, schema: pa.Schema, chunk_events: int, uniques: dict[str, list[str] | None],
             delta: Sequence[str] = ()) -> "FixedCodec | None":
        """The fixed codec for ``schema`` when every column fits (strings: at most DICT_MAX values)."""
        dicts = {}
        for f in schema:
            if is_string(f.type):
                vals = uniques.get(f.name)
                if vals is None or len(vals) > DICT_MAX:
                    return None
                dicts[f.name] = sorted(vals)
            elif fixed_dtype(f.type) is None:
                return None
        return cls(schema, chunk_events, dicts, delta)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "dictionaries": self.dictionaries, "delta": self.delta}

    def extended(self, uniques: dict[str, list[str] | None]) -> "FixedCodec | None":
        """This codec with new dictionary values appended (old codes stay valid), or None if too many."""
        dicts = {}
        for name, old in self.dictionaries.items():
            new = uniques.get(name)
            if new is None:
                return None
            known = set(old)
            merged = old + sorted(v for v in new if v not in known)
            if len(merged) > DICT_MAX:
                return None
            dicts[name] = merged
        return FixedCodec(self.schema, self.c, dicts, self.delta)

    def encoder(self, tbl: pa.Table):
        cols: list[tuple[np.ndarray, int]] = []
        valids: list[np.ndarray] = []
        for f in self.schema:
            col = tbl.column(f.name).combine_chunks()
            _, dt, voff = self.layout[f.name]
            if f.name in self.dictionaries:
                codes = pa.compute.index_in(col, value_set=self._dict_arrays[f.name])
                if codes.null_count > col.null_count:
                    raise FeatureLakeError(f"a value of {f.name} is missing from the build's dictionary")
                arr = codes.fill_null(0).to_numpy(zero_copy_only=False).astype(dt)
            else:
                filled = col.fill_null(False if pa.types.is_boolean(f.type) else 0) if col.null_count else col
                if pa.types.is_boolean(f.type):
                    filled = filled.cast(pa.uint8())
                elif not (pa.types.is_integer(f.type) or pa.types.is_floating(f.type)):
                    filled = filled.view(pa.int64() if dt.itemsize == 8 else pa.int32())
                arr = np.ascontiguousarray(filled.to_numpy(zero_copy_only=False), dtype=dt)
            cols.append((arr, dt.itemsize, f.name in self.delta))
            if voff is not None:
                valids.append(np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=np.uint8))
        c = self.c

        def encode(off: int, ln: int) -> bytes:
            parts = []
            for arr, w, delta in cols:
                x = arr[off : off + ln]
                if delta:
                    x = np.diff(x, prepend=x.dtype.type(0))
                if ln < c:
                    x = np.concatenate([x, np.zeros(c - ln, x.dtype)])
                parts.append(np.ascontiguousarray(x.view(np.uint8).reshape(c, w).T).tobytes() if w > 1 else x.tobytes())
            for v in valids:
                parts.append(v[off : off + ln].tobytes())
                if ln < c:
                    parts.append(bytes(c - ln))
            return b"".join(parts)

        return encode

    def alloc(self, names: Sequence[str], pairs: int) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """Empty padded columns for ``pairs`` values (``chunk_events`` slots each), to decode into."""
        out = {}
        for name in names:
            _, dt, voff = self.layout[name]
            out[name] = (np.empty(pairs * self.c, dt), None if voff is None else np.empty(pairs * self.c, np.bool_))
        return out

    def decode_into(self, values: list[bytes], names: Sequence[str], out: dict[str, tuple[np.ndarray, np.ndarray | None]],
                    first: int, rows: np.ndarray | None = None) -> int:
        """Decode ``values`` straight into ``out`` (from :meth:`alloc`) at value slots ``first``...

        ``rows`` (positions into ``values``) decodes only those values, each
        into slot ``first + position``. Byte planes are copied plane by plane
        into the output's bytes (no intermediate array); returns bytes decoded.
        """
        joined = b"".join(values)
        if len(joined) != len(values) * self.size:
            raise CorruptFileError("a fixed-size sequence chunk has the wrong size (store damaged?)")
        grid = np.frombuffer(joined, np.uint8).reshape(len(values), self.size)
        if rows is not None:
            grid = grid[rows]
        p, c = len(grid), self.c
        decoded = 0
        for name in names:
            off, dt, voff = self.layout[name]
            w = dt.itemsize
            vals, valid = out[name]
            if rows is None:
                target = vals[first * c : (first + p) * c].reshape(p, c)
            else:
                target = np.empty((p, c), dt)
            planes = grid[:, off : off + c * w]
            if w > 1:  # byte planes back to values, one plane at a time into the target's bytes
                tb = target.view(np.uint8).reshape(p, c, w)
                for b in range(w):
                    tb[:, :, b] = planes[:, b * c : (b + 1) * c]
            else:
                target.view(np.uint8)[...] = planes
            if name in self.delta:
                np.cumsum(target, axis=1, dtype=dt, out=target)
            if rows is not None:
                vals.reshape(-1, c)[first + rows] = target
            decoded += p * c * w
            if valid is not None:
                flags = grid[:, voff : voff + c].view(np.bool_)
                if rows is None:
                    valid[first * c : (first + p) * c].reshape(p, c)[...] = flags
                else:
                    valid.reshape(-1, c)[first + rows] = flags
                decoded += p * c
        return decoded

    def decode_padded(self, values: list[bytes], names: Sequence[str]) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
        """Columns over all values, ``chunk_events`` slots per value: name -> (values, validity or None)."""
        out = self.alloc(names, len(values))
        self.decode_into(values, names, out, 0)
        return out

    def to_arrow(self, name: str, vals: np.ndarray, valid: np.ndarray | None) -> pa.Array:
        """One column from decoded values (zero-copy for fixed-width types) and validity flags."""
        f = self.schema.field(name)
        n = len(vals)
        bitmap = None
        if valid is not None and not valid.all():
            bitmap = pa.py_buffer(np.packbits(valid, bitorder="little"))
        if name in self.dictionaries:
            codes = pa.Array.from_buffers(pa.uint16(), n, [bitmap, pa.py_buffer(np.ascontiguousarray(vals))])
            return self._dict_arrays[name].take(codes)
        if pa.types.is_boolean(f.type):
            data = np.packbits(vals.view(np.bool_), bitorder="little")
            return pa.Array.from_buffers(pa.bool_(), n, [bitmap, pa.py_buffer(data)])
        return pa.Array.from_buffers(f.type, n, [bitmap, pa.py_buffer(np.ascontiguousarray(vals))])

    def decode(self, values: list[bytes], counts: np.ndarray, chunk_events: int) -> pa.Table:
        cols = self.decode_padded(values, self.schema.names)
        keep = (np.arange(self.c)[None, :] < np.asarray(counts)[:, None]).reshape(-1)
        arrays = [self.to_arrow(n, v[keep], None if m is None else m[keep]) for n, (v, m) in cols.items()]
        return pa.Table.from_arrays(arrays, schema=self.schema)


def codec_from_dict(d: dict, schema: pa.Schema, chunk_events: int):
    """The fixed or IPC codec a build recorded (``packed``: see :func:`featurelake.sequences.buildinfo.codec_of`)."""
    kind = d.get("kind", "ipc")
    if kind == "fixed":
        return FixedCodec(schema, chunk_events, d.get("dictionaries", {}), d.get("delta", ()))
    if kind != "ipc":
        raise CorruptFileError(f"unknown sequence chunk codec {kind!r} (a build written by a newer featurelake?)")
    return IpcCodec(schema)
