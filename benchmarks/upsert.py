"""Upsert 100k keys into tables of growing size: featurelake's indexed merge-on-read vs pyiceberg.

Tables: ``sample_id`` (0..N-1), ``ts`` over 10 days (``day(ts)`` partitions),
``user_id``, four float features and a label, appended in chunks of 1M rows.
Each upsert carries 100k keys (10k with --quick): 90% existing keys drawn uniformly from the
whole table (so every data file is touched: the worst case for an index) and
10% new keys, setting ``label`` and ``f0``. Every repetition uses fresh keys.

Baseline: pyiceberg's own ``Table.upsert(df, join_cols=["sample_id"])`` on an
identical plain table (copy-on-write), run in a subprocess with a time limit;
when it runs out, the limit is reported as a lower bound.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime, timedelta
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from benchmarks.common import Config, Timing, fmt_s, goal, print_goals, ratio, work_dir, write_result

NAME = "upsert"
DEFAULT_REPEAT = 5
BATCH = 100_000
CHUNK = 1_000_000
T0 = datetime(2026, 1, 1)
PYICEBERG_LIMIT_S = 900
SCHEMA = pa.schema(
    [
        pa.field("sample_id", pa.int64(), nullable=False),
        pa.field("ts", pa.timestamp("us"), nullable=False),
        pa.field("user_id", pa.int64()),
        pa.field("f0", pa.float32()),
        pa.field("f1", pa.float32()),
        pa.field("f2", pa.float32()),
        pa.field("f3", pa.float32()),
        pa.field("label", pa.int32()),
    ]
)


def chunks(rows: int, seed: int) -> Iterator[pa.Table]:
    rng = np.random.default_rng(seed)
    span = int(timedelta(days=10) / timedelta(microseconds=1))
    base = np.datetime64(T0, "us")
    for lo in range(0, rows, CHUNK):
        hi = min(rows, lo + CHUNK)
        ids = np.arange(lo, hi, dtype=np.int64)
        n = hi - lo
        yield pa.table(
            {
                "sample_id": ids,
                "ts": base + (ids * span // max(rows, 1)).astype("timedelta64[us]"),
                "user_id": rng.integers(0, 1_000_000, n),
                "f0": rng.random(n, dtype=np.float32),
                "f1": rng.random(n, dtype=np.float32),
                "f2": rng.random(n, dtype=np.float32),
                "f3": rng.random(n, dtype=np.float32),
                "label": np.zeros(n, dtype=np.int32),
            },
            schema=SCHEMA,
        )


def upsert_batch(rows: int, rep: int, seed: int, keys: int = BATCH) -> pa.Table:
    rng = np.random.default_rng([seed, rep])
    new_keys = keys // 10
    existing = rng.choice(rows, size=keys - new_keys, replace=False)
    new = np.arange(rows + rep * new_keys, rows + (rep + 1) * new_keys, dtype=np.int64)
    ids = np.concatenate([existing, new]).astype(np.int64)
    rng.shuffle(ids)
    span = int(timedelta(days=10) / timedelta(microseconds=1))
    ts = np.datetime64(T0, "us") + (np.minimum(ids, rows - 1) * span // rows).astype("timedelta64[us]")
    return pa.table(
        {
            "sample_id": ids,
            "ts": ts,
            "label": np.full(len(ids), rep + 1, dtype=np.int32),
            "f0": rng.random(len(ids), dtype=np.float32),
        },
        schema=pa.schema([SCHEMA.field(c) for c in ("sample_id", "ts", "label", "f0")]),
    )


def _featurelake(cfg: Config, root, rows: int) -> dict[str, Any]:
    from featurelake import Lake

    lake = Lake(root / f"fl-{rows}")
    t = lake.create_table("bench.upsert", SCHEMA, primary_key="sample_id", partition_by=["day(ts)"])
    t0 = time.perf_counter()
    t.append(chunks(rows, cfg.seed))
    load_s = time.perf_counter() - t0
    timing = Timing()
    reports = []
    for rep in range(cfg.repeat):
        batch = upsert_batch(rows, rep, cfg.seed, _keys(cfg))
        t0 = time.perf_counter()
        t.upsert(batch)
        timing.add(time.perf_counter() - t0)
        r = t.last_update_report
        reports.append({"rows_updated": r.rows_updated, "rows_inserted": r.rows_inserted, "bytes_written": r.bytes_written, "update_files": r.update_files})
    check = t.read(columns=["sample_id", "label"], filter=f"label = {cfg.repeat}")
    stats = t.stats()
    return {
        "rows": rows,
        "load_seconds": round(load_s, 2),
        "data_files": stats["data_files"],
        "upsert": timing.as_dict(),
        "reports": reports,
        "last_batch_rows_with_label": check.num_rows,
    }


_PYICEBERG_SCRIPT = r"""
import json, sys, time
sys.path.insert(0, {root!r})
from benchmarks.upsert import chunks, upsert_batch, SCHEMA
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.partitioning import PartitionSpec, PartitionField
from pyiceberg.transforms import DayTransform
from pyiceberg.schema import Schema
home = {home!r}
rows = {rows}
cat = SqlCatalog("b", uri=f"sqlite:///{{home}}/catalog.db", warehouse=f"file://{{home}}")
cat.create_namespace("b")
from featurelake.schema import iceberg_schema_from_arrow
schema = iceberg_schema_from_arrow(SCHEMA, ["sample_id"])
spec = PartitionSpec(PartitionField(source_id=schema.find_field("ts").field_id, field_id=1000, transform=DayTransform(), name="ts_day"))
t = cat.create_table("b.t", schema=schema, partition_spec=spec)
arrow = schema.as_arrow()
for c in chunks(rows, {seed}):
    t.append(c.cast(arrow))
