"""Offline builds of the sequence store: build records, full builds, incremental builds.

Why a module of its own: building is the write side of the store and shares
nothing with serving but the record format. :func:`build_store` (behind
``SequenceTable.build``) turns a snapshot of the event table into sorted
files that the backend bulk-loads: a full build sorts the events by (user,
time) in key-range buckets (spilling to disk past ``bucket_rows``) and
encodes every user; an incremental build hard-links every layer of the
build it extends and writes one new layer that re-encodes only the users
with new events, from their first affected chunk on. Each build is recorded
in ``<store root>/<build id>/build.json`` (:class:`BuildInfo`): the snapshot
it reflects, its layout and codecs, its layers; readers open a build
through that record (:mod:`featurelake.sequences.lookup`).
"""
from __future__ import annotations

import base64
import dataclasses
import datetime as _dt
import os
import shutil
import time as _time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc

from featurelake import refs
from featurelake.errors import CorruptFileError, FeatureLakeError
from featurelake.sequences.layout import (
    _as_lists,
    _check_groups,
    _dropped,
    _encode_sorted,
    _int_times,
    _Layout,
    _sort_events,
    _uniques,
)
from featurelake.sequences.codecs import FixedCodec, fixed_dtype, is_string
from featurelake.sequences.store import (
    KeyCodec,
    RocksDBBackend,
    StoreBackend,
    backend_from_dict,
    write_json_atomic,
)
from featurelake.sequences.tiering import SegmentWriter, cold_dir
from featurelake.storage import storage_of
from featurelake.sequences.buildinfo import (  # noqa: F401  (public here as before)
    BUILD_FORMAT,
    DEFAULT_THREADS,
    BuildInfo,
    SequenceBuildError,
)

if TYPE_CHECKING:
    from featurelake.sequences.table import SequenceTable

DEFAULT_CHUNK_EVENTS = 128
BUCKET_ROWS = 4_000_000      # events sorted in memory at once during a build; more spill to disk by key range
MAX_LAYERS = 8               # incremental layers on one store before a build starts over
def _layout_key(layout: _Layout, backend: StoreBackend) -> tuple:
    return (layout.key, layout.time, str(layout.key_type), str(layout.time_type), layout.chunk_events,
            [list(g) for g in layout.groups], [_schema_b64(s) for s in layout.group_schemas], backend.describe(),
            layout.codec_mode)


def _schema_b64(schema: pa.Schema) -> str:
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


