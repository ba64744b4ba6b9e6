"""Snapshot expiry and garbage collection.

pyiceberg 0.12 expires snapshots but deletes no file, and has no orphan-file
cleanup (LIBRARY-NOTES.md). Garbage collection here deletes exactly the files
under a table's location that no retained snapshot of any branch or tag
references — data files, update files, platform state, manifests, manifest
lists, old metadata and dead sequence store builds — and only once they are
older than a grace period, which protects writes in flight (their files exist
before their commit does). Folders of tables no longer in the catalog (dropped,
or a ``metadata.json`` a crash left before the catalog insert) are collected
too, but only under the lake's own warehouse. Sequence store builds live on a
local disk, often outside any table location (the lake's cache folder): they are
collected whole, by which builds retained snapshots are served from
(:mod:`featurelake.sequences.collect`), under the same grace period.

It is fail-safe. Every path is compared as a canonical URI through the table's
own FileIO (:mod:`featurelake.storage`), and a table is skipped, its files
kept and the reason reported, whenever the listing and the references
disagree: references that cannot be read, a current ``metadata.json`` that is
not among the listed files, or a listing in which no file is referenced. A
file under a table location it cannot resolve is kept.
"""
from __future__ import annotations

import time
import warnings
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from pyiceberg.io import load_file_io
from pyiceberg.table import Table as IcebergTable

from featurelake import refs
from featurelake.commit import optimistic
from featurelake.errors import GarbageCollectionError
from featurelake.placement import PROJECTIONS_DIR
from featurelake.sequences.buildinfo import PROP_KEY, list_builds, store_root
from featurelake.sequences.tiering import COLD_DIR
from featurelake.sequences.collect import BuildPlan, orphan_roots, plan_builds, plan_orphan_root, remove_builds
from featurelake.state import STATE_KEY, state_of
from featurelake.storage import PLATFORM_DIR, Storage, StoredFile, delete_stored, is_under, storage_of

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
    orphans: dict[str, int] = field(default_factory=dict)  # folder of a table gone from the catalog -> files
    builds: dict[str, list[str]] = field(default_factory=dict)  # table -> its dead sequence store builds
    refused: dict[str, str] = field(default_factory=dict)  # table or folder -> why its files were kept
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



@dataclass
class _Plan:
    """What one collection would delete, and what it kept and why."""

    garbage: list[StoredFile] = field(default_factory=list)
    young: int = 0
    refused: dict[str, str] = field(default_factory=dict)
    store: BuildPlan | None = None  # the table's dead store builds (on a local disk, see sequences.collect)


def _is_catalog_file(f: StoredFile) -> bool:
    return f.uri.endswith(".db")  # an embedded SQLite catalog is never the warehouse's garbage


def _old(f: StoredFile, cutoff: float) -> bool:
    return f.mtime is not None and f.mtime <= cutoff


def _store_root(table: "Table", ice: IcebergTable) -> Path | None:
    """The local folder of the table's store builds (sequence or feature table), or None when it has none."""
    try:
        root = store_root(table.lake.cache_dir, table.name, ice)
    except Exception:  # noqa: BLE001 - no local store configured: no build can exist
        return None
    if PROP_KEY not in ice.metadata.properties and not root.is_dir():
        return None
    return root


