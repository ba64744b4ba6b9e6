"""Maintenance: compaction (fold update files, bin-pack small files).

pyiceberg 0.12 has no compaction (LIBRARY-NOTES.md), and its copy-on-write
would lose featurelake's update files anyway, so it is written here. After
``compact`` a branch is plain Iceberg: any Iceberg reader sees exactly what
featurelake's reader sees (invariant 8).
"""
from __future__ import annotations

import itertools
import time
import uuid
import warnings
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.table import FileScanTask
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.snapshots import DELETED_DATA_FILES, Operation

from featurelake import index, refs
from featurelake import placement as _placement
from featurelake.health import SMALL_FILE_BYTES, SMALL_FILE_PROPERTY
from featurelake.commit import cleanup_on_failure, commit, delete_quietly, optimistic
from featurelake.errors import CorruptFileError
from featurelake.datafiles import index_keys
from featurelake.rewrite import merged_rows, rewrite_scan, write_files
from featurelake.state import StateWriter, distinct_files, summary_props

if TYPE_CHECKING:
    from featurelake.table import Table

DEFAULT_TARGET_BYTES = 128 * 1024 * 1024
COMPACT_ATTEMPTS = 40


@dataclass
class CompactionReport:
    """What one compaction did."""

    table: str
    branch: str
    snapshot_id: int | None = None
    files_in: int = 0
    files_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    update_files_folded: int = 0
    update_bytes_folded: int = 0
    rows: int = 0
    seconds: float = 0.0
    attempts: int = 0
    skipped: bool = False
    bad_files: list[str] = field(default_factory=list)
    column_order: list[str] | None = None  # the files' column order when compacted with placement
    tasks: int = 0  # parallel Ray tasks that rewrote bins (featurelake.ray); 0: rewritten in-process

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _bins(tasks: list[FileScanTask], target: int) -> list[list[FileScanTask]]:
    bins, current, size = [], [], 0
    for t in tasks:
        if current and size + t.file.file_size_in_bytes > target:
            bins.append(current)
            current, size = [], 0
        current.append(t)
        size += t.file.file_size_in_bytes
    if current:
        bins.append(current)
    return bins


@dataclass
class _Bin:
    """Input files rewritten together into ``outputs`` (``keys``: the outputs' index keys)."""

    inputs: list[DataFile]
    outputs: list[DataFile]
    keys: list[tuple[str, Any]]


@dataclass
class _Plan:
    """Rewritten bins planned on snapshot ``base``, reusable on a later head that left their inputs alone."""

    base: int
    bins: list[_Bin]
    bad: dict[str, str]
    segment: dict | None = None  # one index segment over every bin's outputs, written for rebased commits


def _untouched(table: "Table", ice: IcebergTable, plan: _Plan, head) -> list[_Bin]:
    """The bins of ``plan`` whose input files no commit since ``plan.base`` removed or updated.

    Returns [] when ``head`` does not descend from ``plan.base`` (the plan is then redone).
    Kept cheap, since it runs inside the commit window: when the commits since
    are all appends (no data file removed), only the inputs' update entries
    are compared; otherwise the full change set is computed.
    """
    from featurelake.merge import change_set

    meta = ice.metadata
    base = meta.snapshot_by_id(plan.base)
    since = []
    for snap in refs.ancestors(meta, head):
        if snap.snapshot_id == plan.base:
            break
        since.append(snap)
    else:
        return []
    if base is None:
        return []
    inputs = {f.file_path for b in plan.bins for f in b.inputs}
    if all(s.summary is not None and s.summary.operation == Operation.APPEND and not int(s.summary.get(DELETED_DATA_FILES) or 0) for s in since):
        before, after = table._state(ice, base), table._state(ice, head)
        touched = {p for p in inputs if [e.part for e in before.entries_for(p)] != [e.part for e in after.entries_for(p)]}
    else:
        changes = change_set(table, ice, base, head)
        touched = set(changes.removed_files) | {e.data_file for e in changes.added_updates + changes.removed_updates}
    return [b for b in plan.bins if not any(f.file_path in touched for f in b.inputs)]


@dataclass
class BinRewrite:
    """One bin rewritten: its new data files, and its files that could not be read (path -> error)."""

    files: list[DataFile]
    bad: dict[str, str] = field(default_factory=dict)
    keys: dict[str, Any] = field(default_factory=dict)  # new file -> its index keys in row order (not read back)


# Rewrites bins of (table, rewrite scan, bins, target file bytes, bad-file budget, progress, column_order=None)
# -> one BinRewrite each.
BinRewriter = Callable[[IcebergTable, Any, "list[list[FileScanTask]]", int, int, "Callable[[int, int], None] | None"], "list[BinRewrite]"]


