"""The global key index: primary key -> (data file, row position), kept in the lake.

Why not a key-value service: ByteDance keeps its index in the lake itself so
there is nothing extra to run, and so the index is versioned with the table.
Why not pyiceberg: it has no index, and its upsert rewrites whole files.

The index of a snapshot is a set of immutable *segments* listed in that
snapshot's platform state. A segment is an uncompressed Arrow IPC file sorted
by key (``k``: the int64 key, or a 64-bit hash of other keys; ``f``: file
number; ``p``: row position), memory-mapped for lookups, so a batch of keys
costs a binary search per key per segment: it grows with the batch, not the
table (the table only adds a log factor and, cold, the pages touched).

Every write adds a segment for the data files it adds. Entries of files that
are no longer live at a snapshot (rewritten by delete, compaction, revert) are
simply ignored, so merge, rebase and revert keep the index right by taking the
union of segment lists. Segments are merged (dropping dead entries) when they
pile up, and ``rebuild`` makes one from the data alone. Live data files that no
segment covers (written by another engine) are found by scanning their key
columns, so lookups are correct even then.

Segments, like every file in the lake, are written once under a fresh name and
never rewritten. A mapped file that something else truncates would kill the
process with SIGBUS on the next access, so a cached mapping is used only while
the file's identity (inode, size, mtime) is unchanged; a changed or damaged
segment is a CorruptFileError naming it, never a crash.
"""
from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO

from featurelake.errors import CorruptFileError
from featurelake.state import _LRU
from featurelake.storage import platform_dir, storage_of

if TYPE_CHECKING:
    from pyiceberg.table import Table as IcebergTable

MERGE_AT = 24  # merge segments once a snapshot references this many
_SEGMENTS = _LRU(64)


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

    def as_dict(self) -> dict:
        return {"path": self.path, "rows": self.rows, "min": self.min, "max": self.max, "exact": self.exact}

    @staticmethod
    def of(d: dict) -> "Segment":
        return Segment(d["path"], int(d["rows"]), int(d["min"]), int(d["max"]), bool(d["exact"]))


def _column(table: pa.Table, name: str) -> np.ndarray:
    """A column as numpy without copying when it is one chunk (memory-mapped stays mapped)."""
    col = table.column(name)
    chunk = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
    return chunk.to_numpy(zero_copy_only=False)


def _local(path: str) -> str | None:
    """The local filesystem path of a lake path, or None for an object store."""
    if path.startswith("file://"):
        return path.removeprefix("file://")
    return None if "://" in path else path


def _identity(local: str) -> tuple[int, int, int]:
    st = os.stat(local)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class _Loaded:
    """A segment's arrays, memory-mapped where the file is local."""

    def __init__(self, io: FileIO, path: str) -> None:
        storage = storage_of(io)
        local = _local(path)
        self.identity: tuple[int, int, int] | None = None
        try:
            if local is not None:
                self.identity = _identity(local)
            if path.endswith(".arrow"):  # segments written before they were Parquet: memory-mapped
                table = pa.ipc.open_file(storage.map(path)).read_all()
            else:
                with storage.open(path) as f:
                    table = pq.read_table(f)
            meta = table.schema.metadata or {}
            self.files: list[str] = json.loads(meta[b"files"])
            self.k = _column(table, "k")
            self.f = _column(table, "f")
            self.p = _column(table, "p")
        except (OSError, pa.ArrowException, KeyError, ValueError) as e:
            raise CorruptFileError(f"index segment {path} is missing or unreadable ({e}); run rebuild_index", path) from e
        if self.identity is not None and _identity(local) != self.identity:
            raise CorruptFileError(f"index segment {path} changed while being read; files in the lake are immutable", path)

    def unchanged(self, path: str) -> bool:
        """Whether the file is still the one mapped (a rewrite in place would make the mapping fault)."""
        local = _local(path)
        if local is None or self.identity is None:
            return True
        try:
            return _identity(local) == self.identity
        except OSError:  # deleted: the mapping of the unlinked file stays valid
            return True