def _table_plan(table: "Table", ice: IcebergTable, nested: list[str], cutoff: float) -> _Plan:
    """Unreferenced files of one table and its dead store builds, older than ``cutoff``; refuses (keeps all) on any doubt."""
    plan = _Plan()
    storage = storage_of(ice.io)
    location = storage.canonical(ice.location())
    try:
        keep = {storage.canonical(p) for p in referenced_files(table, ice)}
        root = _store_root(table, ice)
        store = storage.canonical(str(root)) if root is not None else None
    except Exception as e:  # noqa: BLE001 - unreadable references: keep everything
        plan.refused[table.name] = f"its references cannot be read ({type(e).__name__}: {e}); nothing deleted"
        return plan
    listed = [f for f in storage.list(ice.location()) if not any(is_under(f.uri, n) for n in nested)]
    current = storage.canonical(ice.metadata_location)
    if not keep:
        plan.refused[table.name] = "it references no file; nothing deleted"
        return plan
    if listed and not any(f.uri in keep for f in listed):
        plan.refused[table.name] = f"none of the {len(listed)} files listed under {location} is referenced; nothing deleted"
        return plan
    if current not in {f.uri for f in listed}:
        plan.refused[table.name] = f"its current metadata {current} is not among the files listed under {location}; nothing deleted"
        return plan
    cold: list[StoredFile] = []
    for f in listed:
        if f.uri in keep or _is_catalog_file(f) or f"/{PLATFORM_DIR}/{PROJECTIONS_DIR}/" in f.uri:
            continue  # projection logs are snapshot-independent platform metadata
        if f"/{PLATFORM_DIR}/{COLD_DIR}/" in f.uri:
            cold.append(f)  # cold segments of store builds: kept while a build on disk reads them (below)
            continue
        if store is not None and is_under(f.uri, store):
            continue  # store builds go whole, by what retained snapshots need (below)
        if _old(f, cutoff):
            plan.garbage.append(f)
        else:
            plan.young += 1
    if root is not None:
        try:
            plan.store = plan_builds(root, ice.metadata, cutoff)
        except Exception as e:  # noqa: BLE001 - an unreadable store folder: keep every build
            plan.refused[f"{table.name} store"] = f"its store builds cannot be listed ({type(e).__name__}: {e}); kept"
            return plan
        plan.young += sum(len(list(Path(root, b).rglob("*"))) for b in plan.store.young)
        try:
            doomed = set(plan.store.build_ids)
            needed = {storage.canonical(seg["path"]) for b in list_builds(root) if b.build_id not in doomed
                      for seg in b.cold_segments}
        except Exception as e:  # noqa: BLE001 - an unreadable record: keep every segment
            plan.refused[f"{table.name} cold segments"] = f"build records cannot be read ({type(e).__name__}: {e}); kept"
            return plan
    else:
        needed = set()
    for f in cold:
        if f.uri in needed:
            continue
        if _old(f, cutoff):
            plan.garbage.append(f)
        else:
            plan.young += 1
    if plan.store is not None and plan.store.foreign:
        plan.refused[str(root)] = (f"{len(plan.store.foreign)} build(s) there record another table "
                                   f"({', '.join(plan.store.foreign[:3])}); kept")
    return plan


def unreferenced_files(table: "Table", ice, cutoff: float) -> tuple[list[StoredFile], int]:
    """Files under the table's location no retained snapshot needs, modified before
    ``cutoff`` (epoch seconds), and the count of younger ones; none when in doubt."""
    plan = _table_plan(table, ice, [], cutoff)
    return plan.garbage, plan.young


def _table_roots(files: list[StoredFile]) -> set[str]:
    """Folders that hold an Iceberg table: the parent of a ``metadata/*.metadata.json``."""
    roots = set()
    for f in files:
        head, sep, name = f.uri.rpartition("/metadata/")
        if sep and "/" not in name and name.endswith(".metadata.json"):
            roots.add(head)
    return roots


def _orphan_plan(storage: Storage, warehouse: str, live: list[str], cutoff: float) -> tuple[_Plan, dict[str, int]]:
    """Files of table folders under the warehouse that no catalog table owns, once all are old."""
    plan, counts = _Plan(), {}
    files = [f for f in storage.list(warehouse) if not _is_catalog_file(f)]
    candidates = [f for f in files if not any(is_under(f.uri, loc) for loc in live)]
    roots = sorted(_table_roots(candidates), key=len, reverse=True)
    groups: dict[str, list[StoredFile]] = {}
    unresolved = 0
    for f in candidates:
        root = next((r for r in roots if is_under(f.uri, r)), None)
        if root is None:
            unresolved += 1
        else:
            groups.setdefault(root, []).append(f)
    if unresolved:
        plan.refused[storage.canonical(warehouse)] = f"{unresolved} file(s) under no table folder were kept"
    for root, group in groups.items():
        if any(is_under(loc, root) for loc in live):
            plan.refused[root] = "a live table lies inside this table folder; kept"
        elif all(_old(f, cutoff) for f in group):
            plan.garbage.extend(group)
            counts[root] = len(group)
        else:
            plan.young += len(group)
    return plan, counts


def _warehouse_storage(lake: "Lake", tables: list[IcebergTable]) -> tuple[Storage, str] | None:
    warehouse = getattr(lake, "warehouse", None)
    if not warehouse:
        return None
    if tables:
        return storage_of(tables[0].io), warehouse
    return Storage(load_file_io(dict(lake.catalog.properties), warehouse)), warehouse


