"""Maintenance: compaction throughput vs a plain pyarrow rewrite, and slim metadata.

(a) Compaction throughput. One table of ``COMPACT_FILES`` small data files
(``sample_id`` + features, random values, ~``COMPACT_MB`` MB in all, one
partition), written by a single featurelake ``append`` with a tiny
``write.target-file-size-bytes`` (one commit, many files). Each repetition
compacts a fresh zero-copy branch of that snapshot with ``t.compact(branch=...,
target_file_bytes=128 MiB)``: every file is small, so all are read and
bin-packed into ~128 MiB files in one commit. Throughput is input MB per second.

The *floor* is the least any engine must do for the same rewrite: for the same
files, grouped into the same 128 MiB bins, ``pyarrow.parquet.read_table`` each
file, ``concat_tables`` and ``pyarrow.parquet.write_table`` (zstd, as the
tables use) — no Iceberg metadata, no statistics, no commit. Featurelake and the
floor alternate within each repetition; ratios use best times.

(b) Metadata slimming. A ``SLIM_COLUMNS``-column table (``sample_id`` +
features) with ``SLIM_FILES`` data files of ``SLIM_ROWS`` rows, created twice
with ``lake.create_table``: once with featurelake's defaults (slim metrics:
bounds and counts only for the key and partition columns) and once with
``write.metadata.metrics.default=truncate(16)`` (pyiceberg's default: bounds,
value and null counts for every column) on an otherwise identical table. The
same Parquet files are registered in both (hard-linked into each table's data
folder; the DataFile statistics are computed by pyiceberg's own
``data_file_statistics_from_parquet_metadata`` with the table's properties,
exactly what its writer and ``parquet_file_to_data_file`` do) in one commit
per table: one commit per file would give the same manifests after merging and
take many minutes with 2,000 columns. Measured: total manifest bytes of the current
snapshot (``inspect.manifests()`` lengths), and scan planning time
(``scan().plan_files()``, best of ``repeat``, on a freshly loaded table) with
no filter and with a filter on the key.

pyiceberg keeps ``column_sizes`` for every column even with metrics mode
``none``, so a slim manifest written by plain pyiceberg still carries one map
entry per column per file. featurelake's writer (``rewrite.write_data_files``)
also drops sizes and counts for columns without metrics: the third table,
``slim_no_column_sizes``, is what featurelake writes.
"""
from __future__ import annotations

import os
import shutil
import time
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import (
    KEY,
    Config,
    Timing,
    fmt_bytes,
    fmt_s,
    goal,
    local_path,
    print_goals,
    profile_call,
    ratio,
    timed,
    wide_schema,
    work_dir,
    write_result,
)

NAME = "maintenance"
MB = 1_000_000
MIB = 1024 * 1024

COMPACT_FILES, COMPACT_MB, COMPACT_COLUMNS = 200, 500, 100
QUICK_COMPACT_FILES, QUICK_COMPACT_MB = 20, 20
TARGET_FILE_BYTES = 128 * MIB

SLIM_COLUMNS, SLIM_FILES, SLIM_ROWS = 2000, 500, 20
QUICK_SLIM_COLUMNS, QUICK_SLIM_FILES = 200, 40

GOAL_SLIM = 10.0


# ---------------------------------------------------------------- data
def _features(rng: np.random.Generator, schema: pa.Schema, lo: int, hi: int) -> pa.Table:
    n = hi - lo
    arrays = [pa.array(np.arange(lo, hi, dtype=np.int64))]
    for f in schema.names[1:]:
        dtype = np.float64 if schema.field(f).type == pa.float64() else np.float32
        arrays.append(pa.array(rng.standard_normal(n, dtype=dtype)))
    return pa.Table.from_arrays(arrays, schema=schema)


def _bytes_per_row(schema: pa.Schema) -> int:
    return sum(t.byte_width for t in schema.types)


# ---------------------------------------------------------------- (a) compaction
def _bins(paths_sizes: list[tuple[str, int]], target: int) -> list[list[str]]:
    """The same greedy bin-packing compaction uses (``featurelake.maintenance._bins``)."""
    bins, current, size = [], [], 0
    for path, n in paths_sizes:
        if current and size + n > target:
            bins.append(current)
            current, size = [], 0
        current.append(path)
        size += n
    if current:
        bins.append(current)
    return bins


def _floor_rewrite(bins: list[list[str]], out_dir: str) -> tuple[int, int]:
    """Plain pyarrow: read every file of a bin, concatenate, write one zstd file per bin."""
    written = rows = 0
    for i, bin_ in enumerate(bins):
        tbl = pa.concat_tables([pq.read_table(p) for p in bin_])
        path = os.path.join(out_dir, f"floor-{i:03d}.parquet")
        pq.write_table(tbl, path, compression="zstd")
        written += os.path.getsize(path)
        rows += tbl.num_rows
    return written, rows


