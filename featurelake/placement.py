"""Column placement for models: record which columns training reads project, and order files by it.

Why: a wide sample table is read by many models, each projecting a few dozen
of its columns. Parquet stores column chunks in file order, so a projection
scattered over the file costs one I/O per chunk; placed side by side, its
chunks coalesce into a few large reads (Meta's column reordering). The
platform records projections cheaply and ``compact(placement=True)`` writes
files whose column order follows them. Field ids, not positions, identify
columns, so every reader sees the same data whatever the order.

Recording is snapshot-independent platform metadata: counts are kept in
memory and written at most every ``FLUSH_SECONDS`` (and at exit) as a small
new Parquet file under ``data/_featurelake/projections/`` -- never one file
or commit per read. Recording is optional (``FEATURELAKE_RECORD_PROJECTIONS=0``)
and failure-safe: an error is logged and the read goes on.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import uuid
from collections import Counter
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from featurelake.storage import platform_dir, storage_of

log = logging.getLogger(__name__)

FLUSH_SECONDS = 300.0
PROJECTIONS_DIR = "projections"
_SEP = "\x1f"
_lock = threading.Lock()
_pending: dict[str, tuple[Any, Counter]] = {}  # table location -> (FileIO, projection counts)
_last_flush: dict[str, float] = {}


def enabled() -> bool:
    return os.environ.get("FEATURELAKE_RECORD_PROJECTIONS", "1").lower() not in ("0", "false", "no", "off")


def projections_dir(location: str) -> str:
    return f"{platform_dir(location)}/{PROJECTIONS_DIR}"


def record(ice: Any, columns: Sequence[str] | None) -> None:
    """Count one read of ``columns`` (None: all columns, not recorded) on the table ``ice``."""
    if columns is None or not enabled():
        return
    try:
        location = ice.location()
        with _lock:
            _, counts = _pending.setdefault(location, (ice.io, Counter()))
            counts[tuple(columns)] += 1
            due = time.monotonic() - _last_flush.setdefault(location, time.monotonic()) >= FLUSH_SECONDS
        if due:
            flush(location)
    except Exception as e:  # noqa: BLE001 - recording must never fail a read
        log.debug("projection not recorded: %s", e)


def flush(location: str | None = None) -> int:
    """Write pending counts (of one table, or all) as new small files; returns files written."""
    with _lock:
        targets = [location] if location is not None else list(_pending)
        work = [(loc, _pending.pop(loc)) for loc in targets if loc in _pending]
        for loc, _ in work:
            _last_flush[loc] = time.monotonic()
    written = 0
    for loc, (io, counts) in work:
        if not counts:
            continue
        try:
            table = pa.table({"columns": [_SEP.join(k) for k in counts], "reads": pa.array(list(counts.values()), pa.int64())})
            path = f"{projections_dir(loc)}/projections-{time.strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:12]}.parquet"
            with storage_of(io).write_new(path) as out:
                pq.write_table(table, out)
            written += 1
        except Exception as e:  # noqa: BLE001 - failure-safe: the counts are dropped, reads go on
            log.warning("could not write projection counts for %s: %s", loc, e)
    return written


def recorded(ice: Any) -> Counter:
    """Every recorded projection of the table (written files plus this process's pending counts)."""
    location = ice.location()
    storage = storage_of(ice.io)
    total: Counter = Counter()
    for f in storage.list(projections_dir(location)):
        if not f.uri.endswith(".parquet"):
            continue
        try:
            t = pq.read_table(storage.open(f.uri))
        except Exception as e:  # noqa: BLE001 - a damaged log only loses its counts
            log.warning("skipping unreadable projection log %s: %s", f.uri, e)
            continue
        for cols, n in zip(t.column("columns").to_pylist(), t.column("reads").to_pylist()):
            total[tuple(cols.split(_SEP))] += n
    with _lock:
        pending = _pending.get(location)
        if pending is not None:
            total.update(pending[1])
    return total


def column_order(names: Sequence[str], projections: Counter, top: int = 16) -> list[str]:
    """``names`` reordered: the columns of the most frequent projections first, each projection contiguous.

    The ``top`` most read projections are placed in order of reads; a column
    already placed by a more frequent one stays there. Other columns follow
    in their schema order.
    """
    known = set(names)
    order: list[str] = []
    placed: set[str] = set()
    for cols, _ in sorted(projections.items(), key=lambda kv: (-kv[1], kv[0]))[:top]:
        for c in cols:
            if c in known and c not in placed:
                order.append(c)
                placed.add(c)
    return order + [c for c in names if c not in placed]


atexit.register(flush)
