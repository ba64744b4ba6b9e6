"""Requests per operation on an object store (SeaweedFS S3 + Iceberg REST), wall time against plain pyiceberg there, and index size.

One SeaweedFS ``weed mini`` (tests/seaweed.py) serves S3 and the REST catalog on
127.0.0.1. S3 requests are SeaweedFS's own counters (``SeaweedFS_s3_request_total``:
GET, ranged GET, PUT, POST, LIST, DELETE; HEADs are filed as GET); catalog calls
are counted on the catalog object (one REST request each).

* Requests per operation against its *floor*: the data files (and update files)
  the operation must read or write, plus one commit; an upsert or backfill also
  writes its platform state root and manifest list (two PUTs: with a commit's
  small update layers packed into one shared update file, these fixed costs are
  most of a backfill's requests). Goal: within 2x of the
  floor, and upsert requests flat with table size.
  Upserting 10k random keys touches every data file, so the floor itself grows
  with the number of files; what must stay flat is the cost above the floor.
  Counted twice: in one process running the operations in sequence (as a
  pipeline does), and "cold", every in-process cache cleared before each
  operation (as a fresh process per operation would run it). A cold floor
  adds the metadata a fresh process must read first, counted from the
  table's metadata before the operation: one catalog load, the current
  manifest list and manifests, the platform state root and, for writes
  checked against the key, the index segments (``_fresh_reads``); for
  garbage collection, that of every table's retained snapshots
  (``_lake_metadata_reads``).
* Wall time on SeaweedFS against plain pyiceberg doing the same job: append,
  a 5-column scan, a one-column backfill (pyiceberg: copy-on-write overwrite
  of the table) and an upsert of 10k keys (pyiceberg ``Table.upsert``). The
  backfill is also timed on a 100-column table (``wide``), the shape of a
  feature table, where copy-on-write rewrites 100 columns to change one.
* Index bytes as a share of data bytes for 10- and 100-column tables.

Table: the upsert benchmark's narrow 8-column table (``sample_id``, ``ts``
partitioned by day, ``user_id``, four float features, ``label``). Sizes: 1M and
10M rows; --quick: ``--rows`` and 4x that.
"""
from __future__ import annotations

import shutil
import sys
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from benchmarks.common import (
    Config,
    Timing,
    build_wide_table,
    fmt_s,
    goal,
    paired_ratio,
    print_goals,
    ratio,
    wide_chunks,
    work_dir,
    write_result,
)
from benchmarks.upsert import SCHEMA, chunks, upsert_batch

NAME = "requests"
DEFAULT_REPEAT = 1
READ_COLUMNS = ["sample_id", "user_id", "f0", "f1", "label"]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


_COLD = False  # forget every in-process cache before each counted operation (a fresh process per operation)


def _forget() -> None:
    from featurelake import index, manifest_cache, merge, state

    index.clear_caches()
    manifest_cache.clear()
    state.clear_caches()
    merge._FILES_CACHE.clear()


def _counted(server, catalog, fn: Callable[[], Any]) -> tuple[dict[str, int], float, Any]:
    from seaweed import counting_catalog_calls

    if _COLD:
        _forget()
    with server.counting() as s3, counting_catalog_calls(catalog) as calls:
        t0 = time.perf_counter()  # the counters' settling waits (>= 0.2 s each side) are not the operation's time
        result = fn()
        seconds = time.perf_counter() - t0
    out = {k: v for k, v in s3.items() if k != "total"}
    out["catalog"] = sum(calls.values())
    out["total"] = s3["total"] + out["catalog"]
    return out, seconds, result


