"""Normalized user sequences (Meta's Sequence Storage): store long histories once, join them at read time.

Why: a training row that carries its user's last 256 events copies the same
events into every row of that user; with tens of rows per user the copies
dwarf everything else. Meta keeps a pointer (user id + event time) in the
training row and the user's events once, in a key-value store built offline,
and joins them back in the reader. featurelake does the same:

* **Sequence table** (:class:`SequenceTable`): an ordinary featurelake table
  of events, one row per event, any attribute types. It is the source of
  truth: append, branch and time-travel it like any table. Rows are sorted by
  (user, time) before they are written, so each data file keeps a user's
  events together (better compression; the table's Iceberg sort order says so).
* **Store build** (``st.build()``): the current snapshot becomes a key-value
  store (:mod:`featurelake.seqstore`): each user's events sorted by time, cut
  into fixed-size chunks (oldest first, ``chunk_events`` per chunk), one value
  per (user, chunk, column group), plus a small per-user head (event count,
  first event time of every chunk). Groups of fixed-width and low-cardinality
  string columns are stored as fixed-size raw chunks (a batch decodes with
  numpy views, no per-chunk work); others (lists, structs, free text) as Arrow
  IPC messages. Written offline into sorted files and bulk-loaded; no
  per-row puts, no compaction. Each build records the snapshot it reflects
  (``<store root>/<build id>/build.json``); an incremental build re-encodes
  only users with new events, from their first affected chunk on, and
  hard-links every other byte from the build it extends.
* **Lookup and join**: ``st.lookup(keys, before, columns, max_len, window)``
  reads the heads of the unique users, picks only the chunks that can hold
  the last ``max_len`` events before ``before`` (inside ``window``), fetches
  them with batched multi-gets in parallel threads, and cuts each row's list
  out of one pool with a single ``take`` per column. ``st.view(...)`` plugs the
  same into ``Table.read/batches(sequences={"hist": view})``.

Strictly-before semantics: a row never sees an event at or after its own
time, so labels cannot leak from the future.
"""
from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import os
import shutil
import threading
import time as _time
import uuid
from concurrent.futures import ThreadPoolExecutor
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from featurelake import refs
from featurelake.errors import (
    CorruptFileError,
    DuplicateKeyError,
    FeatureLakeError,
    NullKeyError,
    SchemaMismatchError,
    TableNotFoundError,
)
from featurelake.seqstore import (
    DICT_MAX,
    READERS,
    FixedCodec,
    IpcCodec,
    KeyCodec,
    RocksDBBackend,
    StoreBackend,
    backend_from_dict,
    codec_from_dict,
    fixed_dtype,
    is_string,
    write_json_atomic,
)
from featurelake.table import MAIN, Table, _chunks

if TYPE_CHECKING:
    from featurelake.lake import Lake

PROP_KEY = "featurelake.sequence.key"
PROP_TIME = "featurelake.sequence.time"
PROP_EVENT_ID = "featurelake.sequence.event-id"
PROP_SYNTHETIC = "featurelake.sequence.event-id-synthetic"
DEFAULT_EVENT_ID = "event_id"
DEFAULT_CHUNK_EVENTS = 128
BUCKET_ROWS = 4_000_000      # events sorted in memory at once during a build; more spill to disk by key range
MAX_LAYERS = 8               # incremental layers on one store before a build starts over
BUILD_FORMAT = 1
DEFAULT_THREADS = 4
DEFAULT_BATCH_KEYS = 512     # keys per multi-get call (RocksDB: 256-1024 beat bigger calls)
JOIN_SLICE_ROWS = 65_536


class SequenceBuildError(FeatureLakeError):
    """No store build reflects the snapshot asked for, or a build cannot be made."""


# ================================================================= creation
def create_sequence_table(
    lake: "Lake",
    name: str,
    schema: pa.Schema,
    key: str,
    time: str,
    partition_by: Sequence[str] = (),
    properties: dict[str, str] | None = None,
    event_id: str = DEFAULT_EVENT_ID,
) -> "SequenceTable":
    """Create an event table keyed by ``key`` (user) and ordered by ``time``.

    featurelake tables need a primary key; events have none, so unless the
    schema already holds ``event_id`` (then the caller supplies unique ids),
    an int64 ``event_id`` column is added and ``append`` assigns increasing
    ids. Increasing ids keep the duplicate-key check cheap: the new ids lie
    above every existing file's id range, so no data file is read.
    """
    if not isinstance(schema, pa.Schema):
        raise SchemaMismatchError(f"schema must be a pyarrow.Schema, got {type(schema).__name__}")
    for role, col in (("key", key), ("time", time)):
        if col not in schema.names:
            raise SchemaMismatchError(f"sequence {role} column {col!r} is not in the schema {schema.names}", [col])
    KeyCodec.for_type(schema.field(key).type)
    tt = schema.field(time).type
    if not (pa.types.is_timestamp(tt) or pa.types.is_integer(tt)):
        raise SchemaMismatchError(f"sequence time column {time!r} must be a timestamp or integer, not {tt}", [time])
    if key == time:
        raise SchemaMismatchError("the key and time columns must differ", [key])
    synthetic = event_id not in schema.names
    fields = [f.with_nullable(False) if f.name in (key, time) else f for f in schema]
    if synthetic:
        fields.append(pa.field(event_id, pa.int64(), nullable=False))
    props = {
        PROP_KEY: key,
        PROP_TIME: time,
        PROP_EVENT_ID: event_id,
        PROP_SYNTHETIC: "true" if synthetic else "false",
        f"write.metadata.metrics.column.{key}": "full",
        f"write.metadata.metrics.column.{time}": "full",
    }
    props.update(properties or {})
    table = lake.create_table(name, pa.schema(fields), primary_key=event_id, partition_by=partition_by, properties=props)
    st = SequenceTable(lake, name, table.iceberg)
    try:  # declare the physical row order (any writer or compactor may honour it)
        from pyiceberg.transforms import IdentityTransform

        with st.iceberg.update_sort_order() as so:
            so.asc(key, IdentityTransform())
            so.asc(time, IdentityTransform())
    except Exception:  # a catalog without sort-order support: the order is still applied by append
        pass
    return st


def open_sequence_table(lake: "Lake", name: str) -> "SequenceTable":
    table = lake.table(name)
    if PROP_KEY not in table.iceberg.metadata.properties:
        raise TableNotFoundError(f"{name!r} is a table but not a sequence table (create it with create_sequence_table)")
    return SequenceTable(lake, name, table.iceberg)


# ==================================================================== builds
@dataclasses.dataclass
class BuildInfo:
    """One store build: the snapshot it reflects, where it lives, what it holds.

    ``layers`` are sorted-file paths relative to the build folder, oldest
    layer first; ``bytes`` counts this build's new files, ``store_bytes`` all
    layers (shared layers are hard links, so disk use is lower).
    """

    build_id: str
    table: str
    snapshot_id: int
    branch: str | None
    created_at: str
    key: str
    time: str
    key_type: str
    time_type: str
    chunk_events: int
    column_groups: list[list[str]]
    group_schemas: list[str]
    store: dict
    layers: list[list[str]]
    users: int
    events: int
    chunks: int
    bytes: int
    store_bytes: int
    group_codecs: list[dict] = dataclasses.field(default_factory=list)
    codec_mode: str = "auto"
    columns: list[str] = dataclasses.field(default_factory=list)  # time + attributes, in table order
    incremental: bool = False
    base_build: str | None = None
    new_events: int = 0
    affected_users: int = 0
    seconds: float = 0.0
    format: int = BUILD_FORMAT
    path: str = ""

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("group_schemas")
        d["group_codecs"] = [c.get("kind", "ipc") for c in self.group_codecs]
        return d

    @property
    def db_dir(self) -> str:
        return str(Path(self.path) / "db")

    def layout(self) -> tuple:
        """What must match for an incremental build to extend this one."""
        return (self.key, self.time, self.key_type, self.time_type, self.chunk_events,
                self.column_groups, self.group_schemas, self.store, self.codec_mode)

    def schemas(self) -> list[pa.Schema]:
        return [ipc.read_schema(pa.py_buffer(base64.b64decode(s))) for s in self.group_schemas]

    def codecs(self) -> list:
        schemas = self.schemas()
        raw = self.group_codecs or [{"kind": "ipc"}] * len(schemas)
        return [codec_from_dict(d, s, self.chunk_events) for d, s in zip(raw, schemas)]


