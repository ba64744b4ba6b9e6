"""Scale-out on Ray: reads, backfills, upserts, compaction and sequence-store builds as parallel tasks.

Each operation keeps the single-process semantics exactly, because it *is* the
single-process operation with one step handed to Ray: the driver validates,
plans from one snapshot and makes the one atomic commit (with the same
optimistic retry on a concurrent commit); Ray tasks only read and write
immutable files. So a distributed backfill equals ``t.backfill``, a distributed
compaction equals ``t.compact``, and a task that fails leaves no commit.

* :func:`read_ray`: a ``ray.data.Dataset`` through :class:`FeatureLakeDatasource`,
  one read task per merge-on-read unit (a data file plus its update layers),
  read with featurelake's reader. Ray's own ``read_iceberg`` reads data files
  only and so misses update files.
* :func:`backfill` / :func:`upsert`: the driver locates rows (key index or
  the given ``_file``/``_pos``); tasks write the update files of groups of
  data files.
* :func:`compact`: one task per bin of files to rewrite.
* :func:`build_sequences`: events split by key range into buckets (a Ray
  shuffle), one task per bucket sorts and writes one sorted file; the driver
  bulk-loads them in one ingest.

Workers never see the catalog: they get the table metadata and the FileIO's
properties, and rebuild the FileIO (so, like every featurelake I/O, they use
the catalog's storage configuration). Killed workers: Ray re-runs a task whose
worker died (``retries``); a re-run writes to the same names, so it leaves no
second copy. When retries run out the operation raises :class:`ClusterError`,
deletes what the other tasks wrote, and commits nothing; a file half-written
by the dead worker is unreferenced and garbage collection removes it.
"""
from __future__ import annotations

import functools
import os
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

try:
    import ray
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask
except ImportError as e:  # pragma: no cover - the extra is part of dev installs
    raise ImportError("featurelake.ray needs Ray: pip install 'featurelake[ray]'") from e

import numpy as np
import pyarrow as pa
from pyiceberg.table import Table as IcebergTable

from featurelake import refs
from featurelake.errors import ClusterError, FeatureLakeError
from featurelake.guard import delete_quietly_io, recording, track
from featurelake.read import Scan
from featurelake.shipping import ShippedScan, ShippedView, TableRef

if TYPE_CHECKING:
    from pyiceberg.table import FileScanTask

    from featurelake.maintenance import BinRewrite, CompactionReport
    from featurelake.sequences.build import BuildInfo
    from featurelake.sequences import SequenceTable
    from featurelake.table import Table
    from featurelake.updates import UpdateFileJob, UpdateReport

ADDRESS_VARIABLES = ("FEATURELAKE_RAY_ADDRESS", "RAY_ADDRESS")
DEFAULT_RETRIES = 3


# ================================================================ the cluster
def cluster_address(address: str | None = None) -> str | None:
    """The cluster to join: ``address``, else FEATURELAKE_RAY_ADDRESS, else RAY_ADDRESS; None: a local one."""
    if address:
        return address
    for name in ADDRESS_VARIABLES:
        if os.environ.get(name):
            return os.environ[name]
    return None


def connect(address: str | None = None, **init_options: Any) -> None:
    """Join the Ray cluster at :func:`cluster_address`, or start a local one; nothing when connected.

    ``init_options`` go to ``ray.init`` (e.g. ``num_cpus`` for a local cluster).
    """
    if ray.is_initialized():
        return
    found = cluster_address(address)
    if found:
        ray.init(address=found, **init_options)
    else:
        ray.init(**{"include_dashboard": False, **init_options})