def _load(io: FileIO, path: str, rows: int | None = None) -> _Loaded:
    """The segment at ``path`` (cached); ``rows``, when known, is checked against its content."""
    loaded = _SEGMENTS.get(path)
    if loaded is None or not loaded.unchanged(path):
        loaded = _Loaded(io, path)
        _SEGMENTS.put(path, loaded)
    if rows is not None and len(loaded.k) != rows:
        raise CorruptFileError(f"index segment {path} holds {len(loaded.k)} keys, its state says {rows}; run rebuild_index", path)
    return loaded


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
    table = pa.table({"k": k, "f": f, "p": p}).replace_schema_metadata({"files": json.dumps(files)})
    path = f"{location.rstrip('/')}/index-{uuid.uuid4().hex}.parquet"
    with storage_of(io).write_new(path) as out:
        # one row group: each column loads as one contiguous array
        pq.write_table(table, out, row_group_size=max(len(k), 1), compression="zstd", use_dictionary=False, write_statistics=False)
    return Segment(path, len(k), int(k[0]), int(k[-1]), exact)


def _positions(k: np.ndarray, keys: np.ndarray, seg: Segment) -> np.ndarray:
    """Insertion points of sorted ``keys`` in the segment's sorted unique keys ``k``.

    Sample ids are mostly dense, so a linear interpolation guess is usually
    the exact place: one memory access per key instead of a binary search
    whose cache misses grow with the table. Guesses that miss are searched.
    """
    n = len(k)
    span = seg.max - seg.min
    if n < 1024 or span <= 0:
        return np.searchsorted(k, keys, side="left")
    guess = ((keys - seg.min).astype(np.float64) * ((n - 1) / span)).astype(np.int64)
    np.clip(guess, 0, n - 1, out=guess)
    found = k[guess] == keys
    if found.all():
        return guess
    missed = ~found
    guess[missed] = np.searchsorted(k, keys[missed], side="left")
    return guess


def lookup(io: FileIO, segments: Sequence[dict], probe: np.ndarray, live: set[str]) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """Where the index keys ``probe`` live among ``live`` data files.

    Returns (probe row, file number, file names, position) for every hit;
    file numbers index the returned names. A key hits more than once only
    when its hash collides (hashed keys): callers verify those.
    """
    order = np.argsort(probe)
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
        loaded = _load(io, seg.path, seg.rows)
        if seg.exact:  # unique keys: a hit is the one key at the insertion point
            start = _positions(loaded.k, keys, seg)
            hit = loaded.k[start] == keys  # keys lie within [min, max], so start is in range
            idx, hit_rows = start[hit], probe_order[hit]
        else:  # hashed keys may collide: every equal key is a candidate
            start = np.searchsorted(loaded.k, keys, side="left")
            counts = np.searchsorted(loaded.k, keys, side="right") - start
            hit = counts > 0
            counts = counts[hit]
            firsts = np.cumsum(counts) - counts
            idx = np.repeat(start[hit] - firsts, counts) + np.arange(counts.sum())
            hit_rows = np.repeat(probe_order[hit], counts)
        if not len(idx):
            continue
        seg_files = loaded.f[idx]
        live_mask = np.fromiter((path in live for path in loaded.files), dtype=bool, count=len(loaded.files))
        keep = live_mask[seg_files]
        if not keep.any():
            continue
        remap = np.cumsum(live_mask) - 1 + len(names)
        names.extend(path for path, ok in zip(loaded.files, live_mask) if ok)
        rows.append(hit_rows[keep])
        file_ids.append(remap[seg_files[keep]].astype(np.int32))
        positions.append(loaded.p[idx][keep])
    if not rows:
        return np.empty(0, np.int64), np.empty(0, np.int32), [], np.empty(0, np.int64)
    return np.concatenate(rows), np.concatenate(file_ids), names, np.concatenate(positions)


def covered_files(io: FileIO, segments: Sequence[dict]) -> set[str]:
    out: set[str] = set()
    for seg in segments:
        out.update(_load(io, seg["path"]).files)
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
        loaded = _load(io, seg["path"])
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


__all__ = ["Segment", "encode", "is_exact", "write_segment", "lookup", "merge", "covered_files", "file_keys", "MERGE_AT"]


def location_of(ice: "IcebergTable") -> str:
    return f"{platform_dir(ice.location())}/index"


def extend(ice: "IcebergTable", writer, new_files: Sequence[str], key_columns: Sequence[str], live_after: set[str]) -> None:
    """Index the data files a commit adds, merging segments once they pile up.

    ``writer`` is the commit's StateWriter; ``live_after`` the data files live
    once the commit lands (the merge keeps only their entries).
    """
    location = location_of(ice)
    schema = ice.schema()
    exact = key_is_exact(schema, key_columns)
    if new_files:
        seg = write_segment(ice.io, location, file_keys(ice, new_files, key_columns), exact)
        if seg is not None:
            writer.add_index_segments([seg.as_dict()])
    if len(writer.index_segments) >= MERGE_AT:
        writer.replace_index_segments(merge(ice.io, location, writer.index_segments, live_after))