def _fresh_reads(ice, keyed: bool = True) -> int:
    """What a fresh process must read before it can act on this table (0 unless counting cold).

    One catalog load, the current snapshot's manifest list and manifests, its platform state
    root and, for a write checked against the primary key, the key index segments: metadata a
    warm process holds (and that the warm floor leaves out), counted from the table's own
    metadata, not from what featurelake requested.
    """
    if not _COLD:
        return 0
    from featurelake.state import STATE_KEY, state_of

    snap = ice.metadata.current_snapshot()
    if snap is None:
        return 1
    state_root = 1 if snap.summary is not None and snap.summary.get(STATE_KEY) else 0
    segments = len(state_of(ice.metadata, ice.io, snap).index_segments) if keyed and state_root else 0
    return 1 + 1 + len(snap.manifests(ice.io)) + state_root + segments


def _lake_metadata_reads(catalog) -> int:
    """What garbage collection in a fresh process must read to prove which files are referenced
    (0 unless counting cold): per table one load, and the distinct manifest lists, manifests and
    platform state roots of its retained snapshots."""
    if not _COLD:
        return 0
    from featurelake.state import STATE_KEY

    total = 0
    for ns in catalog.list_namespaces():
        for ident in catalog.list_tables(ns):
            ice = catalog.load_table(ident)
            snaps = ice.metadata.snapshots
            manifests = {m.manifest_path for s in snaps for m in s.manifests(ice.io)}
            roots = {s.summary.get(STATE_KEY) for s in snaps if s.summary is not None and s.summary.get(STATE_KEY)}
            total += 1 + len({s.manifest_list for s in snaps}) + len(manifests) + len(roots)
    return total


def _entry(name: str, counts: dict[str, int], floor: int, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"operation": name, "requests": counts, "floor": floor, "x_floor": ratio(counts["total"], floor), "seconds": round(seconds, 3), **extra}


def _files(t) -> int:
    return t.stats()["data_files"]


