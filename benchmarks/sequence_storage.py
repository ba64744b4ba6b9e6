"""Bytes per event by component: the normalized lake (event table, index, store build, training rows) against
the denormalized rows (last 256 events inlined), everything under each lake's home counted.

Three shapes: the Meta-like one of issue 14 (1,000 users, ~2,000 events each, heavy-tailed: lognormal sigma 1;
50 training rows per user), the same with a heavier tail (sigma 2: many users with fewer than 256 events, so the
denormalized rows inline less) and the shape of benchmarks/sequences.py (4,000 users x 800 events, 40 rows per
user). Per shape, two
embedded lakes are written side by side: ``norm`` (the sequence table, its store build and the training rows)
and ``denorm`` (the training rows, each carrying its last 256 events with every attribute, zstd Parquet). Every
file under each home is counted once (hard links once: a store build's SST files are linked into its RocksDB
folder). Also reported: one copy of the events compressed column by column with the best transform found
(delta times, byte planes, zstd level 19): the floor any single copy of these synthetic events can reach.
"""
from __future__ import annotations

import datetime as _dt
import os
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.common import Config, fmt_bytes, goal, print_goals, ratio, work_dir, write_result

NAME = "sequence_storage"
DAYS = 60
MAX_LEN = 256
START = _dt.date(2026, 1, 1)
REPEAT_RATE = 0.3
GOAL_RATIO = 3.0        # issue 14: the normalized lake >= 3x smaller than the denormalized rows (Meta-like shape)
APPEND_ROWS = 16_384    # denormalized rows per append, as benchmarks/sequences.py writes them
HEAVY_SIGMA = 1.0       # lognormal spread of events per user (heavy tail; mean kept at the shape's mean)
HEAVIER_SIGMA = 2.0     # a heavier tail: half the users under ~270 events, so rows inline fewer than MAX_LEN


def shapes(cfg: Config) -> dict[str, dict[str, Any]]:
    if cfg.quick:
        return {
            "meta_like": {"users": 40, "mean_events": 300, "sigma": HEAVY_SIGMA, "rows_per_user": 50},
            "meta_like_heavier_tail": {"users": 40, "mean_events": 300, "sigma": HEAVIER_SIGMA, "rows_per_user": 50},
            "sequences_benchmark": {"users": 40, "mean_events": 200, "sigma": 0.0, "rows_per_user": 40},
        }
    return {
        "meta_like": {"users": 1000, "mean_events": 2000, "sigma": HEAVY_SIGMA, "rows_per_user": 50},
        "meta_like_heavier_tail": {"users": 1000, "mean_events": 2000, "sigma": HEAVIER_SIGMA, "rows_per_user": 50},
        "sequences_benchmark": {"users": 4000, "mean_events": 800, "sigma": 0.0, "rows_per_user": 40},
    }


# ------------------------------------------------------------------- data
def event_counts(users: int, mean: int, sigma: float, seed: int) -> np.ndarray:
    """Events per user: all ``mean`` (sigma 0), or lognormal with that sigma scaled to that mean, at least 8."""
    if not sigma:
        return np.full(users, mean, dtype=np.int64)
    c = np.random.default_rng([seed, 0x4E]).lognormal(0.0, sigma, users)
    return np.maximum(8, np.round(c / c.mean() * mean)).astype(np.int64)


def event_log(counts: np.ndarray, seed: int) -> list[pa.RecordBatch]:
    """The synthetic event log with ``counts[u]`` events (to within 5%) for user u, users in tiers of like counts."""
    from featurelake.synthetic import user_events

    order = np.argsort(counts, kind="stable")
    ids = np.empty(len(counts), np.int64)
    out: list[pa.RecordBatch] = []
    i = 0
    while i < len(counts):
        j = i
        while j < len(counts) and counts[order[j]] <= counts[order[i]] * 1.05:
            j += 1
        per = int(counts[order[i:j]].mean())
        out += list(user_events(j - i, per, days=DAYS, start=START, seed=seed + i, first_user=i, batch_size=1 << 20,
                                repeat_rate=REPEAT_RATE))
        ids[order[i:j]] = np.arange(i, j)
        i = j
    return out