def rewrite_bin(
    ice: IcebergTable,
    scan,
    bin_: list[FileScanTask],
    target: int,
    allowed_bad: int,
    write_uuid: uuid.UUID | None = None,
    counter=None,
    column_order: list[str] | None = None,
) -> BinRewrite:
    """Merged rows of a bin's files written as new data files; up to ``allowed_bad`` unreadable files are left out."""
    parts, bad = [], {}
    for t in bin_:
        try:
            parts.append(merged_rows(scan, t))
        except CorruptFileError as e:
            if len(bad) >= allowed_bad:
                raise
            bad[t.file.file_path] = str(e)
            warnings.warn(f"compaction leaves a bad file in place: {e}", stacklevel=2)
    rows = pa.concat_tables(parts) if parts else None
    written = (
        write_files(ice, rows, write_uuid, counter, target_file_bytes=target, column_order=column_order)
        if rows is not None
        else []
    )
    key_columns = _primary_key(ice)
    keys = {}
    if key_columns and all(w.rows is not None and set(key_columns) <= set(w.rows.column_names) for w in written):
        keys = {path: index.encode(k) for path, k in index_keys(written, key_columns)}
    return BinRewrite([w.data_file for w in written], bad, keys)


def _primary_key(ice: IcebergTable) -> list[str]:
    """The table's key columns (as ``Table.primary_key``), empty when it has none."""
    declared = ice.metadata.properties.get("featurelake.primary-key")
    if declared:
        return declared.split(",")
    schema = ice.schema()
    return [schema.find_column_name(i) for i in schema.identifier_field_ids]


def rewrite_here(
    ice: IcebergTable,
    scan,
    bins: list[list[FileScanTask]],
    target: int,
    budget: int,
    progress: Callable[[int, int], None] | None = None,
    column_order: list[str] | None = None,
) -> list[BinRewrite]:
    """Rewrite ``bins`` one after another in this process, sharing one bad-file budget."""
    write_uuid, counter = uuid.uuid4(), itertools.count(0)
    out: list[BinRewrite] = []
    for i, bin_ in enumerate(bins):
        out.append(rewrite_bin(ice, scan, bin_, target, budget - sum(len(r.bad) for r in out), write_uuid, counter, column_order))
        if progress:
            progress(i + 1, len(bins))
    return out


def compact(
    table: "Table",
    branch: str = refs.MAIN,
    *,
    target_file_bytes: int | None = None,
    small_file_bytes: int | None = None,
    fold_updates: bool = True,
    max_bad_file_ratio: float = 0.0,
    progress: Callable[[int, int], None] | None = None,
    placement: bool | Sequence[str] = False,
    rewrite_bins: "BinRewriter | None" = None,
) -> CompactionReport:
    """Rewrite files with update layers (folded) and bin-pack small files per partition.

    ``placement``: True orders the columns of the files written by the recorded
    training projections (:mod:`featurelake.placement`), a list of names gives
    the order; either way every data file is rewritten in that order.

    One atomic overwrite commit. When a concurrent commit lands first, the plan
    is rebased onto the new head: bins whose input files the concurrent
    commits did not remove or update commit as they are (the other commits'
    new files and update files are carried over untouched), the others are
    left for a later run. Only when no bin survives is the plan redone (bins
    whose inputs did not change are reused, not rewritten again). So a
    compaction finishes under steady writes, and never loses one.

    ``rewrite_bins`` rewrites the planned bins (default :func:`rewrite_here`;
    featurelake.ray passes one that rewrites them in parallel Ray tasks).
    """
    t0 = time.perf_counter()
    report = CompactionReport(table=table.name, branch=branch)
    reuse: dict[frozenset, _Bin] = {}
    written: list[str] = []
    committed: set[str] = set()
    plans: list[_Plan] = []
    bad: dict[str, str] = {}  # input files left in place as unreadable (within max_bad_file_ratio)

    def plan_on(ice: IcebergTable, head) -> _Plan | None:
        props = ice.metadata.properties
        target = target_file_bytes or int(props.get("write.target-file-size-bytes", DEFAULT_TARGET_BYTES))
        small = small_file_bytes or int(props.get(SMALL_FILE_PROPERTY, SMALL_FILE_BYTES))
        state = table._state(ice, head)
        order = None
        if placement:
            names = [f.name for f in ice.schema().fields]
            order = list(placement) if not isinstance(placement, bool) else _placement.column_order(names, _placement.recorded(ice))
            report.column_order = order
        tasks = table.scan(branch=str(head.snapshot_id), ice=ice).tasks()
        layers = state.by_data_file([t.file.file_path for t in tasks]) if not state.empty else {}
        groups: dict[Any, list[FileScanTask]] = defaultdict(list)
        for t in tasks:
            groups[(t.file.spec_id, tuple(t.file.partition))].append(t)
        chosen: list[list[FileScanTask]] = []
        for group in groups.values():
            folded = [t for t in group if fold_updates and t.file.file_path in layers]
            smalls = [t for t in group if t.file.file_path not in layers and t.file.file_size_in_bytes < small]
            picked = folded + (smalls if len(smalls) + len(folded) > 1 else [])
            if order is not None:
                picked = group
            if picked and (order is not None or not (len(picked) == 1 and not folded)):
                chosen.extend(_bins(picked, target))
        if not chosen:
            return None
        budget = int(max_bad_file_ratio * len(tasks) + 1e-9)
        scan = rewrite_scan(table, ice, head)
        keys = [
            frozenset((t.file.file_path, tuple(e.part for e in layers.get(t.file.file_path, []))) for t in bin_)
            for bin_ in chosen
        ]
        todo = {k: b for k, b in zip(keys, chosen) if k not in reuse}  # bins an earlier attempt rewrote are reused
        results = (rewrite_bins or rewrite_here)(
            ice, scan, list(todo.values()), target, budget - len(bad), progress, column_order=order
        )
        for (key, bin_), result in zip(todo.items(), results):
            written.extend(f.file_path for f in result.files)
            bad.update(result.bad)
            inputs = [t.file for t in bin_ if t.file.file_path not in result.bad]
            unknown = [f.file_path for f in result.files if f.file_path not in result.keys]
            read_back = dict(index.file_keys(ice, unknown, table.primary_key)) if unknown else {}
            fresh = [(f.file_path, result.keys.get(f.file_path, read_back.get(f.file_path))) for f in result.files]
            reuse[key] = _Bin(inputs, result.files, fresh)
        if len(bad) > budget:
            path = sorted(bad)[0]
            raise CorruptFileError(f"{len(bad)} data file(s) cannot be read (budget {budget}): {path}: {bad[path]}", path)
        return _Plan(head.snapshot_id, [reuse[k] for k in keys], bad)

    def attempt(ice: IcebergTable) -> CompactionReport:
        report.attempts += 1
        head = refs.branch_head(ice.metadata, branch)
        if head is None:
            report.skipped = True
            return report
        bins = _untouched(table, ice, plans[-1], head) if plans else []
        if not bins:
            plan = plan_on(ice, head)
            if plan is None:
                report.skipped = True
                report.snapshot_id = head.snapshot_id
                return report
            plans.append(plan)
            bins = plan.bins
        return _commit_bins(table, ice, head, branch, bins, plans[-1], report, written, committed)

    with cleanup_on_failure(table._ice, written, landed=lambda: report.snapshot_id is not None):
        # After the first plan an attempt is a cheap rebase: many quick ones, not a long backoff.
        optimistic(table.refresh, attempt, f"compact {table.name}@{branch}", attempts=COMPACT_ATTEMPTS, max_wait=0.25)
    report.seconds = time.perf_counter() - t0
    # Bins rewritten for an attempt that lost a race and were not reused are garbage now.
    delete_quietly(table._ice, [p for p in written if p not in committed])
    return report