# ================================================================= building
def build_store(
    st: SequenceTable,
    branch: str = refs.MAIN,
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
    full_build: "FullBuilder | None" = None,
    tier_after: int | None = None,
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
    ``"ipc"`` uses Arrow IPC everywhere. ``full_build`` makes the sorted
    files of a full build (default :func:`_full_build`, here; featurelake.ray
    passes one that sorts and writes them in parallel Ray tasks).
    ``tier_after=N`` (N >= 1) keeps each user's newest N chunks in the local
    store and writes the older ones to cold segments on the lake's storage,
    read on demand through a local cache (:mod:`featurelake.sequences.tiering`);
    0 tiers nothing; None: as the previous build.
    """
    t0 = _time.perf_counter()
    ice = st.refresh()
    snap = refs.resolve(ice.metadata, branch, snapshot_id)
    if snap is None:
        raise SequenceBuildError(f"{st.name}@{branch} has no events yet: append events first")
    previous = st.builds()
    if tier_after is not None and (isinstance(tier_after, bool) or not isinstance(tier_after, (int, np.integer))
                                   or tier_after < 0):
        raise FeatureLakeError(f"tier_after must be a whole number of chunks >= 0 (0: no tiering), not {tier_after!r}")
    tier = int(tier_after) if tier_after is not None else (previous[-1].tier_after if previous else 0)
    if tier < 0:
        raise FeatureLakeError(f"tier_after must be a whole number of chunks >= 0 (0: no tiering), not {tier_after!r}")
    if tier and full_build is not None:
        raise FeatureLakeError("tier_after is not supported with a custom full build (Ray builds): build without it")
    inherit = previous and chunk_events is None and column_groups is None and codecs is None
    layout = _layout(st, ice, snap, chunk_events, column_groups, previous, codecs)
    backend = backend or (backend_from_dict(previous[-1].store) if inherit else RocksDBBackend())
    if not force:
        same = [b for b in previous if b.snapshot_id == snap.snapshot_id and _layout_key(layout, backend) == b.layout()
                and b.tier_after == tier]
        if same:
            return same[-1]
    base, new_files = (_incremental_base(st, ice, snap, layout, backend, [b for b in previous if b.tier_after == tier])
                       if incremental else (None, None))

    build_id = f"{_dt.datetime.now(_dt.timezone.utc):%Y%m%dT%H%M%S%f}-{uuid.uuid4().hex[:6]}"
    root = st.store_root
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{build_id}"
    final = root / build_id
    try:
        (tmp / "sst").mkdir(parents=True)
        extended = None
        if base is not None:
            try:
                extended = _extend_build(st, ice, snap, layout, backend, base, new_files, tmp, threads)
            except (OSError, CorruptFileError):
                if Path(base.path, "build.json").exists():
                    raise
                extended = None  # garbage collection took the base meanwhile: build in full
            if extended is None:  # e.g. a dictionary outgrew the fixed codec: start over
                base = None
                shutil.rmtree(tmp / "sst", ignore_errors=True)
                (tmp / "sst").mkdir()
        cold = SegmentWriter(tmp / "cold", 0) if tier and extended is None else None
        layers, stats, codec_list = extended or (full_build or _full_build)(
            st, ice, snap, layout, backend, tmp, bucket_rows, **({"cold": cold, "hot_chunks": tier} if cold else {}))
        segments = list(base.cold_segments) if extended is not None else []
        if cold is not None and cold.values:
            cold.finish()
            segments += cold.upload(storage_of(ice.io), cold_dir(ice.location(), build_id))
            shutil.rmtree(tmp / "cold", ignore_errors=True)
        backend.assemble(str(tmp / "db"), [[str(tmp / p) for p in layer] for layer in layers])
        sizes = [[os.path.getsize(tmp / p) for p in layer] for layer in layers]
        info = BuildInfo(
            build_id=build_id,
            table=st.name,
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
            table_uuid=str(ice.metadata.table_uuid),
            tier_after=tier,
            cold_segments=segments,
            cold_bytes=sum(int(x["bytes"]) for x in segments),
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


def _layout(st: SequenceTable, ice, snap, chunk_events, column_groups, previous: list[BuildInfo],
            codecs: str | None = None) -> _Layout:
    from featurelake.schema import arrow_schema

    schema_id = snap.schema_id if snap.schema_id is not None else ice.metadata.current_schema_id
    ice_schema = ice.metadata.schema_by_id(schema_id) or ice.schema()
    arrow = arrow_schema(ice_schema, field_ids=False)
    key, time, eid = st.key, st.time, st.event_id
    synthetic = st.synthetic_event_id
    attrs = [n for n in arrow.names if n not in (key, time) and not (synthetic and n == eid)]
    if column_groups is None and chunk_events is None and codecs is None and previous:
        last = previous[-1]
        if sorted(c for g in last.column_groups for c in g) == sorted(attrs):
            column_groups, chunk_events, codecs = last.column_groups, last.chunk_events, last.codec_mode
    codecs = codecs or "auto"
    if codecs not in ("auto", "ipc"):
        raise FeatureLakeError(f"codecs must be 'auto' or 'ipc', not {codecs!r}")
    if column_groups is None and codecs == "auto":
        column_groups = default_groups(arrow, attrs)
    groups = _check_groups(column_groups, attrs, time)
    c = int(chunk_events or DEFAULT_CHUNK_EVENTS)
    if not 1 <= c <= 1 << 20:
        raise FeatureLakeError(f"chunk_events must be between 1 and 2**20, not {chunk_events}")
    group_schemas = [pa.schema(([arrow.field(time)] if i == 0 else []) + [arrow.field(n) for n in g])
                     for i, g in enumerate(groups)]
    return _Layout(key, time, eid, synthetic, arrow.field(key).type, arrow.field(time).type, c, groups,
                   attrs, group_schemas, codecs)


def default_groups(arrow: pa.Schema, attrs: list[str]) -> list[list[str]] | None:
    """Column groups when none are given: fixed-width and string columns first, the others apart.

    Why: the first group is stored with the fixed codec (delta-coded times,
    byte planes, dictionary codes) only when every column in it fits; one
    list or struct column would send all of them to Arrow IPC (measured on the
    synthetic event log: 21.6 bytes an event in one IPC group, 16.6 with the
    list column in a group of its own). None when one group holds them all.
    """
    fits = [n for n in attrs if fixed_dtype(arrow.field(n).type) is not None or is_string(arrow.field(n).type)]
    rest = [n for n in attrs if n not in fits]
    return [fits, rest] if fits and rest else None


def _incremental_base(st: SequenceTable, ice, snap, layout, backend,
                      previous) -> tuple[BuildInfo | None, set[str] | None]:
    """The newest build this snapshot extends by appends only, and the data files added since."""
    want = _layout_key(layout, backend)
    target_files = None
    target_updates = _update_files(st, ice, snap)
    for b in reversed(previous):
        if b.format != BUILD_FORMAT or b.layout() != want or len(b.layers) >= MAX_LAYERS:
            continue
        base_snap = ice.metadata.snapshot_by_id(b.snapshot_id)
        if base_snap is None or _update_files(st, ice, base_snap) != target_updates:
            continue  # expired, or columns were backfilled since: values changed in place
        if target_files is None:
            target_files = {t.file.file_path for t in ice.scan(snapshot_id=snap.snapshot_id).plan_files()}
        base_files = {t.file.file_path for t in ice.scan(snapshot_id=base_snap.snapshot_id).plan_files()}
        if base_files <= target_files and Path(b.path).exists():
            return b, target_files - base_files
    return None, None


def _update_files(st: SequenceTable, ice, snap) -> frozenset[str]:
    state = st._state(ice, snap)
    return frozenset() if state.empty else frozenset(e.update_file for e in state.entries())


# (sequence table, table, snapshot, layout, backend, build folder, bucket rows) -> (layers, totals, codecs)
FullBuilder = Callable[..., "tuple[list[list[str]], dict, list]"]


def _full_build(st: SequenceTable, ice, snap, layout: _Layout, backend: StoreBackend, tmp: Path, bucket_rows: int,
                cold: SegmentWriter | None = None, hot_chunks: int = 0):
    """Sort the whole snapshot by (key, time) in key-range buckets; one sorted file per bucket.

    With ``cold`` (a tiered build) chunks before each user's newest ``hot_chunks`` go to cold segments.
    """
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
        got = _encode_sorted(_sort_events(tbl, layout).drop_columns(_dropped(layout)), layout, codecs, codec, w,
                             cold=cold, hot_chunks=hot_chunks)
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
        sample.append(key_sample(codec.values(batch.column(0))))
    return bounds_from_sample(sample, buckets)


def key_sample(values: np.ndarray) -> np.ndarray:
    """About 2048 evenly spaced keys of one batch, for :func:`bounds_from_sample`."""
    return values[:: max(1, len(values) // 2048)]


def bounds_from_sample(sample: list[np.ndarray], buckets: int) -> np.ndarray:
    """Key-range boundaries splitting the sampled keys into ``buckets`` about equal ranges."""
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
    from featurelake.sequences.heads import Heads
    from featurelake.sequences.lookup import DEFAULT_BATCH_KEYS, SequenceStore
    from featurelake.sequences.store import _link_or_copy

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
    store = SequenceStore(base, io=ice.io)
    c = layout.chunk_events
    key_vals = codec.values(new.column(layout.key).combine_chunks())
    times = _int_times(new.column(layout.time))
    users, first = np.unique(key_vals, return_index=True)   # first row of each user = its earliest new event
    heads = Heads(store, users, threads, DEFAULT_BATCH_KEYS, {})
    first_times = heads.first_times()
    prefix: dict = {}
    pair_users: list = []
    pair_chunks: list[int] = []
    pair_counts: list[int] = []
    old_users = old_events = old_chunks = 0
    for u, ft, n_old, f in zip(users, first_times, heads.n_events, first):
        if ft is None:
            continue
        n_old = int(n_old)
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
