"""Table health from cheap metadata: does a branch need compaction?

A maintenance sensor polls every table and branch of a lake, so what it reads
must stay cheap however big the tables grow. :func:`table_health` never opens
a data file or an update file. It reads, per branch head:

* the table metadata (one catalog call and the ``metadata.json`` the table
  object already loads): refs, snapshots and their summaries;
* the snapshot summary totals ``total-data-files``, ``total-files-size`` and
  ``total-records`` (pyiceberg writes them on every commit);
* the platform state (invariant 3): one small JSON root per platform commit,
  whose per-shard totals give the number and bytes of live update files, and
  its Parquet shards (one row per live update file, a few KB) for the number of
  update layers per data file;
* the snapshot's manifests, only for what no summary holds: the size and
  partition of every live data file, to count *small* files. Manifests are
  immutable, so each one is read once per process and kept as a few counters
  (:data:`_MANIFESTS`); a new commit costs the manifests it wrote, not the
  table's whole history. With ``skip_manifests_below`` the manifests are not
  read at all when the summary shows too few data files to matter.

Results are cached by (table uuid, snapshot id, small-file size): a snapshot is
immutable, so a sensor that polls an unchanged branch costs one metadata load.

Counts, per branch head:

``data_files``, ``data_bytes``, ``rows``
    live data files, their bytes and rows (summary totals; manifests when a
    summary lacks them).
``small_files``
    data files smaller than ``featurelake.small-file-bytes`` (default 32 MiB).
``compactable_small_files``
    small files that share their partition with at least one other small file:
    the ones compaction can bin-pack (a lone small file per partition has
    nothing to merge with, so it never triggers a compaction on its own).
``update_files``, ``update_bytes``
    live update files (merge-on-read column updates; a file shared by the small
    layers of one commit counts once) and the stored bytes of their live layers.
``max_update_layers``
    the most update layers stacked on one data file: every layer costs the reader
    one more merge, compaction folds them all.
``files_with_updates``
    data files with at least one update file.

The platform state counts every live update entry it holds; entries whose data
file another engine removed (a plain pyiceberg delete, which featurelake's
state does not see) stay counted until featurelake rewrites that file.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Iterable

from pyiceberg.manifest import ManifestContent
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Snapshot

from featurelake import refs
from featurelake.lru import LRU
from featurelake.staleness import (  # noqa: F401  (public here as before)
    MAX_PENDING_LAYERS_PROPERTY,
    MAX_STALENESS_PROPERTY,
    StalenessPolicy,
    staleness_policy,
)
from featurelake.state import state_of

if TYPE_CHECKING:
    from featurelake.lake import Lake
    from featurelake.table import Table

SMALL_FILE_PROPERTY = "featurelake.small-file-bytes"
SMALL_FILE_BYTES = 32 * 1024 * 1024  # data files below this count as small (compaction merges them)


# ---------------------------------------------------------------- caches
@dataclass(frozen=True)
class _ManifestCounts:
    """What one data manifest contributes: live files, bytes, rows, small files per partition."""

    files: int
    bytes: int
    rows: int
    small: tuple[tuple[Any, int], ...]  # ((spec_id, partition tuple), small files)


@dataclass(frozen=True)
class _StateCounts:
    update_files: int
    update_bytes: int
    max_update_layers: int
    files_with_updates: int
    oldest_update_ms: int | None = None  # commit time of the oldest live update file


_MANIFESTS = LRU(8192)  # (manifest path, small bytes) -> _ManifestCounts
_STATES = LRU(1024)  # state root path -> _StateCounts
_HEALTH = LRU(4096)  # (table uuid, snapshot id, small bytes, manifests?) -> dict

_read_counters = Counter()  # manifests / state roots actually parsed (tests, benchmarks)


def clear_caches() -> None:
    """Forget every cached count (tests and benchmarks measuring cold reads)."""
    _MANIFESTS.clear()
    _STATES.clear()
    _HEALTH.clear()
    _read_counters.clear()


def read_counters() -> dict[str, int]:
    """How many manifests and platform-state roots were parsed (not served from cache)."""
    return dict(_read_counters)


# ---------------------------------------------------------------- pieces
def _manifest_counts(ice: IcebergTable, manifest, small_bytes: int) -> _ManifestCounts:
    key = (manifest.manifest_path, small_bytes)
    cached = _MANIFESTS.get(key)
    if cached is not None:
        return cached
    files = size = rows = 0
    small: Counter = Counter()
    for entry in manifest.fetch_manifest_entry(ice.io, discard_deleted=True):
        f = entry.data_file
        files += 1
        size += f.file_size_in_bytes
        rows += f.record_count
        if f.file_size_in_bytes < small_bytes:
            small[(f.spec_id, tuple(f.partition))] += 1
    _read_counters["manifests"] += 1
    counts = _ManifestCounts(files, size, rows, tuple(small.items()))
    _MANIFESTS.put(key, counts)
    return counts


def _state_counts(ice: IcebergTable, snapshot: Snapshot) -> tuple[_StateCounts, str | None]:
    state = state_of(ice.metadata, ice.io, snapshot)
    if state.empty:
        return _StateCounts(0, 0, 0, 0), state.root_path
    cached = _STATES.get(state.root_path)
    if cached is None:
        entries = state.by_data_file().values()
        layers = [len(es) for es in entries]
        cached = _StateCounts(
            update_files=state.update_files,  # the root's per-shard totals
            update_bytes=state.update_bytes,
            max_update_layers=max(layers, default=0),
            files_with_updates=sum(1 for n in layers if n),
            oldest_update_ms=_oldest_commit_ms(ice, {e.snapshot_id for es in entries for e in es}),
        )
        _read_counters["states"] += 1
        _STATES.put(state.root_path, cached)
    return cached, state.root_path


def _oldest_commit_ms(ice: IcebergTable, snapshot_ids: set[int]) -> int | None:
    """When the oldest of these snapshots was committed; an expired one counts as at least as old
    as the oldest snapshot still in the metadata."""
    stamps = {s.snapshot_id: s.timestamp_ms for s in ice.metadata.snapshots}
    known = [stamps[i] for i in snapshot_ids if i in stamps]
    if len(known) < len(snapshot_ids) and stamps:
        known.append(min(stamps.values()))
    return min(known, default=None)


def _summary_int(snapshot: Snapshot, key: str) -> int | None:
    summary = snapshot.summary
    value = summary.get(key) if summary is not None else None
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def small_file_bytes_of(ice: IcebergTable) -> int:
    """The table's small-file size (``featurelake.small-file-bytes``, default 32 MiB)."""
    return int(ice.metadata.properties.get(SMALL_FILE_PROPERTY, SMALL_FILE_BYTES))


