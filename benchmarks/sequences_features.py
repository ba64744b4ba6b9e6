"""Section 5 of the sequences benchmark: a sequence view and an item-feature view joined together vs the unjoined read.

An item feature table (``items`` items, 1..8 versions each over the event
window; price, ctr, category and a 64-float embedding) is built into its
store; the training rows get an ``item_id`` (Zipf-like popularity) and are
read four ways, interleaved, best of ``repeat``: no join, the sequence view
only, the item-feature view only (as of the row's time), and both. Each
joined batch's embedding is taken to numpy zero-copy, as a trainer would.
"""
from __future__ import annotations

import datetime as _dt
import time
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.common import ratio

EMB_DIM = 64
MAX_VERSIONS = 8


def item_schema() -> pa.Schema:
    return pa.schema([("item_id", pa.int64()), ("updated_at", pa.timestamp("us")), ("price", pa.float32()),
                      ("ctr", pa.float32()), ("category", pa.string()), ("emb", pa.list_(pa.float32(), EMB_DIM))])


def item_versions(items: int, days: int, start: _dt.date, seed: int) -> pa.Table:
    rng = np.random.default_rng([seed, 11])
    counts = rng.integers(1, MAX_VERSIONS + 1, items)
    n = int(counts.sum())
    ids = np.repeat(np.arange(items, dtype=np.int64), counts)
    day0 = np.datetime64(_dt.datetime.combine(start, _dt.time()), "us")
    ts = day0 + rng.integers(0, days * 86_400_000_000, n).astype("timedelta64[us]")
    emb = pa.FixedSizeListArray.from_arrays(pa.array(rng.standard_normal(n * EMB_DIM).astype(np.float32)), EMB_DIM)
    return pa.table({
        "item_id": ids,
        "updated_at": pa.array(ts, pa.timestamp("us")),
        "price": pa.array(rng.gamma(2.0, 10.0, n).astype(np.float32)),
        "ctr": pa.array(rng.beta(1, 30, n).astype(np.float32)),
        "category": pa.array([f"c{i}" for i in rng.integers(0, 40, n)]),
        "emb": emb,
    }, schema=item_schema())


def with_items(rows: pa.Table, items: int, seed: int) -> pa.Table:
    """The training rows plus an item_id column (Zipf-like popularity over ``items`` items)."""
    rng = np.random.default_rng([seed, 12])
    pick = np.minimum(rng.zipf(1.3, rows.num_rows) - 1, items - 1).astype(np.int64)
    perm = rng.permutation(items).astype(np.int64)    # popular items spread over the id range
    return rows.append_column("item_id", pa.array(perm[pick]))


def feature_join(lake, rows: pa.Table, seq_view, items: int, start: _dt.date, days: int, seed: int, batch: int,
                 threads: int, repeat: int, columns: list[str]) -> dict[str, Any]:
    """Rows/s of the plain read, each join alone and both joins together (see the module docstring)."""
    versions = item_versions(items, days, start, seed)
    ft = lake.create_feature_table("bench.items", item_schema(), key="item_id", time="updated_at")
    t0 = time.perf_counter()
    ft.append(versions)
    info = ft.build()
    build_s = time.perf_counter() - t0
    samples = lake.create_table("bench.samples_items", rows.schema.append(pa.field("item_id", pa.int64())),
                                primary_key="sample_id")
    samples.append(with_items(rows, items, seed))
    item_view = ft.view(key_column="item_id", as_of="ts", threads=threads)

    def read(sequences=None, features=None):
        def run() -> tuple[int, int]:
            n = floats = 0
            for b in samples.batches(columns=columns, batch_size=batch, sequences=sequences, features=features):
                n += b.num_rows
                if features:
                    floats += b.column("item.emb").values.to_numpy(zero_copy_only=True).size
            return n, floats
        return run

    ways = {
        "plain": read(),
        "sequences": read(sequences={"hist": seq_view}),
        "features": read(features={"item": item_view}),
        "both": read(sequences={"hist": seq_view}, features={"item": item_view}),
    }
    best = {k: float("inf") for k in ways}
    counts: dict[str, tuple[int, int]] = {}
    for _ in range(repeat):
        for name, fn in ways.items():       # interleaved: the machine's noise hits every way alike
            t1 = time.perf_counter()
            counts[name] = fn()
            best[name] = min(best[name], time.perf_counter() - t1)
    n = counts["plain"][0]
    hit = samples.read(columns=["sample_id"], features={"item": ft.view(key_column="item_id", as_of="ts",
                                                                         columns=["price"])})
    return {
        "items": items,
        "item_versions": versions.num_rows,
        "embedding_dim": EMB_DIM,
        "rows": n,
        "rows_with_an_item_version": n - hit.column("item.price").null_count,
        "item_store_bytes": info.store_bytes,
        "item_build_s": round(build_s, 3),
        "item_column_groups": info.column_groups,
        "item_group_codecs": info.to_dict()["group_codecs"],
        **{f"{k}_s": round(v, 4) for k, v in best.items()},
        **{f"{k}_rows_per_s": round(n / v) for k, v in best.items()},
        "both_over_plain_throughput": ratio(best["plain"], best["both"]),
        "both_over_sequences_throughput": ratio(best["sequences"], best["both"]),
        "features_over_plain_throughput": ratio(best["plain"], best["features"]),
        "embedding_floats_per_read": counts["both"][1],
        "embedding_bytes_per_s_both": round(counts["both"][1] * 4 / best["both"]),
    }