def tree_bytes(root: Path) -> dict[str, int]:
    """Bytes under ``root`` by component (each hard-linked file once)."""
    seen: set[tuple[int, int]] = set()
    out: dict[str, int] = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            st = os.stat(path)
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            out[_component(os.path.relpath(path, root))] = out.get(_component(os.path.relpath(path, root)), 0) + st.st_size
    out["total"] = sum(out.values())
    return out


def _component(rel: str) -> str:
    parts = rel.split(os.sep)
    if parts[0] == "sequences":
        return "store_builds"
    if parts[0] != "warehouse" or len(parts) < 4:
        return "catalog"
    table = parts[2]
    if parts[3] == "metadata":
        return f"{table}.metadata"
    if "_featurelake" in parts:
        return f"{table}.index" if "index" in parts else f"{table}.platform_state"
    return f"{table}.data"


def one_copy_floor(events: pa.Table) -> dict[str, float]:
    """Bytes per event of one copy, each column with the best transform found and zstd level 19."""
    import zstandard

    z = zstandard.ZstdCompressor(level=19)
    n = events.num_rows

    def planes(a: np.ndarray) -> bytes:
        return np.ascontiguousarray(a.view(np.uint8).reshape(-1, a.dtype.itemsize).T).tobytes()

    def size(b: bytes) -> float:
        return len(z.compress(b)) / n

    t = events.sort_by([("user_id", "ascending"), ("ts", "ascending")])
    u = t.column("user_id").to_numpy()
    ts = t.column("ts").cast(pa.int64()).to_numpy()
    d = np.diff(ts, prepend=0)
    d[np.r_[True, u[1:] != u[:-1]]] = 0     # a user's first time is in its head
    tags = t.column("tags").combine_chunks()
    etype = pa.compute.index_in(t.column("event_type"), pa.compute.unique(t.column("event_type")))
    out = {
        "ts": size(planes(d)),
        "item_id": size(planes(t.column("item_id").to_numpy())),
        "event_type": size(etype.to_numpy(zero_copy_only=False).astype(np.uint8).tobytes()),
        "dwell": size(planes(t.column("dwell").to_numpy())),
        "tags": size(np.diff(tags.offsets.to_numpy()).astype(np.uint8).tobytes())
        + size(planes(tags.values.to_numpy().astype(np.uint16))),
    }
    out = {k: round(v, 3) for k, v in out.items()}
    out["total"] = round(sum(out.values()), 3)
    return out


