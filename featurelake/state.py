"""Per-snapshot platform state: which update files are live for which data files.

Iceberg knows data files; it does not know featurelake's update files. That
knowledge is kept as immutable files referenced from a snapshot's summary
(invariant 3), so a snapshot, a branch head or a time-travel read always sees
exactly the update files of its own commit.

Layout, split the way Iceberg splits manifests so a commit rewrites only what
it touched:

* a *root* per platform commit (``featurelake.state`` in the snapshot
  summary): JSON with the commit order counter, the set of updated field
  ids, totals, and a map ``shard -> file holding its entries``;
* *shards*, one row per live update layer, each holding the entries of the
  data files whose path hashes to that shard. A layer is a whole update file
  (``row_group`` null, as every state before packing wrote) or one row group
  of a shared update file (the nullable ``row_group`` and ``file_bytes``
  columns, present only in packs that hold such layers); the root lists each
  shared file with its live row groups (``shared``), so distinct files are
  counted without reading every shard. A commit writes only the
  shards it changed and references the others unchanged. The shards one
  commit changed are written together in one file (a *pack*), and a shard's
  entries are the rows of that file whose data file hashes to it (an older
  pack's rows of a shard rewritten since are ignored).

Format 2 (this one): the root *is* the commit's pack, a Parquet file of shard
rows with the JSON in its footer's key-value metadata (``featurelake.state``),
so a commit's state is one PUT and a cold read of it one GET; the shards it
changed name the root itself. A commit changing more than
:data:`INLINE_ENTRIES` entries writes them to a separate pack instead, so that
reading a root stays small. Format 1 roots (a one-cell Parquet ``state``
column, or plain JSON, with every pack separate) are read as before.

A snapshot without the summary key (an append, or another engine's commit)
inherits its nearest ancestor's state. Every file is immutable and cached by
path, so reading the state of a hot branch costs one small JSON read.
"""
from __future__ import annotations

import json
import threading
import uuid
import zlib
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator, Mapping

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.io import FileIO
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot

from featurelake.errors import CorruptFileError, UnsupportedFormatError
from featurelake.lru import LRU
from featurelake.refs import ancestors
from featurelake.storage import storage_of
from featurelake.threads import Pending, start_all

STATE_KEY = "featurelake.state"
STATE_BYTES_KEY = "featurelake.state-bytes"  # the root's size: an object store reads it in one GET, no HEAD
# What a reader of the snapshot that ignores update files misses (string values, see summary_props)
PENDING_FILES_KEY = "featurelake.pending-update-files"
PENDING_LAYERS_KEY = "featurelake.pending-update-layers"
N_SHARDS = 64
FORMAT = 2
# A root whose state holds layers that are row groups of shared update files says format 3: a featurelake
# that predates them would read such a file whole as one layer, so each reader refuses a format newer than
# it knows (the versions before packing checked no format, which is why a packed lake must not be downgraded).
PACKED_FORMAT = 3
READ_FORMAT = PACKED_FORMAT
INLINE_ENTRIES = 1024  # a commit's changed entries go into its root up to this many (else a separate pack)
_ROOT_META = b"featurelake.state"  # the footer key holding a format-2 root's JSON