def cluster_cpus() -> int:
    """CPUs of the connected cluster (the default number of parallel tasks)."""
    connect()
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _gather(futures: list, progress: Callable[[int, int], None] | None = None, undo: Callable[[Any], None] | None = None) -> list:
    """Results of ``futures`` in order; on a failure the others are cancelled, what they made is undone, and it is raised.

    A task whose worker died more often than its retries allow raises
    :class:`ClusterError`; an exception raised inside a task is re-raised as itself.
    """
    index = {f: i for i, f in enumerate(futures)}
    results: list = [None] * len(futures)
    pending = list(futures)
    failure: BaseException | None = None
    done_count = 0
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for f in done:
            try:
                results[index[f]] = ray.get(f)
                done_count += 1
                if progress and failure is None:
                    progress(done_count, len(futures))
            except BaseException as e:  # noqa: BLE001 - the first failure is raised below
                if failure is None:
                    failure = e
                    for other in pending:
                        ray.cancel(other)
                results[index[f]] = None
    if failure is None:
        return results
    if undo is not None:
        for r in results:
            if r is not None:
                undo(r)
    if isinstance(failure, ray.exceptions.RayTaskError):
        cause = failure.as_instanceof_cause()
        if isinstance(cause, FeatureLakeError):
            raise cause
    if isinstance(failure, FeatureLakeError):
        raise failure
    if isinstance(failure, (ray.exceptions.WorkerCrashedError, ray.exceptions.TaskCancelledError, ray.exceptions.RayError)):
        raise ClusterError(f"a Ray task was lost ({type(failure).__name__}: {failure}); nothing was committed") from failure
    raise failure


def _split(items: list, parts: int, weight: Callable[[Any], int]) -> list[list]:
    """``items`` in at most ``parts`` contiguous groups of about equal total weight."""
    parts = max(1, min(parts, len(items)))
    total = sum(weight(i) for i in items) or 1
    groups: list[list] = [[]]
    acc = 0
    for item in items:
        if groups[-1] and acc >= total * len(groups) / parts and len(groups) < parts:
            groups.append([])
        groups[-1].append(item)
        acc += weight(item)
    return groups


# ======================================================================= reads
class FeatureLakeDatasource(Datasource):
    """A featurelake scan as a Ray Datasource: one read task per data file with its update layers.

    The scan is planned once, on the driver, from one snapshot; the tasks carry
    everything they need (file, layers, projection, filter), so the dataset
    pickles without the catalog (``streaming_split`` ships it to an actor).
    """

    def __init__(self, scan: Scan, sequences: dict[str, Any] | None = None, drop: Sequence[str] = ()) -> None:
        super().__init__()
        units = scan.tasks()
        self._units = [(t, ShippedScan(scan, [t.file.file_path])) for t in units]
        self._filtered = scan.arrow_filter is not None
        self._views = {name: ShippedView(v) for name, v in (sequences or {}).items()}
        self._drop = list(drop)
        schema = scan.output_schema
        for name, view in (sequences or {}).items():
            schema = schema.append(pa.field(name, view.type))
        self._schema = pa.schema([f for f in schema if f.name not in self._drop])

    def get_name(self) -> str:
        return "FeatureLake"

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(t.file.file_size_in_bytes for t, _ in self._units) or None

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None, data_context: Any = None) -> list[ReadTask]:
        tasks = []
        for task, shipped in self._units:
            meta = BlockMetadata(
                num_rows=None if self._filtered else task.file.record_count,
                size_bytes=task.file.file_size_in_bytes,
                input_files=(task.file.file_path,),
                exec_stats=None,
            )
            read = functools.partial(_read_unit, shipped, task, self._views, self._drop, self._schema)
            tasks.append(ReadTask(read, meta, schema=self._schema, per_task_row_limit=per_task_row_limit))
        return tasks


def _read_unit(shipped: ShippedScan, task: "FileScanTask", views: dict, drop: list[str], schema: pa.Schema) -> Iterable[pa.Table]:
    scan = shipped.open()
    opened = {name: v.open() for name, v in views.items()}
    empty = True
    for batch in scan.read_file(task, whole=True):
        if not batch.num_rows:
            continue
        block = pa.Table.from_batches([batch])
        if opened:
            from featurelake.sequences import join_sequences

            block = join_sequences(block, opened, drop=drop)
        empty = False
        yield block
    if empty:  # every row filtered out: an empty block that still has the schema
        yield schema.empty_table()