def bench_compaction(lake, cfg: Config, root) -> dict[str, Any]:
    files = QUICK_COMPACT_FILES if cfg.quick else COMPACT_FILES
    total_mb = QUICK_COMPACT_MB if cfg.quick else COMPACT_MB
    schema = wide_schema(COMPACT_COLUMNS)
    rows = int(total_mb * MB / _bytes_per_row(schema))
    per_file_bytes = total_mb * MB // files
    print(f"(a) compaction: {files} small files, ~{total_mb} MB ({rows:,} rows x {COMPACT_COLUMNS} columns)")

    t = lake.create_table(
        "bench.compaction",
        schema,
        primary_key=KEY,
        properties={"write.target-file-size-bytes": str(per_file_bytes)},
    )
    rng = np.random.default_rng(cfg.seed)
    t0 = time.perf_counter()
    t.append(_features(rng, schema, 0, rows))
    setup_s = time.perf_counter() - t0
    # back to the default target size: the compaction writer splits its output by this property
    with t.iceberg.transaction() as tx:
        tx.remove_properties("write.target-file-size-bytes")
    ice = t.iceberg
    base = ice.current_snapshot().snapshot_id
    tasks = list(ice.scan().plan_files())
    paths_sizes = [(local_path(x.file.file_path), x.file.file_size_in_bytes) for x in tasks]
    bytes_in = sum(s for _, s in paths_sizes)
    print(f"  table: {len(tasks)} data files, {fmt_bytes(bytes_in)}, written in {fmt_s(setup_s)}")
    if len(tasks) < 2:
        raise RuntimeError("the compaction table was written as one file: nothing to compact")
    bins = _bins(paths_sizes, TARGET_FILE_BYTES)

    fl, floor = Timing(), Timing()
    reports: list[dict] = []
    floor_out = floor_rows = 0
    out_dir = os.path.join(str(root), "floor")
    for rep in range(cfg.repeat):
        shutil.rmtree(out_dir, ignore_errors=True)
        os.makedirs(out_dir)
        dt, (floor_out, floor_rows) = timed(lambda: _floor_rewrite(bins, out_dir), floor)
        print(f"  rep {rep}: floor (pyarrow read+concat+write) {fmt_s(dt):>9}  {bytes_in / MB / dt:7.1f} MB/s")
        branch = f"compact-{rep}"
        t.create_branch(branch, from_ref=base)
        dt, report = timed(lambda: t.compact(branch=branch, target_file_bytes=TARGET_FILE_BYTES), fl)
        reports.append(report.as_dict())
        print(
            f"  rep {rep}: featurelake t.compact()          {fmt_s(dt):>9}  {report.bytes_in / MB / dt:7.1f} MB/s"
            f"  ({report.files_in} -> {report.files_out} files)"
        )
    shutil.rmtree(out_dir, ignore_errors=True)
    last = reports[-1]
    if last["files_in"] != len(tasks) or last["rows"] != rows:
        raise RuntimeError(f"compaction rewrote {last['files_in']} files / {last['rows']} rows, expected {len(tasks)} / {rows}")
    check = t.read(columns=[KEY], branch=f"compact-{cfg.repeat - 1}")
    if check.num_rows != rows:
        raise RuntimeError(f"compacted branch holds {check.num_rows} rows, expected {rows}")

    profile = None
    if cfg.profile:
        t.create_branch("compact-profile", from_ref=base)
        _, top, _text = profile_call(lambda: t.compact(branch="compact-profile", target_file_bytes=TARGET_FILE_BYTES))
        profile = top

    fl_mbs = bytes_in / MB / fl.best
    floor_mbs = bytes_in / MB / floor.best
    print(
        f"  best: featurelake {fl_mbs:.1f} MB/s, floor {floor_mbs:.1f} MB/s "
        f"-> featurelake at {fl_mbs / floor_mbs:.2f}x the floor's throughput"
    )
    return {
        "files_in": len(tasks),
        "bytes_in": bytes_in,
        "rows": rows,
        "columns": COMPACT_COLUMNS,
        "target_file_bytes": TARGET_FILE_BYTES,
        "bins": len(bins),
        "setup_seconds": round(setup_s, 3),
        "featurelake": {
            **fl.as_dict(),
            "mb_per_s": round(fl_mbs, 2),
            "files_out": last["files_out"],
            "bytes_out": last["bytes_out"],
            "attempts": last["attempts"],
        },
        "floor": {**floor.as_dict(), "mb_per_s": round(floor_mbs, 2), "bytes_out": floor_out, "rows": floor_rows},
        "throughput_ratio_to_floor": ratio(fl_mbs, floor_mbs),
        "slowdown_vs_floor": ratio(fl.best, floor.best),
        "profile": profile,
    }