def _load_build(path: Path) -> BuildInfo:
    import json

    raw = json.loads((path / "build.json").read_text())
    raw["path"] = str(path)
    known = {f.name for f in dataclasses.fields(BuildInfo)}
    return BuildInfo(**{k: v for k, v in raw.items() if k in known})


@dataclasses.dataclass
class _Layout:
    key: str
    time: str
    event_id: str
    synthetic: bool
    key_type: pa.DataType
    time_type: pa.DataType
    chunk_events: int
    groups: list[list[str]]          # attribute columns per group
    attributes: list[str]            # every stored attribute, in table order
    group_schemas: list[pa.Schema]   # group 0 carries the time column too (the hot group)
    codec_mode: str = "auto"         # "auto": fixed-size chunks where the types allow; "ipc": Arrow IPC everywhere

    @property
    def stored(self) -> list[str]:
        return [c for g in self.groups for c in g]

    @property
    def scan_columns(self) -> list[str]:
        extra = [self.event_id] if self.event_id not in self.stored else []
        return [self.key, self.time] + extra + self.stored

    def dictionary_columns(self) -> list[str]:
        """String columns of groups that could use the fixed codec (their distinct values are counted)."""
        if self.codec_mode != "auto":
            return []
        out = []
        for schema in self.group_schemas:
            if all(fixed_dtype(f.type) is not None or is_string(f.type) for f in schema):
                out += [f.name for f in schema if is_string(f.type)]
        return out

    def plan_codecs(self, uniques: dict[str, list[str] | None]) -> list:
        if self.codec_mode != "auto":
            return [IpcCodec(s) for s in self.group_schemas]
        return [FixedCodec.plan(s, self.chunk_events, uniques, delta=[self.time]) or IpcCodec(s) for s in self.group_schemas]