def read_ray(
    table: "Table",
    columns: Sequence[str] | None = None,
    filter: Any = None,
    branch: str = refs.MAIN,
    snapshot_id: int | None = None,
    sequences: dict[str, Any] | None = None,
    **read_args: Any,
) -> "ray.data.Dataset":
    """The rows ``table.read(...)`` returns, as a ``ray.data.Dataset`` (update files merged).

    Row order across files is Ray's; use ``iter_torch_batches`` to train and
    ``streaming_split(n)`` to feed ``n`` Ray Train workers. ``read_args`` go to
    ``ray.data.read_datasource`` (``concurrency``, ``ray_remote_args``...).
    """
    from featurelake.sequences import columns_for_join

    connect()
    extra: list[str] = []
    if sequences:
        columns, extra = columns_for_join(columns, sequences)
    scan = table.scan(columns, filter, branch, snapshot_id)
    if sequences:
        from featurelake.sequences.join import _check_views

        _check_views(sequences, scan.columns)
    return ray.data.read_datasource(FeatureLakeDatasource(scan, sequences, extra), **read_args)


# =================================================== backfill and upsert
@ray.remote
def _write_updates(ref: TableRef, jobs: list["UpdateFileJob"], target: pa.Schema) -> list[int]:
    from featurelake import updates

    ice = ref.table()
    # A worker killed during an earlier run of this task may have left some of these files:
    # the paths are this operation's own and no commit references them yet.
    delete_quietly_io(ice.io, [j.path for j in jobs])
    return [updates.write_job(ice, job, target) for job in jobs]


class _UpdateWriter:
    """Writes planned update files in parallel Ray tasks (an ``UpdateFileWriter``)."""

    def __init__(self, tasks: int | None, retries: int) -> None:
        self.tasks = tasks
        self.retries = retries
        self.used = 0

    def __call__(self, ice: IcebergTable, jobs: list["UpdateFileJob"], target: pa.Schema) -> list[int]:
        if not jobs:
            return []
        ref = ray.put(TableRef.of(ice))
        groups = _split(jobs, self.tasks or cluster_cpus(), lambda j: j.rows.num_rows + 1024)
        self.used += len(groups)
        futures = [_write_updates.options(max_retries=self.retries).remote(ref, g, target) for g in groups]
        # the caller named every path before this call: on failure it deletes them all
        return [size for sizes in _gather(futures) for size in sizes]


def backfill(
    table: "Table", data: Any, branch: str = refs.MAIN, on_unknown: str = "error", *, tasks: int | None = None, retries: int = DEFAULT_RETRIES
) -> "UpdateReport":
    """``table.backfill`` with the update files written by up to ``tasks`` parallel Ray tasks; one commit.

    Returns the UpdateReport (also kept in ``table.last_update_report``);
    ``report.tasks`` says how many tasks wrote. ``retries``: re-runs of a task
    whose worker died.
    """
    from featurelake.guard import storage_errors
    from featurelake.updates import apply_column_updates

    connect()
    writer = _UpdateWriter(tasks, retries)
    with storage_errors("backfill"):
        report = apply_column_updates(table, data, branch, on_unknown=on_unknown, write_files=writer)  # type: ignore[arg-type]
    report.tasks = writer.used
    table.last_update_report = report
    return report


def upsert(table: "Table", data: Any, branch: str = refs.MAIN, *, tasks: int | None = None, retries: int = DEFAULT_RETRIES) -> "UpdateReport":
    """``table.upsert`` with the update files of existing keys written in parallel Ray tasks; one commit."""
    from featurelake.guard import storage_errors
    from featurelake.upsert import upsert as upsert_here

    connect()
    writer = _UpdateWriter(tasks, retries)
    with storage_errors("upsert"):
        report = upsert_here(table, data, branch, write_files=writer)
    report.tasks = writer.used
    table.last_update_report = report
    return report


# ================================================================ compaction
@ray.remote
def _rewrite_bin(
    ref: TableRef, shipped: ShippedScan, bin_: list, target: int, allowed_bad: int, column_order: list | None
) -> "BinRewrite":
    from featurelake import maintenance

    ice = ref.table()
    track(ice.io)
    with recording() as session:
        try:
            # Files in the lake are never overwritten, so a re-run after a killed worker writes fresh
            # names; what the killed attempt left is unreferenced and garbage collection removes it.
            return maintenance.rewrite_bin(ice, shipped.open(), bin_, target, allowed_bad, uuid.uuid4(), column_order=column_order)
        except BaseException:
            delete_quietly_io(ice.io, session.created())
            raise


