"""The demo's ``sequences`` section (registered by platform_defs/demo.py, after ``labels``).

Runs on the demo's persistent Dagster instance (so ``make ui`` shows the runs):
for every demo day, one run materializes ``user_events`` (that day's events
into the sequence table ``ml.user_events``) and then ``sequence_store`` (an
incremental build) -- what the daily ``main_job`` does. Incremental builds
stack layers (a user's last, partial chunk is re-encoded in the new layer and
shadows the older copy), so a last run rebuilds the store in full (config
``incremental: false, force: true``, as one would run ``sequence_job`` weekly):
``store_bytes_incremental_chain`` is the layered size, ``store_bytes`` the rebuilt one.
Then a training read of the rebuilt store:

* ``ml.samples`` in batches of 4096 with a joined history column ``hist``
  (``ts``, ``item_id``, ``event_type`` of the user's last 64 events strictly
  before the row's ``ts``): rows/s, events joined, and ``violations``, the
  joined events at or after their row's ``ts`` (must be 0);
* bytes: the store (all layers of the build served) and the event table, versus
  a denormalized copy -- every row carrying its history of up to 64 events
  with all their attributes -- measured by writing the rows with and without
  that column to zstd Parquet (on a sample of rows for big demos, scaled).
"""
from __future__ import annotations

import io
import time
from typing import Any, Optional

QUIET = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
TAGS = {"featurelake/demo": "true", "featurelake/demo-section": "sequences"}
HIST = "hist"
HIST_COLUMNS = ["ts", "item_id", "event_type"]
MAX_LEN = 64
BATCH_SIZE = 4096
#: Rows written to Parquet to measure the denormalized copy (more are sampled and scaled).
MEASURE_ROWS = 100_000


def _materialized(result, node: str) -> dict:
    mats = result.asset_materializations_for_node(node)
    return {k: v.value for k, v in mats[-1].metadata.items()} if mats else {}


def _parquet_bytes(batches: list, compression: str = "zstd") -> int:
    import pyarrow.parquet as pq

    if not batches:
        return 0
    buf = io.BytesIO()
    with pq.ParquetWriter(buf, batches[0].schema, compression=compression) as w:
        for b in batches:
            w.write_batch(b)
    return buf.getbuffer().nbytes


def _violations(batch, time_column: str = "ts") -> int:
    """Joined events at or after their own row's time."""
    import pyarrow.compute as pc

    hist = batch.column(HIST)
    flat = pc.list_flatten(hist)
    if not len(flat):
        return 0
    row_ts = pc.take(batch.column(time_column), pc.list_parent_indices(hist))
    return int(pc.sum(pc.greater_equal(flat.field(time_column), row_ts)).as_py() or 0)


