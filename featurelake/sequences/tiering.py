"""Tiered sequence stores: older chunks as cold segments on the lake's storage, fetched on demand through a local cache.

Why: at lifetime-length histories most of a user's chunks are old and
rarely read, yet a plain build keeps every one of them in RocksDB on the
serving machine's disk. A build made with ``tier_after=N``
(``SequenceTable.build``) keeps each user's head, head pages and newest
``N`` chunks in RocksDB (*hot*) and writes every older chunk value, bytes
exactly as the store would hold them, into immutable *cold segments* on the
lake's own storage (the table's location: S3 for an S3 lake), recorded in
the build. RocksDB keeps, per cold (chunk, group), a 16-byte *pointer*
(tag ``0x03``; key ``prefix + 0x03 + chunk (u32 BE) + group (u8)``):
segment number, offset, length.

Reading (:class:`TieredReader`) stays one ``multi_get``: keys RocksDB
answers are hot; for chunk keys it misses, the pointers are read in one more
multi-get and the values come from the segments through :class:`ColdCache`:
segments are cut into ``BLOCK_BYTES`` blocks, missing blocks are fetched as
coalesced ranged reads (one request per run of adjacent blocks), kept in a
bounded in-memory LRU and on a bounded local disk cache (``<store root>/.cold-cache``),
so a repeated lookup makes no request. Segments never change (a build's
segments have fresh names), so a cached block never goes stale. A lookup
returns the same values with and without tiering: only where the bytes come
from differs.

Segment files: an object store serving an Iceberg catalog accepts only
Iceberg file types under a table's folder, so a segment is a real Parquet
file (one row, one uncompressed PLAIN ``binary`` column holding the
concatenated values) under ``data/_featurelake/sequences-cold/<build id>/``;
the build records where the column's bytes start in the file, and pointers
address bytes from there. Any Parquet reader can open one.

Incremental builds reference the segments of the build they extend (their
new layer is all hot: new events are recent); garbage collection
(:mod:`featurelake.gc`) keeps the segments of every build still on disk and
deletes the others once older than its grace period.
"""
from __future__ import annotations

import hashlib
import os
import struct
import threading
import uuid
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from featurelake.errors import CorruptFileError, FeatureLakeError

COLD_TAG = 0x03
COLD_DIR = "sequences-cold"       # under the table's platform folder (data/_featurelake)
SEGMENT_BYTES = 64 << 20          # a segment rolls over past this many value bytes
BLOCK_BYTES = 64 << 10            # cache and fetch unit
GAP_BLOCKS = 2                    # missing blocks this close are fetched in one ranged read
MEMORY_CACHE_BYTES = 64 << 20     # in-process block LRU
DISK_CACHE_BYTES = int(os.environ.get("FEATURELAKE_COLD_CACHE_BYTES", 2 << 30))  # local disk cache bound
FRAME_BYTES = 32 << 10            # values compressed together (zstd), at most one user's
FRAME_LEVEL = 3
FRAME_MEMORY_BYTES = 32 << 20     # in-process LRU of decompressed frames
# segment number, frame offset in the segment's values, frame bytes, frame raw bytes, value offset in the raw frame,
# value length, crc32 of the value
_PTR = struct.Struct("<IQIIIII")


def cold_dir(table_location: str, build_id: str) -> str:
    """Where build ``build_id`` writes its cold segments on the lake's storage."""
    from featurelake.storage import platform_dir

    return f"{platform_dir(table_location)}/{COLD_DIR}/{build_id}"