# ---------------------------------------------------------------- (b) slim metadata
def _register(ice, sources: list[tuple[str, Any]], strip_sizes: bool = False) -> dict[str, Any]:
    """Link the files into the table's data folder and commit them in one fast append.

    The DataFile statistics come from pyiceberg's own helpers with the table's
    properties (what ``parquet_file_to_data_file`` and its writer do), with the
    statistics plan computed once per table instead of once per file.
    """
    from pyiceberg.io.pyarrow import (
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    from pyiceberg.typedef import Record

    data_dir = local_path(f"{ice.location().rstrip('/')}/data")
    os.makedirs(data_dir, exist_ok=True)
    meta = ice.metadata
    schema = meta.schema()
    plan = compute_statistics_plan(schema, meta.properties)
    mapping = parquet_path_to_id_mapping(schema)
    keep_ids = {fid for fid, c in plan.items() if c.mode.type.name != "NONE"}
    t0 = time.perf_counter()
    data_files = []
    for src, footer in sources:
        dst = os.path.join(data_dir, f"{uuid.uuid4().hex}.parquet")
        try:
            os.link(src, dst)  # the table's own directory entry, no second copy of the bytes
        except OSError:
            shutil.copyfile(src, dst)
        stats = data_file_statistics_from_parquet_metadata(footer, plan, mapping).to_serialized_dict()
        if strip_sizes:
            stats["column_sizes"] = {k: v for k, v in stats["column_sizes"].items() if k in keep_ids}
        data_files.append(
            DataFile.from_args(
                content=DataFileContent.DATA,
                file_path=f"file://{dst}",
                file_format=FileFormat.PARQUET,
                partition=Record(),
                file_size_in_bytes=os.path.getsize(dst),
                sort_order_id=None,
                equality_ids=None,
                key_metadata=None,
                **stats,
            )
        )
    stats_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    tx = ice.transaction()
    with tx.update_snapshot().fast_append() as op:
        for df in data_files:
            op.append_data_file(df)
    tx.commit_transaction()
    return {"register_seconds": round(stats_s, 3), "commit_seconds": round(time.perf_counter() - t0, 3)}


def _manifest_bytes(ice) -> dict[str, int]:
    m = ice.inspect.manifests()
    snap = ice.current_snapshot()
    list_bytes = os.path.getsize(local_path(snap.manifest_list))
    return {"manifests": m.num_rows, "manifest_bytes": int(sum(m["length"].to_pylist())), "manifest_list_bytes": list_bytes}


def _plan_times(lake, name: str, repeat: int, key_filter: str) -> dict[str, Any]:
    full, filtered, fl_filtered = Timing(), Timing(), Timing()
    n_full = n_filtered = 0
    for _ in range(repeat):
        ice = lake.catalog.load_table(name)  # fresh table object: manifests are read again
        _, tasks = timed(lambda: list(ice.scan().plan_files()), full)
        n_full = len(tasks)
        ice = lake.catalog.load_table(name)
        _, tasks = timed(lambda: list(ice.scan(row_filter=key_filter).plan_files()), filtered)
        n_filtered = len(tasks)
        t = lake.table(name)
        _, fl_tasks = timed(lambda: t.scan(filter=key_filter).tasks(), fl_filtered)
    return {
        "plan_files": {**full.as_dict(), "files": n_full},
        "plan_files_key_filter": {**filtered.as_dict(), "files": n_filtered, "filter": key_filter},
        "featurelake_plan_key_filter": {**fl_filtered.as_dict(), "files": len(fl_tasks)},
    }


def bench_slim(lake, cfg: Config, root) -> dict[str, Any]:
    columns = QUICK_SLIM_COLUMNS if cfg.quick else SLIM_COLUMNS
    files = QUICK_SLIM_FILES if cfg.quick else SLIM_FILES
    rows = SLIM_ROWS
    schema = wide_schema(columns)
    print(f"(b) metadata slimming: {columns} columns, {files} data files of {rows} rows")

    variants = {
        "default_metrics": {"write.metadata.metrics.default": "truncate(16)"},
        "slim_metrics": {},
        "slim_no_column_sizes": {},
    }
    tables = {
        name: lake.create_table(f"bench.{name}", schema, primary_key=KEY, properties=props)
        for name, props in variants.items()
    }
    # one set of Parquet files (field ids from the table schema), registered in every table
    from featurelake.schema import arrow_schema

    target = arrow_schema(tables["slim_metrics"].iceberg.schema())
    src_dir = os.path.join(str(root), "slim-src")
    os.makedirs(src_dir)
    rng = np.random.default_rng(cfg.seed)
    t0 = time.perf_counter()
    sources = []
    for i in range(files):
        chunk = _features(rng, schema, i * rows, (i + 1) * rows).cast(target)
        path = os.path.join(src_dir, f"part-{i:04d}.parquet")
        pq.write_table(chunk, path, compression="zstd")
        sources.append((path, pq.read_metadata(path)))
    write_s = time.perf_counter() - t0
    data_bytes = sum(os.path.getsize(p) for p, _ in sources)
    print(f"  {files} Parquet files, {fmt_bytes(data_bytes)}, written in {fmt_s(write_s)}")

    key_filter = f"{KEY} < {rows * 3}"  # the first three files
    out: dict[str, Any] = {"columns": columns, "files": files, "rows_per_file": rows, "data_bytes": data_bytes}
    for name, t in tables.items():
        reg = _register(t.iceberg, sources, strip_sizes=(name == "slim_no_column_sizes"))
        ice = t.iceberg
        sizes = _manifest_bytes(ice)
        plans = _plan_times(lake, f"bench.{name}", cfg.repeat, key_filter)
        out[name] = {"properties": variants[name] or "featurelake defaults", **reg, **sizes, **plans}
        print(
            f"  {name:<21} manifests {fmt_bytes(sizes['manifest_bytes']):>10}"
            f"  plan {fmt_s(plans['plan_files']['best_s']):>9}"
            f"  plan(key filter) {fmt_s(plans['plan_files_key_filter']['best_s']):>9}"
            f" ({plans['plan_files_key_filter']['files']} files)"
        )
    d, s, n = out["default_metrics"], out["slim_metrics"], out["slim_no_column_sizes"]
    out["manifest_bytes_ratio"] = ratio(d["manifest_bytes"], s["manifest_bytes"])
    out["plan_time_ratio"] = ratio(d["plan_files"]["best_s"], s["plan_files"]["best_s"])
    out["plan_time_ratio_key_filter"] = ratio(d["plan_files_key_filter"]["best_s"], s["plan_files_key_filter"]["best_s"])
    out["manifest_bytes_ratio_without_column_sizes"] = ratio(d["manifest_bytes"], n["manifest_bytes"])
    out["plan_time_ratio_without_column_sizes"] = ratio(d["plan_files"]["best_s"], n["plan_files"]["best_s"])
    print(
        f"  default / slim: manifests {out['manifest_bytes_ratio']}x, planning {out['plan_time_ratio']}x "
        f"(key filter {out['plan_time_ratio_key_filter']}x); without column sizes: manifests "
        f"{out['manifest_bytes_ratio_without_column_sizes']}x, planning {out['plan_time_ratio_without_column_sizes']}x"
    )
    shutil.rmtree(src_dir, ignore_errors=True)
    return out


# ---------------------------------------------------------------- entry point
def run(cfg: Config) -> dict[str, Any]:
    from featurelake import Lake

    started = time.perf_counter()
    with work_dir(NAME, keep=cfg.keep) as root:
        lake = Lake(root / "lake")
        compaction = bench_compaction(lake, cfg, root)
        slim = bench_slim(lake, cfg, root)
    goals = [
        goal("slim metrics alone (pyiceberg writer) vs default metrics", slim["manifest_bytes_ratio"], GOAL_SLIM),
        goal(
            "featurelake writer (slim metrics, sizes and counts only for key/partition columns) vs default metrics",
            slim["manifest_bytes_ratio_without_column_sizes"],
            GOAL_SLIM,
        ),
    ]
    print_goals(goals)
    if cfg.quick:
        print(
            f"  (quick sizes: {QUICK_SLIM_COLUMNS} columns x {QUICK_SLIM_FILES} files, where the schema every "
            "manifest carries dominates; the goal is for the full 2,000 x 500 run)"
        )
    print(
        f"  compaction throughput: featurelake {compaction['featurelake']['mb_per_s']} MB/s vs floor "
        f"{compaction['floor']['mb_per_s']} MB/s ({compaction['throughput_ratio_to_floor']}x; no target set)"
    )
    result = {
        "compaction": compaction,
        "metadata_slimming": slim,
        "goals": goals,
        "seconds": round(time.perf_counter() - started, 1),
    }
    path = write_result(NAME, cfg, result)
    print(f"  -> {path}")
    return result
