"""Snapshot expiry and garbage collection.

pyiceberg 0.12 expires snapshots but deletes no file, and has no orphan-file
cleanup (LIBRARY-NOTES.md). Garbage collection here deletes exactly the files
under a table's location that no retained snapshot of any branch or tag
references — data files, update files, platform state, manifests, manifest
lists and old metadata — and only once they are older than a grace period,
which protects writes in flight (their files exist before their commit does).
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Iterable

import pyarrow.fs as pafs
from pyiceberg.table import Table as IcebergTable

from featurelake import refs
from featurelake.commit import optimistic
from featurelake.state import STATE_KEY, state_of

if TYPE_CHECKING:
    from featurelake.lake import Lake
    from featurelake.table import Table


@dataclass
class GarbageReport:
    """Files (and bytes) that no retained snapshot references, deleted or, in a dry run, listed."""

    dry_run: bool
    files: list[str] = field(default_factory=list)
    bytes: int = 0
    kept_young: int = 0
    tables: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _state_provider(meta, snapshot) -> int | None:
    """The snapshot whose summary holds the platform state ``snapshot`` sees."""
    for snap in refs.ancestors(meta, snapshot):
        if snap.summary is not None and snap.summary.get(STATE_KEY):
            return snap.snapshot_id
    return None


def fork_paths(meta) -> set[int]:
    """Snapshots on the way from each ref head back to its fork point with every branch.

    Merge, rebase and diff find the common base by walking parents (and merged
    sources) from both heads; keeping these walks intact keeps a live branch
    mergeable however much history is expired around it.
    """
    from featurelake.merge import fork_point, history

    heads = {name: meta.snapshot_by_id(ref.snapshot_id) for name, ref in meta.refs.items()}
    keep: set[int] = set()
    for name in refs.branches(meta):
        for other, head in heads.items():
            if other == name or head is None or heads[name] is None:
                continue
            base = fork_point(meta, heads[name], head)
            if base is None:
                continue
            for side in (heads[name], head):
                for snap in history(meta, side):  # nearest first: every shortest path to base comes before it
                    keep.add(snap.snapshot_id)
                    if snap.snapshot_id == base.snapshot_id:
                        break
    return keep


def retained_snapshot_ids(meta, cutoff_ms: int, retain_last: int) -> set[int]:
    """The snapshots expiry keeps: ref heads, the last ``retain_last`` of each branch,
    those newer than the cutoff, the walks from each branch to its fork points
    (``fork_paths``), and those carrying state a kept one inherits."""
    keep: set[int] = fork_paths(meta)
    for ref in meta.refs.values():
        head = meta.snapshot_by_id(ref.snapshot_id)
        for i, snap in enumerate(refs.ancestors(meta, head)):
            if i < retain_last or snap.timestamp_ms >= cutoff_ms:
                keep.add(snap.snapshot_id)
            else:
                break
    keep.update(s.snapshot_id for s in meta.snapshots if s.timestamp_ms >= cutoff_ms)
    for sid in list(keep):
        provider = _state_provider(meta, meta.snapshot_by_id(sid))
        if provider is not None:
            keep.add(provider)
    return keep


def expire_snapshots(table: "Table", older_than: datetime, retain_last: int = 1) -> list[int]:
    """Expire snapshots older than ``older_than``; returns the expired ids.

    Every ref head and the last ``retain_last`` snapshots of each branch are
    kept, and so are the fork points of live branches with the snapshots
    leading to them (so merge, rebase and diff still work), and any snapshot
    whose summary carries the platform state a kept snapshot inherits (a
    commit by another engine has none of its own).
    Files are freed later by ``collect_garbage``.
    """
    if retain_last < 1:
        raise ValueError("retain_last must be at least 1")
    cutoff = older_than if older_than.tzinfo else older_than.replace(tzinfo=timezone.utc)
    cutoff_ms = int(cutoff.timestamp() * 1000)

    def attempt(ice: IcebergTable) -> list[int]:
        meta = ice.metadata
        keep = retained_snapshot_ids(meta, cutoff_ms, retain_last)
        expired = [s.snapshot_id for s in meta.snapshots if s.snapshot_id not in keep]
        if expired:
            ice.maintenance.expire_snapshots().by_ids(expired).commit()
        return expired

    return optimistic(table.refresh, attempt, f"expire snapshots of {table.name}")


def referenced_files(table: "Table", ice: IcebergTable) -> set[str]:
    """Every file a retained snapshot (or the current metadata) of the table needs."""
    meta = ice.metadata
    io = ice.io
    keep: set[str] = {ice.metadata_location}
    keep.update(entry.metadata_file for entry in meta.metadata_log)
    seen_manifests: set[str] = set()
    seen_states: set[str] = set()
    for snap in meta.snapshots:
        keep.add(snap.manifest_list)
        for manifest in snap.manifests(io):
            keep.add(manifest.manifest_path)
            if manifest.manifest_path in seen_manifests:
                continue
            seen_manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(io, discard_deleted=True):
                keep.add(entry.data_file.file_path)
        root = snap.summary.get(STATE_KEY) if snap.summary else None
        if root and root not in seen_states:
            seen_states.add(root)
            keep.add(root)
            state = state_of(meta, io, snap)
            keep.update(state.shards.values())
            keep.update(e.update_file for e in state.entries())
            keep.update(seg["path"] for seg in state.index_segments)
    for stats in list(getattr(meta, "statistics", []) or []) + list(getattr(meta, "partition_statistics", []) or []):
        keep.add(stats.statistics_path)
    return keep


def _normalize(path: str) -> str:
    return path.removeprefix("file://")


def _list(location: str) -> Iterable[pafs.FileInfo]:
    fs, root = pafs.FileSystem.from_uri(location)
    try:
        infos = fs.get_file_info(pafs.FileSelector(root, recursive=True, allow_not_found=True))
    except FileNotFoundError:
        return []
    return [(fs, i) for i in infos if i.type == pafs.FileType.File]


def unreferenced_files(table: "Table", ice, cutoff: float) -> tuple[list, int]:
    """Files under the table's location no retained snapshot needs, modified before
    ``cutoff`` (epoch seconds): ([(filesystem, file info)], count of younger ones)."""
    keep = {_normalize(p) for p in referenced_files(table, ice)}
    garbage, young = [], 0
    for fs, info in _list(ice.location()):
        path = _normalize(info.path)
        if path in keep or path.endswith(".db"):
            continue
        if (info.mtime.timestamp() if info.mtime else 0) > cutoff:
            young += 1
            continue
        garbage.append((fs, info))
    return garbage, young


def collect_garbage(lake: "Lake", older_than: timedelta = timedelta(days=3), dry_run: bool = False) -> GarbageReport:
    """Delete files no retained snapshot of any ref references, older than the grace period."""
    t0 = time.perf_counter()
    report = GarbageReport(dry_run=dry_run)
    cutoff = time.time() - older_than.total_seconds()
    for name in lake.tables():
        table = lake.table(name)
        ice = table.refresh()
        garbage, young = unreferenced_files(table, ice, cutoff)
        report.kept_young += young
        counts = {"files": 0, "bytes": 0}
        for fs, info in garbage:
            report.files.append(info.path)
            report.bytes += info.size or 0
            counts["files"] += 1
            counts["bytes"] += info.size or 0
            if not dry_run:
                fs.delete_file(info.path)
        report.tables[name] = counts
    report.seconds = time.perf_counter() - t0
    return report