def run_sequences(lake, context: dict) -> Optional[dict]:
    """Materialize user_events + sequence_store per demo day, then a joined training read."""
    import pyarrow.compute as pc
    from dagster import DagsterInstance

    from assets.main import SAMPLES_TABLE
    from assets.sequences import EVENTS_TABLE, sequence_job
    from platform_defs.runs import run_job
    from resources import LakeResource

    keys = context.get("partitions") or []
    if not (keys and context.get("dagster_home") and context.get("home")) or SAMPLES_TABLE not in lake.tables():
        return None
    resources = {"lake": LakeResource(home=str(context["home"]))}

    per_day: dict[str, dict] = {}
    replaced = chain_bytes = 0
    instance = DagsterInstance.from_config(str(context["dagster_home"]))
    try:
        for key in keys:
            started = time.perf_counter()
            result = run_job(  # the sequence half of the day's main_job
                "main_job", instance, resources, partition_key=key, run_config=QUIET, tags=TAGS,
                asset_selection=["user_events", "sequence_store"],
            )
            ev, store = _materialized(result, "user_events"), _materialized(result, "sequence_store")
            per_day[key] = {
                "events": int(ev.get("events", 0)),
                "build": store.get("mode", "failed" if not result.success else ""),
                "store_events": int(store.get("events", 0)),
                "new_bytes": int(store.get("bytes", 0)),
                "build_s": float(store.get("build_seconds", 0.0)),
            }
            replaced += int(ev.get("replaced_events", 0))
            chain_bytes = int(store.get("store_bytes", 0))
        # the daily incremental builds stack layers (each user's re-encoded last chunk
        # shadows the older copy); a full rebuild, as sequence_job would run it, compacts them
        rebuild = run_job(
            sequence_job.name, instance, resources, tags=TAGS,
            run_config={**QUIET, "ops": {"sequence_store": {"config": {"incremental": False, "force": True}}}},
        )
        rebuilt = _materialized(rebuild, "sequence_store")
    finally:
        instance.dispose()

    st = lake.sequence_table(EVENTS_TABLE)
    samples = lake.table(SAMPLES_TABLE)
    info = st.build_for()  # the build of the head: the one the view serves
    head = st.stats()
    view = st.view(key="user_id", time="ts", columns=HIST_COLUMNS, max_len=MAX_LEN)

    # -- the training read: batches of ml.samples with the joined history ------------------
    rows = joined = empty = violations = longest = 0
    started = time.perf_counter()
    for batch in samples.batches(batch_size=BATCH_SIZE, sequences={HIST: view}):
        lens = pc.list_value_length(batch.column(HIST))
        rows += batch.num_rows
        joined += int(pc.sum(lens).as_py() or 0)
        empty += int(pc.sum(pc.equal(lens, 0)).as_py() or 0)
        longest = max(longest, int(pc.max(lens).as_py() or 0))
        violations += _violations(batch)
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    plain_rows = sum(b.num_rows for b in samples.batches(batch_size=BATCH_SIZE))
    plain_seconds = time.perf_counter() - started

    # -- a denormalized copy: every row carrying its history, all attributes ---------------
    full_view = st.view(key="user_id", time="ts", columns=None, max_len=MAX_LEN)
    fraction = min(1.0, MEASURE_ROWS / rows) if rows else 1.0
    with_hist: list = []
    measured = 0
    for batch in samples.batches(batch_size=BATCH_SIZE, sample=fraction if fraction < 1 else None,
                                 sequences={HIST: full_view}):
        with_hist.append(batch)
        measured += batch.num_rows
    without = [b.drop_columns([HIST]) for b in with_hist]
    hist_bytes = _parquet_bytes(with_hist) - _parquet_bytes(without)
    denormalized = int(hist_bytes * rows / measured) if measured else 0

    store_bytes = int(info.store_bytes)
    out: dict[str, Any] = {
        "table": EVENTS_TABLE,
        "store_build": f"{info.build_id} ({'incremental' if info.incremental else 'full'})",
        "store_matches_head": info.snapshot_id == head.get("snapshot_id"),
        "users": int(info.users),
        "events": int(info.events),
        "table_events": int(head.get("rows", 0)),
        "events_replaced": replaced,  # > 0 when the demo re-runs its days: replaced, not duplicated
        "hist_columns": ", ".join(HIST_COLUMNS),
        "max_len": MAX_LEN,
        "rows": rows,
        "read_seconds": round(seconds, 3),
        "rows_per_second": round(rows / seconds, 1) if seconds > 0 else None,
        "rows_per_second_without_join": round(plain_rows / plain_seconds, 1) if plain_seconds > 0 else None,
        "events_joined": joined,
        "events_per_row": round(joined / rows, 2) if rows else 0.0,
        "rows_without_history": empty,
        "longest_history": longest,
        "violations": violations,
        "store_bytes_incremental_chain": int(chain_bytes),
        "full_rebuild_seconds": float(rebuilt.get("build_seconds", 0.0)),
        "store_bytes": store_bytes,
        "events_table_bytes": int(head.get("bytes", 0)),
        "denormalized_bytes": denormalized,
        "denormalized_measured_rows": measured,
        "denormalized_over_store": round(denormalized / store_bytes, 2) if store_bytes else None,
        # each stored event reaches this many training rows (the copies a denormalized table holds)
        "copies_per_event": round(joined / int(info.events), 2) if info.events else 0.0,
        "per_day": per_day,
    }
    return out


__all__ = ["run_sequences"]