def collect_garbage(lake: "Lake", older_than: timedelta = timedelta(days=3), dry_run: bool = False) -> GarbageReport:
    """Delete files no retained snapshot of any ref references, older than the grace period.

    Also the sequence store builds no retained snapshot is served from, wherever the
    lake keeps them (its local cache folder too; see :mod:`featurelake.sequences.collect`);
    ``report.builds`` names them per table.

    Raises GarbageCollectionError on a negative grace period (files of writes in
    flight are younger than zero days only by clock skew). Tables or folders it
    cannot prove garbage are kept and listed in ``report.refused``.
    """
    if not isinstance(older_than, timedelta) or older_than < timedelta(0):
        raise GarbageCollectionError(f"the grace period must be a timedelta of zero or more, got {older_than!r}")
    t0 = time.perf_counter()
    report = GarbageReport(dry_run=dry_run)
    cutoff = time.time() - older_than.total_seconds()
    loaded: list[tuple[str, "Table", IcebergTable]] = []
    for name in lake.tables():
        try:
            table = lake.table(name)  # loads it: one catalog call per table
            loaded.append((name, table, table._ice))
        except Exception as e:  # noqa: BLE001 - an unloadable table: its files cannot be told apart
            report.refused[name] = f"cannot be loaded ({type(e).__name__}: {e}); its files are kept"
    unloadable = bool(report.refused)
    locations = {name: storage_of(ice.io).canonical(ice.location()) for name, _, ice in loaded}
    plans: list[tuple[str | None, _Plan]] = []
    for name, table, ice in loaded:
        nested = [loc for other, loc in locations.items() if other != name and is_under(loc, locations[name])]
        plans.append((name, _table_plan(table, ice, nested, cutoff)))
    where = _warehouse_storage(lake, [ice for _, _, ice in loaded])
    if where is not None:
        if unloadable:
            report.refused[where[1]] = "a table could not be loaded, so no orphaned table folder is collected"
        else:
            orphans, report.orphans = _orphan_plan(where[0], where[1], list(locations.values()), cutoff)
            plans.append((None, orphans))
    if not unloadable:
        plans.extend((None, p) for p in _orphan_store_plans(lake, {name for name, _, _ in loaded}, cutoff))
    for name, plan in plans:
        report.kept_young += plan.young
        report.refused.update(plan.refused)
        counts = {"files": 0, "bytes": 0}
        for f in plan.garbage:
            report.files.append(f.uri)
            report.bytes += f.size
            counts["files"] += 1
            counts["bytes"] += f.size
        if not dry_run:
            delete_stored(plan.garbage)  # batched on S3: one request per 1,000 files
        store = plan.store
        if store is not None and store.doomed:
            report.files.extend("file://" + p for p in store.files)
            report.bytes += store.bytes
            counts["files"] += len(store.files)
            counts["bytes"] += store.bytes
            report.builds[name or str(store.root)] = list(store.build_ids)
            if not dry_run:
                remove_builds(store)
                if name is None:  # a dropped table's store root: its folder goes too, once empty
                    try:
                        store.root.rmdir()
                    except OSError:
                        pass
        if name is not None:
            report.tables[name] = counts
    report.seconds = time.perf_counter() - t0
    return report


def _orphan_store_plans(lake: "Lake", tables: set[str], cutoff: float) -> list[_Plan]:
    """Store roots of tables dropped from the catalog, under an embedded lake's own home only.

    A catalog lake's cache folder may be shared with other lakes, whose tables
    this catalog does not list: their stores are never touched.
    """
    home, cache = getattr(lake, "home", None), getattr(lake, "cache_dir", None)
    if home is None or cache is None or Path(cache).resolve() != Path(home).resolve():
        return []
    plans = []
    for root in orphan_roots(Path(cache) / "sequences", tables):
        plan = _Plan(store=plan_orphan_root(root, cutoff))
        plan.young = len(plan.store.young)
        plans.append(plan)
    return plans


def purge_files(lake: "Lake", name: str, ice: IcebergTable) -> int:
    """Delete every file of a table just dropped from the catalog (``drop_table(purge=True)``).

    Files under another table's location (nested) are kept. Returns the count deleted.
    """
    storage = storage_of(ice.io)
    location = storage.canonical(ice.location())
    others = []
    for other in lake.tables():
        try:
            other_ice = lake.catalog.load_table(other)
        except Exception as e:  # noqa: BLE001 - cannot tell what it owns: keep everything
            warnings.warn(f"drop_table({name!r}, purge=True) kept the table's files: table {other!r} could not be "
                          f"loaded to tell which files it owns ({type(e).__name__}: {e}); collect_garbage removes the "
                          "dropped table's folder after the grace period", stacklevel=3)
            return 0
        others.append(storage_of(other_ice.io).canonical(other_ice.location()))
    if any(is_under(location, loc) for loc in others):
        return 0  # another table's folder holds this one: garbage collection decides file by file
    folders = [ice.location()]
    if lake.cache_dir is not None and ice.metadata.properties.get(PROP_KEY):
        folders.append(str(store_root(lake.cache_dir, name, ice)))
    doomed: list[StoredFile] = []
    for folder in folders:
        for f in storage.list(folder):
            if any(is_under(f.uri, loc) for loc in others) or _is_catalog_file(f):
                continue
            doomed.append(f)
    delete_stored(doomed)
    return len(doomed)