# ---------------------------------------------------------------- API
def snapshot_health(
    ice: IcebergTable,
    snapshot: Snapshot | None,
    *,
    small_file_bytes: int | None = None,
    skip_manifests_below: int | None = None,
) -> dict[str, Any]:
    """Health counters of one snapshot of a pyiceberg table (see the module doc)."""
    small_bytes = int(small_file_bytes or small_file_bytes_of(ice))
    if snapshot is None:  # an empty table's main
        return _empty(small_bytes)
    summary_files = _summary_int(snapshot, "total-data-files")
    skip = (
        skip_manifests_below is not None
        and summary_files is not None
        and summary_files < int(skip_manifests_below)
    )
    key = (ice.metadata.table_uuid, snapshot.snapshot_id, small_bytes, not skip)
    cached = _HEALTH.get(key)
    if cached is not None:
        return dict(cached)

    state, root = _state_counts(ice, snapshot)
    out: dict[str, Any] = {
        "snapshot_id": snapshot.snapshot_id,
        "timestamp_ms": snapshot.timestamp_ms,
        "rows": _summary_int(snapshot, "total-records"),
        "data_files": summary_files,
        "data_bytes": _summary_int(snapshot, "total-files-size"),
        "small_files": None,
        "compactable_small_files": None,
        "update_files": state.update_files,
        "update_bytes": state.update_bytes,
        "max_update_layers": state.max_update_layers,
        "files_with_updates": state.files_with_updates,
        "oldest_update_ms": state.oldest_update_ms,
        "small_file_bytes": small_bytes,
        "state_root": root,
        "manifests_read": not skip,
    }
    if not skip:
        files = size = rows = 0
        per_partition: Counter = Counter()
        for manifest in snapshot.manifests(ice.io):
            if manifest.content != ManifestContent.DATA:
                continue  # featurelake writes no delete files; other engines' are not data
            counts = _manifest_counts(ice, manifest, small_bytes)
            files += counts.files
            size += counts.bytes
            rows += counts.rows
            per_partition.update(dict(counts.small))
        out["small_files"] = sum(per_partition.values())
        out["compactable_small_files"] = sum(n for n in per_partition.values() if n > 1)
        # the manifests are exact; the summary totals are kept when present (they agree)
        out["data_files"] = files if summary_files is None else summary_files
        out["data_bytes"] = size if out["data_bytes"] is None else out["data_bytes"]
        out["rows"] = rows if out["rows"] is None else out["rows"]
    else:  # no small file can be counted without manifests; fewer files than the threshold anyway
        out["small_files"] = out["compactable_small_files"] = None
    out["bytes"] = (out["data_bytes"] or 0) + out["update_bytes"]
    _HEALTH.put(key, dict(out))
    return out