def rebuild(table, branch: str = "main") -> dict:
    """Replace a branch's index by one segment built from its data files (a metadata-only commit)."""
    from featurelake import refs
    from featurelake.commit import commit, optimistic
    from featurelake.merge import snapshot_files
    from featurelake.state import StateWriter, summary_props

    def attempt(ice) -> dict:
        head = refs.branch_head(ice.metadata, branch)
        if head is None:
            return {"branch": branch, "rows": 0, "files": 0, "snapshot_id": None}
        live = sorted(snapshot_files(ice, head))
        keys = table.primary_key
        seg = write_segment(ice.io, location_of(ice), file_keys(ice, live, keys), key_is_exact(ice.schema(), keys))
        writer = StateWriter(table._state(ice, head), ice.io, table._platform_dir(ice))
        writer.replace_index_segments([seg.as_dict()] if seg else [])
        props = {**summary_props(ice.io, writer.write()), "featurelake.operation": "index rebuild"}
        tx = ice.transaction()
        tx.update_snapshot(snapshot_properties=props, branch=branch).fast_append().commit()
        return {"branch": branch, "rows": seg.rows if seg else 0, "files": len(live), "snapshot_id": commit(tx, branch)}

    return optimistic(table.refresh, attempt, f"rebuild index of {table.name}@{branch}")


def verify(table, branch: str = "main", snapshot_id: int | None = None) -> dict:
    """Check the index against the data: every live row found at its own place, no key twice."""
    from featurelake import refs
    from featurelake.keys import ROW, duplicate_keys, find
    from featurelake.merge import snapshot_files
    from featurelake.schema import LOCATOR_FILE, LOCATOR_POS

    ice = table.refresh()
    snap = refs.resolve(ice.metadata, branch, snapshot_id)
    keys = table.primary_key
    state = table._state(ice, snap)
    live = set(snapshot_files(ice, snap))
    truth = table.scan(keys, branch=str(snap.snapshot_id) if snap else branch, with_locator=True, ice=ice).to_table()
    found = find(table, ice, snap, truth.select(keys))
    # (key, file, row) triples: a hit at another key's row is wrong even though that row exists
    codes = encode(truth.select(keys))
    expected = set(zip(codes.tolist(), truth.column(LOCATOR_FILE).to_pylist(), truth.column(LOCATOR_POS).to_pylist()))
    got = set(
        zip(
            codes[found.column(ROW).to_numpy()].tolist(),
            found.column(LOCATOR_FILE).cast(pa.string()).to_pylist(),
            found.column(LOCATOR_POS).to_pylist(),
        )
    )
    covered = covered_files(ice.io, state.index_segments) if state.index_segments else set()
    dups = duplicate_keys(truth, keys)
    exact = key_is_exact(ice.schema(), keys)
    report = {
        "branch": branch,
        "rows": truth.num_rows,
        "segments": len(state.index_segments),
        "uncovered_files": len(live - covered),
        "missing": len(expected - got),
        "wrong": len(got - expected),
        "duplicate_keys": dups.num_rows,
        "duplicate_entries": _duplicate_entries(ice.io, state.index_segments, live) if exact else 0,
    }
    report["ok"] = report["missing"] == report["wrong"] == report["duplicate_keys"] == report["duplicate_entries"] == 0
    return report


def _duplicate_entries(io: FileIO, segments: Sequence[dict], live: set[str]) -> int:
    """Keys that live entries of an exact index place at more than one row.

    A lookup reads one entry per key and segment, so a second entry can hide
    behind the right one: only a look at the entries themselves finds it.
    """
    file_ids: dict[str, int] = {}
    parts = []
    for seg in segments:
        loaded = _load(io, seg["path"])
        ids = np.array([file_ids.setdefault(path, len(file_ids)) if path in live else -1 for path in loaded.files], dtype=np.int64)
        f = ids[loaded.f]
        keep = f >= 0
        parts.append(pd.DataFrame({"k": loaded.k[keep], "f": f[keep], "p": loaded.p[keep]}))
    if not parts:
        return 0
    counts = pd.concat(parts).drop_duplicates()["k"].value_counts()
    return int((counts > 1).sum())