_SHARD_SCHEMA = pa.schema(
    [
        pa.field("data_file", pa.string(), nullable=False),
        pa.field("update_file", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("field_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("dense", pa.bool_(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
        pa.field("snapshot_id", pa.int64(), nullable=False),
    ]
)
# Entries that are one row group of a shared update file (featurelake.updates packs small parts) add
# these columns; a pack without them (every state file written before) decodes them as None.
_PART_FIELDS = [pa.field("row_group", pa.int32(), nullable=True), pa.field("file_bytes", pa.int64(), nullable=True)]
_PACKED_SCHEMA = pa.schema(list(_SHARD_SCHEMA) + _PART_FIELDS)


@dataclass(frozen=True)
class UpdateEntry:
    """One live update layer: new values of ``field_ids`` for rows of ``data_file``.

    ``seq`` is the commit order (higher wins); ``dense`` means the layer holds
    every row of the data file in order, so it has no ``_pos`` column.

    ``row_group`` None: the layer is the whole of ``update_file`` and ``bytes``
    its size (every entry written before packing). An int: the layer is exactly
    that row group of a shared update file holding the small parts of one
    commit (featurelake.updates); ``bytes`` is then the row group's stored
    bytes and ``file_bytes`` the shared file's size (what a reader opens it
    with: no HEAD request on an object store).
    """

    data_file: str
    update_file: str
    seq: int
    field_ids: tuple[int, ...]
    dense: bool
    rows: int
    bytes: int
    snapshot_id: int
    row_group: int | None = None
    file_bytes: int | None = None

    @property
    def part(self) -> tuple[str, int | None]:
        """What identifies this layer's stored values: (update file, row group or None for the whole file)."""
        return (self.update_file, self.row_group)

    @property
    def file_size(self) -> int:
        """The size of the update file holding this layer (a shared file's whole size)."""
        return self.file_bytes if self.file_bytes is not None else self.bytes


def distinct_files(entries: Iterable[UpdateEntry]) -> int:
    """How many update files ``entries`` live in (a shared file counts once)."""
    return len({e.update_file for e in entries})


def shard_of(data_file: str) -> int:
    return zlib.crc32(data_file.encode()) % N_SHARDS


@dataclass(frozen=True)
class PlatformState:
    """The live update files of one snapshot (immutable)."""

    root_path: str | None = None
    next_seq: int = 1
    shard_info: Mapping[int, dict] = field(default_factory=dict)
    index_segments: tuple[dict, ...] = ()
    io: FileIO | None = field(default=None, compare=False, repr=False)
    shared_files: Mapping[str, int] = field(default_factory=dict)  # shared update file -> its live row groups

    @property
    def shards(self) -> dict[int, str]:
        return {k: v["path"] for k, v in self.shard_info.items()}

    @property
    def update_layers(self) -> int:
        """Live update layers (entries): a shared file's row groups count one each."""
        return sum(v["files"] for v in self.shard_info.values())

    @property
    def update_files(self) -> int:
        """Distinct live update files (a shared file counts once, whatever its live row groups)."""
        return self.update_layers - sum(self.shared_files.values()) + len(self.shared_files)

    @property
    def update_bytes(self) -> int:
        return sum(v["bytes"] for v in self.shard_info.values())

    @property
    def max_layers(self) -> int:
        """The most update files stacked on one data file (the root's per-shard figure when it has one)."""
        most = 0
        for shard, info in self.shard_info.items():
            layers = info.get("layers")
            if layers is None:  # a root written before shards recorded it
                layers = max((len(es) for es in _shard_entries(self.io, info["path"], shard, info.get("size")).values()), default=0)
            most = max(most, int(layers))
        return most

    @property
    def updated_field_ids(self) -> frozenset[int]:
        return frozenset(f for v in self.shard_info.values() for f in v["field_ids"])

    @property
    def empty(self) -> bool:
        return not self.shard_info

    def entries_for(self, data_file: str) -> list[UpdateEntry]:
        """Update files of ``data_file`` in commit order (oldest first)."""
        shard = shard_of(data_file)
        info = self.shard_info.get(shard)
        if info is None:
            return []
        return _shard_entries(self.io, info["path"], shard, info.get("size")).get(data_file, [])

    def by_data_file(self, data_files: Iterable[str] | None = None) -> dict[str, list[UpdateEntry]]:
        """Entries grouped by data file, for ``data_files`` or for all."""
        if data_files is None:
            out: dict[str, list[UpdateEntry]] = {}
            for shard, info in self.shard_info.items():
                out.update(_shard_entries(self.io, info["path"], shard, info.get("size")))
            return out
        wanted: dict[int, list[str]] = {}
        for f in data_files:
            wanted.setdefault(shard_of(f), []).append(f)
        out = {}
        for shard, files in wanted.items():
            info = self.shard_info.get(shard)
            if info is None:
                continue
            loaded = _shard_entries(self.io, info["path"], shard, info.get("size"))
            for f in files:
                if f in loaded:
                    out[f] = loaded[f]
        return out

    def entries(self) -> Iterator[UpdateEntry]:
        for entries in self.by_data_file().values():
            yield from entries


def state_of(meta: TableMetadata, io: FileIO, snapshot: Snapshot | None) -> PlatformState:
    """The platform state a snapshot sees: its own, or its nearest ancestor's."""
    for snap in ancestors(meta, snapshot):
        path = snap.summary.get(STATE_KEY) if snap.summary is not None else None
        if path:
            return _load_root(io, path, _int(snap.summary.get(STATE_BYTES_KEY)))
    return PlatformState(io=io)


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value else None
    except ValueError:
        return None


def summary_props(io: FileIO, root_path: str | None) -> dict[str, str]:
    """The snapshot summary of a platform commit: its state root, and what readers that
    ignore update files miss (pending update files and the most layers on one data file).

    Values are strings: an int in a summary breaks pyiceberg's ``inspect.snapshots()``.
    """
    state = _load_root(io, root_path) if root_path else PlatformState(io=io)
    props = {STATE_KEY: root_path} if root_path else {}
    size = _ROOT_SIZES.get(root_path) if root_path else None
    if size is not None:
        props[STATE_BYTES_KEY] = str(size)
    props[PENDING_FILES_KEY] = str(state.update_files)
    props[PENDING_LAYERS_KEY] = str(state.max_layers)
    return props


class StateWriter:
    """Builds the next state from a base state plus changes, writing only touched shards."""

    def __init__(self, base: PlatformState, io: FileIO, location: str) -> None:
        self.base = base
        self.io = io
        self.location = location.rstrip("/")
        self._changed: dict[int, dict[str, list[UpdateEntry]]] = {}
        self._before: dict[int, list[UpdateEntry]] = {}  # a changed shard's entries in the base state
        self.next_seq = base.next_seq
        self.index_segments: list[dict] = list(base.index_segments)
        self._index_changed = False

    def add_index_segments(self, segments: Iterable[dict]) -> None:
        """Reference more key-index segments (see featurelake.index)."""
        known = {s["path"] for s in self.index_segments}
        for seg in segments:
            if seg["path"] not in known:
                self.index_segments.append(seg)
                known.add(seg["path"])
                self._index_changed = True

    def replace_index_segments(self, segments: Iterable[dict]) -> None:
        self.index_segments = list(segments)
        self._index_changed = True

    def _shard(self, shard: int) -> dict[str, list[UpdateEntry]]:
        if shard not in self._changed:
            info = self.base.shard_info.get(shard)
            loaded = _shard_entries(self.io, info["path"], shard, info.get("size")) if info else {}
            self._changed[shard] = {k: list(v) for k, v in loaded.items()}
            self._before[shard] = [e for es in loaded.values() for e in es]
        return self._changed[shard]

    def take_seq(self) -> int:
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def add(self, entry: UpdateEntry) -> None:
        self._shard(shard_of(entry.data_file)).setdefault(entry.data_file, []).append(entry)

    def drop_data_file(self, data_file: str) -> list[UpdateEntry]:
        """Forget every update of a data file (it was rewritten or removed)."""
        return self._shard(shard_of(data_file)).pop(data_file, [])

    def drop_where(self, data_file: str, predicate) -> list[UpdateEntry]:
        shard = self._shard(shard_of(data_file))
        kept = [e for e in shard.get(data_file, []) if not predicate(e)]
        dropped = [e for e in shard.get(data_file, []) if predicate(e)]
        if kept:
            shard[data_file] = kept
        else:
            shard.pop(data_file, None)
        return dropped

    @property
    def changed(self) -> bool:
        return bool(self._changed) or self._index_changed

    def new_root_path(self) -> str:
        """A fresh root path, known before the commit that will reference it."""
        return f"{self.location}/state-{uuid.uuid4().hex}.parquet"

    def write(self, root_path: str | None = None) -> str:
        """Write the changed shards and a new root; return the root's path once both are stored."""
        root_path, uploading = self.start(root_path)
        uploading.wait()
        return root_path

    def start(self, root_path: str | None = None) -> tuple[str, Pending]:
        """Encode the changed shards and the new root and start their uploads; returns (root path, uploads).

        The caller overlaps other work (the snapshot's manifest list) with the
        uploads and must wait for them (``Pending.wait``, also on its failure
        path) before committing a snapshot that names the root. The root is
        cached from memory at once, so :func:`summary_props` reads nothing.
        Totals are kept per shard in the root, so a commit costs what it
        touched, not the size of the whole state.
        """
        root_path = root_path or self.new_root_path()
        changed = {shard: [e for es in entries.values() for e in es] for shard, entries in self._changed.items()}
        packed = [e for rows in changed.values() for e in rows]
        inline = len(packed) <= INLINE_ENTRIES
        pack = root_path if inline else f"{self.location}/shard-{uuid.uuid4().hex}.parquet"
        shards = dict(self.base.shard_info)
        for shard, rows in changed.items():
            if not rows:
                shards.pop(shard, None)
                continue
            shards[shard] = {
                "path": pack,
                "files": len(rows),
                "bytes": sum(e.bytes for e in rows),
                "field_ids": sorted({f for e in rows for f in e.field_ids}),
                "layers": max(len(es) for es in self._changed[shard].values()),
            }
        uploads: list[tuple[str, pa.Buffer]] = []
        if packed and not inline:  # its size goes into the root: a reader fetches it in one GET
            encoded = _encode_entries(packed)
            uploads.append((pack, encoded))
            for shard in changed:
                if shard in shards and shards[shard]["path"] == pack:
                    shards[shard]["size"] = encoded.size
        shared = self._shared_after(changed)
        root = {
            "format": PACKED_FORMAT if shared else FORMAT,
            "next_seq": self.next_seq,
            "shards": {str(k): v for k, v in sorted(shards.items())},
            "index": self.index_segments,
        }
        if shared:
            root["shared"] = shared
        encoded_root = _encode_entries(packed if inline else [], json.dumps(root))
        uploads.append((root_path, encoded_root))
        if storage_of(self.io).is_local(root_path):  # a local write is quicker than a hand-off to a thread
            uploading = Pending([], [_upload(self.io, *upload) for upload in uploads])
        else:
            uploading = start_all(lambda upload: _upload(self.io, *upload), uploads, len(uploads))
        if packed:
            by_file: dict[str, list[UpdateEntry]] = {}
            for e in sorted(packed, key=lambda e: e.seq):
                by_file.setdefault(e.data_file, []).append(e)
            _SHARD_CACHE.put(pack, by_file)
        if inline:  # the root cannot record its own size; readers take it from the GET (see _load_root)
            shards = {k: ({**v, "size": encoded_root.size} if v["path"] == root_path else v) for k, v in shards.items()}
        _ROOT_SIZES.put(root_path, encoded_root.size)
        _ROOT_CACHE.put(root_path, PlatformState(root_path, self.next_seq, shards, tuple(self.index_segments), shared_files=shared))
        return root_path, uploading

    def _shared_after(self, changed: dict[int, list[UpdateEntry]]) -> dict[str, int]:
        """The base's live row groups per shared update file, updated by the changed shards (before -> after).

        Kept in the root so that :attr:`PlatformState.update_files` counts distinct files without
        reading every shard: entries of one shared file may sit in many shards.
        """
        shared = dict(self.base.shared_files)
        for shard, rows in changed.items():
            for sign, entries in ((-1, self._before.get(shard, [])), (1, rows)):
                for e in entries:
                    if e.row_group is not None:
                        shared[e.update_file] = shared.get(e.update_file, 0) + sign
        return {path: n for path, n in sorted(shared.items()) if n > 0}


# ---------------------------------------------------------------- file cache
_ROOT_CACHE = LRU(512)
_SHARD_CACHE = LRU(2048)
_SPLIT_CACHE = LRU(2048)
_LOAD_LOCKS = [threading.Lock() for _ in range(16)]
_ROOT_SIZES = LRU(512)  # sizes of roots this process wrote, for the summary of the commit that references them


def clear_caches() -> None:
    """Forget every cached root and shard (as a fresh process would start)."""
    for cache in (_ROOT_CACHE, _SHARD_CACHE, _SPLIT_CACHE, _ROOT_SIZES):
        with cache.lock:
            cache.items.clear()


def _load_root(io: FileIO, path: str, size: int | None = None) -> PlatformState:
    cached = _ROOT_CACHE.get(path)
    if cached is None:
        try:
            data = _root_bytes(io, path, size)
            text, entries = _decode_root(data)
            raw = json.loads(text)
            _check_format(raw.get("format", 1), path)
            shard_info = {int(k): _shard_info(v) for k, v in raw["shards"].items()}
            if entries is not None:  # format 2: the root holds its commit's shards, and now its size is known
                _SHARD_CACHE.put(path, entries)
                for info in shard_info.values():
                    if info["path"] == path:
                        info.setdefault("size", len(data))
            cached = PlatformState(
                root_path=path,
                next_seq=int(raw["next_seq"]),
                shard_info=shard_info,
                index_segments=tuple(raw.get("index", ())),
                shared_files={str(k): int(v) for k, v in raw.get("shared", {}).items()},
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError, pa.ArrowException) as e:
            raise CorruptFileError(f"platform state file {path} is missing or unreadable: {e!r}", path) from e
        _ROOT_CACHE.put(path, cached)
    return replace(cached, io=io)


def _check_format(fmt: Any, path: str) -> None:
    if not isinstance(fmt, int) or fmt > READ_FORMAT:
        raise UnsupportedFormatError(
            f"platform state file {path} has format {fmt!r}; this featurelake reads formats up to {READ_FORMAT}: "
            "the table was written by a newer featurelake, upgrade to read it"
        )


def _root_bytes(io: FileIO, path: str, size: int | None) -> bytes:
    """A root's bytes: in one GET when its size is known, else as any file (a size recorded wrong: the latter)."""
    storage = storage_of(io)
    if size:
        try:
            with storage.open(path, size=size, whole_below=size) as f:
                data = f.read()
            if data[:4] == b"PAR1" and data[-4:] == b"PAR1" or data[:1] == b"{":
                return data
        except OSError:
            pass
    return storage.read(path)


def _shard_info(v: dict) -> dict:
    """A root's entry for one shard, refusing one that lacks a field readers use."""
    missing = [k for k in ("path", "files", "bytes", "field_ids") if k not in v]
    if missing:
        raise KeyError(f"shard entry lacks {missing}")
    return v


def _decode_root(data: bytes) -> tuple[str, dict[str, list[UpdateEntry]] | None]:
    """A root's JSON, and its shard rows by data file (None for a format-1 root, which has none).

    Format 2 is a Parquet file of shard rows with the JSON in its footer;
    format 1 a one-cell Parquet file (column ``state``: an Iceberg file type,
    which object stores behind a catalog accept), or plain JSON as roots were
    first written.
    """
    if data[:4] != b"PAR1":
        return data.decode(), None
    f = pq.ParquetFile(pa.BufferReader(data))
    meta = f.metadata.metadata or {}
    if _ROOT_META in meta:
        return meta[_ROOT_META].decode(), _entries_by_file(f.read())
    return f.read().column("state")[0].as_py(), None


def _shard_entries(io: FileIO | None, path: str, shard: int, size: int | None = None) -> dict[str, list[UpdateEntry]]:
    """The entries of ``shard`` in the shard file or pack at ``path`` (a pack also holds other shards)."""
    split = _SPLIT_CACHE.get(path)
    if split is None:
        split = {}
        for f, es in _load_shard(io, path, size).items():
            split.setdefault(shard_of(f), {})[f] = es
        _SPLIT_CACHE.put(path, split)
    return split.get(shard, {})


def _load_shard(io: FileIO | None, path: str, size: int | None = None) -> dict[str, list[UpdateEntry]]:
    """Every entry of a shard file or pack, by data file (cached by path: files are immutable).

    Concurrent readers of one path (a read's threads, each asking for its data
    file's entries) wait for one fetch instead of each fetching the file.
    """
    cached = _SHARD_CACHE.get(path)
    if cached is not None:
        return cached
    with _LOAD_LOCKS[zlib.crc32(path.encode()) % len(_LOAD_LOCKS)]:
        cached = _SHARD_CACHE.get(path)
        if cached is not None:
            return cached
        return _fetch_shard(io, path, size)


def _fetch_shard(io: FileIO | None, path: str, size: int | None) -> dict[str, list[UpdateEntry]]:
    assert io is not None
    try:
        with storage_of(io).open(path, size=size) as f:
            tbl = pq.read_table(f)
    except (OSError, pa.ArrowInvalid) as e:
        raise CorruptFileError(f"platform state shard {path} is missing or unreadable: {e}", path) from e
    out = _entries_by_file(tbl)
    _SHARD_CACHE.put(path, out)
    return out


def _entries_by_file(tbl: pa.Table) -> dict[str, list[UpdateEntry]]:
    """A pack's (or format-2 root's) rows as entries by data file, each list in commit order."""
    out: dict[str, list[UpdateEntry]] = {}
    names = tbl.column_names
    cols = tbl.select(_SHARD_SCHEMA.names + [f.name for f in _PART_FIELDS if f.name in names]).to_pydict()
    row_groups = cols.get("row_group") or [None] * tbl.num_rows
    file_bytes = cols.get("file_bytes") or [None] * tbl.num_rows
    for i in range(tbl.num_rows):
        e = UpdateEntry(
            data_file=cols["data_file"][i],
            update_file=cols["update_file"][i],
            seq=cols["seq"][i],
            field_ids=tuple(cols["field_ids"][i]),
            dense=cols["dense"][i],
            rows=cols["rows"][i],
            bytes=cols["bytes"][i],
            snapshot_id=cols["snapshot_id"][i],
            row_group=row_groups[i],
            file_bytes=file_bytes[i],
        )
        out.setdefault(e.data_file, []).append(e)
    for v in out.values():
        v.sort(key=lambda e: e.seq)
    return out


def _upload(io: FileIO, path: str, data: pa.Buffer) -> int:
    """Store encoded bytes as the new file ``path``; returns its size."""
    return storage_of(io).write_bytes(path, data)


def _encode_entries(entries: list[UpdateEntry], root_json: str | None = None) -> pa.Buffer:
    """A pack's bytes; with ``root_json``, a format-2 root's (the JSON in the footer, no Arrow schema copy of it)."""
    entries = sorted(entries, key=lambda e: (e.data_file, e.seq))
    columns = {
        "data_file": [e.data_file for e in entries],
        "update_file": [e.update_file for e in entries],
        "seq": [e.seq for e in entries],
        "field_ids": [list(e.field_ids) for e in entries],
        "dense": [e.dense for e in entries],
        "rows": [e.rows for e in entries],
        "bytes": [e.bytes for e in entries],
        "snapshot_id": [e.snapshot_id for e in entries],
    }
    schema = _SHARD_SCHEMA
    if any(e.row_group is not None for e in entries):  # packed parts: the nullable columns (absent otherwise, as before)
        schema = _PACKED_SCHEMA
        columns["row_group"] = [e.row_group for e in entries]
        columns["file_bytes"] = [e.file_bytes for e in entries]
    tbl = pa.Table.from_pydict(columns, schema=schema)
    sink = pa.BufferOutputStream()
    if root_json is None:
        pq.write_table(tbl, sink, compression="zstd")
    else:
        with pq.ParquetWriter(sink, schema, compression="zstd", store_schema=False) as writer:
            writer.write_table(tbl)
            writer.add_key_value_metadata({_ROOT_META.decode(): root_json})
    return sink.getvalue()