def _commit_bins(
    table: "Table",
    ice: IcebergTable,
    head,
    branch: str,
    bins: list[_Bin],
    plan: _Plan,
    report: CompactionReport,
    written: list[str],
    committed: set[str],
) -> CompactionReport:
    """Replace the bins' inputs by their outputs on ``head`` in one commit, keeping everything else of ``head``.

    Files it writes go to ``written``; those the commit references, once it lands, to ``committed``.
    """
    from featurelake.livefiles import snapshot_files

    state = table._state(ice, head)
    writer = StateWriter(state, ice.io, table._platform_dir(ice))
    removed = [f for b in bins for f in b.inputs]
    added = [f for b in bins for f in b.outputs]
    added_paths = [f.file_path for f in added]
    folded = [e for f in removed for e in writer.drop_data_file(f.file_path)]
    exact = index.key_is_exact(ice.schema(), table.primary_key)
    if head.snapshot_id == plan.base:
        # Rewritten rows moved: merge the index into one segment that covers the new files too.
        live_after = (set(snapshot_files(ice, head)) - {f.file_path for f in removed}) | {f.file_path for f in added}
        fresh = [k for b in bins for k in b.keys]
        writer.replace_index_segments(index.merge(ice.io, index.location_of(ice), writer.index_segments, live_after, extra=fresh, exact=exact))
    else:
        # Rebased: keep the commit window short, add one segment for the outputs (entries of
        # outputs of bins left out are never live, so lookups ignore them; the next merge drops them).
        if plan.segment is None:
            seg = index.write_segment(ice.io, index.location_of(ice), [k for b in plan.bins for k in b.keys], exact)
            plan.segment = seg.as_dict() if seg is not None else {}
            if seg is not None:
                written.append(seg.path)
        if plan.segment:
            writer.add_index_segments([plan.segment])
            added_paths.append(plan.segment["path"])
    root = writer.write() if writer.changed else state.root_path
    snapshot_props = {"featurelake.operation": "compact", **refs.same_events_props(head)}
    snapshot_props.update(summary_props(ice.io, root))
    tx = ice.transaction()
    with tx.update_snapshot(snapshot_properties=snapshot_props, branch=branch).overwrite() as op:
        for f in removed:
            op.delete_data_file(f)
        for f in added:
            op.append_data_file(f)
    report.snapshot_id = commit(tx, branch)
    committed.update(added_paths)
    report.files_in, report.bytes_in = len(removed), sum(f.file_size_in_bytes for f in removed)
    report.rows = sum(f.record_count for f in removed)
    report.files_out = len(added)
    report.bytes_out = sum(f.file_size_in_bytes for f in added)
    report.update_files_folded = distinct_files(folded)  # update files with a layer folded (a shared one once)
    report.update_bytes_folded = sum(e.bytes for e in folded)
    report.bad_files = sorted(plan.bad)
    return report