batch = upsert_batch(rows, 0, {seed}, {keys})
full = batch.append_column("user_id", __import__("pyarrow").nulls(batch.num_rows, __import__("pyarrow").int64()))
for name in ("f1", "f2", "f3"):
    full = full.append_column(name, __import__("pyarrow").nulls(batch.num_rows, __import__("pyarrow").float32()))
full = full.select(arrow.names).cast(arrow)
t0 = time.perf_counter()
res = t.upsert(full, join_cols=["sample_id"])
print(json.dumps({{"seconds": time.perf_counter() - t0, "updated": res.rows_updated, "inserted": res.rows_inserted}}))
"""


def _pyiceberg(cfg: Config, root, rows: int) -> dict[str, Any]:
    home = root / f"pi-{rows}"
    home.mkdir()
    from benchmarks.common import ROOT

    script = _PYICEBERG_SCRIPT.format(root=str(ROOT.parent), home=str(home), rows=rows, seed=cfg.seed, keys=_keys(cfg))
    t0 = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=PYICEBERG_LIMIT_S + 600)
    except subprocess.TimeoutExpired:
        return {"rows": rows, "seconds": None, "lower_bound_s": PYICEBERG_LIMIT_S, "note": "did not finish"}
    if out.returncode != 0:
        return {"rows": rows, "seconds": None, "error": out.stderr[-2000:], "wall_s": round(time.perf_counter() - t0, 1)}
    return {"rows": rows, **json.loads(out.stdout.strip().splitlines()[-1])}


def _keys(cfg: Config) -> int:
    return 10_000 if cfg.quick else BATCH


def run(cfg: Config) -> dict[str, Any]:
    cfg = cfg.started()
    sizes = [20_000, 200_000] if cfg.quick else [1_000_000, 10_000_000, 50_000_000]
    baseline_at = sizes[-1] if cfg.quick else 10_000_000
    results, baseline = [], None
    with work_dir(NAME, cfg.keep) as root:
        for rows in sizes:
            r = _featurelake(cfg, root, rows)
            results.append(r)
            print(f"  featurelake upsert of {_keys(cfg):,} keys into {rows:,} rows: {fmt_s(r['upsert']['best_s'])} ({r['data_files']} files)")
        baseline = _pyiceberg(cfg, root, baseline_at)
        print(f"  pyiceberg upsert at {baseline_at:,} rows: {baseline}")
    best = {r["rows"]: r["upsert"]["best_s"] for r in results}
    growth = {f"{b:,}/{a:,}": ratio(best[b], best[a]) for a, b in zip(sizes[:-1], sizes[1:])}
    ten_x = ratio(best[sizes[1]], best[sizes[0]]) if len(sizes) > 1 else None
    pi_s = baseline.get("seconds") or baseline.get("lower_bound_s")
    speedup = ratio(pi_s, best[baseline_at]) if pi_s else None
    goals = [
        goal(f"time growth for 10x rows ({sizes[1]:,} vs {sizes[0]:,})", ten_x, 1.5, higher_is_better=False),
        goal(f"faster than pyiceberg upsert at {baseline_at:,} rows", speedup, 20.0),
    ]
    if len(sizes) > 2:
        # the same allowance as 1.5x per 10x rows, for the 5x step: 1.5 ** log10(5)
        allowed = round(1.5 ** np.log10(sizes[2] / sizes[1]), 3)
        goals.insert(1, goal(f"time growth {sizes[2]:,} vs {sizes[1]:,} rows", ratio(best[sizes[2]], best[sizes[1]]), allowed, higher_is_better=False))
    print_goals(goals)
    result = {
        "description": __doc__.splitlines()[0],
        "batch": {"keys": _keys(cfg), "existing": _keys(cfg) - _keys(cfg) // 10, "new": _keys(cfg) // 10},
        "featurelake": results,
        "pyiceberg": baseline,
        "ratios": {"growth": growth, "speedup_vs_pyiceberg": speedup},
        "goals": goals,
    }
    write_result(NAME, cfg, result)
    return result
