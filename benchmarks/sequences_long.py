"""Lifetime histories for benchmarks/sequences.py: lookup cost at 2K, 80K and 800K events per user.

Every size gets the same lookups: batches of as many distinct users as the
largest size has (one row each, so that no two rows share a chunk; ``before``
uniform over days 60..365 of a one-year history), the hot columns, ``max_len`` 256;
and the same batches as time-window lookups whose window covers 1% of a
user's history (3.65 days), also capped at 256 events. Sizes are timed
interleaved (one pass of every size per repeat), medians reported. The
head's cost is visible in ``head_bytes_per_lookup``: at 800K events per user a
single-level head would be 50 KB per user; two-level it is the short top
level plus one 512-byte page.
"""
from __future__ import annotations

import datetime as _dt
import time
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.common import Config, fmt_bytes, ratio

DAYS = 365
WINDOW = _dt.timedelta(days=DAYS) / 100  # 1% of a user's history


def long_sizes(quick: bool) -> list[tuple[str, int, int]]:
    """(label, users, events per user)."""
    if quick:
        return [("2k", 40, 2000), ("20k", 8, 20_000), ("80k", 4, 80_000)]
    return [("2k", 2000, 2000), ("80k", 100, 80_000), ("800k", 16, 800_000)]


def long_histories(lake, cfg: Config, threads: int, start: _dt.date, hot: list[str], groups: list[list[str]],
                   max_len: int, repeat_rate: float) -> dict[str, Any]:
    """Same lookups against users with short, long and lifetime histories: cost per lookup, bytes, events."""
    from featurelake.synthetic import user_events, user_events_schema

    sizes = long_sizes(cfg.quick)
    batch_users = min(u for _, u, _ in sizes)
    rows_per_user = 1  # several rows of one user in a batch share chunks, more so for short histories
    n_batches = 10 if cfg.quick else 120
    out: dict[str, Any] = {"batch_users": batch_users, "rows_per_user": rows_per_user, "batches": n_batches,
                           "max_len": max_len, "window_days": round(WINDOW / _dt.timedelta(days=1), 2), "threads": threads}
    stores = {}
    for label, users, per in sizes:
        st = lake.create_sequence_table(f"bench.events_{label}", user_events_schema(), key="user_id", time="ts")
        t0 = time.perf_counter()
        st.append(user_events(users, per, days=DAYS, start=start, seed=cfg.seed + 3, batch_size=1 << 20,
                              repeat_rate=repeat_rate))
        t_append = time.perf_counter() - t0
        info = st.build(column_groups=groups)
        stores[label] = (st.open_store(), users)
        out[label] = {"users": users, "events_per_user": per, "events": info.events, "append_s": round(t_append, 2),
                      "build_s": info.seconds, "store_bytes": info.store_bytes, "layers": len(info.layers[0])}
        print(f"  {label}: {info.events:,} events, build {info.seconds:.1f} s, store {fmt_bytes(info.store_bytes)}")

    rng = np.random.default_rng(cfg.seed + 4)
    day0 = np.datetime64(_dt.datetime.combine(start, _dt.time()), "us")
    day_us = 86_400_000_000
    n_rows = batch_users * rows_per_user
    befores = [pa.array(day0 + (60 * day_us + rng.integers(0, 305 * day_us, n_rows)).astype("timedelta64[us]"),
                        pa.timestamp("us")) for _ in range(n_batches)]
    plans = {}
    for label, (store, users) in stores.items():
        plans[label] = [pa.array(np.repeat(rng.choice(users, size=batch_users, replace=False), rows_per_user)
                                 .astype(np.int64)) for _ in range(n_batches)]
        for keys, before in list(zip(plans[label], befores))[:3]:  # warm the caches alike
            store.lookup(keys, before, hot, max_len, None, threads=threads)

    kinds = {"last": None, "window": WINDOW}
    times: dict[tuple[str, str], list[float]] = {(lb, k): [] for lb in stores for k in kinds}
    figures: dict[tuple[str, str], dict[str, int]] = {}
    block = 4  # sizes and kinds alternate every few batches, so that all see the same machine load
    for _ in range(max(5, cfg.repeat + 2)):
        spent = {key: 0.0 for key in times}
        for b0 in range(0, n_batches, block):
            for label, (store, _users) in stores.items():
                for kind, window in kinds.items():
                    agg = figures.setdefault((label, kind), {"head_bytes": 0, "chunk_bytes": 0, "events": 0,
                                                             "decoded_bytes": 0}) if b0 == 0 else figures[(label, kind)]
                    if b0 == 0:
                        for k in agg:
                            agg[k] = 0
                    t0 = time.perf_counter()
                    for keys, before in zip(plans[label][b0 : b0 + block], befores[b0 : b0 + block]):
                        store.lookup(keys, before, hot, max_len, window, threads=threads)
                        for k in agg:
                            agg[k] += store.last_stats[k]
                    spent[(label, kind)] += time.perf_counter() - t0
        for key, v in spent.items():
            times[key].append(v)
    n = n_batches * n_rows
    for label in stores:
        for kind in kinds:
            f = figures[(label, kind)]
            sfx = "" if kind == "last" else "_window"
            out[label].update({
                f"us_per_lookup{sfx}": round(float(np.median(times[(label, kind)])) / n * 1e6, 2),
                f"bytes_per_lookup{sfx}": round((f["head_bytes"] + f["chunk_bytes"]) / n),
                f"head_bytes_per_lookup{sfx}": round(f["head_bytes"] / n),
                f"decoded_bytes_per_lookup{sfx}": round(f["decoded_bytes"] / n),
                f"events_per_lookup{sfx}": round(f["events"] / n, 1),
            })
    small, big = sizes[0][0], sizes[-1][0]
    for label, _, _ in sizes[1:]:
        out[f"cost_{label}_over_{small}"] = ratio(out[label]["us_per_lookup"], out[small]["us_per_lookup"])
        out[f"cost_{label}_over_{small}_window"] = ratio(out[label]["us_per_lookup_window"], out[small]["us_per_lookup_window"])
        out[f"bytes_{label}_over_{small}"] = ratio(out[label]["bytes_per_lookup"], out[small]["bytes_per_lookup"])
    out["largest"], out["smallest"] = big, small
    out["cost_largest_over_smallest"] = out[f"cost_{big}_over_{small}"]
    out["cost_largest_over_smallest_window"] = out[f"cost_{big}_over_{small}_window"]
    return out