# ================================================================= writing
class SegmentWriter:
    """Collects a build's cold chunk values into zstd frames and segments (local files first, then :meth:`upload`).

    Values are appended per user (:meth:`add`, then :meth:`end_user`): a frame
    closes at ``FRAME_BYTES`` of values or at the end of a user's cold chunks,
    so one user's chunks share frames (a lookup reads consecutive chunks of a
    user) and no frame mixes users needlessly. Compressed per frame, the
    values shrink as RocksDB's own block compression would shrink them.
    """

    def __init__(self, folder: Path, first_index: int) -> None:
        self.folder = folder
        self.first_index = first_index
        self._parts: list[list[bytes]] = [[]]   # compressed frames per segment
        self._size = 0                          # bytes of the current segment
        self._frame: list[bytes] = []           # values of the open frame
        self._frame_raw = 0
        self._pending: list[tuple[int, int, int, int]] = []  # (frame slot, offset in frame, length, crc32): this user's
        self._closed: list[tuple[int, int, int, int]] = []  # per frame slot: (segment, offset, compressed, raw)
        self._codec = pa.Codec("zstd", FRAME_LEVEL)
        self.values = 0
        self.bytes = 0
        self.raw_bytes = 0
        self.local: list[tuple[Path, int]] = []  # (file, where the values start in it)

    def add(self, value: bytes) -> None:
        """Append one chunk value of the current user (its pointer comes from :meth:`end_user`)."""
        self._pending.append((len(self._closed), self._frame_raw, len(value), zlib.crc32(value)))
        self._frame.append(value)
        self._frame_raw += len(value)
        self.values += 1
        self.raw_bytes += len(value)
        if self._frame_raw >= FRAME_BYTES:
            self._close_frame()

    def _close_frame(self) -> None:
        if not self._frame:
            return
        raw = b"".join(self._frame)
        comp = self._codec.compress(raw, asbytes=True)
        if self._size + len(comp) > SEGMENT_BYTES and self._size:
            self._parts.append([])
            self._size = 0
        self._closed.append((self.first_index + len(self._parts) - 1, self._size, len(comp), len(raw)))
        self._parts[-1].append(comp)
        self._size += len(comp)
        self.bytes += len(comp)
        self._frame, self._frame_raw = [], 0

    def end_user(self) -> list[bytes]:
        """Close the user's last frame; the pointers (RocksDB values) of the values added since the last call."""
        self._close_frame()
        out = []
        for slot, off, ln, crc in self._pending:
            seg, foff, clen, rawlen = self._closed[slot]
            out.append(_PTR.pack(seg, foff, clen, rawlen, off, ln, crc))
        self._pending = []
        return out

    def finish(self) -> list[tuple[Path, int]]:
        """Write the segments as Parquet files; returns (file, value offset) per segment."""
        self._close_frame()
        self.folder.mkdir(parents=True, exist_ok=True)
        for i, part in enumerate(p for p in self._parts if p):
            blob = b"".join(part)
            path = self.folder / f"seg-{i:05d}.parquet"
            _write_segment(path, blob)
            self.local.append((path, _value_offset(path, blob)))
        self._parts = [[]]
        return self.local

    def upload(self, storage: Any, location: str) -> list[dict]:
        """Copy the written segments to ``location`` on the lake's storage; their build-record entries."""
        out = []
        for path, base in self.local:
            uri = f"{location}/{path.name}"
            with storage.write_new(uri) as dst, open(path, "rb") as src:
                while True:
                    buf = src.read(8 << 20)
                    if not buf:
                        break
                    dst.write(buf)
            out.append({"path": uri, "bytes": path.stat().st_size, "base": base})
            path.unlink()
        return out


def _write_segment(path: Path, blob: bytes) -> None:
    table = pa.table({"values": pa.array([blob], pa.large_binary())})
    pq.write_table(table, str(path), compression="none", use_dictionary=False, write_statistics=False,
                   data_page_version="1.0", store_schema=False)


def _value_offset(path: Path, blob: bytes) -> int:
    """Where ``blob`` starts in the Parquet file (it is stored verbatim: uncompressed PLAIN)."""
    meta = pq.ParquetFile(str(path)).metadata
    start = meta.row_group(0).column(0).data_page_offset
    data = path.read_bytes()
    probe = blob[:64]
    at = data.find(probe, start)
    if at < 0 or data[at : at + len(blob)] != blob:
        raise FeatureLakeError(f"cold segment {path}: its values are not stored verbatim")
    return at


