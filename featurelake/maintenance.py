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
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa
from pyiceberg.manifest import DataFile
from pyiceberg.table import FileScanTask
from pyiceberg.table import Table as IcebergTable

from featurelake import index, refs
from featurelake.commit import cleanup_on_failure, delete_quietly, optimistic
from featurelake.errors import CorruptFileError
from featurelake.rewrite import merged_rows, rewrite_scan, write_data_files
from featurelake.state import STATE_KEY, StateWriter

if TYPE_CHECKING:
    from featurelake.table import Table

DEFAULT_TARGET_BYTES = 128 * 1024 * 1024


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
class BinRewrite:
    """One bin rewritten: its new data files, and its files that could not be read (path -> error)."""

    files: list[DataFile]
    bad: dict[str, str] = field(default_factory=dict)


# Rewrites bins of (table, rewrite scan, bins, target file bytes, bad-file budget, progress) -> one BinRewrite each.
BinRewriter = Callable[[IcebergTable, Any, "list[list[FileScanTask]]", int, int, "Callable[[int, int], None] | None"], "list[BinRewrite]"]


def rewrite_bin(
    ice: IcebergTable, scan, bin_: list[FileScanTask], target: int, allowed_bad: int, write_uuid: uuid.UUID | None = None, counter=None
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
    files = write_data_files(ice, rows, write_uuid, counter, target_file_bytes=target) if rows is not None else []
    return BinRewrite(files, bad)


def rewrite_here(
    ice: IcebergTable, scan, bins: list[list[FileScanTask]], target: int, budget: int, progress: Callable[[int, int], None] | None = None
) -> list[BinRewrite]:
    """Rewrite ``bins`` one after another in this process, sharing one bad-file budget."""
    write_uuid, counter = uuid.uuid4(), itertools.count(0)
    out: list[BinRewrite] = []
    for i, bin_ in enumerate(bins):
        out.append(rewrite_bin(ice, scan, bin_, target, budget - sum(len(r.bad) for r in out), write_uuid, counter))
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
    rewrite_bins: "BinRewriter | None" = None,
) -> CompactionReport:
    """Rewrite files with update layers (folded) and bin-pack small files per partition.

    One atomic overwrite commit. On a concurrent commit the plan is redone on
    the new head (a concurrent append is never lost); rewritten bins whose
    inputs did not change are reused, not rewritten again. ``rewrite_bins``
    rewrites the planned bins (default :func:`rewrite_here`; featurelake.ray
    passes one that rewrites them in parallel Ray tasks).
    """
    from featurelake.table import SMALL_FILE_BYTES

    t0 = time.perf_counter()
    report = CompactionReport(table=table.name, branch=branch)
    reuse: dict[frozenset, BinRewrite] = {}
    written: list[str] = []
    committed: set[str] = set()

    def attempt(ice: IcebergTable) -> CompactionReport:
        report.attempts += 1
        head = refs.branch_head(ice.metadata, branch)
        if head is None:
            report.skipped = True
            return report
        props = ice.metadata.properties
        target = target_file_bytes or int(props.get("write.target-file-size-bytes", DEFAULT_TARGET_BYTES))
        small = small_file_bytes or int(props.get("featurelake.small-file-bytes", SMALL_FILE_BYTES))
        state = table._state(ice, head)
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
            if picked and not (len(picked) == 1 and not folded):
                chosen.extend(_bins(picked, target))
        if not chosen:
            report.skipped = True
            report.snapshot_id = head.snapshot_id
            return report
        budget = int(max_bad_file_ratio * len(tasks) + 1e-9)
        scan = rewrite_scan(table, ice, head)
        writer = StateWriter(state, ice.io, table._platform_dir(ice))
        removed: list[DataFile] = []
        added: list[DataFile] = []
        stats = dict(files_in=0, bytes_in=0, folded=0, folded_bytes=0, rows=0)
        keys = [
            frozenset((t.file.file_path, tuple(e.update_file for e in layers.get(t.file.file_path, []))) for t in bin_)
            for bin_ in chosen
        ]
        todo = {k: b for k, b in zip(keys, chosen) if k not in reuse}  # bins an earlier attempt rewrote are reused
        results = (rewrite_bins or rewrite_here)(ice, scan, list(todo.values()), target, budget, progress)
        for key, result in zip(todo, results):
            written.extend(f.file_path for f in result.files)
            reuse[key] = result
        bad = {p: e for k in keys for p, e in reuse[k].bad.items()}
        if len(bad) > budget:
            path = sorted(bad)[0]
            raise CorruptFileError(f"{len(bad)} data file(s) cannot be read (budget {budget}): {path}: {bad[path]}", path)
        for key, bin_ in zip(keys, chosen):
            added.extend(reuse[key].files)
            for t in bin_:
                if t.file.file_path in bad:
                    continue
                removed.append(t.file)
                entries = writer.drop_data_file(t.file.file_path)
                stats["files_in"] += 1
                stats["bytes_in"] += t.file.file_size_in_bytes
                stats["folded"] += len(entries)
                stats["folded_bytes"] += sum(e.bytes for e in entries)
                stats["rows"] += t.file.record_count
        removed_paths = {f.file_path for f in removed}
        live_after = ({t.file.file_path for t in tasks} - removed_paths) | {f.file_path for f in added}
        # Rewritten rows moved: merge the index into one segment that covers the new files too.
        fresh = index.file_keys(ice, [f.file_path for f in added], table.primary_key)
        writer.replace_index_segments(
            index.merge(ice.io, index.location_of(ice), writer.index_segments, live_after, extra=fresh, exact=index.key_is_exact(ice.schema(), table.primary_key))
        )
        root = writer.write() if writer.changed else state.root_path
        snapshot_props = {"featurelake.operation": "compact"}
        if root:
            snapshot_props[STATE_KEY] = root
        tx = ice.transaction()
        with tx.update_snapshot(snapshot_properties=snapshot_props, branch=branch).overwrite() as op:
            for f in removed:
                op.delete_data_file(f)
            for f in added:
                op.append_data_file(f)
        new = tx.commit_transaction()
        committed.update(f.file_path for f in added)
        report.snapshot_id = new.metadata.refs[branch].snapshot_id
        report.files_in, report.bytes_in, report.rows = stats["files_in"], stats["bytes_in"], stats["rows"]
        report.files_out = len(added)
        report.bytes_out = sum(f.file_size_in_bytes for f in added)
        report.update_files_folded = stats["folded"]
        report.update_bytes_folded = stats["folded_bytes"]
        report.bad_files = sorted(bad)
        return report

    with cleanup_on_failure(table._ice, written, landed=lambda: report.snapshot_id is not None):
        optimistic(table.refresh, attempt, f"compact {table.name}@{branch}")
    report.seconds = time.perf_counter() - t0
    # Bins rewritten for an attempt that lost a race and were not reused are garbage now.
    delete_quietly(table._ice, [p for p in written if p not in committed])
    return report