def _empty(small_bytes: int) -> dict[str, Any]:
    return {
        "snapshot_id": None,
        "timestamp_ms": None,
        "rows": 0,
        "data_files": 0,
        "data_bytes": 0,
        "small_files": 0,
        "compactable_small_files": 0,
        "update_files": 0,
        "update_bytes": 0,
        "max_update_layers": 0,
        "files_with_updates": 0,
        "oldest_update_ms": None,
        "small_file_bytes": small_bytes,
        "state_root": None,
        "manifests_read": False,
        "bytes": 0,
    }


def table_health(
    table: "Table",
    branch: str = refs.MAIN,
    *,
    small_file_bytes: int | None = None,
    skip_manifests_below: int | None = None,
    ice: IcebergTable | None = None,
) -> dict[str, Any]:
    """Cheap health counters of a branch head: no data or update file is read.

    Returns ``table``, ``branch``, ``snapshot_id``, ``rows``, ``data_files``,
    ``data_bytes``, ``small_files``, ``compactable_small_files``,
    ``update_files``, ``update_bytes``, ``max_update_layers``,
    ``files_with_updates``, ``bytes`` and ``small_file_bytes``. With
    ``skip_manifests_below=N`` a head whose summary shows fewer than N data
    files is answered without reading manifests (``small_files`` is None).
    Raises BranchNotFoundError for an unknown branch.
    """
    ice = ice or table.refresh()
    head = refs.resolve(ice.metadata, branch)
    out = snapshot_health(
        ice, head, small_file_bytes=small_file_bytes, skip_manifests_below=skip_manifests_below
    )
    return {"table": table.name, "branch": branch, **out}


def lake_health(
    lake: "Lake",
    *,
    tables: Iterable[str] | None = None,
    branches: Iterable[str] | None = None,
    small_file_bytes: int | None = None,
    skip_manifests_below: int | None = None,
) -> list[dict[str, Any]]:
    """:func:`table_health` of every branch of every table (or of those named).

    One metadata load per table; branches are read from its refs (tags are
    read-only and never compacted).
    """
    wanted = set(branches) if branches is not None else None
    out = []
    for name in tables if tables is not None else lake.tables():
        table = lake.table(name)
        ice = table._ice  # just loaded by lake.table
        for branch in sorted(
            n for n, r in ice.metadata.refs.items() if r.snapshot_ref_type == SnapshotRefType.BRANCH
        ) or [refs.MAIN]:
            if wanted is not None and branch not in wanted:
                continue
            out.append(
                table_health(
                    table,
                    branch,
                    small_file_bytes=small_file_bytes,
                    skip_manifests_below=skip_manifests_below,
                    ice=ice,
                )
            )
    return out


