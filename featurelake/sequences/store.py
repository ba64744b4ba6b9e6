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
  one column group, in the group's codec: ``fixed`` or ``ipc``
  (:mod:`featurelake.sequences.codecs`) or ``packed``
  (:mod:`featurelake.sequences.packed`).
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
    """``buf`` cut into ``width``-byte keys: numpy's void items become ``bytes`` in one C loop (5x a slice per key)."""
    return np.frombuffer(buf, f"V{width}").tolist() if buf else []


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