class _BinRewriter:
    """Rewrites compaction bins in parallel Ray tasks, one task per bin (a ``BinRewriter``)."""

    def __init__(self, retries: int) -> None:
        self.retries = retries
        self.used = 0

    def __call__(
        self, ice: IcebergTable, scan: Scan, bins: list[list], target: int, budget: int, progress=None, column_order: list | None = None
    ) -> list["BinRewrite"]:
        if not bins:
            return []
        ref = ray.put(TableRef.of(ice))
        self.used += len(bins)
        futures = [
            _rewrite_bin.options(max_retries=self.retries).remote(
                ref, ShippedScan(scan, [t.file.file_path for t in b]), b, target, budget, column_order
            )
            for b in bins
        ]
        # each task may skip up to the whole budget; compact checks the total
        return _gather(futures, progress, undo=lambda r: delete_quietly_io(ice.io, [f.file_path for f in r.files]))


def compact(table: "Table", branch: str = refs.MAIN, *, retries: int = DEFAULT_RETRIES, **options: Any) -> "CompactionReport":
    """``table.compact`` with every bin rewritten in its own Ray task; one commit, same retry on a concurrent commit.

    ``options`` are those of :func:`featurelake.maintenance.compact`;
    ``report.tasks`` counts the tasks.
    """
    from featurelake.guard import storage_errors
    from featurelake.maintenance import compact as compact_here

    connect()
    rewriter = _BinRewriter(retries)
    with storage_errors("compact"):
        report = compact_here(table, branch, rewrite_bins=rewriter, **options)
    report.tasks = rewriter.used
    return report


# ===================================================== sequence store builds
@ray.remote
def _profile(shipped: ShippedScan, units: list, key: str, key_type: pa.DataType, dict_cols: list[str]) -> tuple[list, dict]:
    """A key sample and the distinct values of the dictionary columns of some event files."""
    from featurelake.sequences.build import key_sample
    from featurelake.sequences.layout import _uniques
    from featurelake.sequences.store import KeyCodec

    codec, scan = KeyCodec.for_type(key_type), shipped.open()
    sample: list = []
    uniques: dict = {}
    for t in units:
        for batch in scan.read_file(t, whole=True):
            if batch.num_rows:
                sample.append(key_sample(codec.values(batch.column(key))))
                _uniques(pa.Table.from_batches([batch]), dict_cols, uniques)
    return sample, uniques


def _partition(shipped: ShippedScan, units: list, key: str, key_type: pa.DataType, bounds: np.ndarray, buckets: int) -> Any:
    """The rows of some event files split into ``buckets`` key ranges (one returned table per range)."""
    from featurelake.sequences.store import KeyCodec

    codec, scan = KeyCodec.for_type(key_type), shipped.open()
    parts: list[list[pa.RecordBatch]] = [[] for _ in range(buckets)]
    for t in units:
        for batch in scan.read_file(t, whole=True):
            if not batch.num_rows:
                continue
            b = np.searchsorted(bounds, codec.values(batch.column(key)), side="right")
            for i in np.unique(b):
                parts[int(i)].append(batch.filter(pa.array(b == i)))
    out = [pa.Table.from_batches(p, schema=scan.output_schema) for p in parts]
    return out[0] if buckets == 1 else tuple(out)


@ray.remote
def _encode_bucket(layout: Any, codecs: list, backend: Any, path: str, *parts: pa.Table) -> tuple[bool, dict]:
    """Sort one key range of events by (key, time) and write it as one sorted file."""
    from featurelake.sequences.layout import _dropped, _encode_sorted, _sort_events
    from featurelake.sequences.store import KeyCodec

    if os.path.exists(path):  # left by a killed earlier run of this task; nothing references it
        os.remove(path)
    tbl = pa.concat_tables(parts)
    w = backend.writer(path)
    got = _encode_sorted(_sort_events(tbl, layout).drop_columns(_dropped(layout)), layout, codecs, KeyCodec.for_type(layout.key_type), w)
    return bool(w.finish()), got