# ---------------------------------------------------------------- external readers
def staleness_of(health: dict[str, Any], policy: StalenessPolicy, now: datetime | None = None) -> dict[str, Any]:
    """How stale a branch head looks to external readers, and which policy bounds it breaks.

    ``health`` is a :func:`snapshot_health` / :func:`table_health` result (no file is read here).
    """
    files = int(health.get("update_files") or 0)
    layers = int(health.get("max_update_layers") or 0)
    oldest = health.get("oldest_update_ms") if files else None
    now_ms = (now or datetime.now(timezone.utc)).timestamp() * 1000
    stale_s = max(0.0, (now_ms - oldest) / 1000) if oldest is not None else 0.0
    violations = []
    if policy.max_pending_layers is not None and layers > policy.max_pending_layers:
        violations.append(f"pending update layers {layers} > {MAX_PENDING_LAYERS_PROPERTY}={policy.max_pending_layers}")
    if policy.max_staleness is not None and files and stale_s > policy.max_staleness.total_seconds():
        violations.append(
            f"updates pending for {stale_s:.0f}s > {MAX_STALENESS_PROPERTY}={policy.max_staleness.total_seconds():.0f}s"
        )
    return {
        "pending_update_files": files,
        "pending_update_layers": layers,
        "final_for_external_readers": files == 0,
        "oldest_pending_update": (
            datetime.fromtimestamp(oldest / 1000, timezone.utc).isoformat(timespec="seconds") if oldest is not None else None
        ),
        "stale_seconds": round(stale_s, 3),
        "policy": policy.as_dict(),
        "violations": violations,
    }


def branch_staleness(
    table: "Table", branch: str = refs.MAIN, *, ice: IcebergTable | None = None, now: datetime | None = None
) -> dict[str, Any]:
    """:func:`staleness_of` a table branch under the table's own policy (cheap metadata only)."""
    ice = ice or table.refresh()
    health = table_health(table, branch, ice=ice, skip_manifests_below=2**62)
    return {"table": table.name, "branch": branch, "snapshot_id": health["snapshot_id"],
            **staleness_of(health, staleness_policy(ice.metadata.properties), now)}


# ---------------------------------------------------------------- forecast
def maintenance_forecast(
    lake: "Lake",
    older_than: datetime,
    retain_last: int = 1,
    grace: timedelta = timedelta(0),
) -> dict[str, Any]:
    """What nightly maintenance *would* free, committing and deleting nothing.

    Simulates ``expire_snapshots(older_than, retain_last)`` on every table (the
    same keep rule: every ref head, the last ``retain_last`` snapshots of each
    branch, snapshots newer than the cutoff, and the snapshots carrying the
    platform state a kept one inherits), then lists the files garbage
    collection would delete once they are older than ``grace``. Metadata and
    manifests are read; data files are only listed.

    A plain ``collect_garbage(dry_run=True)`` before expiry frees almost
    nothing, because every old snapshot still references its files; this
    answers "how much does expiry plus GC give back".
    """
    from featurelake.gc import retained_snapshot_ids, unreferenced_files

    t0 = time.perf_counter()
    cutoff = older_than if older_than.tzinfo else older_than.replace(tzinfo=timezone.utc)
    cutoff_ms = int(cutoff.timestamp() * 1000)
    now = time.time()
    report: dict[str, Any] = {"snapshots": 0, "files": 0, "bytes": 0, "kept_young": 0, "tables": {}}
    for name in lake.tables():
        table = lake.table(name)
        ice = table._ice
        meta = ice.metadata
        keep = retained_snapshot_ids(meta, cutoff_ms, retain_last)
        expired = [s for s in meta.snapshots if s.snapshot_id not in keep]
        simulated = _MetadataView(ice, meta.model_copy(update={"snapshots": [s for s in meta.snapshots if s.snapshot_id in keep]}))
        garbage, young = unreferenced_files(table, simulated, now - grace.total_seconds())  # type: ignore[arg-type]
        files = len(garbage)
        size = sum(f.size for f in garbage)
        report["tables"][name] = {"snapshots": len(expired), "files": files, "bytes": size, "kept_young": young}
        report["snapshots"] += len(expired)
        report["files"] += files
        report["bytes"] += size
        report["kept_young"] += young
    report["seconds"] = round(time.perf_counter() - t0, 4)
    return report


class _MetadataView:
    """A pyiceberg table stand-in with other metadata (what ``referenced_files`` reads)."""

    def __init__(self, ice: IcebergTable, metadata) -> None:
        self.metadata = metadata
        self.io = ice.io
        self.metadata_location = ice.metadata_location
        self._ice = ice

    def location(self) -> str:
        return self._ice.location()


__all__ = [
    "table_health",
    "snapshot_health",
    "lake_health",
    "maintenance_forecast",
    "small_file_bytes_of",
    "StalenessPolicy",
    "staleness_policy",
    "staleness_of",
    "branch_staleness",
    "clear_caches",
    "read_counters",
]
