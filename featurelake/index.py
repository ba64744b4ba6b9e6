"""The global key index: primary key -> (data file, row position), kept in the lake.

Why not a key-value service: ByteDance keeps its index in the lake itself so
there is nothing extra to run, and so the index is versioned with the table.
Why not pyiceberg: it has no index, and its upsert rewrites whole files.

The index of a snapshot is a set of immutable *segments* listed in that
snapshot's platform state. A segment is a Parquet file of entries sorted by
index key (``k``: the int64 key, or a 64-bit hash of other keys; ``f``: file
number into the ``files`` list kept in the footer; ``p``: row position).

Layout, for an object store where a request costs ~10-50 ms and bytes cost
too (see ``_write``):

* **Buckets.** The sorted entries are cut into row groups of ``BUCKET_ROWS``
  entries; the footer keeps each row group's ``k`` min/max. A bucket is thus
  a contiguous range of the key space: for hashed keys a range of the hash,
  i.e. a hash bucket; for integer keys a key range, which keeps the locality
  of sample ids (appends of growing ids touch one bucket, and a range's keys
  and positions are nearly consecutive numbers). A probe reads the footer
  (cached: segments are immutable) and then only the row groups whose range
  holds one of its keys, in one coalesced ranged read (``pre_buffer``); 10
  keys read at most 10 buckets of one segment whatever the table's size.
* **Compression.** ``k`` and ``p`` are DELTA_BINARY_PACKED (sorted keys and
  in-file positions become deltas of a few bits: dense sample ids cost close
  to nothing), ``f`` is dictionary/RLE encoded (long runs of one file), all
  zstd on top; statistics only for ``k``. Measured: the index of a 2M-row,
  8-column table went from ~38% of the data's bytes (plain int64 + zstd) to
  under 1%.

Segments written before this layout (one row group without statistics, or an
Arrow IPC file) stay readable: a row group without statistics spans the
segment's whole ``[min, max]``, so it is read whole, as before.

Every write adds a segment for the data files it adds. Entries of files that
are no longer live at a snapshot (rewritten by delete, compaction, revert) are
simply ignored, so merge, rebase and revert keep the index right by taking the
union of segment lists. Segments are merged (dropping dead entries) when they
pile up, and ``rebuild`` makes one from the data alone. Live data files that no
segment covers (written by another engine) are found by scanning their key
columns, so lookups are correct even then; the files a segment covers are in
its footer, so finding them reads no entries.
"""
from __future__ import annotations

import json
import os
import threading
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO

from featurelake import sorting
from featurelake.errors import CorruptFileError
from featurelake.lru import LRU
from featurelake.storage import platform_dir, storage_of

if TYPE_CHECKING:
    from pyiceberg.table import Table as IcebergTable

MERGE_AT = 24  # merge segments once a snapshot references this many
BUCKET_ROWS = 32_768  # entries per row group: a probe reads whole buckets, the footer keeps one range per bucket
_FOOTERS = LRU(256)  # path -> _Segment (footer, bucket ranges, open file)
# (path, bucket) -> _Entries, ~0.65 MB each: the default holds the index of ~130M keys, so steady
# upserts into a large table do not re-read (and re-decode) every bucket they touch.
_BUCKETS = LRU(int(os.environ.get("FEATURELAKE_INDEX_CACHE_BUCKETS", "4096")))


def is_exact(key_types: Sequence[pa.DataType]) -> bool:
    """A single integer key is its own index key; anything else is hashed."""
    return len(key_types) == 1 and pa.types.is_integer(key_types[0])


def key_is_exact(schema, key_columns: Sequence[str]) -> bool:
    """Whether a table's primary key indexes exactly (a single integer column)."""
    from pyiceberg.types import IntegerType, LongType

    return len(key_columns) == 1 and isinstance(schema.find_field(key_columns[0]).field_type, (IntegerType, LongType))


