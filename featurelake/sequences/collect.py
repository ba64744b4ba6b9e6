"""Garbage collection of store builds: which builds no retained snapshot needs, and removing them safely.

Why a module of its own: a store build (:mod:`featurelake.sequences.build`) lives
on a local disk -- the lake's cache folder, or next to a table on local disk --
never under an object store's table location, so the file-by-file listing of
:mod:`featurelake.gc` cannot see it. This module answers, per table, from the
table's Iceberg metadata and the build records alone:

* **live** builds (:func:`featurelake.sequences.buildinfo.live_builds`): the build
  each retained snapshot of any branch or tag is served from, and the newest
  build of every retained snapshot in each layout (one a reader may pin by id);
* **dead** builds: the rest -- builds of expired snapshots no retained one shares
  its events with, and older builds of a snapshot superseded by a newer build in
  the same layout. Incremental builds hard-link the files of the build they
  extend, so deleting a dead base never touches a live build's bytes.

Safety: a build goes only once every file and folder in it is older than the
grace period by both modification and status-change time (a hard link made by
a build in progress renews the linked file's status-change time), so an
unfinished build (``.tmp-*``) or a build just linked from is never taken away.
A build whose record names another table (same name, another lake sharing the
cache folder, or a dropped and re-created table) is never deleted. A build is
removed by renaming its folder out of sight first (``.gc-*``, atomic: readers
see it whole or not at all), then deleting the folder; a deletion cut short
leaves a ``.gc-*`` folder that the next collection removes.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from featurelake.sequences.buildinfo import BuildInfo, list_builds, live_builds

TMP_PREFIX = ".tmp-"   # a build being written (see build.build_store)
GC_PREFIX = ".gc-"     # a dead build whose deletion began


@dataclass
class BuildPlan:
    """What a collection of one store root deletes (``doomed``) and what it keeps, and why."""

    root: Path
    doomed: list[Path] = field(default_factory=list)     # build, unfinished-build or leftover folders
    build_ids: list[str] = field(default_factory=list)   # the dead finished builds among them
    young: list[str] = field(default_factory=list)       # dead but inside the grace period: kept
    foreign: list[str] = field(default_factory=list)     # records of another table: kept
    files: list[str] = field(default_factory=list)       # every file of the doomed folders
    bytes: int = 0                                       # bytes freed (files no kept folder links to)


def _newest_change(folder: Path) -> float:
    """The latest modification or status change of ``folder`` or anything under it (epoch seconds)."""
    newest = 0.0
    for d, dirs, files in os.walk(folder):
        for name in [""] + dirs + files:
            try:
                st = os.lstat(os.path.join(d, name) if name else d)
            except FileNotFoundError:
                continue
            newest = max(newest, st.st_mtime, st.st_ctime)
    return newest


def _files(folder: Path) -> list[Path]:
    return [Path(d) / f for d, _, files in os.walk(folder) for f in files]


def _freed_bytes(files: list[Path]) -> int:
    """Bytes deleting ``files`` frees: a file hard-linked from a kept build frees nothing."""
    links: dict[tuple[int, int], list] = {}
    for p in files:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        entry = links.setdefault((st.st_dev, st.st_ino), [0, st.st_nlink, st.st_size])
        entry[0] += 1
    return sum(size for seen, nlink, size in links.values() if seen >= nlink)


def folder_bytes(folder: str | Path) -> int:
    """Bytes the files under ``folder`` take on disk, each hard-linked file once (a build's real footprint)."""
    seen: dict[tuple[int, int], int] = {}
    for p in _files(Path(folder)):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        seen[(st.st_dev, st.st_ino)] = st.st_size
    return sum(seen.values())


def plan_builds(root: Path, meta: Any, cutoff: float) -> BuildPlan:
    """The folders under store root ``root`` that no retained snapshot of ``meta`` needs, changed before ``cutoff``.

    ``meta`` is the table's current Iceberg metadata (every branch and tag's
    retained snapshots); ``cutoff`` epoch seconds (now minus the grace period).
    """
    plan = BuildPlan(root)
    if not root.is_dir():
        return plan
    builds = list_builds(root)
    uuid = str(getattr(meta, "table_uuid", "") or "")
    mine = [b for b in builds if not b.table_uuid or not uuid or b.table_uuid == uuid]
    plan.foreign = sorted(b.build_id for b in builds if b not in mine)
    live = {b.build_id for b in live_builds(meta, mine)}
    dead: dict[str, BuildInfo] = {b.build_id: b for b in mine if b.build_id not in live}
    for d in sorted(root.iterdir()):
        if not d.is_dir():
            continue
        name = d.name
        if name.startswith(GC_PREFIX):
            plan.doomed.append(d)  # a deletion cut short: nothing reads it
        elif name.startswith(TMP_PREFIX):
            if _newest_change(d) <= cutoff:
                plan.doomed.append(d)  # an unfinished build abandoned longer than the grace period
        elif name in dead:
            if _newest_change(d) <= cutoff:
                plan.doomed.append(d)
                plan.build_ids.append(name)
            else:
                plan.young.append(name)
        # any other folder (live, foreign, or without a readable record) is kept
    files = [f for d in plan.doomed for f in _files(d)]
    plan.files = [str(f) for f in files]
    plan.bytes = _freed_bytes(files)
    return plan


def remove_builds(plan: BuildPlan) -> None:
    """Delete the folders of ``plan``: each renamed out of sight first, then removed."""
    from featurelake.sequences.store import READERS

    for d in plan.doomed:
        target = d
        if not d.name.startswith(GC_PREFIX):
            target = d.with_name(GC_PREFIX + d.name.lstrip("."))
            try:
                os.replace(d, target)  # readers and builders stop seeing it here, at once
            except FileNotFoundError:
                continue  # another collector got there first
            READERS.drop(str(d / "db"))
        shutil.rmtree(target, ignore_errors=True)


def collect_builds(root: Path, meta: Any, cutoff: float, dry_run: bool = False) -> BuildPlan:
    """Plan (and unless ``dry_run``, carry out) the collection of one store root; see :func:`plan_builds`."""
    plan = plan_builds(root, meta, cutoff)
    if not dry_run:
        remove_builds(plan)
    return plan


def orphan_roots(stores: Path, tables: set[str]) -> list[Path]:
    """Store roots under ``stores`` (``<cache>/sequences``) of tables no longer in the catalog."""
    if not stores.is_dir():
        return []
    return [d for d in sorted(stores.iterdir()) if d.is_dir() and not d.name.startswith(".") and d.name not in tables]


def plan_orphan_root(root: Path, cutoff: float) -> BuildPlan:
    """Every folder of a dropped table's store root, once all of it is older than the grace period."""
    plan = BuildPlan(root)
    if _newest_change(root) > cutoff:
        plan.young = [d.name for d in root.iterdir() if d.is_dir()]
        return plan
    plan.doomed = [d for d in sorted(root.iterdir()) if d.is_dir()]
    plan.build_ids = [b.build_id for b in list_builds(root)]
    files = [f for d in plan.doomed for f in _files(d)]
    plan.files = [str(f) for f in files]
    plan.bytes = _freed_bytes(files)
    return plan