# ================================================================= reading
class ColdCache:
    """Blocks of cold segments: in memory (LRU), on a local disk folder (bounded), else fetched (coalesced)."""

    def __init__(self, folder: Path | None, memory_bytes: int = MEMORY_CACHE_BYTES,
                 disk_bytes: int = DISK_CACHE_BYTES) -> None:
        self.folder = folder
        self.memory_bytes = memory_bytes
        self.disk_bytes = disk_bytes
        self._mem: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._mem_size = 0
        self._frames: OrderedDict[tuple[str, int], bytes] = OrderedDict()  # decompressed frames
        self._frames_size = 0
        self._disk_size: int | None = None
        self._lock = threading.Lock()
        self.fetches = 0          # ranged reads made (tests, benchmarks)
        self.fetched_bytes = 0

    def drop_memory(self) -> None:
        """Forget the in-memory layers only (as a new process would start: the disk cache stays)."""
        with self._lock:
            self._mem.clear()
            self._mem_size = 0
            self._frames.clear()
            self._frames_size = 0

    def clear(self) -> None:
        """Forget every cached block, in memory and on disk (benchmarks, tests; segments are never stale)."""
        import shutil

        with self._lock:
            self._mem.clear()
            self._mem_size = 0
            self._frames.clear()
            self._frames_size = 0
            self._disk_size = None
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    # -------------------------------------------------------------- blocks
    def _disk_path(self, seg: str, block: int) -> Path | None:
        if self.folder is None:
            return None
        return self.folder / hashlib.sha1(seg.encode()).hexdigest()[:20] / f"{block:08d}"

    def _get(self, seg: str, block: int) -> bytes | None:
        with self._lock:
            data = self._mem.get((seg, block))
            if data is not None:
                self._mem.move_to_end((seg, block))
                return data
        p = self._disk_path(seg, block)
        if p is None:
            return None
        try:
            data = p.read_bytes()
        except OSError:
            return None
        self._remember(seg, block, data)
        return data

    def _remember(self, seg: str, block: int, data: bytes) -> None:
        with self._lock:
            if (seg, block) in self._mem:
                return
            self._mem[(seg, block)] = data
            self._mem_size += len(data)
            while self._mem_size > self.memory_bytes and self._mem:
                _, old = self._mem.popitem(last=False)
                self._mem_size -= len(old)

    def _store(self, seg: str, block: int, data: bytes) -> None:
        self._remember(seg, block, data)
        p = self._disk_path(seg, block)
        if p is None:
            return
        try:
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = p.with_name(f".{p.name}.{uuid.uuid4().hex[:8]}")
            tmp.write_bytes(data)
            os.replace(tmp, p)
        except OSError:
            return  # a full or read-only disk: the memory layer still serves
        with self._lock:
            if self._disk_size is None:
                self._disk_size = sum(f.stat().st_size for f in self.folder.rglob("*") if f.is_file())
            else:
                self._disk_size += len(data)
            over = self._disk_size > self.disk_bytes
        if over:
            self._evict()

    def _evict(self) -> None:
        """Delete the least recently written blocks until the disk cache is under 90% of its bound."""
        files = []
        for f in self.folder.rglob("*"):
            try:
                st = f.stat()
            except OSError:
                continue
            if f.is_file():
                files.append((st.st_mtime, st.st_size, f))
        files.sort()
        total = sum(s for _, s, _ in files)
        for _, size, f in files:
            if total <= self.disk_bytes * 0.9:
                break
            try:
                f.unlink()
                total -= size
            except OSError:
                pass
        with self._lock:
            self._disk_size = total

    # ------------------------------------------------------------- reading
    def read(self, storage: Any, segments: list[dict], pointers: list[tuple]) -> list[bytes]:
        """The values the unpacked ``pointers`` address: frames from memory, else their bytes through the block cache."""
        frames: dict[tuple[int, int], bytes] = {}
        missing: dict[tuple[int, int], tuple[int, int]] = {}
        for seg_no, foff, clen, rawlen, _, _, _ in pointers:
            if seg_no >= len(segments):
                raise CorruptFileError(f"a cold pointer names segment {seg_no}; the build records {len(segments)}", "")
            key = (seg_no, foff)
            if key in frames or key in missing:
                continue
            with self._lock:
                raw = self._frames.get((segments[seg_no]["path"], foff))
                if raw is not None:
                    self._frames.move_to_end((segments[seg_no]["path"], foff))
            if raw is not None:
                frames[key] = raw
            else:
                missing[key] = (clen, rawlen)
        if missing:
            order = list(missing)
            got = self._ranges(storage, segments, [(s_, f_, missing[(s_, f_)][0]) for s_, f_ in order])
            codec = pa.Codec("zstd")
            for key, comp in zip(order, got):
                path = segments[key[0]]["path"]
                rawlen = missing[key][1]
                try:
                    raw = codec.decompress(comp, rawlen, asbytes=True)
                except (OSError, ValueError, pa.ArrowException) as e:
                    raise CorruptFileError(f"cold segment {path} is damaged (a frame does not decompress: {e})", path) from e
                frames[key] = raw
                with self._lock:
                    self._frames[(path, key[1])] = raw
                    self._frames_size += len(raw)
                    while self._frames_size > FRAME_MEMORY_BYTES and self._frames:
                        _, old = self._frames.popitem(last=False)
                        self._frames_size -= len(old)
        out = []
        for seg_no, foff, _, _, voff, vlen, crc in pointers:
            value = frames[(seg_no, foff)][voff : voff + vlen]
            if len(value) != vlen or zlib.crc32(value) != crc:
                path = segments[seg_no]["path"]
                raise CorruptFileError(f"cold segment {path} is damaged (a value's checksum differs)", path)
            out.append(value)
        return out

    def _ranges(self, storage: Any, segments: list[dict], wants: list[tuple[int, int, int]], threads: int = 8) -> list[bytes]:
        """The bytes of each (segment number, offset, length) in ``wants`` (offsets from the segment's values)."""
        need: dict[int, set[int]] = {}
        have: dict[tuple[int, int], bytes] = {}
        for seg_no, off, ln in wants:
            if seg_no >= len(segments):
                raise CorruptFileError(f"a cold pointer names segment {seg_no}; the build records {len(segments)}", "")
            base = segments[seg_no]["base"]
            for b in range((base + off) // BLOCK_BYTES, (base + off + ln - 1) // BLOCK_BYTES + 1):
                if (seg_no, b) in have:
                    continue
                data = self._get(segments[seg_no]["path"], b)
                if data is None:
                    need.setdefault(seg_no, set()).add(b)
                else:
                    have[(seg_no, b)] = data
        runs = []
        for seg_no, blocks in need.items():
            blocks_sorted = sorted(blocks)
            start = prev = blocks_sorted[0]
            for b in blocks_sorted[1:]:
                if b - prev > GAP_BLOCKS:
                    runs.append((seg_no, start, prev))
                    start = b
                prev = b
            runs.append((seg_no, start, prev))

        def fetch(run: tuple[int, int, int]) -> list[tuple[tuple[int, int], bytes]]:
            seg_no, b0, b1 = run
            seg = segments[seg_no]
            size = int(seg["bytes"])
            lo, hi = b0 * BLOCK_BYTES, min(size, (b1 + 1) * BLOCK_BYTES)
            try:
                data = _read_range(storage, seg["path"], size, lo, hi - lo)
            except FileNotFoundError as e:
                raise CorruptFileError(f"cold segment {seg['path']} is missing", seg["path"]) from e
            except OSError as e:
                raise CorruptFileError(f"cold segment {seg['path']} cannot be read: {e}", seg["path"]) from e
            if len(data) != hi - lo:
                raise CorruptFileError(f"cold segment {seg['path']} is shorter than recorded ({size} bytes)", seg["path"])
            with self._lock:
                self.fetches += 1
                self.fetched_bytes += len(data)
            out = []
            for b in range(b0, b1 + 1):
                piece = data[(b - b0) * BLOCK_BYTES : (b - b0 + 1) * BLOCK_BYTES]
                if piece:
                    out.append(((seg_no, b), piece))
            return out

        if runs:
            results = list(_pool().map(fetch, runs)) if len(runs) > 1 and threads > 1 else [fetch(r) for r in runs]
            for got in results:
                for (seg_no, b), piece in got:
                    self._store(segments[seg_no]["path"], b, piece)
                    have[(seg_no, b)] = piece
        out = []
        for seg_no, off, ln in wants:
            pos = segments[seg_no]["base"] + off
            b0, b1 = pos // BLOCK_BYTES, (pos + ln - 1) // BLOCK_BYTES
            if b0 == b1:
                s = pos - b0 * BLOCK_BYTES
                out.append(have[(seg_no, b0)][s : s + ln])
            else:
                joined = b"".join(have[(seg_no, b)] for b in range(b0, b1 + 1))
                s = pos - b0 * BLOCK_BYTES
                out.append(joined[s : s + ln])
        return out


def _read_range(storage: Any, uri: str, size: int, offset: int, length: int) -> bytes:
    """``length`` bytes at ``offset``: on S3 one signed ranged GET (no HEAD), else a ranged read of the file."""
    import pyarrow.fs as pafs

    _, fs, path = storage.resolve(uri)
    if isinstance(fs, pafs.S3FileSystem):
        from featurelake.s3sign import get_object

        data = get_object(fs, path, length, offset=offset)
        if data is not None:
            return data
    with storage.open(uri, size=size, whole_below=0) as f:
        return f.read_at(length, offset)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="featurelake-cold")
        return _POOL