def _featurelake_ops(server, lake, rows: int, keys: int, seed: int, with_all: bool, name: str = "r") -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Requests of each operation on a fresh ``rows``-row table; the last ones only when ``with_all``."""
    ops, times = [], {}
    t = lake.create_table(f"bench.{name}{rows}", SCHEMA, primary_key="sample_id", partition_by=["day(ts)"])
    parts = list(chunks(rows, seed))
    for i, part in enumerate(parts):
        fresh = _fresh_reads(t.iceberg) if i == 0 else 0
        counts, seconds, _ = _counted(server, lake.catalog, lambda: t.append(part))
        if i == 0:
            added = _files(t)
            times["append"] = seconds
            ops.append(_entry("append", counts, added + 1 + fresh, seconds, rows=part.num_rows, data_files_written=added))
    files = _files(t)
    batch = upsert_batch(rows, 0, seed, keys=keys)
    fresh = _fresh_reads(t.iceberg)
    counts, seconds, _ = _counted(server, lake.catalog, lambda: t.upsert(batch))
    report = t.last_update_report
    new_files = _files(t) - files
    times["upsert"] = seconds
    ops.append(_entry("upsert", counts, report.update_files + new_files + 3 + fresh, seconds, keys=keys, table_rows=rows,
                      update_files=report.update_files, data_files_written=new_files))
    if not with_all:
        return ops, times
    ids = t.read(columns=["sample_id"])
    values = pa.table({"sample_id": ids["sample_id"], "f1": pc.multiply(pc.cast(ids["sample_id"], pa.float32()), pa.scalar(0.5, pa.float32()))})
    fresh = _fresh_reads(t.iceberg)
    counts, seconds, _ = _counted(server, lake.catalog, lambda: t.backfill(values))
    report = t.last_update_report
    times["backfill"] = seconds
    ops.append(_entry("backfill one column", counts, report.update_files + 3 + fresh, seconds, rows=values.num_rows,
                      update_files=report.update_files))
    stats = t.stats()
    fresh = _fresh_reads(t.iceberg, keyed=False)
    counts, seconds, got = _counted(server, lake.catalog, lambda: t.read(columns=READ_COLUMNS))
    times["read"] = seconds
    ops.append(_entry("read 5 columns", counts, stats["data_files"] + stats["update_files"] + 1 + fresh, seconds, rows=got.num_rows))
    fresh = _fresh_reads(t.iceberg)
    counts, seconds, rep = _counted(server, lake.catalog, lambda: t.compact())
    after = t.stats()
    touched = stats["data_files"] + stats["update_files"] + after["data_files"]
    ops.append(_entry("compact", counts, touched + 1 + fresh, seconds, files_read=stats["data_files"] + stats["update_files"], files_written=after["data_files"]))
    t.expire_snapshots(datetime.now() + timedelta(seconds=1), retain_last=1)
    fresh = _lake_metadata_reads(lake.catalog)
    counts, seconds, gc = _counted(server, lake.catalog, lambda: lake.collect_garbage(older_than=timedelta(0)))
    deleted = len(gc.files)
    ops.append(_entry("gc", counts, deleted + 1 + fresh, seconds, files_deleted=deleted))
    return ops, times


def _pyiceberg_times(lake, rows: int, keys: int, seed: int) -> dict[str, float]:
    """The same jobs with plain pyiceberg on the same catalog and store."""
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform

    times: dict[str, float] = {}
    catalog = lake.catalog
    schema = SCHEMA
    from pyiceberg.io.pyarrow import pyarrow_to_schema
    from pyiceberg.schema import Schema
    from pyiceberg.table.name_mapping import MappedField, NameMapping

    mapping = NameMapping([MappedField(field_id=i + 1, names=[f.name]) for i, f in enumerate(schema)])
    ice_schema: Schema = pyarrow_to_schema(schema, name_mapping=mapping)
    spec = PartitionSpec(PartitionField(source_id=ice_schema.find_field("ts").field_id, field_id=1000, transform=DayTransform(), name="ts_day"))
    tbl = catalog.create_table(f"bench.plain{rows}", schema=ice_schema, partition_spec=spec)
    for i, part in enumerate(chunks(rows, seed)):
        t0 = time.perf_counter()
        tbl.append(part)
        if i == 0:
            times["append"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    got = tbl.scan(selected_fields=tuple(READ_COLUMNS)).to_arrow()
    times["read"] = time.perf_counter() - t0
    assert got.num_rows == rows
    t0 = time.perf_counter()  # copy-on-write backfill: read everything, set the column, overwrite
    full = tbl.scan().to_arrow()
    i = full.column_names.index("f1")
    full = full.set_column(i, full.schema.field(i), pc.multiply(pc.cast(full["sample_id"], pa.float32()), pa.scalar(0.5, pa.float32())))
    tbl.overwrite(full)
    times["backfill"] = time.perf_counter() - t0
    batch = upsert_batch(rows, 0, seed, keys=keys)
    t0 = time.perf_counter()
    target = tbl.schema().as_arrow()  # pyiceberg's upsert wants whole rows: absent columns are null
    full = pa.Table.from_arrays(
        [batch[f.name].cast(f.type) if f.name in batch.column_names else pa.nulls(batch.num_rows, f.type) for f in target],
        schema=target,
    )
    tbl.upsert(full, join_cols=["sample_id"])
    times["upsert"] = time.perf_counter() - t0
    return times


def _wide_backfill(lake, rows: int, columns: int, seed: int, repeat: int = 3) -> dict[str, Any]:
    """One column backfilled into a ``columns``-wide table: featurelake against pyiceberg's copy-on-write.

    Both tables hold the same rows on the same store; the runs alternate and
    the medians are compared (each featurelake run stacks one more update file).
    """
    from pyiceberg.io.pyarrow import pyarrow_to_schema
    from pyiceberg.table.name_mapping import MappedField, NameMapping

    sub = Config(rows=rows, columns=columns, files=4, seed=seed)
    t = build_wide_table(lake, f"bench.wide{columns}", sub)
    schema = t.schema
    mapping = NameMapping([MappedField(field_id=i + 1, names=[f.name]) for i, f in enumerate(schema)])
    tbl = lake.catalog.create_table(f"bench.plainwide{columns}", schema=pyarrow_to_schema(schema, name_mapping=mapping))
    for chunk in wide_chunks(rows, columns, 4, seed):
        tbl.append(chunk)
    column = schema.names[1]
    ids = t.read(columns=["sample_id"])["sample_id"]
    fl, pi = [], []
    for rep in range(repeat):
        values = pa.table({"sample_id": ids, column: pa.array(np.full(len(ids), float(rep), np.float32))})
        t0 = time.perf_counter()
        t.backfill(values)
        fl.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        full = tbl.scan().to_arrow()
        i = full.column_names.index(column)
        full = full.set_column(i, full.schema.field(i), pa.array(np.full(full.num_rows, float(rep), np.float32)))
        tbl.overwrite(full)
        pi.append(time.perf_counter() - t0)
    got = t.read(columns=[column])[column]
    assert pc.all(pc.equal(got, float(repeat - 1))).as_py()
    fl_s, pi_s = float(np.median(fl)), float(np.median(pi))
    return {"rows": rows, "columns": columns, "featurelake_s": round(fl_s, 3), "pyiceberg_s": round(pi_s, 3),
            "speedup": ratio(pi_s, fl_s), "runs": {"featurelake": [round(x, 3) for x in fl], "pyiceberg": [round(x, 3) for x in pi]}}


def _interleaved(lake, rows: int, repeat: int, backfill_pairs: int) -> dict[str, dict[str, list[float]]]:
    """The read and the one-column backfill again, featurelake and pyiceberg in alternating pairs.

    Single runs on a shared 2-core machine swing by 2x; each pair runs both
    sides back to back, so load that drifts hits both alike, and the sides
    take turns going first (ABBA), so neither always runs right after the
    other's allocations. ``repeat`` read pairs and ``backfill_pairs`` backfill
    pairs (each pyiceberg run rewrites the table); the first featurelake
    backfill follows the cold-process sequence, which cleared every in-process cache.
    """
    t = lake.table(f"bench.r{rows}")
    tbl = lake.catalog.load_table(f"bench.plain{rows}")
    ids = t.read(columns=["sample_id"])["sample_id"]
    runs: dict[str, dict[str, list[float]]] = {"read": {"featurelake": [], "pyiceberg": []},
                                              "backfill": {"featurelake": [], "pyiceberg": []}}

    def featurelake_read() -> None:
        t.read(columns=READ_COLUMNS)

    def pyiceberg_read() -> None:
        tbl.scan(selected_fields=tuple(READ_COLUMNS)).to_arrow()

    for rep in range(repeat):
        _pair(runs["read"], rep, featurelake_read, pyiceberg_read)
    for rep in range(backfill_pairs):
        value = pa.array(np.full(len(ids), float(rep), np.float32))

        def featurelake_backfill() -> None:
            t.backfill(pa.table({"sample_id": ids, "f1": value}))

        def pyiceberg_backfill() -> None:  # copy-on-write: read everything, set the column, overwrite
            full = tbl.scan().to_arrow()
            i = full.column_names.index("f1")
            tbl.overwrite(full.set_column(i, full.schema.field(i), pa.array(np.full(full.num_rows, float(rep), np.float32))))

        _pair(runs["backfill"], rep, featurelake_backfill, pyiceberg_backfill)
    got = t.read(columns=["f1"])["f1"]
    assert pc.all(pc.equal(got, float(backfill_pairs - 1))).as_py()
    return runs


def _pair(sides: dict[str, list[float]], rep: int, featurelake: Callable[[], None], pyiceberg: Callable[[], None]) -> None:
    """Time one featurelake run and one pyiceberg run back to back; odd pairs run pyiceberg first."""
    order = [("featurelake", featurelake), ("pyiceberg", pyiceberg)]
    for side, fn in order if rep % 2 == 0 else order[::-1]:
        t0 = time.perf_counter()
        fn()
        sides[side].append(time.perf_counter() - t0)


def _paired_speedup(sides: dict[str, list[float]]) -> float | None:
    """Median over pairs of pyiceberg / featurelake (the load of each pair cancels out)."""
    return paired_ratio(Timing(sides["pyiceberg"]), Timing(sides["featurelake"]))


def _index_share(root: Path, cfg: Config, columns: int, rows: int) -> dict[str, Any]:
    from featurelake import Lake
    from featurelake.storage import table_storage

    lake = Lake(root / f"local{columns}")
    sub = Config(rows=rows, columns=columns, files=max(1, rows // 250_000), seed=cfg.seed)
    t = build_wide_table(lake, f"bench.w{columns}", sub)
    ice = t.refresh()
    segments = t._state(ice, ice.current_snapshot()).index_segments
    index_bytes = sum(table_storage(ice).size(s["path"]) for s in segments)
    data_bytes = t.stats()["data_bytes"]
    return {"columns": columns, "rows": rows, "index_bytes": index_bytes, "data_bytes": data_bytes, "share": round(index_bytes / data_bytes, 5)}


def run(cfg: Config) -> dict[str, Any]:
    from featurelake import Lake
    from seaweed import SeaweedServer

    cfg = cfg.started()
    sizes = [cfg.rows, 4 * cfg.rows] if cfg.quick else [1_000_000, 10_000_000]
    keys = min(10_000, max(10, sizes[0] // 20))
    with work_dir(NAME, cfg.keep) as root:
        server = SeaweedServer(root / "seaweed").start()
        try:
            lake = Lake.from_uri(server.catalog_uri, server.warehouse, **server.catalog_properties())
            lake.catalog.create_namespace("bench")
            per_size, fl_times = {}, {}
            for n, rows in enumerate(sizes):
                ops, times = _featurelake_ops(server, lake, rows, keys, cfg.seed, with_all=(n == 0))
                per_size[rows] = ops
                if n == 0:
                    fl_times = times
                for op in ops:
                    print(f"  {rows:>11,} rows  {op['operation']:<20} {op['requests']['total']:>5} requests (floor {op['floor']}, {op['x_floor']}x)  {fmt_s(op['seconds'])}")
            pi_times = _pyiceberg_times(lake, sizes[0], keys, cfg.seed)
            print(f"  wall time at {sizes[0]:,} rows, featurelake vs pyiceberg: "
                  + ", ".join(f"{k} {fmt_s(fl_times[k])} vs {fmt_s(pi_times[k])}" for k in pi_times))
            global _COLD
            _COLD = True  # the same sequence, each operation as a fresh process would run it
            try:
                cold, _ = _featurelake_ops(server, lake, sizes[0], keys, cfg.seed, with_all=True, name="cold")
            finally:
                _COLD = False
            for op in cold:
                print(f"  {sizes[0]:>11,} rows  {op['operation']:<20} {op['requests']['total']:>5} requests cold (floor {op['floor']}, {op['x_floor']}x)")
            fl_times["read_with_update_files_one_run"] = fl_times["read"]  # before compaction: 21 update files merged
            fl_times["backfill_one_run"] = fl_times["backfill"]
            runs = _interleaved(lake, sizes[0], repeat=2 if cfg.quick else 6, backfill_pairs=2 if cfg.quick else 9)
            for op, sides in runs.items():
                fl_times[op], pi_times[op] = float(np.median(sides["featurelake"])), float(np.median(sides["pyiceberg"]))
            paired = {op: _paired_speedup(sides) for op, sides in runs.items()}
            print("  interleaved medians: " + ", ".join(f"{op} {fmt_s(fl_times[op])} vs {fmt_s(pi_times[op])} "
                                                       f"(paired {paired[op]}x)" for op in runs))
            wide = _wide_backfill(lake, min(sizes[0], 200_000), 100, cfg.seed)
            print(f"  backfill of one column, {wide['rows']:,} rows x {wide['columns']} columns: "
                  f"featurelake {fmt_s(wide['featurelake_s'])} vs pyiceberg copy-on-write {fmt_s(wide['pyiceberg_s'])} ({wide['speedup']}x)")
        finally:
            server.stop()
            shutil.rmtree(root / "seaweed", ignore_errors=True)
        shares = [_index_share(root, cfg, 10, min(sizes[0], 1_000_000)), _index_share(root, cfg, 100, min(sizes[0], 200_000))]
    for s in shares:
        print(f"  index / data bytes, {s['columns']} columns: {s['share']:.2%}")
    first = per_size[sizes[0]]
    upsert_ops = {rows: next(o for o in ops if o["operation"] == "upsert") for rows, ops in per_size.items()}
    upserts = {rows: o["requests"]["total"] for rows, o in upsert_ops.items()}
    above = {rows: o["requests"]["total"] - o["floor"] for rows, o in upsert_ops.items()}
    speed = {k: ratio(pi_times[k], fl_times[k]) for k in pi_times}
    speed_of_medians = {k: speed[k] for k in paired}
    speed.update(paired)  # read and backfill: the median of the pairs' ratios (each pair under one load)
    goals = [goal(f"{o['operation']} requests vs floor at {sizes[0]:,} rows", o["x_floor"], 2.0, higher_is_better=False) for o in first]
    goals += [goal(f"{o['operation']} requests vs floor at {sizes[0]:,} rows, cold process", o["x_floor"], 2.0, higher_is_better=False) for o in cold]
    goals += [goal(f"upsert requests vs floor at {sizes[1]:,} rows", upsert_ops[sizes[1]]["x_floor"], 2.0, higher_is_better=False)]
    goals += [
        goal(f"upsert requests above the floor, {sizes[1]:,} vs {sizes[0]:,} rows", ratio(max(above[sizes[1]], 0), max(above[sizes[0]], 1)), 1.0, higher_is_better=False),
        goal("read at least as fast as pyiceberg", speed["read"], 1.0),
        goal("backfill faster than pyiceberg copy-on-write", speed["backfill"], 10.0),
        goal(f"backfill faster than pyiceberg copy-on-write, {wide['columns']}-column table", wide["speedup"], 10.0),
        goal("upsert faster than pyiceberg upsert", speed["upsert"], 10.0),
        goal("index share of data bytes, 10 columns", shares[0]["share"], 0.10, higher_is_better=False, unit=""),
        goal("index share of data bytes, 100 columns", shares[1]["share"], 0.02, higher_is_better=False, unit=""),
    ]
    print_goals(goals)
    result = {
        "description": __doc__.splitlines()[0],
        "sizes": sizes,
        "upsert_keys": keys,
        "requests": {str(rows): ops for rows, ops in per_size.items()},
        "requests_cold_process": {"rows": sizes[0], "note": "every in-process cache cleared before each operation", "operations": cold},
        "wall_time_s": {"rows": sizes[0], "featurelake": {k: round(v, 3) for k, v in fl_times.items()}, "pyiceberg": {k: round(v, 3) for k, v in pi_times.items()},
                        "note": "read and backfill: medians of alternating runs (interleaved_runs_s); append and upsert: one run each"},
        "interleaved_runs_s": {op: {side: [round(x, 3) for x in xs] for side, xs in sides.items()} for op, sides in runs.items()},
        "speedup_vs_pyiceberg": speed,
        "speedup_note": "read and backfill: median over alternating pairs of pyiceberg/featurelake (interleaved_runs_s); "
                        "append and upsert: one run each",
        "speedup_ratio_of_medians": speed_of_medians,
        "upsert_requests_by_size": {str(r): {"total": upserts[r], "floor": upsert_ops[r]["floor"], "above_floor": above[r]} for r in sizes},
        "wide_backfill": wide,
        "index_share": shares,
        "goals": goals,
    }
    write_result(NAME, cfg, result)
    return result
