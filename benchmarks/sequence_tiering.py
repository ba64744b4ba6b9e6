"""Tiered sequence builds on an object store: local store bytes, and lookup cost hot, cold (cold cache), cold (warm cache).

One SeaweedFS ``weed mini`` (tests/seaweed.py) serves S3 and the Iceberg REST
catalog on 127.0.0.1; the lake's sequence stores live in a local cache folder.
One event table (long histories: ``users`` x ``per_user`` events over a
year) is built twice from the same snapshot, in the same layout: untiered,
and with ``tier_after`` chunks per user kept local (the rest as cold
segments on S3). Figures:

* local bytes (RocksDB SST files) of both builds, and the cold segments' bytes;
* lookup cost per batch (distinct users, one row each, hot columns,
  ``max_len``) for: *hot* -- the latest events (``before`` past the end: the
  newest chunks, local in both builds); *cold, cold cache* -- ``before``
  uniform over the first half of the year (chunks on S3), every cached block
  forgotten before each batch (memory and disk), as a fresh serving machine;
  *cold, warm cache* -- the same batches again once all of them are cached. Each is timed
  against the untiered build on the same batches, interleaved, medians.
* S3 requests and bytes of one cold-cache batch (the server's own counters).
Lookup results of both builds are checked equal on every batch.
"""
from __future__ import annotations

import datetime as _dt
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.common import Config, fmt_bytes, ratio, work_dir, write_result