# ============================================================ the table
class SequenceTable(Table):
    """An event table plus its serving store (see the module docstring)."""

    # ------------------------------------------------------------ identity
    @property
    def _props(self) -> dict[str, str]:
        return self._ice.metadata.properties

    @property
    def key(self) -> str:
        return self._props[PROP_KEY]

    @property
    def time(self) -> str:
        return self._props[PROP_TIME]

    @property
    def event_id(self) -> str:
        return self._props.get(PROP_EVENT_ID, DEFAULT_EVENT_ID)

    @property
    def synthetic_event_id(self) -> bool:
        return self._props.get(PROP_SYNTHETIC, "true") == "true"

    def __repr__(self) -> str:
        return f"SequenceTable({self.name!r}, key={self.key!r}, time={self.time!r})"

    @property
    def store_root(self) -> Path:
        """Where this table's store builds live.

        Embedded lakes: ``<home>/sequences/<table>``. Otherwise
        ``$FEATURELAKE_SEQUENCE_HOME/<table>``, or next to the table when its
        location is a local folder (RocksDB needs a local disk).
        """
        env = os.environ.get("FEATURELAKE_SEQUENCE_HOME")
        if self.lake.home is not None:
            return Path(self.lake.home) / "sequences" / self.name
        if env:
            return Path(env) / self.name
        loc = self._ice.location()
        if loc.startswith("file:") or "://" not in loc:
            from urllib.parse import unquote, urlparse

            local = unquote(urlparse(loc).path) if loc.startswith("file:") else loc
            return Path(local) / "sequence-store"
        raise SequenceBuildError(
            f"{self.name} lives at {loc}: set FEATURELAKE_SEQUENCE_HOME to a local folder for its sequence store"
        )

    # -------------------------------------------------------------- writing
    def append(self, data: Any, branch: str = MAIN) -> int | None:
        """Append events: key and time must be set; rows are sorted by (key, time) per file.

        With a synthetic ``event_id`` the ids are assigned here (increasing);
        a concurrent append that took the same ids is retried (materialized
        input) or refused with DuplicateKeyError (a stream, nothing written).
        """
        materialized = isinstance(data, (pa.Table, pa.RecordBatch)) or type(data).__name__ == "DataFrame"
        attempts = 3 if materialized and self.synthetic_event_id else 1
        for attempt in range(attempts):
            base = self._next_event_id(branch) if self.synthetic_event_id else 0
            try:
                return super().append(self._prepared_events(data, base), branch=branch)
            except DuplicateKeyError:
                if attempt + 1 == attempts:
                    raise
        return None  # pragma: no cover

    def _prepared_events(self, data: Any, base: int) -> Iterator[pa.Table]:
        key, time, eid = self.key, self.time, self.event_id
        for chunk in _chunks(data):
            for col in (key, time):
                if col not in chunk.column_names:
                    raise SchemaMismatchError(f"events need the {col!r} column", [col])
            if chunk.column(key).null_count:
                raise NullKeyError(f"{chunk.column(key).null_count} event(s) have a null {key!r}", count=chunk.column(key).null_count)
            if chunk.column(time).null_count:
                raise SchemaMismatchError(f"{chunk.column(time).null_count} event(s) have a null {time!r}", [time])
            if not self.synthetic_event_id:
                yield chunk.sort_by([(key, "ascending"), (time, "ascending"), (eid, "ascending")])
                continue
            if eid in chunk.column_names:
                raise SchemaMismatchError(f"{eid!r} is assigned by the sequence table; leave it out of the events", [eid])
            # ids follow the written order (ties keep arrival order): they stay sequential inside each file
            chunk = chunk.take(pc.sort_indices(chunk, [(key, "ascending"), (time, "ascending")]))
            yield chunk.append_column(eid, pa.array(np.arange(base, base + chunk.num_rows, dtype=np.int64)))
            base += chunk.num_rows

    def _next_event_id(self, branch: str) -> int:
        from pyiceberg.conversions import from_bytes

        ice = self.refresh()
        head = refs.branch_head(ice.metadata, branch)
        if head is None:
            return 0
        field = ice.schema().find_field(self.event_id)
        top = -1
        for task in ice.scan(snapshot_id=head.snapshot_id).plan_files():
            upper = (task.file.upper_bounds or {}).get(field.field_id)
            if upper is None:  # a file without statistics: read the ids
                col = self.scan([self.event_id], snapshot_id=head.snapshot_id, ice=ice).to_table().column(0)
                m = pc.max(col).as_py()
                return 0 if m is None else int(m) + 1
            top = max(top, int(from_bytes(field.field_type, upper)))
        return top + 1

    # --------------------------------------------------------------- builds
    def builds(self) -> list[BuildInfo]:
        """Every finished build of this table, oldest first."""
        root = self.store_root
        if not root.exists():
            return []
        out = []
        for d in sorted(root.iterdir()):
            if d.is_dir() and not d.name.startswith(".") and (d / "build.json").exists():
                try:
                    out.append(_load_build(d))
                except (OSError, ValueError, TypeError):
                    continue  # a damaged record: ignored, like an unfinished build
        return sorted(out, key=lambda b: (b.created_at, b.build_id))

    def build_for(self, branch: str = MAIN, snapshot_id: int | None = None, build: str | None = None) -> BuildInfo:
        """The build a reader of ``branch`` (or ``snapshot_id``) must use; a clear error when none matches."""
        all_builds = self.builds()
        if build is not None:
            for b in all_builds:
                if b.build_id == build:
                    return b
            raise SequenceBuildError(f"no build {build!r} of {self.name}; builds: {[b.build_id for b in all_builds]}")
        ice = self.refresh()
        snap = refs.resolve(ice.metadata, branch, snapshot_id)
        if snap is None:
            raise SequenceBuildError(f"{self.name}@{branch} has no events yet: append events and build first")
        matching = [b for b in all_builds if b.snapshot_id == snap.snapshot_id]
        if matching:
            return matching[-1]
        where = f"snapshot {snapshot_id}" if snapshot_id is not None else f"{branch} (snapshot {snap.snapshot_id})"
        latest = f"; the latest build reflects snapshot {all_builds[-1].snapshot_id}" if all_builds else "; there are no builds yet"
        raise SequenceBuildError(
            f"no sequence store build of {self.name} reflects {where}{latest}: run build(branch={branch!r})"
            + (f" or build(snapshot_id={snapshot_id})" if snapshot_id is not None else "")
        )

    def drop_build(self, build_id: str) -> None:
        """Delete one build (later builds keep their own links to shared files)."""
        info = self.build_for(build=build_id)
        READERS.drop(info.db_dir)
        shutil.rmtree(info.path, ignore_errors=True)

    def prune_builds(self, keep_last: int = 2) -> list[str]:
        """Delete all but the newest ``keep_last`` builds; returns the ids deleted."""
        builds = self.builds()
        doomed = builds[: max(0, len(builds) - max(keep_last, 0))]
        for b in doomed:
            self.drop_build(b.build_id)
        return [b.build_id for b in doomed]

    def build(
        self,
        branch: str = MAIN,
        snapshot_id: int | None = None,
        *,
        incremental: bool = True,
        chunk_events: int | None = None,
        column_groups: Sequence[Sequence[str]] | None = None,
        backend: StoreBackend | None = None,
        bucket_rows: int = BUCKET_ROWS,
        force: bool = False,
        threads: int = DEFAULT_THREADS,
        codecs: str | None = None,
    ) -> BuildInfo:
        """Build the serving store for a branch head (or a snapshot); returns its record.

        Reuses an existing build of that snapshot unless ``force``. With
        ``incremental`` and a previous build whose snapshot's data files are
        all still live (appends only since), only users with new events are
        re-encoded, from their first affected chunk on. ``column_groups``
        splits attributes into separately fetched groups, hot first: the
        first group also holds the time column. ``codecs="auto"`` stores
        groups of fixed-width and low-cardinality string columns as fixed-size
        raw chunks (decoded without per-chunk work), others as Arrow IPC;
        ``"ipc"`` uses Arrow IPC everywhere.
        """
        t0 = _time.perf_counter()
        ice = self.refresh()
        snap = refs.resolve(ice.metadata, branch, snapshot_id)
        if snap is None:
            raise SequenceBuildError(f"{self.name}@{branch} has no events yet: append events first")
        previous = self.builds()
        inherit = previous and chunk_events is None and column_groups is None and codecs is None
        layout = self._layout(ice, snap, chunk_events, column_groups, previous, codecs)
        backend = backend or (backend_from_dict(previous[-1].store) if inherit else RocksDBBackend())
        if not force:
            same = [b for b in previous if b.snapshot_id == snap.snapshot_id and _layout_key(layout, backend) == b.layout()]
            if same:
                return same[-1]
        base, new_files = (self._incremental_base(ice, snap, layout, backend, previous) if incremental else (None, None))

        build_id = f"{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%S%f}-{uuid.uuid4().hex[:6]}"
        root = self.store_root
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / f".tmp-{build_id}"
        final = root / build_id
        try:
            (tmp / "sst").mkdir(parents=True)
            extended = None
            if base is not None:
                extended = _extend_build(self, ice, snap, layout, backend, base, new_files, tmp, threads)
                if extended is None:  # e.g. a dictionary outgrew the fixed codec: start over
                    base = None
                    shutil.rmtree(tmp / "sst", ignore_errors=True)
                    (tmp / "sst").mkdir()
            layers, stats, codec_list = extended or _full_build(self, ice, snap, layout, backend, tmp, bucket_rows)
            backend.assemble(str(tmp / "db"), [[str(tmp / p) for p in layer] for layer in layers])
            sizes = [[os.path.getsize(tmp / p) for p in layer] for layer in layers]
            info = BuildInfo(
                build_id=build_id,
                table=self.name,
                snapshot_id=snap.snapshot_id,
                branch=branch if snapshot_id is None else None,
                created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(),
                key=layout.key,
                time=layout.time,
                key_type=str(layout.key_type),
                time_type=str(layout.time_type),
                chunk_events=layout.chunk_events,
                column_groups=[list(g) for g in layout.groups],
                group_schemas=[_schema_b64(s) for s in layout.group_schemas],
                group_codecs=[c.to_dict() for c in codec_list],
                codec_mode=layout.codec_mode,
                columns=[layout.time] + layout.attributes,
                store=backend.describe(),
                layers=layers,
                bytes=sum(map(sum, sizes[len(base.layers):])) if base is not None else sum(map(sum, sizes)),
                store_bytes=sum(map(sum, sizes)),
                incremental=base is not None,
                base_build=base.build_id if base is not None else None,
                seconds=round(_time.perf_counter() - t0, 3),
                **stats,
            )
            payload = dataclasses.asdict(info)
            payload.pop("path")
            write_json_atomic(tmp / "build.json", payload)
            os.replace(tmp, final)  # the build exists from here on, whole or not at all
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        info.path = str(final)
        return info

    def _layout(self, ice, snap, chunk_events, column_groups, previous: list[BuildInfo], codecs: str | None = None) -> _Layout:
        from featurelake.schema import arrow_schema

        schema_id = snap.schema_id if snap.schema_id is not None else ice.metadata.current_schema_id
        ice_schema = ice.metadata.schema_by_id(schema_id) or ice.schema()
        arrow = arrow_schema(ice_schema, field_ids=False)
        key, time, eid = self.key, self.time, self.event_id
        synthetic = self.synthetic_event_id
        attrs = [n for n in arrow.names if n not in (key, time) and not (synthetic and n == eid)]
        if column_groups is None and chunk_events is None and codecs is None and previous:
            last = previous[-1]
            if sorted(c for g in last.column_groups for c in g) == sorted(attrs):
                column_groups, chunk_events, codecs = last.column_groups, last.chunk_events, last.codec_mode
        codecs = codecs or "auto"
        if codecs not in ("auto", "ipc"):
            raise FeatureLakeError(f"codecs must be 'auto' or 'ipc', not {codecs!r}")
        groups = _check_groups(column_groups, attrs, time)
        c = int(chunk_events or DEFAULT_CHUNK_EVENTS)
        if not 1 <= c <= 1 << 20:
            raise FeatureLakeError(f"chunk_events must be between 1 and 2**20, not {chunk_events}")
        group_schemas = [pa.schema(([arrow.field(time)] if i == 0 else []) + [arrow.field(n) for n in g])
                         for i, g in enumerate(groups)]
        return _Layout(key, time, eid, synthetic, arrow.field(key).type, arrow.field(time).type, c, groups,
                       attrs, group_schemas, codecs)

    def _incremental_base(self, ice, snap, layout, backend, previous) -> tuple[BuildInfo | None, set[str] | None]:
        """The newest build this snapshot extends by appends only, and the data files added since."""
        want = _layout_key(layout, backend)
        target_files = None
        target_updates = self._update_files(ice, snap)
        for b in reversed(previous):
            if b.format != BUILD_FORMAT or b.layout() != want or len(b.layers) >= MAX_LAYERS:
                continue
            base_snap = ice.metadata.snapshot_by_id(b.snapshot_id)
            if base_snap is None or self._update_files(ice, base_snap) != target_updates:
                continue  # expired, or columns were backfilled since: values changed in place
            if target_files is None:
                target_files = {t.file.file_path for t in ice.scan(snapshot_id=snap.snapshot_id).plan_files()}
            base_files = {t.file.file_path for t in ice.scan(snapshot_id=base_snap.snapshot_id).plan_files()}
            if base_files <= target_files and Path(b.path).exists():
                return b, target_files - base_files
        return None, None

    def _update_files(self, ice, snap) -> frozenset[str]:
        state = self._state(ice, snap)
        return frozenset() if state.empty else frozenset(e.update_file for e in state.entries())

    # ---------------------------------------------------------------- reads
    def open_store(self, branch: str = MAIN, snapshot_id: int | None = None, build: str | None = None) -> "SequenceStore":
        """The servable store of the build matching ``branch``/``snapshot_id`` (or named ``build``)."""
        return SequenceStore(self.build_for(branch, snapshot_id, build))

    def lookup(
        self,
        keys: Any,
        before: Any = None,
        columns: Sequence[str] | None = None,
        max_len: int | None = None,
        window: Any = None,
        branch: str = MAIN,
        snapshot_id: int | None = None,
        build: str | None = None,
        threads: int = DEFAULT_THREADS,
    ) -> pa.ListArray:
        """Each key's events with time < ``before``, only ``columns``, the last ``max_len`` within ``window``.

        ``before`` is one time for all keys or one per key (None: no bound);
        ``window`` a timedelta (integer time: units) counted back from
        ``before``. Returns a list<struct> array aligned with ``keys``, oldest
        event first; unknown or null keys get an empty list. Reads the build
        that reflects the branch head (or ``snapshot_id``), else
        SequenceBuildError. The last call's IO figures are in
        ``last_lookup_stats``.
        """
        store = self.open_store(branch, snapshot_id, build)
        keys = _as_array(keys, store.key_type)
        out = store.lookup(keys, before, columns, max_len, window, threads=threads)
        self.last_lookup_stats = dict(store.last_stats)
        return out

    def view(
        self,
        key: str,
        time: str,
        columns: Sequence[str] | None = None,
        max_len: int | None = 256,
        window: Any = None,
        branch: str = MAIN,
        snapshot_id: int | None = None,
        build: str | None = None,
        threads: int = DEFAULT_THREADS,
        batch_keys: int = DEFAULT_BATCH_KEYS,
    ) -> "SequenceView":
        """A join spec for ``Table.read/batches(sequences={name: view})``.

        ``key`` and ``time`` name the training row's columns holding the user
        and the row's time (events strictly before it are joined). The build
        is resolved now, so every batch of an epoch sees the same store.
        """
        store = self.open_store(branch, snapshot_id, build)
        cols = store.check_columns(columns)
        return SequenceView(store, key, time, cols, max_len, window, threads, batch_keys)

    def store_stats(self, branch: str = MAIN) -> dict[str, Any]:
        """Table figures plus the builds and whether the branch head has one."""
        stats = self.stats(branch=branch)
        builds = self.builds()
        head = stats.get("snapshot_id")
        return {
            "table": self.name,
            "branch": branch,
            "key": self.key,
            "time": self.time,
            "snapshot_id": head,
            "events": stats.get("rows"),
            "data_files": stats.get("data_files"),
            "table_bytes": stats.get("bytes"),
            "head_built": any(b.snapshot_id == head for b in builds),
            "builds": [
                {k: b.to_dict()[k] for k in ("build_id", "snapshot_id", "incremental", "users", "events", "chunks",
                                             "bytes", "store_bytes", "seconds", "created_at")}
                for b in builds
            ],
        }