class _SequenceBuilder:
    """A full sequence-store build as Ray tasks: profile, shuffle by key range, sort and write per range."""

    def __init__(self, tasks: int | None, retries: int) -> None:
        self.tasks = tasks
        self.retries = retries
        self.used = 0

    def __call__(self, st: "SequenceTable", ice: IcebergTable, snap: Any, layout: Any, backend: Any, tmp: Any, bucket_rows: int):
        from featurelake.sequences.build import _full_build, bounds_from_sample
        from featurelake.sequences.layout import _as_lists
        from featurelake.sequences.codecs import DICT_MAX

        scan = st.scan(layout.scan_columns, snapshot_id=snap.snapshot_id, ice=ice)
        units = scan.tasks()
        if not units:
            return _full_build(st, ice, snap, layout, backend, tmp, bucket_rows)
        width = self.tasks or cluster_cpus()
        groups = _split(units, width, lambda t: t.file.record_count)
        shipped = [ShippedScan(scan, [t.file.file_path for t in g]) for g in groups]
        opts = {"max_retries": self.retries}
        dict_cols = layout.dictionary_columns()
        profiles = _gather([
            _profile.options(**opts).remote(s, g, layout.key, layout.key_type, dict_cols) for s, g in zip(shipped, groups)
        ])
        total = sum(t.file.record_count for t in units)
        buckets = max(width, -(-total // bucket_rows))
        bounds = bounds_from_sample([a for sample, _ in profiles for a in sample], buckets)
        buckets = len(bounds) + 1
        uniques: dict = {}
        for _, found in profiles:
            for col, values in found.items():
                if col in uniques and uniques[col] is None:
                    continue
                merged = values if values is None else (uniques.get(col) or set()) | values
                uniques[col] = merged if merged is not None and len(merged) <= DICT_MAX else None
        codecs = layout.plan_codecs(_as_lists(uniques))
        partition = ray.remote(_partition).options(num_returns=buckets, **opts)
        parts = [partition.remote(s, g, layout.key, layout.key_type, bounds, buckets) for s, g in zip(shipped, groups)]
        parts = [p if isinstance(p, list) else [p] for p in parts]
        (tmp / "sst" / "L000").mkdir(parents=True, exist_ok=True)
        rels = [f"sst/L000/part-{b:05d}.sst" for b in range(buckets)]
        encoded = _gather([
            _encode_bucket.options(**opts).remote(layout, codecs, backend, str(tmp / rel), *[p[b] for p in parts])
            for b, rel in enumerate(rels)
        ])
        self.used += len(groups) * 2 + buckets
        totals = {"users": 0, "events": 0, "chunks": 0}
        for _, got in encoded:
            for k in totals:
                totals[k] += got[k]
        return [[rel for rel, (kept, _) in zip(rels, encoded) if kept]], totals, codecs


def build_sequences(
    st: "SequenceTable", branch: str = refs.MAIN, *, tasks: int | None = None, retries: int = DEFAULT_RETRIES, **options: Any
) -> "BuildInfo":
    """``st.build`` with a full build's sorting and file writing spread over Ray tasks; one bulk load.

    Events are split into key ranges (sampled boundaries, so the sorted files
    do not overlap and all land on the store's last level: one IO per read);
    each range is sorted and written by one task. An incremental build (new
    events of a few users) stays in-process. ``options`` are those of
    ``SequenceTable.build``; ``info.tasks`` counts the tasks (0: none ran).
    The build folder must be on a filesystem the workers share.
    """
    from featurelake.sequences.build import build_store

    connect()
    builder = _SequenceBuilder(tasks, retries)
    info = build_store(st, branch, full_build=builder, **options)
    if builder.used:
        info.tasks = builder.used
    return info


__all__ = [
    "ADDRESS_VARIABLES",
    "FeatureLakeDatasource",
    "backfill",
    "build_sequences",
    "cluster_address",
    "cluster_cpus",
    "compact",
    "connect",
    "read_ray",
    "upsert",
]