# ------------------------------------------------------------------ shape
def measure_shape(label: str, shape: dict[str, Any], wd: Path, cfg: Config) -> dict[str, Any]:
    from featurelake import Lake
    from featurelake.sequences import join_sequences
    from featurelake.synthetic import user_events_schema

    from benchmarks.sequences import training_rows

    users = shape["users"]
    counts = event_counts(users, shape["mean_events"], shape["sigma"], cfg.seed)
    log = event_log(counts, cfg.seed)
    events = pa.Table.from_batches(log)
    n = events.num_rows
    per_user = np.bincount(events.column("user_id").to_numpy(), minlength=users)

    norm = Lake(wd / f"{label}-norm")
    st = norm.create_sequence_table("bench.events", user_events_schema(), key="user_id", time="ts")
    t0 = time.perf_counter()
    st.append(iter(log))
    append_s = time.perf_counter() - t0
    info = st.build()
    rows = training_rows(users, cfg.seed, shape["rows_per_user"])
    samples = norm.create_table("bench.samples", rows.schema, primary_key="sample_id")
    samples.append(rows)

    # denormalized: every row carries its last MAX_LEN events. Written as benchmarks/sequences.py (and the issue's
    # figure) does, in time-ordered appends of APPEND_ROWS rows, and as one write (one file per 1M rows).
    view = st.view(key="user_id", time="ts", columns=None, max_len=MAX_LEN)
    joined = []
    inlined = 0
    for off in range(0, rows.num_rows, APPEND_ROWS):
        part = join_sequences(rows.slice(off, APPEND_ROWS), {"hist": view})
        inlined += len(part.column("hist").combine_chunks().values)
        joined.append(part)
    dschema = rows.schema.append(pa.field("hist", view.type))
    denorm = {}
    for variant in ("appends", "one_write"):
        home = wd / f"{label}-denorm-{variant}"
        t = Lake(home).create_table("bench.samples", dschema, primary_key="sample_id")
        if variant == "appends":
            for part in joined:
                t.append(part)
        else:
            t.append(pa.concat_tables(joined))
        denorm[variant] = tree_bytes(home)
    del joined

    nb = tree_bytes(wd / f"{label}-norm")
    stats = st.store_stats()
    per_event = {k: round(v / n, 3) for k, v in sorted(nb.items())}
    smaller = min(denorm.values(), key=lambda d: d["total"])
    out = {
        "shape": {**shape, "events": n, "events_per_user_min": int(per_user.min()),
                  "events_per_user_median": int(np.median(per_user)), "events_per_user_max": int(per_user.max()),
                  "training_rows": rows.num_rows, "inlined_events": inlined, "max_len": MAX_LEN},
        "normalized_bytes": nb["total"],
        "denormalized_bytes": smaller["total"],
        "denormalized_over_normalized": ratio(smaller["total"], nb["total"]),
        "denormalized_variants_bytes": {k: d["total"] for k, d in denorm.items()},
        "denormalized_variants_over_normalized": {k: ratio(d["total"], nb["total"]) for k, d in denorm.items()},
        "normalized_components": nb,
        "normalized_bytes_per_event": per_event,
        "denormalized_components": smaller,
        "denormalized_bytes_per_inlined_event": round(smaller["total"] / inlined, 3),
        "denormalized_bytes_per_event": round(smaller["total"] / n, 3),
        "event_copies_bytes_per_event": round((nb.get("events.data", 0) + nb.get("store_builds", 0)) / n, 3),
        "seq_stats_bytes_per_event": stats["bytes_per_event"],
        "store_groups": info.column_groups,
        "store_codecs": [c.get("kind") for c in info.group_codecs],
        "append_s": round(append_s, 2),
        "build_s": info.seconds,
        "one_copy_floor_bytes_per_event": one_copy_floor(events),
    }
    print(f"  {label}: {n:,} events ({users:,} users, {rows.num_rows:,} rows, {inlined:,} inlined): normalized "
          f"{fmt_bytes(nb['total'])} vs denormalized {fmt_bytes(smaller['total'])} = {out['denormalized_over_normalized']}x "
          f"(variants {out['denormalized_variants_over_normalized']}); "
          f"per event: event data {per_event.get('events.data')}, index {per_event.get('events.index', 0)}, "
          f"store {per_event.get('store_builds')}, samples {per_event.get('samples.data')}; "
          f"floor of one copy {out['one_copy_floor_bytes_per_event']['total']}")
    return out


def storage_by_shape(cfg: Config, wd: Path) -> dict[str, Any]:
    """Both shapes, measured one after the other in this process."""
    return {label: measure_shape(label, shape, wd, cfg) for label, shape in shapes(cfg).items()}


def run(cfg: Config) -> dict[str, Any]:
    t0 = time.perf_counter()
    result: dict[str, Any] = {"description": __doc__.strip().splitlines()[0]}
    with work_dir(NAME, cfg.keep) as wd:
        result["shapes"] = storage_by_shape(cfg, wd)
    meta = result["shapes"]["meta_like"]
    goals = [goal("Meta-like shape: denormalized / normalized (everything under each home)",
                  meta["denormalized_over_normalized"], GOAL_RATIO)]
    result["goals"] = goals
    result["notes"] = [
        "normalized = everything under the normalized lake's home: event table (data, index, platform state, "
        "metadata), its store build (SST files counted once though linked into the RocksDB folder), training rows, "
        "catalog; denormalized = everything under a second home holding the training rows with hist inlined, "
        "written in time-ordered appends of 16,384 rows (as benchmarks/sequences.py) and as one write; the ratio "
        "and the goal use the smaller of the two",
        "bytes per event divide by the unique events of the shape; denormalized also per inlined event",
        "one_copy_floor: one copy of the events, column by column with the best transform found and zstd -19: what "
        "any single stored copy of these synthetic events costs at least (times are uniform microseconds, dwell a "
        "random float32: ~4 and ~3.3 bytes of entropy an event)",
    ]
    result["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    result["seconds"] = round(time.perf_counter() - t0, 1)
    print_goals(goals)
    path = write_result(NAME, cfg, result)
    print(f"  wrote {path}")
    return result