_CACHES: dict[str, ColdCache] = {}


def cache_for(folder: Path) -> ColdCache:
    """The process's cache of one local folder (shared by every store reading through it)."""
    key = str(folder)
    with _POOL_LOCK:
        found = _CACHES.get(key)
        if found is None:
            found = _CACHES[key] = ColdCache(folder)
        return found


class TieredReader:
    """A store reader that answers chunk keys RocksDB lacks from the build's cold segments."""

    def __init__(self, hot: Any, info: Any, io: Any, cache: ColdCache) -> None:
        self.hot = hot
        self.info = info
        self.io = io
        self.cache = cache
        self.segments = info.cold_segments

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        vals = self.hot.multi_get(keys)
        if None not in vals:
            return vals
        miss = [i for i, v in enumerate(vals) if v is None and len(keys[i]) >= 6 and keys[i][-6] == 0x01]
        if not miss:
            return vals
        ptr_keys = [keys[i][:-6] + bytes([COLD_TAG]) + keys[i][-5:] for i in miss]
        ptrs = self.hot.multi_get(ptr_keys)
        found = [(i, p) for i, p in zip(miss, ptrs) if p is not None]
        if not found:
            return vals
        if self.io is None:
            raise FeatureLakeError(
                f"build {self.info.build_id} keeps older chunks on the lake's storage; open it through its table "
                "(SequenceTable.open_store / lookup) so they can be read"
            )
        from featurelake.storage import storage_of

        wants = []
        for _, p in found:
            if len(p) != _PTR.size:
                raise CorruptFileError(f"sequence store {self.info.db_dir} holds a damaged cold pointer", self.info.db_dir)
            wants.append(_PTR.unpack(p))
        got = self.cache.read(storage_of(self.io), self.segments, wants)
        for (i, _), v in zip(found, got):
            vals[i] = v
        return vals

    def close(self) -> None:
        self.hot.close()


def cold_pointer_key(chunk_key: bytes) -> bytes:
    """The key of a cold chunk's pointer (the chunk key with tag 0x03)."""
    return chunk_key[:-6] + bytes([COLD_TAG]) + chunk_key[-5:]