def encode(keys: pa.Table) -> np.ndarray:
    """Index keys (int64) of the rows of ``keys`` (the primary-key columns)."""
    if is_exact([c.type for c in keys.columns]):
        return keys.column(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    frame = keys.to_pandas()
    return pd.util.hash_pandas_object(frame, index=False).to_numpy().view(np.int64)


@dataclass(frozen=True)
class Segment:
    path: str
    rows: int
    min: int
    max: int
    exact: bool
    bytes: int | None = None  # the file's size (saves an object store the HEAD); None in older states

    def as_dict(self) -> dict:
        d = {"path": self.path, "rows": self.rows, "min": self.min, "max": self.max, "exact": self.exact}
        if self.bytes is not None:
            d["bytes"] = self.bytes
        return d

    @staticmethod
    def of(d: dict) -> "Segment":
        size = d.get("bytes")
        return Segment(d["path"], int(d["rows"]), int(d["min"]), int(d["max"]), bool(d["exact"]),
                       int(size) if size is not None else None)


@dataclass(frozen=True)
class Entries:
    """Index entries: key ``k`` lives in ``files[f[i]]`` at row ``p[i]``, sorted by ``k``."""

    files: list[str]
    k: np.ndarray
    f: np.ndarray
    p: np.ndarray


def _column(table: pa.Table, name: str) -> np.ndarray:
    """A column as numpy without copying when it is one chunk."""
    col = table.column(name)
    chunk = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return chunk.to_numpy(zero_copy_only=False)


def _corrupt(path: str, e: BaseException) -> CorruptFileError:
    return CorruptFileError(f"key index segment {path} is missing or unreadable ({e}); rebuild it with rebuild_index()", path)


_READ_ERRORS = (OSError, ValueError, KeyError, pa.ArrowException)


def _identity(location: str) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of a local file, None on an object store. Files in the lake are
    never rewritten; one changed underneath must be re-read (and refused if damaged), never
    served from a cache or a memory map that would fault with SIGBUS."""
    local = location.removeprefix("file://") if location.startswith("file://") else (None if "://" in location else location)
    if local is None:
        return None
    try:
        st = os.stat(local)
    except OSError:  # deleted: what was read stays valid
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class _Segment:
    """An opened segment: its files, the key range of each bucket, and a reader for its buckets."""

    def __init__(self, io: FileIO, seg: Segment) -> None:
        self.path = seg.path
        self.lock = threading.Lock()
        self.identity = _identity(seg.path)
        try:
            if seg.path.endswith(".arrow"):  # segments written before they were Parquet
                table = pa.ipc.open_file(storage_of(io).map(seg.path)).read_all()
                self.parquet = None
                self.whole = table
                meta = table.schema.metadata or {}
                self.lo = np.array([seg.min], np.int64)
                self.hi = np.array([seg.max], np.int64)
            else:
                self.parquet = pq.ParquetFile(storage_of(io).open(seg.path, size=seg.bytes), pre_buffer=True)
                self.whole = None
                md = self.parquet.metadata
                meta = self.parquet.schema_arrow.metadata or {}
                k_index = self.parquet.schema_arrow.get_field_index("k")
                lo, hi = [], []
                for i in range(md.num_row_groups):
                    stats = md.row_group(i).column(k_index).statistics
                    has = stats is not None and stats.has_min_max
                    lo.append(stats.min if has else seg.min)  # older segments: one bucket spanning the segment
                    hi.append(stats.max if has else seg.max)
                self.lo = np.array(lo, np.int64)
                self.hi = np.array(hi, np.int64)
            self.files: list[str] = json.loads(meta[b"files"])
            self.runs: list[list[int]] | None = json.loads(meta[b"runs"]) if b"runs" in meta else None
            if self.runs is not None and len(self.runs) != len(self.files):
                raise ValueError(f"{len(self.runs)} key runs for {len(self.files)} files")
            sizes = [len(self.whole)] if self.whole is not None else [md.row_group(i).num_rows for i in range(md.num_row_groups)]
            self.offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])  # first entry of each bucket
            held = len(self.whole) if self.whole is not None else md.num_rows
        except _READ_ERRORS as e:
            raise _corrupt(seg.path, e) from e
        if held != seg.rows:
            raise CorruptFileError(f"key index segment {seg.path} holds {held} keys, its state says {seg.rows}; rebuild it with rebuild_index()", seg.path)

    def unchanged(self) -> bool:
        return self.identity is None or _identity(self.path) in (None, self.identity)

    def buckets_for(self, sorted_keys: np.ndarray) -> np.ndarray:
        """The buckets whose key range holds at least one of ``sorted_keys``."""
        a = np.searchsorted(sorted_keys, self.lo, side="left")
        b = np.searchsorted(sorted_keys, self.hi, side="right")
        return np.flatnonzero(b > a)

    def read(self, buckets: Sequence[int]) -> list[Entries]:
        """The entries of ``buckets`` (cached; the missing ones fetched in one coalesced read)."""
        out: dict[int, Entries] = {}
        missing = []
        for b in buckets:
            found = _BUCKETS.get((self.path, int(b)))
            if found is None:
                missing.append(int(b))
            else:
                out[int(b)] = found
        if missing:
            try:
                with self.lock:
                    if self.whole is not None:
                        parts = [self.whole]
                    else:
                        table = self.parquet.read_row_groups(missing, columns=["k", "f", "p"], use_threads=False)
                        sizes = [self.parquet.metadata.row_group(b).num_rows for b in missing]
                        starts = np.concatenate([[0], np.cumsum(sizes)])
                        parts = [table.slice(int(a), int(n)) for a, n in zip(starts[:-1], sizes)]
            except _READ_ERRORS as e:
                raise _corrupt(self.path, e) from e
            for b, part in zip(missing, parts):
                entries = Entries(self.files, _column(part, "k"), _column(part, "f"), _column(part, "p"))
                _BUCKETS.put((self.path, b), entries)
                out[b] = entries
        return [out[int(b)] for b in buckets]

    def keys_between(self, start: int, stop: int) -> list[np.ndarray]:
        """The keys ``k[start:stop]`` of the sorted entries, as views into the (cached) buckets holding them."""
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        last = int(np.searchsorted(self.offsets, stop, side="left"))
        out = []
        for b, entries in zip(range(first, last), self.read(range(first, last))):
            lo = int(self.offsets[b])
            out.append(entries.k[max(start - lo, 0): stop - lo])
        return out

    def read_all(self) -> Entries:
        parts = self.read(range(len(self.lo)))
        if len(parts) == 1:
            return parts[0]
        return Entries(self.files, *(np.concatenate([getattr(e, c) for e in parts]) for c in ("k", "f", "p")))


def _open(io: FileIO, seg: dict | Segment) -> _Segment:
    seg = seg if isinstance(seg, Segment) else Segment.of(seg)
    found = _FOOTERS.get(seg.path)
    if found is not None and not found.unchanged():
        for key in [k for k in list(_BUCKETS.items) if k[0] == seg.path]:
            _BUCKETS.items.pop(key, None)
        found = None
    if found is None:
        found = _Segment(io, seg)
        _FOOTERS.put(seg.path, found)
    return found


def clear_caches() -> None:
    """Forget opened segments and cached buckets (tests that damage files on purpose)."""
    _FOOTERS.items.clear()
    _BUCKETS.items.clear()


def read_segment(io: FileIO, seg: dict) -> Entries:
    """Every entry of one segment (for merging, checks and tests)."""
    return _open(io, seg).read_all()


def write_segment(io: FileIO, location: str, entries: Iterable[tuple[str, np.ndarray]], exact: bool) -> Segment | None:
    """A segment for ``(data file, index keys in row order)`` pairs; None when empty."""
    files, ks, fs, ps = [], [], [], []
    for i, (path, keys) in enumerate(entries):
        files.append(path)
        ks.append(keys.astype(np.int64, copy=False))
        fs.append(np.full(len(keys), i, dtype=np.int32))
        ps.append(np.arange(len(keys), dtype=np.int64))
    if not files or not sum(len(k) for k in ks):
        return None
    return _write(io, location, files, np.concatenate(ks), np.concatenate(fs), np.concatenate(ps), exact)


def _write(io: FileIO, location: str, files: list[str], k: np.ndarray, f: np.ndarray, p: np.ndarray, exact: bool) -> Segment:
    order = np.argsort(k, kind="stable")
    k, f, p = k[order], f[order], p[order]
    table = pa.table({"k": k, "f": f.astype(np.int32, copy=False), "p": p.astype(np.int64, copy=False)})
    meta = {"files": json.dumps(files)}
    if exact:
        meta["runs"] = json.dumps(key_runs(k, f, p, len(files)))
    table = table.replace_schema_metadata(meta)
    path = f"{location.rstrip('/')}/index-{uuid.uuid4().hex}.parquet"
    with storage_of(io).write_new(path) as out:
        pq.write_table(
            table, out, row_group_size=BUCKET_ROWS, compression="zstd", use_dictionary=["f"],
            column_encoding={"k": "DELTA_BINARY_PACKED", "p": "DELTA_BINARY_PACKED"}, write_statistics=["k"],
        )
        size = out.tell()
    return Segment(path, len(k), int(k[0]), int(k[-1]), exact, size)


def key_runs(k: np.ndarray, f: np.ndarray, p: np.ndarray, files: int) -> list[list[int]]:
    """Per file number, ``[first entry, entries, first key, last key]`` of the sorted entries
    ``(k, f, p)`` when the file's entries are one contiguous run holding positions 0, 1, 2, ...
    in that order, else ``[-1, 0, 0, 0]``.

    Such a file's keys, in row order, are exactly ``k[first:first + entries]``
    (ascending): a backfill handed that very sequence sets every row of the
    file, which ``featurelake.wholefiles`` checks with one comparison instead
    of a probe per key. Files whose keys do not ascend with the row position,
    or whose key range interleaves with another file's, have no run.
    """
    out = [[-1, 0, 0, 0] for _ in range(files)]
    n = len(f)
    if not n:
        return out
    starts = np.concatenate([[0], np.flatnonzero(f[1:] != f[:-1]) + 1])
    ends = np.concatenate([starts[1:], [n]])
    run_file = f[starts].astype(np.int64)
    once = np.bincount(run_file, minlength=files)[run_file] == 1  # the file's entries are this one run
    steps = np.flatnonzero(np.diff(p) != 1)  # j where p[j + 1] is not p[j] + 1
    no_gap = np.searchsorted(steps, starts, side="left") == np.searchsorted(steps, ends - 1, side="left")
    for i in np.flatnonzero(once & no_gap & (p[starts] == 0)):
        a, b = int(starts[i]), int(ends[i])
        out[int(run_file[i])] = [a, b - a, int(k[a]), int(k[b - 1])]
    return out


def _positions(k: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Insertion points of sorted ``keys`` in a bucket's sorted unique keys ``k``.

    Sample ids are mostly dense, so a linear interpolation guess is usually
    the exact place: one memory access per key instead of a binary search.
    Guesses that miss are searched.
    """
    n = len(k)
    span = int(k[-1]) - int(k[0]) if n else 0
    if n < 1024 or span <= 0:
        return np.searchsorted(k, keys, side="left")
    guess = ((keys - k[0]).astype(np.float64) * ((n - 1) / span)).astype(np.int64)
    np.clip(guess, 0, n - 1, out=guess)
    found = k[guess] == keys
    if found.all():
        return guess
    missed = ~found
    guess[missed] = np.searchsorted(k, keys[missed], side="left")
    return guess


def _hits(entries: Entries, keys: np.ndarray, probe_order: np.ndarray, exact: bool) -> tuple[np.ndarray | None, np.ndarray]:
    """(entry index, probe row) of every entry matching one of the sorted ``keys``.

    The entry index is None when every entry matches, in order (the probe
    holds exactly the bucket's keys: a backfill of every row).
    """
    k = entries.k
    if not len(k):
        return np.empty(0, np.int64), np.empty(0, np.int64)
    if len(keys) and (keys[0] < k[0] or keys[-1] > k[-1]):  # keys are sorted: only the ends can lie outside
        inside = (keys >= k[0]) & (keys <= k[-1])
        keys, probe_order = keys[inside], probe_order[inside]
    if exact:  # unique keys: a hit is the one key at the insertion point
        if len(keys) == len(k) and np.array_equal(keys, k) and not (k[1:] == k[:-1]).any():
            return None, probe_order  # every key of the bucket probed (a backfill of all rows)
        start = _positions(k, keys)
        hit = k[np.minimum(start, len(k) - 1)] == keys
        return start[hit], probe_order[hit]
    start = np.searchsorted(k, keys, side="left")  # hashed keys may collide: every equal key is a candidate
    counts = np.searchsorted(k, keys, side="right") - start
    hit = counts > 0
    counts = counts[hit]
    firsts = np.cumsum(counts) - counts
    return np.repeat(start[hit] - firsts, counts) + np.arange(counts.sum()), np.repeat(probe_order[hit], counts)


def lookup(io: FileIO, segments: Sequence[dict], probe: np.ndarray, live: set[str]) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """Where the index keys ``probe`` live among ``live`` data files.

    Returns (probe row, file number, file names, position) for every hit;
    file numbers index the returned names. A key hits more than once only
    when its hash collides (hashed keys): callers verify those. Only the
    buckets holding a probed key are read.
    """
    order = sorting.argsort(probe)  # keys from a scan come in a few ascending runs: near-linear
    if order is None:
        order = np.arange(len(probe))
        sorted_probe = probe
    else:
        sorted_probe = probe[order]
    rows, file_ids, positions = [], [], []
    names: list[str] = []
    for seg_dict in segments:
        seg = Segment.of(seg_dict)
        # Only the probes inside the segment's key range go to it: appends of key ranges
        # (sample ids grow) give disjoint segments, so each probe is searched about once.
        a = np.searchsorted(sorted_probe, seg.min, side="left")
        b = np.searchsorted(sorted_probe, seg.max, side="right")
        if a >= b:
            continue
        keys, probe_order = sorted_probe[a:b], order[a:b]
        opened = _open(io, seg)
        live_mask = np.fromiter((path in live for path in opened.files), dtype=bool, count=len(opened.files))
        if not live_mask.any():
            continue
        remap = (np.cumsum(live_mask) - 1 + len(names)).astype(np.int32)
        all_live, offset = bool(live_mask.all()), len(names)
        used = False
        buckets = opened.buckets_for(keys)
        # each bucket is probed only with the keys inside its key range (keys are sorted)
        firsts = np.searchsorted(keys, opened.lo[buckets], side="left")
        lasts = np.searchsorted(keys, opened.hi[buckets], side="right")
        for entries, first, last in zip(opened.read(buckets), firsts, lasts):
            idx, hit_rows = _hits(entries, keys[first:last], probe_order[first:last], seg.exact)
            if not len(hit_rows):
                continue
            seg_files = entries.f if idx is None else entries.f[idx]
            seg_pos = entries.p if idx is None else entries.p[idx]
            keep = None if all_live else live_mask[seg_files]
            if keep is None or keep.all():
                rows.append(hit_rows)
                if not all_live:
                    file_ids.append(remap[seg_files])
                elif offset:  # every file of the segment live: its numbers shift by the names before it
                    file_ids.append(seg_files.astype(np.int32) + np.int32(offset))
                else:
                    file_ids.append(seg_files.astype(np.int32, copy=False))
                positions.append(seg_pos)
                used = True
                continue
            if not keep.any():
                continue
            used = True
            rows.append(hit_rows[keep])
            file_ids.append(remap[seg_files[keep]].astype(np.int32))
            positions.append(seg_pos[keep])
        if used:
            names.extend(path for path, ok in zip(opened.files, live_mask) if ok)
    if not rows:
        return np.empty(0, np.int64), np.empty(0, np.int32), [], np.empty(0, np.int64)
    return np.concatenate(rows), np.concatenate(file_ids), names, np.concatenate(positions)


def covered_files(io: FileIO, segments: Sequence[dict]) -> set[str]:
    """The data files the segments index (from their footers: no entry is read)."""
    out: set[str] = set()
    for seg in segments:
        out.update(_open(io, seg).files)
    return out


def merge(
    io: FileIO,
    location: str,
    segments: Sequence[dict],
    live: set[str],
    extra: Sequence[tuple[str, np.ndarray]] = (),
    exact: bool | None = None,
) -> list[dict]:
    """One segment holding the live entries of ``segments`` plus ``extra`` (file, keys) pairs."""
    files: list[str] = []
    ks, fs, ps = [], [], []
    if exact is None:
        exact = all(bool(s["exact"]) for s in segments)
    for seg in segments:
        loaded = read_segment(io, seg)
        remap = np.full(len(loaded.files), -1, dtype=np.int32)
        for i, path in enumerate(loaded.files):
            if path in live and path not in files:
                remap[i] = len(files)
                files.append(path)
        new_ids = remap[loaded.f]
        keep = new_ids >= 0
        ks.append(loaded.k[keep])
        fs.append(new_ids[keep])
        ps.append(loaded.p[keep])
    for path, keys in extra:
        ks.append(keys.astype(np.int64, copy=False))
        fs.append(np.full(len(keys), len(files), dtype=np.int32))
        ps.append(np.arange(len(keys), dtype=np.int64))
        files.append(path)
    if not files or not sum(len(k) for k in ks):
        return []
    return [_write(io, location, files, np.concatenate(ks), np.concatenate(fs), np.concatenate(ps), exact).as_dict()]


def read_key_columns(ice: "IcebergTable", path: str, key_columns: Sequence[str]) -> pa.Table:
    """A data file's key columns in row order, matched by field id, under their current names."""
    schema = ice.schema()
    ids = [schema.find_field(k).field_id for k in key_columns]
    with storage_of(ice.io).open(path) as f:
        pf = pq.ParquetFile(f)
        by_id = {}
        for field in pf.schema_arrow:
            fid = (field.metadata or {}).get(b"PARQUET:field_id")
            if fid is not None:
                by_id[int(fid)] = field.name
        table = pf.read(columns=[by_id[i] for i in ids])
    return table.rename_columns(list(key_columns))


def file_keys(ice: "IcebergTable", paths: Iterable[str], key_columns: Sequence[str]) -> list[tuple[str, np.ndarray]]:
    """The index keys of data files, in row order."""
    return [(path, encode(read_key_columns(ice, path, key_columns))) for path in paths]


__all__ = ["Segment", "Entries", "encode", "is_exact", "write_segment", "read_segment", "lookup", "merge", "covered_files", "file_keys", "MERGE_AT", "BUCKET_ROWS"]


def location_of(ice: "IcebergTable") -> str:
    return f"{platform_dir(ice.location())}/index"


def extend(
    ice: "IcebergTable", writer, new_files: Sequence[str], key_columns: Sequence[str], live_after: set[str],
    known: dict[str, pa.Table] | None = None,
) -> None:
    """Index the data files a commit adds, merging segments once they pile up.

    ``writer`` is the commit's StateWriter; ``live_after`` the data files live
    once the commit lands (the merge keeps only their entries). ``known`` maps
    files this process just wrote to their key columns in row order: those are
    indexed from memory, not read back.
    """
    location = location_of(ice)
    schema = ice.schema()
    exact = key_is_exact(schema, key_columns)
    if new_files:
        known = known or {}
        unknown = [p for p in new_files if p not in known]
        read_back = dict(file_keys(ice, unknown, key_columns)) if unknown else {}
        pairs = [(p, encode(known[p]) if p in known else read_back[p]) for p in new_files]
        seg = write_segment(ice.io, location, pairs, exact)
        if seg is not None:
            writer.add_index_segments([seg.as_dict()])
    if len(writer.index_segments) >= MERGE_AT:
        writer.replace_index_segments(merge(ice.io, location, writer.index_segments, live_after))


def rebuild(table, branch: str = "main") -> dict:
    """Replace a branch's index by one segment built from its data files (a metadata-only commit)."""
    from featurelake import refs
    from featurelake.commit import optimistic
    from featurelake.livefiles import snapshot_files
    from featurelake.state import STATE_KEY, StateWriter

    def attempt(ice) -> dict:
        head = refs.branch_head(ice.metadata, branch)
        if head is None:
            return {"branch": branch, "rows": 0, "files": 0, "snapshot_id": None}
        live = sorted(snapshot_files(ice, head))
        keys = table.primary_key
        seg = write_segment(ice.io, location_of(ice), file_keys(ice, live, keys), key_is_exact(ice.schema(), keys))
        writer = StateWriter(table._state(ice, head), ice.io, table._platform_dir(ice))
        writer.replace_index_segments([seg.as_dict()] if seg else [])
        props = {STATE_KEY: writer.write(), "featurelake.operation": "index rebuild", **refs.same_events_props(head)}
        tx = ice.transaction()
        tx.update_snapshot(snapshot_properties=props, branch=branch).fast_append().commit()
        new = tx.commit_transaction()
        return {"branch": branch, "rows": seg.rows if seg else 0, "files": len(live), "snapshot_id": new.metadata.refs[branch].snapshot_id}

    return optimistic(table.refresh, attempt, f"rebuild index of {table.name}@{branch}")


def duplicate_entries(io: FileIO, segments: Sequence[dict], live: set[str]) -> int:
    """Keys that live entries of an exact index place at more than one row.

    A lookup reads one entry per key and segment, so a second entry can hide
    behind the right one: only a look at the entries themselves finds it.
    """
    file_ids: dict[str, int] = {}
    parts = []
    for seg in segments:
        loaded = read_segment(io, seg)
        ids = np.array([file_ids.setdefault(path, len(file_ids)) if path in live else -1 for path in loaded.files], dtype=np.int64)
        f = ids[loaded.f]
        keep = f >= 0
        parts.append(pd.DataFrame({"k": loaded.k[keep], "f": f[keep], "p": loaded.p[keep]}))
    if not parts:
        return 0
    counts = pd.concat(parts).drop_duplicates()["k"].value_counts()
    return int((counts > 1).sum())
