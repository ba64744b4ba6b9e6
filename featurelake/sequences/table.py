"""SequenceTable: an event table with a serving store, its creation and opening, and the public names of the package (see :mod:`featurelake.sequences`)."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from featurelake import refs
from featurelake.errors import (
    DuplicateKeyError,
    NullKeyError,
    SchemaMismatchError,
    TableNotFoundError,
)
from featurelake.sequences.build import (
    BUCKET_ROWS,
    BUILD_FORMAT,
    DEFAULT_CHUNK_EVENTS,
    DEFAULT_THREADS,
    MAX_LAYERS,
    BuildInfo,
    SequenceBuildError,
    build_store,
)
from featurelake.sequences.buildinfo import (  # noqa: F401  (public here as before)
    PROP_EVENT_ID,
    PROP_KEY,
    PROP_SYNTHETIC,
    PROP_TIME,
    STORE_DIR,
    build_serving,
    list_builds,
    live_builds,
    store_root,
)
from featurelake.sequences.collect import folder_bytes
from featurelake.sequences.join import (  # noqa: F401  (public here as before)
    JOIN_SLICE_ROWS,
    SequenceView,
    columns_for_join,
    join_sequences,
    join_sequences_batches,
)
from featurelake.sequences.historycache import HistoryCache
from featurelake.sequences.listview import as_list, lookup_view
from featurelake.sequences.arguments import as_array
from featurelake.sequences.lookup import DEFAULT_BATCH_KEYS, SequenceStore
from featurelake.sequences.store import READERS, KeyCodec
from featurelake.guard import storage_errors
from featurelake.table import MAIN, Table
from featurelake.appends import input_chunks

if TYPE_CHECKING:
    from featurelake.lake import Lake

__all__ = [
    "BUCKET_ROWS",
    "BUILD_FORMAT",
    "DEFAULT_BATCH_KEYS",
    "DEFAULT_CHUNK_EVENTS",
    "DEFAULT_EVENT_ID",
    "DEFAULT_THREADS",
    "JOIN_SLICE_ROWS",
    "MAX_LAYERS",
    "PROP_EVENT_ID",
    "PROP_KEY",
    "PROP_SYNTHETIC",
    "PROP_TIME",
    "BuildInfo",
    "HistoryCache",
    "SequenceBuildError",
    "SequenceStore",
    "SequenceTable",
    "SequenceView",
    "as_list",
    "columns_for_join",
    "create_sequence_table",
    "join_sequences",
    "join_sequences_batches",
    "lookup_view",
    "open_sequence_table",
]

DEFAULT_EVENT_ID = "event_id"
EVENT_ZSTD_LEVEL = 9


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
        **event_encodings(pa.schema(fields), key, time, event_id, synthetic),
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


def event_encodings(schema: pa.Schema, key: str, time: str, event_id: str, synthetic: bool) -> dict[str, str]:
    """Parquet encodings of an event table's columns (``featurelake.parquet.encoding.*`` properties).

    Events are written sorted by (key, time): the time column is a run of
    small increasing steps per user (DELTA_BINARY_PACKED: ~4.3 instead of
    ~6.8 bytes an event, measured), synthetic event ids are consecutive in a
    file (delta: ~0 instead of ~1 byte), float attributes compress better
    byte-split, and integer attributes (item ids) are bit-packed
    (DELTA_BINARY_PACKED: 2.3 instead of 2.6 bytes an id). The key keeps its
    dictionary (long runs of one user). zstd runs at level
    ``EVENT_ZSTD_LEVEL``: events are written once and kept, so ~0.3 byte an
    event is worth the slower encode. Every setting is a table property the
    caller can override through ``properties``.
    """
    from featurelake.writer_settings import ENCODING_PROPERTY

    out = {f"{ENCODING_PROPERTY}{time}": "DELTA_BINARY_PACKED", "write.parquet.compression-codec": "zstd",
           "write.parquet.compression-level": str(EVENT_ZSTD_LEVEL)}
    if synthetic:
        out[f"{ENCODING_PROPERTY}{event_id}"] = "DELTA_BINARY_PACKED"
    for f in schema:
        if f.name in (key, time, event_id):
            continue
        if pa.types.is_floating(f.type) and f.type.bit_width >= 32:
            out[f"{ENCODING_PROPERTY}{f.name}"] = "BYTE_STREAM_SPLIT"
        elif pa.types.is_integer(f.type) and f.type.bit_width >= 32:
            out[f"{ENCODING_PROPERTY}{f.name}"] = "DELTA_BINARY_PACKED"  # ids: bit-packed (min + width per miniblock)
    return out


def open_sequence_table(lake: "Lake", name: str) -> "SequenceTable":
    table = lake.table(name)
    if PROP_KEY not in table.iceberg.metadata.properties:
        raise TableNotFoundError(f"{name!r} is a table but not a sequence table (create it with create_sequence_table)")
    return SequenceTable(lake, name, table.iceberg)


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
        """Where this table's store builds live (see :func:`featurelake.sequences.buildinfo.store_root`)."""
        return store_root(self.lake.cache_dir, self.name, self._ice)

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
        for chunk in input_chunks(data):
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

    def _next_event_id(self, branch: str | None = None, ice=None) -> int:
        """One above the largest event id any branch or tag head holds (table-wide, not per branch).

        Allocating ids across the whole table keeps the events two branches
        append after they fork apart, so merging them is a plain union
        (:mod:`featurelake.sequences.branching`). ``branch`` must exist (checked).
        Reads file statistics only, unless a file has none.
        """
        from pyiceberg.conversions import from_bytes

        from featurelake.livefiles import snapshot_files

        ice = ice or self.refresh()
        if branch is not None:
            refs.branch_head(ice.metadata, branch)  # an unknown branch: its clear error, before anything else
        field = ice.schema().find_field(self.event_id)
        top = -1
        heads = {r.snapshot_id for r in ice.metadata.refs.values()}
        for sid in sorted(heads):
            snap = ice.metadata.snapshot_by_id(sid)
            for path, f in snapshot_files(ice, snap).items():
                upper = (f.upper_bounds or {}).get(field.field_id)
                if upper is None:  # a file without statistics: read its ids
                    from featurelake.index import read_key_columns

                    m = pc.max(read_key_columns(ice, path, [self.event_id]).column(0)).as_py()
                    top = max(top, -1 if m is None else int(m))
                    continue
                top = max(top, int(from_bytes(field.field_type, upper)))
        return top + 1

    # --------------------------------------------------------------- builds
    def builds(self) -> list[BuildInfo]:
        """Every finished build of this table, oldest first."""
        return list_builds(self.store_root)

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
        found = build_serving(ice.metadata, snap, all_builds)
        if found is not None:
            return found
        where = f"snapshot {snapshot_id}" if snapshot_id is not None else f"{branch} (snapshot {snap.snapshot_id})"
        latest = f"; the latest build reflects snapshot {all_builds[-1].snapshot_id}" if all_builds else "; there are no builds yet"
        raise SequenceBuildError(
            f"no sequence store build of {self.name} reflects {where}{latest}: run build(branch={branch!r})"
            + (f" or build(snapshot_id={snapshot_id})" if snapshot_id is not None else "")
        )

    def live_builds(self, ice=None) -> list[BuildInfo]:
        """The builds a retained snapshot of any branch or tag may be served from; garbage collection keeps these.

        See :func:`featurelake.sequences.buildinfo.live_builds`. The others are
        deleted by ``lake.collect_garbage()`` once older than its grace period
        (this replaces the former ``prune_builds``).
        """
        return live_builds((ice or self.refresh()).metadata, self.builds())

    def drop_build(self, build_id: str) -> None:
        """Delete one build now, needed or not (later builds keep their own links to shared files).

        ``lake.collect_garbage()`` deletes only builds no retained snapshot needs;
        this is for a build known to be bad.
        """
        info = self.build_for(build=build_id)
        READERS.drop(info.db_dir)
        shutil.rmtree(info.path, ignore_errors=True)

    build = build_store  # the offline build lives in featurelake.sequences.build

    # ------------------------------------------------------------- branches
    @storage_errors("merge")
    def merge(self, source: str | int, into: str = MAIN) -> int:
        """Merge a branch (or tag or snapshot) of events into ``into``: the union of the events both added.

        Synthetic event ids never conflict (clashing ones are renumbered); the
        caller's own event ids do: MergeConflictError names them, nothing is
        written. See :mod:`featurelake.sequences.branching`. A build for the
        merged head is made as for any snapshot: ``build(branch=into)``.
        """
        from featurelake.sequences.branching import merge_events

        return merge_events(self, source, into)

    # ---------------------------------------------------------------- reads
    def open_store(self, branch: str = MAIN, snapshot_id: int | None = None, build: str | None = None) -> "SequenceStore":
        """The servable store of the build matching ``branch``/``snapshot_id`` (or named ``build``)."""
        return SequenceStore(self.build_for(branch, snapshot_id, build), io=self._ice.io)

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
        keys = as_array(keys, store.key_type)
        out, stats = store.lookup_stats(keys, before, columns, max_len, window, threads=threads)
        self.last_lookup_stats = stats
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
        layout: str = "list",
        cache_bytes: int | None = None,
    ) -> "SequenceView":
        """A join spec for ``Table.read/batches(sequences={name: view})``.

        ``key`` and ``time`` name the training row's columns holding the user
        and the row's time (events strictly before it are joined). The build
        is resolved now, so every batch of an epoch sees the same store.
        ``layout="list_view"`` joins an Arrow list-view column (offsets and
        sizes into one pool of events shared by the batch's rows, dictionary
        strings as codes) instead of copying each row's events;
        ``cache_bytes`` (list views only) keeps decoded whole histories across
        batches up to about that many bytes. ``featurelake.sequences.as_list``
        turns a list view into the ``list`` layout's column.
        """
        store = self.open_store(branch, snapshot_id, build)
        cols = store.check_columns(columns)
        return SequenceView(store, key, time, cols, max_len, window, threads, batch_keys, layout, cache_bytes)

    def store_stats(self, branch: str = MAIN) -> dict[str, Any]:
        """Table figures, the builds, and the bytes an event costs in each stored component.

        ``components`` (bytes) and ``bytes_per_event`` split the cost of the
        branch head's events: ``event_data`` (the Parquet data files),
        ``event_updates`` (column update files), ``index`` (the key index
        segments), ``store_build`` (the SST files of the build serving the head,
        or 0 without one) and ``store_builds_on_disk`` (every build of the
        table, hard-linked files counted once; informational, not in ``total``).
        """
        stats = self.stats(branch=branch)
        builds = self.builds()
        head = stats.get("snapshot_id")
        events = int(stats.get("rows") or 0)
        try:
            serving = self.build_for(branch) if head is not None else None
        except SequenceBuildError:
            serving = None
        components = {
            "event_data": int(stats.get("data_bytes") or 0),
            "event_updates": int(stats.get("update_bytes") or 0),
            "index": self._index_bytes(branch),
            "store_build": int(serving.store_bytes) if serving is not None else 0,
        }
        components["total"] = sum(components.values())
        per_event = {k: (round(v / events, 3) if events else None) for k, v in components.items()}
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
            "serving_build": serving.build_id if serving is not None else None,
            "components": components,
            "bytes_per_event": per_event,
            "store_builds_on_disk": folder_bytes(self.store_root),
            "builds": [
                {k: b.to_dict()[k] for k in ("build_id", "snapshot_id", "incremental", "users", "events", "chunks",
                                             "bytes", "store_bytes", "seconds", "created_at")}
                for b in builds
            ],
        }

    def _index_bytes(self, branch: str) -> int:
        """Bytes of the key index segments the branch head lists (one size query per segment)."""
        ice = self.refresh()
        snap = refs.resolve(ice.metadata, branch)
        if snap is None:
            return 0
        total = 0
        for seg in self._state(ice, snap).index_segments:
            try:
                total += len(ice.io.new_input(seg["path"]))
            except (OSError, FileNotFoundError):  # a segment gone missing: verify_index reports it
                continue
        return total