def _layout_key(layout: _Layout, backend: StoreBackend) -> tuple:
    return (layout.key, layout.time, str(layout.key_type), str(layout.time_type), layout.chunk_events,
            [list(g) for g in layout.groups], [_schema_b64(s) for s in layout.group_schemas], backend.describe(),
            layout.codec_mode)


def _schema_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def _check_groups(groups: Sequence[Sequence[str]] | None, attrs: list[str], time: str) -> list[list[str]]:
    if groups is None:
        return [list(attrs)]
    out: list[list[str]] = []
    seen: set[str] = set()
    for g in groups:
        g = [c for c in g if c != time]
        bad = [c for c in g if c not in attrs]
        if bad:
            raise SchemaMismatchError(f"column_groups name unknown attribute(s) {bad}; attributes: {attrs}", bad)
        twice = [c for c in g if c in seen]
        if twice:
            raise SchemaMismatchError(f"column_groups list {twice} more than once", twice)
        seen.update(g)
        if g:
            out.append(list(g))
    rest = [c for c in attrs if c not in seen]
    if rest or not out:
        out.append(rest)
    if len(out) > 255:
        raise FeatureLakeError("at most 255 column groups")
    return out


# ================================================================ encoding
def _int_times(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if pa.types.is_timestamp(arr.type):
        arr = arr.cast(pa.int64())
    return arr.cast(pa.int64()).to_numpy(zero_copy_only=False)


def _uniques(tbl: pa.Table, columns: Sequence[str], into: dict[str, set | None]) -> None:
    """Add the distinct values of string ``columns`` to ``into`` (None once past DICT_MAX)."""
    for col in columns:
        seen = into.get(col, set())
        if seen is None:
            continue
        seen.update(v for v in pc.unique(tbl.column(col)).to_pylist() if v is not None)
        into[col] = seen if len(seen) <= DICT_MAX else None


def _as_lists(uniques: dict[str, set | None]) -> dict[str, list[str] | None]:
    return {k: (sorted(v) if v is not None else None) for k, v in uniques.items()}


def _encode_sorted(
    tbl: pa.Table,
    layout: _Layout,
    codecs: list,
    codec: KeyCodec,
    writer,
    prefix: dict | None = None,
) -> dict[str, int]:
    """Write the heads and chunks of every user in ``tbl`` (sorted by key, time).

    ``prefix`` maps a user to (first chunk number, first times of the chunks
    before it): an incremental build re-encodes a user from that chunk on.
    """
    n = tbl.num_rows
    if n == 0:
        return {"users": 0, "events": 0, "chunks": 0}
    c = layout.chunk_events
    keys = codec.values(tbl.column(layout.key).combine_chunks())
    times = _int_times(tbl.column(layout.time))
    starts = np.concatenate([[0], np.flatnonzero(keys[1:] != keys[:-1]) + 1, [n]])
    encoders = [cd.encoder(tbl.select(schema.names).cast(schema)) for cd, schema in zip(codecs, layout.group_schemas)]
    users = events = chunks = 0
    for i in range(len(starts) - 1):
        s, e = int(starts[i]), int(starts[i + 1])
        user = keys[s]
        k0, ft_prefix = (prefix or {}).get(user if codec.kind == "string" else int(user), (0, None))
        count = -(-(e - s) // c)
        ft = times[s:e:c][:count]
        if ft_prefix is not None and len(ft_prefix):
            ft = np.concatenate([ft_prefix, ft])
        head = np.concatenate([[k0 * c + (e - s), times[e - 1]], ft]).astype("<i8").tobytes()
        p = codec.prefix(user)
        writer.put(p + b"\x00", head)
        for j in range(count):
            off = s + j * c
            ln = min(c, e - off)
            ck = p + b"\x01" + (k0 + j).to_bytes(4, "big")
            for g, enc in enumerate(encoders):
                writer.put(ck + bytes([g]), enc(off, ln))
        users += 1
        events += k0 * c + (e - s)
        chunks += k0 + count
    return {"users": users, "events": events, "chunks": chunks}


def _sort_events(tbl: pa.Table, layout: _Layout) -> pa.Table:
    return tbl.sort_by([(layout.key, "ascending"), (layout.time, "ascending"), (layout.event_id, "ascending")])


def _dropped(layout: _Layout) -> list[str]:
    return [layout.event_id] if layout.event_id not in layout.stored else []


def _full_build(st: SequenceTable, ice, snap, layout: _Layout, backend: StoreBackend, tmp: Path, bucket_rows: int):
    """Sort the whole snapshot by (key, time) in key-range buckets; one sorted file per bucket."""
    codec = KeyCodec.for_type(layout.key_type)
    scan = st.scan(layout.scan_columns, snapshot_id=snap.snapshot_id, ice=ice)
    total_rows = sum(t.file.record_count for t in scan.tasks())
    totals = {"users": 0, "events": 0, "chunks": 0}
    files: list[str] = []
    dict_cols = layout.dictionary_columns()
    uniques: dict[str, set | None] = {}

    def encode(tbl: pa.Table, index: int, codecs: list) -> None:
        rel = f"sst/L000/part-{index:05d}.sst"
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        w = backend.writer(str(tmp / rel))
        got = _encode_sorted(_sort_events(tbl, layout).drop_columns(_dropped(layout)), layout, codecs, codec, w)
        if w.finish():
            files.append(rel)
        for k in totals:
            totals[k] += got[k]

    if total_rows <= bucket_rows:
        tbl = scan.to_table()
        _uniques(tbl, dict_cols, uniques)
        codecs = layout.plan_codecs(_as_lists(uniques))
        encode(tbl, 0, codecs)
        return [files], totals, codecs
    bounds = _key_bounds(st, ice, snap, layout, codec, -(-total_rows // bucket_rows))
    spill_dir = tmp / "spill"
    spill_dir.mkdir()
    writers: dict[int, ipc.RecordBatchFileWriter] = {}
    try:
        for batch in scan.to_batches():
            if not batch.num_rows:
                continue
            _uniques(pa.Table.from_batches([batch]), dict_cols, uniques)
            b = np.searchsorted(bounds, codec.values(batch.column(layout.key)), side="right")
            order = np.argsort(b, kind="stable")
            sb = b[order]
            cuts = np.flatnonzero(np.diff(sb)) + 1
            for lo, hi in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [len(sb)]])):
                bucket = int(sb[lo])
                if bucket not in writers:
                    writers[bucket] = ipc.new_file(str(spill_dir / f"{bucket:05d}.arrow"), scan.output_schema)
                writers[bucket].write_batch(batch.take(pa.array(order[lo:hi])))
    finally:
        for w in writers.values():
            w.close()
    codecs = layout.plan_codecs(_as_lists(uniques))
    for bucket in sorted(writers):
        path = spill_dir / f"{bucket:05d}.arrow"
        with pa.memory_map(str(path)) as src:
            tbl = ipc.open_file(src).read_all()
        encode(tbl, bucket, codecs)
        del tbl
        path.unlink()
    shutil.rmtree(spill_dir, ignore_errors=True)
    return [files], totals, codecs


def _key_bounds(st, ice, snap, layout: _Layout, codec: KeyCodec, buckets: int) -> np.ndarray:
    """Key-range boundaries giving ~equal buckets, from a sample of the key column."""
    sample = []
    scan = st.scan([layout.key], snapshot_id=snap.snapshot_id, ice=ice)
    for batch in scan.to_batches():
        vals = codec.values(batch.column(0))
        sample.append(vals[:: max(1, len(vals) // 2048)])
    allv = np.sort(np.concatenate(sample)) if sample else np.array([])
    if not len(allv):
        return allv
    qs = [allv[min(len(allv) - 1, int(len(allv) * i / buckets))] for i in range(1, buckets)]
    return np.array(sorted(set(qs)), dtype=allv.dtype)


def _extend_build(st: SequenceTable, ice, snap, layout: _Layout, backend: StoreBackend, base: BuildInfo,
                  new_files: set[str], tmp: Path, threads: int):
    """Base layers (hard links) plus one new layer re-encoding the users with new events.

    Returns None when the new events do not fit the base's codecs (a
    dictionary would grow past DICT_MAX): the caller builds from scratch.
    """
    from featurelake.seqstore import _link_or_copy

    codec = KeyCodec.for_type(layout.key_type)
    codecs = base.codecs()
    new = None
    if new_files:
        scan = st.scan(layout.scan_columns, snapshot_id=snap.snapshot_id, ice=ice)
        parts = [b for t in scan.tasks() if t.file.file_path in new_files for b in scan.read_file(t)]
        new = pa.Table.from_batches(parts, schema=scan.output_schema) if parts else None
    if new is not None and new.num_rows:
        uniques: dict[str, set | None] = {}
        fixed = [cd for cd in codecs if isinstance(cd, FixedCodec)]
        _uniques(new, [n for cd in fixed for n in cd.dictionaries], uniques)
        grown = []
        for cd in codecs:
            if isinstance(cd, FixedCodec) and cd.dictionaries:
                cd = cd.extended(_as_lists(uniques))
                if cd is None:
                    return None
            grown.append(cd)
        codecs = grown

    layers: list[list[str]] = []
    for li, layer in enumerate(base.layers):
        out = []
        for p in layer:
            rel = f"sst/L{li:03d}/{Path(p).name}"
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(str(Path(base.path) / p), str(tmp / rel))
            out.append(rel)
        layers.append(out)
    stats = {"users": base.users, "events": base.events, "chunks": base.chunks, "new_events": 0, "affected_users": 0}
    if new is None or not new.num_rows:
        return layers, stats, codecs
    new = _sort_events(new, layout).drop_columns(_dropped(layout))
    store = SequenceStore(base)
    c = layout.chunk_events
    key_vals = codec.values(new.column(layout.key).combine_chunks())
    times = _int_times(new.column(layout.time))
    users, first = np.unique(key_vals, return_index=True)   # first row of each user = its earliest new event
    heads = store.multi_get(codec.head_keys(users), threads)
    prefix: dict = {}
    pair_users: list = []
    pair_chunks: list[int] = []
    pair_counts: list[int] = []
    old_users = old_events = old_chunks = 0
    for u, h, f in zip(users, heads, first):
        if h is None:
            continue
        arr = np.frombuffer(h, "<i8")
        n_old, ft = int(arr[0]), arr[2:]
        k0 = max(0, int(np.searchsorted(ft, times[f], side="right")) - 1)
        uk = u if codec.kind == "string" else int(u)
        prefix[uk] = (k0, ft[:k0].copy())
        for k in range(k0, len(ft)):
            pair_users.append(u)
            pair_chunks.append(k)
            pair_counts.append(min(c, n_old - k * c))
        old_users += 1
        old_events += n_old
        old_chunks += len(ft)
    merged = new
    if pair_users:
        pu = np.asarray(pair_users, dtype=users.dtype)
        counts = np.asarray(pair_counts, dtype=np.int64)
        groups = list(range(len(layout.groups)))
        values = store.multi_get(codec.chunk_keys(pu, np.asarray(pair_chunks, dtype=np.int64), groups), threads)
        if any(v is None for v in values):
            raise CorruptFileError(f"build {base.build_id} lacks chunks its heads list", base.db_dir)
        ng = len(groups)
        cols = {}
        for g, cd in enumerate(store.codecs):
            table = cd.decode(values[g::ng], counts, c)
            for name in table.column_names:
                cols[name] = table.column(name)
        keys_rep = np.repeat(pu, counts)
        key_arr = pa.array(keys_rep if codec.kind == "int" else list(keys_rep), type=layout.key_type)
        old_tbl = pa.table({layout.key: key_arr, **cols}).select(new.column_names).cast(new.schema)
        tie, pos = "__featurelake_src", "__featurelake_pos"
        old_tbl = old_tbl.append_column(tie, pa.array(np.zeros(old_tbl.num_rows, np.int8))).append_column(
            pos, pa.array(np.arange(old_tbl.num_rows)))
        new_t = new.append_column(tie, pa.array(np.ones(new.num_rows, np.int8))).append_column(
            pos, pa.array(np.arange(new.num_rows)))
        merged = pa.concat_tables([old_tbl, new_t]).sort_by(
            [(layout.key, "ascending"), (layout.time, "ascending"), (tie, "ascending"), (pos, "ascending")]
        ).drop_columns([tie, pos])
    rel = f"sst/L{len(layers):03d}/delta-00000.sst"
    (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
    w = backend.writer(str(tmp / rel))
    got = _encode_sorted(merged, layout, codecs, codec, w, prefix)
    if w.finish():
        layers.append([rel])
    stats["users"] = base.users - old_users + got["users"]
    stats["events"] = base.events - old_events + got["events"]
    stats["chunks"] = base.chunks - old_chunks + got["chunks"]
    stats["new_events"] = new.num_rows
    stats["affected_users"] = len(users)
    return layers, stats, codecs


# ================================================================== reading
class SequenceStore:
    """One build opened for reading: heads, chunk selection, parallel fetch, assembly."""

    def __init__(self, info: BuildInfo) -> None:
        if info.format != BUILD_FORMAT:
            raise SequenceBuildError(
                f"build {info.build_id} has store format {info.format}; this featurelake reads format {BUILD_FORMAT}: rebuild"
            )
        self.info = info
        self.backend = backend_from_dict(info.store)
        if not Path(info.db_dir).exists():
            raise CorruptFileError(f"sequence store {info.db_dir} of build {info.build_id} is missing", info.db_dir)
        self.reader = READERS.get(info.db_dir, self.backend)
        self.schemas = info.schemas()
        self.codecs = info.codecs()
        self.time = info.time
        self.time_type = self.schemas[0].field(info.time).type
        self.key_type = _parse_type(info.key_type)
        self.codec = KeyCodec.for_type(self.key_type)
        self.chunk_events = int(info.chunk_events)
        self.group_of: dict[str, int] = {info.time: 0}
        for g, cols in enumerate(info.column_groups):
            for col in cols:
                self.group_of[col] = g
        self.columns = list(info.columns) or [info.time] + [c for g in info.column_groups for c in g]
        self.last_stats: dict[str, int] = {}
        self.recorder: list[list[bytes]] | None = None  # set to a list to keep every key fetched (benchmarks)

    # ------------------------------------------------------------- plumbing
    def check_columns(self, columns: Sequence[str] | None) -> list[str]:
        if columns is None:
            return list(self.columns)
        if isinstance(columns, str):
            columns = [columns]
        if not columns:
            raise SchemaMismatchError("columns must name at least one sequence column (None: all)")
        bad = [c for c in columns if c not in self.group_of]
        if bad:
            raise SchemaMismatchError(f"unknown sequence column(s) {bad}; stored: {self.columns}", bad)
        if len(set(columns)) != len(columns):
            raise SchemaMismatchError(f"columns repeat a name: {list(columns)}")
        return list(columns)

    def output_type(self, columns: Sequence[str]) -> pa.DataType:
        return pa.list_(pa.struct([self._field(c) for c in columns]))

    def _field(self, col: str) -> pa.Field:
        return self.schemas[self.group_of[col]].field(col)

    def multi_get(self, keys: list[bytes], threads: int = 1, batch: int = DEFAULT_BATCH_KEYS) -> list[bytes | None]:
        """Raw batched point reads, split into calls of ``batch`` keys over ``threads`` threads."""
        if self.recorder is not None:
            self.recorder.append(keys)
        if threads <= 1 or len(keys) <= batch:
            return self.reader.multi_get(keys)
        parts = [keys[i : i + batch] for i in range(0, len(keys), batch)]
        return list(chain.from_iterable(_pool(threads).map(self.reader.multi_get, parts)))

    def _fetch(self, users: np.ndarray, chunks: np.ndarray, names: dict[int, list[str]], threads: int,
               batch: int, stats: dict) -> dict[int, Any]:
        """Chunks of (user, chunk) pairs for the groups in ``names``, fetched and decoded in parallel.

        Per group: fixed codec -> {column: (values, validity)} with
        ``chunk_events`` slots per pair; IPC codec -> a Table of the pairs'
        events back to back.
        """
        groups = sorted(names)
        keys = self.codec.chunk_keys(users, chunks, groups)
        if self.recorder is not None:
            self.recorder.append(keys)
        ng = len(groups)
        per = max(ng, (batch // ng) * ng)

        def work(lo: int) -> tuple[list[Any], int]:
            vals = self.reader.multi_get(keys[lo : lo + per])
            if any(v is None for v in vals):
                raise CorruptFileError(
                    f"sequence store {self.info.db_dir} lacks a chunk its head lists (build {self.info.build_id})",
                    self.info.db_dir,
                )
            out = []
            for gi, g in enumerate(groups):
                cd = self.codecs[g]
                part = vals[gi::ng]
                out.append(cd.decode_padded(part, names[g]) if isinstance(cd, FixedCodec) else cd.decode(part, None, 0))
            return out, sum(map(len, vals))

        starts = range(0, len(keys), per)
        if threads > 1 and len(keys) > per:
            results = list(_pool(threads).map(work, starts))
        else:
            results = [work(s) for s in starts]
        merged: dict[int, Any] = {}
        for gi, g in enumerate(groups):
            parts = [r[0][gi] for r in results]
            if len(parts) == 1:
                merged[g] = parts[0]
            elif isinstance(self.codecs[g], FixedCodec):
                merged[g] = {
                    n: (np.concatenate([p[n][0] for p in parts]),
                        None if parts[0][n][1] is None else np.concatenate([p[n][1] for p in parts]))
                    for n in names[g]
                }
            else:
                merged[g] = pa.concat_tables(parts)
        stats["chunk_bytes"] += sum(r[1] for r in results)
        stats["chunk_values"] += len(keys)
        return merged

    # --------------------------------------------------------------- lookup
    def lookup(self, keys: pa.Array, before: Any, columns: Sequence[str] | None, max_len: int | None, window: Any,
               threads: int = DEFAULT_THREADS, batch_keys: int = DEFAULT_BATCH_KEYS) -> pa.ListArray:
        """See :meth:`SequenceTable.lookup`; ``keys`` must already have the key's Arrow type family."""
        columns = self.check_columns(columns)
        if max_len is not None and (isinstance(max_len, bool) or int(max_len) < 0):
            raise FeatureLakeError(f"max_len must be a non-negative int or None, not {max_len!r}")
        n = len(keys)
        b, b_valid = _before_ints(before, n, self.time_type)
        w = _window_int(window, self.time_type)
        if w is not None and b is None:
            raise FeatureLakeError("a window counts back from `before`: give before= too")
        stats = {"rows": n, "users": 0, "head_bytes": 0, "chunk_bytes": 0, "chunk_values": 0, "events": 0}
        valid = np.asarray(keys.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        if b_valid is not None:
            valid &= b_valid
        rows = np.flatnonzero(valid)
        lo = np.zeros(n, np.int64)
        hi = np.zeros(n, np.int64)
        delta = np.zeros(n, np.int64)
        fetched: dict[int, Any] = {}
        if len(rows):
            lo[rows], hi[rows], delta[rows], fetched = self._select(keys, rows, b, w, max_len, columns, threads,
                                                                    batch_keys, stats)
        lengths = hi - lo
        total = int(lengths.sum())
        if total >= 1 << 31:
            raise FeatureLakeError("a lookup returned more than 2**31 events: use smaller batches or max_len")
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(lengths, out=offsets[1:])
        idx = np.repeat(lo - offsets[:-1], lengths) + np.arange(total, dtype=np.int64)
        padded = None
        arrays = []
        fields = [self._field(c) for c in columns]
        for col, f in zip(columns, fields):
            g = self.group_of[col]
            if not total:
                arrays.append(pa.nulls(0, f.type))
            elif isinstance(self.codecs[g], FixedCodec):
                if padded is None:
                    padded = idx + np.repeat(delta, lengths)
                vals, ok = fetched[g][col]
                arrays.append(self.codecs[g].to_arrow(col, vals[padded], None if ok is None else ok[padded]))
            else:
                arrays.append(fetched[g].column(col).take(pa.array(idx)).combine_chunks())
        struct = pa.StructArray.from_arrays(arrays, fields=fields)
        stats["events"] = total
        self.last_stats = stats
        return pa.ListArray.from_arrays(pa.array(offsets), struct, type=self.output_type(columns))

    def _select(self, keys, rows, b, w, max_len, columns, threads, batch_keys, stats):
        """Per valid row: [lo, hi) into the pairs' events back to back, the offset of fixed-codec slots, and the data."""
        c = self.chunk_events
        kv = self.codec.values(keys.take(pa.array(rows)))
        users, inv = np.unique(kv, return_inverse=True)
        inv = inv.reshape(-1)
        stats["users"] = len(users)
        heads = self.multi_get(self.codec.head_keys(users), threads, batch_keys)
        lens = np.fromiter((len(h) // 8 if h else 0 for h in heads), np.int64, len(heads))
        stats["head_bytes"] = int(lens.sum()) * 8
        buf = np.frombuffer(b"".join(h for h in heads if h), "<i8")
        hstart = np.zeros(len(users) + 1, np.int64)
        np.cumsum(lens, out=hstart[1:])
        present = lens > 0
        n_chunks = np.where(present, lens - 2, 0)
        n_events = np.zeros(len(users), np.int64)
        n_events[present] = buf[hstart[:-1][present]]
        ft_start = np.zeros(len(users) + 1, np.int64)
        np.cumsum(n_chunks, out=ft_start[1:])
        if len(buf):
            header = np.zeros(len(buf), bool)
            header[hstart[:-1][present]] = True
            header[hstart[:-1][present] + 1] = True
            ft_pool = buf[~header]
        else:
            ft_pool = np.empty(0, np.int64)

        # which chunks each row needs: up to the last chunk starting before `before`,
        # back far enough for max_len events, not before the window
        br = b[rows] if b is not None else None
        if br is None:
            c_hi = n_chunks[inv] - 1
        else:
            c_hi = _seg_search(ft_pool, ft_start, inv, br) - ft_start[inv] - 1
        c_lo = np.zeros(len(rows), np.int64)
        if max_len is not None:
            c_lo = np.maximum(0, (c_hi * c + 1 - int(max_len)) // c)
        if w is not None:
            c_lo = np.maximum(c_lo, _seg_search(ft_pool, ft_start, inv, br - w) - ft_start[inv] - 1)
        m = np.maximum(c_hi - c_lo + 1, 0)
        if max_len == 0:
            m[:] = 0
        need = np.flatnonzero(m)
        lo = np.zeros(len(rows), np.int64)
        hi = np.zeros(len(rows), np.int64)
        delta = np.zeros(len(rows), np.int64)
        if not len(need):
            return lo, hi, delta, {}

        # the unique (user, chunk) pairs of the batch, in (user, chunk) order
        mn = m[need]
        rep = np.repeat(need, mn)
        step = np.arange(len(rep)) - np.repeat(np.cumsum(mn) - mn, mn)
        codes = np.unique(inv[rep].astype(np.int64) * (1 << 32) + c_lo[rep] + step)
        pair_user = codes >> 32
        pair_chunk = codes & 0xFFFFFFFF
        counts = np.minimum(c, n_events[pair_user] - pair_chunk * c)
        pool_off = np.zeros(len(codes) + 1, np.int64)
        np.cumsum(counts, out=pool_off[1:])

        need_time = br is not None
        names: dict[int, list[str]] = {}
        for col in columns:
            names.setdefault(self.group_of[col], []).append(col)
        if need_time and self.time not in names.setdefault(0, []):
            names[0].append(self.time)
        fetched = self._fetch(users[pair_user], pair_chunk, names, threads, batch_keys, stats)

        p_lo = np.searchsorted(codes, inv[need].astype(np.int64) * (1 << 32) + c_lo[need])
        s = pool_off[p_lo]
        e = pool_off[p_lo + mn]
        h = e
        if need_time:
            if isinstance(self.codecs[0], FixedCodec):
                slots = fetched[0][self.time][0].reshape(-1, c)
                tp = slots[np.arange(c)[None, :] < counts[:, None]]
            else:
                tp = _int_times(fetched[0].column(self.time))
            run_start = pool_off[np.searchsorted(pair_user, np.arange(len(users) + 1))]
            h = np.clip(_seg_search(tp, run_start, inv[need], br[need]), s, e)
        low = s.copy()
        if max_len is not None:
            low = np.maximum(low, h - int(max_len))
        if w is not None:
            low = np.maximum(low, np.clip(_seg_search(tp, run_start, inv[need], br[need] - w), s, e))
        lo[need] = np.minimum(low, h)
        hi[need] = h
        # fixed-codec slots: a row's pairs are whole chunks except maybe the last, so one offset maps them
        delta[need] = p_lo * c - pool_off[p_lo]
        return lo, hi, delta, fetched


def _seg_search(pool: np.ndarray, run_start: np.ndarray, q_run: np.ndarray, q: np.ndarray) -> np.ndarray:
    """For each query: the first position in its run of ``pool`` whose value is >= q.

    ``pool`` is sorted within each run ``[run_start[r], run_start[r+1])``.
    Vectorized: runs are laid end to end on one axis (run * span + value),
    split into groups of runs when that would overflow int64.
    """
    out = np.empty(len(q), np.int64)
    if not len(q):
        return out
    if not len(pool):
        return run_start[q_run].astype(np.int64)
    vmin, vmax = int(pool.min()), int(pool.max())
    span = vmax - vmin + 3
    qc = np.clip(q, vmin - 1, vmax + 1) - (vmin - 1)
    if span >= 1 << 61:  # absurd value ranges: one search per query
        for i, (r, v) in enumerate(zip(q_run, q)):
            a, z = run_start[r], run_start[r + 1]
            out[i] = a + np.searchsorted(pool[a:z], v, side="left")
        return out
    n_runs = len(run_start) - 1
    per = max(1, (1 << 62) // span)
    run_len = np.diff(run_start)
    shifted = pool - (vmin - 1)
    for g0 in range(0, n_runs, per):
        g1 = min(n_runs, g0 + per)
        sel = slice(None) if (g0 == 0 and g1 == n_runs) else (q_run >= g0) & (q_run < g1)
        p0, p1 = int(run_start[g0]), int(run_start[g1])
        combined = np.repeat(np.arange(g1 - g0, dtype=np.int64), run_len[g0:g1]) * span + shifted[p0:p1]
        qq = (q_run[sel].astype(np.int64) - g0) * span + qc[sel]
        out[sel] = p0 + np.searchsorted(combined, qq, side="left")
    return out


_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    with _POOLS_LOCK:
        pool = _POOLS.get(threads)
        if pool is None:
            pool = _POOLS[threads] = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="featurelake-seq")
        return pool


# ---------------------------------------------------------------- time values
_UNIT_NS = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


def _parse_type(text: str) -> pa.DataType:
    simple = {"int8": pa.int8(), "int16": pa.int16(), "int32": pa.int32(), "int64": pa.int64(), "uint8": pa.uint8(),
              "uint16": pa.uint16(), "uint32": pa.uint32(), "uint64": pa.uint64(), "string": pa.string(),
              "large_string": pa.large_string()}
    if text in simple:
        return simple[text]
    raise FeatureLakeError(f"unsupported sequence key type {text}")


def _as_array(values: Any, t: pa.DataType) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(np.asarray(values) if isinstance(values, np.ndarray) else list(values))
    if pa.types.is_integer(t) and pa.types.is_integer(values.type):
        return values.cast(pa.int64())
    if pa.types.is_null(values.type):
        return pa.nulls(len(values), pa.int64() if pa.types.is_integer(t) else pa.string())
    try:
        return values.cast(pa.int64() if pa.types.is_integer(t) else pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
        raise SchemaMismatchError(f"keys of type {values.type} do not fit the sequence key type {t}: {e}") from e


def _times_to_int(arr: pa.Array, target: pa.DataType) -> tuple[np.ndarray, np.ndarray]:
    """Times as int64 in the target's unit, rounding up (no event at or after the time slips in)."""
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    if pa.types.is_timestamp(target):
        if pa.types.is_date(arr.type):
            arr = arr.cast(pa.timestamp("s"))
        if pa.types.is_integer(arr.type):  # raw values in the sequence time's unit
            arr = arr.cast(pa.int64()).cast(target)
        if not pa.types.is_timestamp(arr.type):
            raise SchemaMismatchError(f"times of type {arr.type} cannot bound a {target} sequence time")
        raw = arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        src, dst = _UNIT_NS[arr.type.unit], _UNIT_NS[target.unit]
        if src > dst:
            raw = raw * (src // dst)
        elif src < dst:
            f = dst // src
            raw = -((-raw) // f)  # ceil: t < before  <=>  t < ceil(before) for whole target units
        return raw.astype(np.int64), valid
    if not pa.types.is_integer(arr.type):
        raise SchemaMismatchError(f"times of type {arr.type} cannot bound an integer sequence time")
    return arr.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64), valid


def _before_ints(before: Any, n: int, target: pa.DataType) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``before`` (None, one time, or one per key) as int64 in the sequence time's unit, plus validity."""
    if before is None:
        return None, None
    if isinstance(before, pa.ChunkedArray):
        before = before.combine_chunks()
    if isinstance(before, pa.Array):
        arr = before
    elif isinstance(before, np.ndarray) and before.ndim == 1:
        arr = pa.array(before)
    elif isinstance(before, (list, tuple)):
        arr = pa.array([_dt.datetime.fromisoformat(v) if isinstance(v, str) else v for v in before])
    else:
        value = before.as_py() if isinstance(before, pa.Scalar) else before
        if isinstance(value, str):
            value = _dt.datetime.fromisoformat(value)
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            arr = pa.array([int(value)], type=target if pa.types.is_timestamp(target) else pa.int64())
        else:
            arr = pa.array([value])
        ints, valid = _times_to_int(arr, target)
        return np.full(n, ints[0], np.int64), np.full(n, bool(valid[0]))
    if len(arr) != n:
        raise FeatureLakeError(f"before has {len(arr)} values for {n} keys")
    return _times_to_int(arr, target)


def _window_int(window: Any, target: pa.DataType) -> int | None:
    if window is None:
        return None
    if isinstance(window, _dt.timedelta):
        if not pa.types.is_timestamp(target):
            raise FeatureLakeError("a timedelta window needs a timestamp sequence time; give an int for integer times")
        us = window // _dt.timedelta(microseconds=1)
        w = us * 1000 // _UNIT_NS[target.unit]
    elif isinstance(window, np.timedelta64):
        return _window_int(window.astype("timedelta64[us]").item(), target)
    else:
        w = int(window)
    if w < 0:
        raise FeatureLakeError(f"window must not be negative, got {window!r}")
    return int(w)


# ==================================================================== joining
class SequenceView:
    """What ``Table.read/batches(sequences={name: view})`` joins: a store plus lookup settings."""

    def __init__(self, store: SequenceStore, key: str, time: str, columns: list[str], max_len: int | None,
                 window: Any, threads: int, batch_keys: int) -> None:
        self.store = store
        self.key = key
        self.time = time
        self.columns = columns
        self.max_len = max_len
        self.window = window
        self.threads = threads
        self.batch_keys = batch_keys
        self.type = store.output_type(columns)
        _window_int(window, store.time_type)  # fail now, not at the first batch
        self.stats: dict[str, int] = {}

    def __repr__(self) -> str:
        return (f"SequenceView({self.store.info.table}@{self.store.info.snapshot_id}, key={self.key!r}, "
                f"time={self.time!r}, columns={self.columns}, max_len={self.max_len})")

    def join(self, keys: pa.Array, times: pa.Array) -> pa.ListArray:
        """The list column for one batch of training rows."""
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        if isinstance(times, pa.ChunkedArray):
            times = times.combine_chunks()
        out = self.store.lookup(_as_array(keys, self.store.key_type), times, self.columns, self.max_len, self.window,
                                self.threads, self.batch_keys)
        for k, v in self.store.last_stats.items():
            self.stats[k] = self.stats.get(k, 0) + v
        return out


def _check_views(sequences: dict[str, Any], names: Sequence[str]) -> None:
    for name, view in sequences.items():
        if not isinstance(view, SequenceView):
            raise FeatureLakeError(f"sequences[{name!r}] must be a view from SequenceTable.view(), not {type(view).__name__}")
        if name in names:
            raise SchemaMismatchError(f"sequence column {name!r} clashes with a column of the read", [name])
        missing = [c for c in (view.key, view.time) if c not in names]
        if missing:
            raise SchemaMismatchError(f"the read has no column(s) {missing} for sequence {name!r}", missing)


def columns_for_join(columns: Sequence[str] | None, sequences: dict[str, Any]) -> tuple[list[str] | None, list[str]]:
    """The columns a read must fetch for its joins, and those to drop afterwards."""
    if columns is None:
        return None, []
    cols = list(columns)
    extra = []
    for view in sequences.values():
        for c in (getattr(view, "key", None), getattr(view, "time", None)):
            if c is not None and c not in cols and c not in extra:
                extra.append(c)
    return cols + extra, extra


def _join_one(data: pa.Table | pa.RecordBatch, sequences: dict[str, Any]):
    for name, view in sequences.items():
        col = view.join(data.column(view.key), data.column(view.time))
        data = data.append_column(pa.field(name, view.type), col)
    return data


def join_sequences(result: pa.Table, sequences: dict[str, Any], drop: Sequence[str] = ()) -> pa.Table:
    """Append one list<struct> column per view to ``result`` (row order kept), slice by slice."""
    _check_views(sequences, result.column_names)
    parts = [_join_one(pa.Table.from_batches([b]), sequences) for b in _slices(result)]
    if parts:
        out = pa.concat_tables(parts)
    else:
        empty = result.schema
        for name, view in sequences.items():
            empty = empty.append(pa.field(name, view.type))
        out = empty.empty_table()
    return out.drop_columns(list(drop)) if drop else out


def _slices(result: pa.Table) -> Iterator[pa.RecordBatch]:
    for batch in result.to_batches(max_chunksize=JOIN_SLICE_ROWS):
        if batch.num_rows:
            yield batch


def join_sequences_batches(stream: Iterator[pa.RecordBatch], sequences: dict[str, Any], drop: Sequence[str] = (),
                           prefetch: int = 1) -> Iterator[pa.RecordBatch]:
    """Join each batch of ``stream``; the next batch is joined in the background while one is consumed."""
    checked = False
    pending: list = []
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="featurelake-join")

    def finish(fut) -> pa.RecordBatch:
        out = fut.result()
        return out.drop_columns(list(drop)) if drop else out

    try:
        for batch in stream:
            if not checked:
                _check_views(sequences, batch.schema.names)
                checked = True
            pending.append(pool.submit(_join_one, batch, sequences))
            if len(pending) > prefetch:
                yield finish(pending.pop(0))
        while pending:
            yield finish(pending.pop(0))
    finally:
        for fut in pending:
            fut.cancel()
        pool.shutdown(wait=True)