NAME = "sequence_tiering"
DEFAULT_REPEAT = 5
DAYS = 365
HOT = ["ts", "item_id", "event_type"]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def run(cfg: Config) -> dict[str, Any]:
    from featurelake import Lake
    from featurelake.synthetic import user_events, user_events_schema
    from seaweed import SeaweedServer

    users, per_user = (40, 2_000) if cfg.quick else (400, 20_000)
    tier_after, max_len, batch_users = 4, 256, 32
    n_batches = 4 if cfg.quick else 12
    start = _dt.date(2025, 1, 1)
    result: dict[str, Any] = {"users": users, "events_per_user": per_user, "tier_after_chunks": tier_after,
                              "max_len": max_len, "batch_users": batch_users, "batches": n_batches}
    with work_dir(NAME, cfg.keep) as root:
        server = SeaweedServer(root / "seaweed").start()
        try:
            lake = Lake.from_uri(server.catalog_uri, server.warehouse, cache_dir=root / "cache",
                                 **server.catalog_properties())
            st = lake.create_sequence_table("bench.events", user_events_schema(), key="user_id", time="ts")
            st.append(user_events(users, per_user, days=DAYS, start=start, seed=cfg.seed, batch_size=1 << 20))
            plain = st.build()
            tiered = st.build(tier_after=tier_after)
            result.update({
                "events": plain.events, "chunk_events": plain.chunk_events,
                "local_bytes_untiered": plain.store_bytes, "local_bytes_tiered": tiered.store_bytes,
                "cold_segment_bytes": tiered.cold_bytes, "cold_segments": len(tiered.cold_segments),
                "local_bytes_ratio": ratio(plain.store_bytes, tiered.store_bytes),
                "build_s_untiered": plain.seconds, "build_s_tiered": tiered.seconds,
            })
            print(f"  {plain.events:,} events: local store {fmt_bytes(plain.store_bytes)} untiered, "
                  f"{fmt_bytes(tiered.store_bytes)} tiered (+ {fmt_bytes(tiered.cold_bytes)} on S3 in "
                  f"{len(tiered.cold_segments)} segment(s))")
            s_plain = st.open_store(build=plain.build_id)
            s_tier = st.open_store(build=tiered.build_id)
            cache = s_tier.reader.cache
            rng = np.random.default_rng(cfg.seed + 1)
            day0 = np.datetime64(_dt.datetime.combine(start, _dt.time()), "us")
            day_us = 86_400_000_000
            keys = [pa.array(rng.choice(users, batch_users, replace=False).astype(np.int64)) for _ in range(n_batches)]
            far = pa.array([day0 + np.timedelta64(DAYS + 10, "D")] * batch_users, pa.timestamp("us"))
            early = [pa.array(day0 + (20 * day_us + rng.integers(0, 160 * day_us, batch_users)).astype("timedelta64[us]"),
                              pa.timestamp("us")) for _ in range(n_batches)]
            for k, b in zip(keys, early):  # same answers; warms RocksDB's block cache for both builds alike
                assert s_tier.lookup(k, b, HOT, max_len, None).equals(s_plain.lookup(k, b, HOT, max_len, None))
                assert s_tier.lookup(k, far, HOT, max_len, None).equals(s_plain.lookup(k, far, HOT, max_len, None))

            def one(store, k, b, clear: bool) -> float:
                if clear:
                    cache.clear()
                t0 = time.perf_counter()
                store.lookup(k, b, HOT, max_len, None)
                return time.perf_counter() - t0

            kinds = ["hot", "cold_cold_cache", "cold_warm_cache"]
            times = {(side, kind): [] for side in ("untiered", "tiered") for kind in kinds}
            for _ in range(max(3, cfg.repeat)):
                spent = {key: 0.0 for key in times}
                for k, b in zip(keys, early):  # pass 1: each batch hot, then cold with nothing cached
                    for side, store in (("untiered", s_plain), ("tiered", s_tier)):
                        spent[(side, "hot")] += one(store, k, far, False)
                        spent[(side, "cold_cold_cache")] += one(store, k, b, side == "tiered")
                for k, b in zip(keys, early):  # pass 2 (not timed): every batch's blocks into the cache
                    s_tier.lookup(k, b, HOT, max_len, None)
                for k, b in zip(keys, early):  # pass 3: the same batches, all cached
                    for side, store in (("untiered", s_plain), ("tiered", s_tier)):
                        spent[(side, "cold_warm_cache")] += one(store, k, b, False)
                for key, v in spent.items():
                    times[key].append(v / n_batches)
            for kind in kinds:
                ms_t = float(np.median(times[("tiered", kind)])) * 1e3
                ms_p = float(np.median(times[("untiered", kind)])) * 1e3
                result[f"ms_per_batch_{kind}_tiered"] = round(ms_t, 3)
                result[f"ms_per_batch_{kind}_untiered"] = round(ms_p, 3)
                result[f"{kind}_tiered_over_untiered"] = ratio(ms_t, ms_p)
                print(f"  {kind:<16} tiered {ms_t:8.2f} ms/batch  untiered {ms_p:8.2f} ms/batch  "
                      f"({result[f'{kind}_tiered_over_untiered']}x)")
            cache.clear()
            fetches0, bytes0 = cache.fetches, cache.fetched_bytes
            sent0 = server.bytes_sent()
            with server.counting() as counts:
                s_tier.lookup(keys[0], early[0], HOT, max_len, None)
            result["cold_cache_batch_s3_requests"] = dict(counts)
            result["cold_cache_batch_ranged_reads"] = cache.fetches - fetches0
            result["cold_cache_batch_bytes_fetched"] = cache.fetched_bytes - bytes0
            result["cold_cache_batch_s3_bytes_sent"] = server.bytes_sent() - sent0
            with server.counting() as again:
                s_tier.lookup(keys[0], early[0], HOT, max_len, None)
            result["warm_cache_batch_s3_requests"] = dict(again)
            print(f"  one cold-cache batch: {counts.get('total', 0)} S3 requests, "
                  f"{fmt_bytes(result['cold_cache_batch_bytes_fetched'])} fetched; warm: {again.get('total', 0)} requests")
        finally:
            server.stop()
            shutil.rmtree(root / "seaweed", ignore_errors=True)
    write_result(NAME, cfg, result)
    return result
