"""Group ``main``, normalized user sequences: ``user_events`` -> ``sequence_store``.

Meta's Sequence Storage: a training row of ``ml.samples`` carries only a
pointer (``user_id`` + ``ts``); each user's event history is stored once, in
the sequence table ``ml.user_events``, and served from a key-value store
built offline from it. A reader joins the histories back at read time
(``t.batches(sequences={"hist": st.view(...)})``), strictly before each row's
``ts``.

* ``user_events`` (daily partitions, the same :data:`assets.main.daily_partitions`
  as the samples): the day's events from the synthetic event-history
  generator, for the impressions' user population (ids ``0 .. users-1``,
  the range ``impressions_for_day`` draws ``user_id`` from), with ``ts``
  inside the day. The table is partitioned by ``day(ts)``.

  Re-materializing a day must not duplicate events. ``SequenceTable`` has no
  event-aware ``overwrite`` (the inherited ``Table.overwrite`` would bypass the
  event-id assignment and sorting that ``SequenceTable.append`` does), so the
  day is replaced by ``delete(day's ts range)`` then ``append`` -- two commits.
  The delete drops whole data files (the table is day-partitioned, so no file
  is rewritten) and commits nothing when the day is absent. If the run fails
  between the two commits the day is missing, never doubled, and the asset
  fails: re-running it restores the day. Should ``SequenceTable`` gain its own
  ``overwrite``, the asset uses it instead (one atomic commit).

* ``sequence_store`` (unpartitioned, depends on every ``user_events``
  partition): ``st.build()`` of the main-branch head. Incremental by default:
  after appends only the users with new events are re-encoded; after a day was
  replaced (files removed) the engine extends the newest build whose files are
  all still live, or builds in full. A head that already has a build is
  reused, not rebuilt. Builds no retained snapshot needs are deleted by the
  nightly ``garbage_collection`` asset (``lake.collect_garbage``), not here.

``main_job`` selects the whole group: a daily run appends the day's events and
then builds the store incrementally (an unpartitioned asset runs un-partitioned
inside a partitioned run). ``sequence_job`` rebuilds the store alone.

No ``from __future__ import annotations`` here: Dagster resolves the config and
resource parameters of asset functions from real (not string) annotations.
"""
import inspect
import os
import time
from datetime import date, datetime, timedelta
from typing import Iterator, List, Optional

import pyarrow as pa
import pyarrow.compute as pc
from dagster import (
    AllPartitionMapping,
    AssetDep,
    AssetExecutionContext,
    AssetSelection,
    Config,
    Failure,
    MaterializeResult,
    MetadataValue,
    asset,
    define_asset_job,
)
from pydantic import Field

from assets.main import GROUP, START, daily_partitions, day_filter, day_index, partition_day
from assets.metadata import with_mib
from resources import RAY, LakeResource, RayCluster, path_metadata

EVENTS_TABLE = "ml.user_events"
KEY_COLUMN = "user_id"
TIME_COLUMN = "ts"
EVENTS_PARTITION_BY = ["day(ts)"]
#: A day's events are day 0 of a SPREAD_DAYS-day generator call: every user gets a
#: binomial number of events that day (mean ``events_per_user``), not the same count.
SPREAD_DAYS = 7
DEFAULT_EVENTS_PER_USER = 8
#: The store's column groups, hot first: training reads item_id + event_type (+ ts, always in
#: the first group); fixed-width and low-cardinality columns decode as raw fixed-size chunks,
#: ~2x faster joins than one Arrow-IPC group holding the list column ``tags`` too.
DEFAULT_COLUMN_GROUPS = [["item_id", "event_type"], ["dwell", "tags"]]
#: Events per stored chunk. A day adds ~8 events per user and training reads the last 64:
#: small chunks keep an incremental build's re-encoded tail (each user's last, partial
#: chunk) small and a 64-event read at 2-3 chunks (the engine's default is 128).
DEFAULT_CHUNK_EVENTS = 32


def impressions_users() -> int:
    """The user population of the impressions generator (its ``users`` default)."""
    from featurelake.synthetic import impressions_for_day

    return int(inspect.signature(impressions_for_day).parameters["users"].default)


def default_events_per_user() -> int:
    """Mean events per user per day (FEATURELAKE_DEMO_EVENTS_PER_USER, default 8)."""
    return int(os.environ.get("FEATURELAKE_DEMO_EVENTS_PER_USER") or DEFAULT_EVENTS_PER_USER)


def day_seed(seed: int, index: int) -> int:
    """The generator seed of day ``index``: the generator keys its randomness by seed and
    day offset from ``start``, and every call here starts at the partition's day."""
    return (int(seed) << 20) | int(index)


def day_bounds(day: date) -> tuple:
    lo = datetime(day.year, day.month, day.day)
    return lo, lo + timedelta(days=1)


def day_event_batches(
    index: int, users: int, events_per_user: int, seed: int = 0, start: Optional[date] = None
) -> Iterator[pa.RecordBatch]:
    """The events of day ``index`` (0 = ``start``): users ``0 .. users-1``, ``ts`` in the day.

    Deterministic in its arguments. Built on ``featurelake.synthetic.user_events``:
    a ``SPREAD_DAYS``-day call starting at the day, of which only the first day
    is kept (the generator streams day by day, so the rest is never drawn
    beyond the next day's first block).
    """
    from featurelake.synthetic import user_events

    day = (start or START) + timedelta(days=int(index))
    lo, hi = day_bounds(day)
    hi_scalar = pa.scalar(hi, pa.timestamp("us"))
    stream = user_events(
        int(users),
        int(events_per_user) * SPREAD_DAYS,
        days=SPREAD_DAYS,
        start=day,
        seed=day_seed(seed, index),
    )
    for batch in stream:
        inside = pc.less(batch.column(TIME_COLUMN), hi_scalar)
        kept = batch.filter(inside)
        if kept.num_rows:
            yield kept
        if kept.num_rows < batch.num_rows:  # the stream is in time order: the day is over
            return


def day_events(
    index: int, users: int, events_per_user: int, seed: int = 0, start: Optional[date] = None
) -> pa.Table:
    """All of :func:`day_event_batches` as one table (one day fits in memory)."""
    from featurelake.synthetic import user_events_schema

    batches = list(day_event_batches(index, users, events_per_user, seed, start))
    return pa.Table.from_batches(batches, schema=user_events_schema())


def ensure_events_table(lake):
    """Open ``ml.user_events``, creating the sequence table (day partitions) if missing."""
    from featurelake.errors import TableExistsError
    from featurelake.synthetic import user_events_schema

    if not lake.table_exists(EVENTS_TABLE):
        try:
            return lake.create_sequence_table(
                EVENTS_TABLE,
                schema=user_events_schema(),
                key=KEY_COLUMN,
                time=TIME_COLUMN,
                partition_by=EVENTS_PARTITION_BY,
            )
        except TableExistsError:  # a concurrent partition run created it first
            pass
    return lake.sequence_table(EVENTS_TABLE)


def _has_own_overwrite(st) -> bool:
    """Whether the sequence table class defines an event-aware ``overwrite``."""
    from featurelake.sequences import SequenceTable

    return "overwrite" in SequenceTable.__dict__ and isinstance(st, SequenceTable)


def replace_day(st, events: pa.Table, day: date) -> tuple:
    """Replace ``day`` of the sequence table with ``events``; returns (snapshot id, mode, filter)."""
    filt = day_filter(day, st.iceberg.schema().as_arrow().field(TIME_COLUMN).type)
    if _has_own_overwrite(st):
        return st.overwrite(events, filter=filt), "overwrite", filt
    st.delete(filt)  # no commit when the day is absent
    snapshot_id = st.append(events) if events.num_rows else st.stats().get("snapshot_id")
    return snapshot_id, "delete+append", filt


class UserEventsConfig(Config):
    users: int = Field(
        default_factory=impressions_users,
        description="Users 0..users-1 get events; the default is the impressions' user population "
        "(so every sample's user_id has a history).",
    )
    events_per_user: int = Field(
        default_factory=default_events_per_user,
        description="Mean events per user per day (binomial per user).",
    )
    seed: int = Field(default=0, description="Generator seed.")


@asset(
    group_name=GROUP,
    partitions_def=daily_partitions,
    kinds={"iceberg"},
    description=f"The day's user events in the sequence table {EVENTS_TABLE} (key {KEY_COLUMN}, "
    f"time {TIME_COLUMN}, partitioned by day(ts)), for the impressions' users; a day is replaced, "
    "never duplicated.",
)
def user_events(
    context: AssetExecutionContext, config: UserEventsConfig, lake: LakeResource
) -> MaterializeResult:
    day = partition_day(context.partition_key)
    index = day_index(day)
    if index < 0:
        raise Failure(f"partition {day} is before the data start {START}")
    if config.users < 1 or config.events_per_user < 0 or config.seed < 0:
        raise Failure(
            f"user_events: users must be >= 1, events_per_user and seed >= 0 (got {config.users}, "
            f"{config.events_per_user}, {config.seed})"
        )
    started = time.perf_counter()
    events = day_events(index, config.users, config.events_per_user, config.seed)
    lo, hi = day_bounds(day)
    if events.num_rows:
        bounds = pc.min_max(events.column(TIME_COLUMN)).as_py()
        if bounds["min"] < lo or bounds["max"] >= hi:
            raise Failure(f"generated events of {day} span {bounds['min']}..{bounds['max']}: outside the day")

    st = ensure_events_table(lake.lake())
    rows_before = int(st.stats().get("rows", 0))
    snapshot_id, mode, filt = replace_day(st, events, day)
    seconds = time.perf_counter() - started
    stats = st.stats()
    rows_after = int(stats.get("rows", 0))
    replaced = rows_before + events.num_rows - rows_after
    users = int(pc.count_distinct(events.column(KEY_COLUMN)).as_py()) if events.num_rows else 0
    context.log.info(
        f"{EVENTS_TABLE}: {events.num_rows} events of {day} for {users} users ({mode}, "
        f"{replaced} replaced); table now {rows_after} events (snapshot {snapshot_id})"
    )
    return MaterializeResult(
        metadata=with_mib({
            "table": MetadataValue.text(EVENTS_TABLE),
            "day": MetadataValue.text(day.isoformat()),
            "events": MetadataValue.int(events.num_rows),
            "dagster/row_count": MetadataValue.int(events.num_rows),
            "users": MetadataValue.int(users),
            "replaced_events": MetadataValue.int(replaced),
            "mode": MetadataValue.text(mode),
            "filter": MetadataValue.text(filt),
            "table_events": MetadataValue.int(rows_after),
            "files": MetadataValue.int(int(stats.get("data_files", 0))),
            "bytes": MetadataValue.int(int(stats.get("bytes", 0))),
            "snapshot_id": MetadataValue.text(str(snapshot_id)),
            "seed": MetadataValue.int(config.seed),
            "seconds": MetadataValue.float(round(seconds, 4)),
        })
    )


# ---------------------------------------------------------------------------------
class SequenceStoreConfig(Config):
    incremental: bool = Field(
        default=True,
        description="Extend the newest build when only appends happened since (else a full build).",
    )
    force: bool = Field(default=False, description="Build even if the head already has a build.")
    column_groups: Optional[List[List[str]]] = Field(
        default_factory=lambda: [list(g) for g in DEFAULT_COLUMN_GROUPS],
        description="Attribute groups fetched separately, hot first (the first also holds ts); "
        "None: the engine's default, one group (or, with chunk_events None too, the previous "
        "build's layout). A change of layout makes the next build a full one.",
    )
    chunk_events: Optional[int] = Field(
        default=DEFAULT_CHUNK_EVENTS,
        description="Events per stored chunk (None together with column_groups None: the previous "
        "build's layout; None alone: the engine's default). A change makes the next build a full one.",
    )


@asset(
    group_name=GROUP,
    deps=[AssetDep(user_events, partition_mapping=AllPartitionMapping())],
    kinds={"rocksdb"},
    resource_defs={"ray": RAY},
    description=f"The serving store of {EVENTS_TABLE}: each user's events once, in time-ordered "
    "chunks, bulk-loaded into a key-value store (one IO per read); built incrementally from the "
    "main-branch head. Training reads join it back: t.batches(sequences={'hist': view}).",
)
def sequence_store(
    context: AssetExecutionContext, config: SequenceStoreConfig, lake: LakeResource, ray: RayCluster
) -> MaterializeResult:
    lk = lake.lake()
    if not lk.table_exists(EVENTS_TABLE):
        raise Failure(f"{EVENTS_TABLE} does not exist yet: materialize user_events first")
    st = lk.sequence_table(EVENTS_TABLE)
    started = time.perf_counter()
    known = {b.build_id for b in st.builds()}
    options = dict(
        incremental=config.incremental,
        force=config.force,
        column_groups=config.column_groups,
        chunk_events=config.chunk_events,
    )
    ray_path = ray.chooses_ray(st.stats().get("bytes", 0))
    try:
        if ray_path:
            from featurelake import ray as distributed

            ray.ensure_connected(context)
            info = distributed.build_sequences(st, tasks=ray.tasks, **options)
        else:
            info = st.build(**options)
    except Exception as e:
        from featurelake.errors import FeatureLakeError

        if isinstance(e, FeatureLakeError):
            raise Failure(f"sequence_store: {e}") from e
        raise
    reused = info.build_id in known
    builds = st.builds()
    seconds = time.perf_counter() - started
    head = st.stats().get("snapshot_id")
    mode = "reused" if reused else ("incremental" if info.incremental else "full")
    context.log.info(
        f"{EVENTS_TABLE}: {mode} store build {info.build_id} of snapshot {info.snapshot_id}: "
        f"{info.users} users, {info.events} events, {info.bytes} new bytes "
        f"({info.store_bytes} in the store), {info.seconds:.3f} s"
    )
    return MaterializeResult(
        metadata=with_mib({
            "table": MetadataValue.text(EVENTS_TABLE),
            "build_id": MetadataValue.text(info.build_id),
            # snapshot ids are 63-bit: text keeps them exact in the UI (GraphQL ints are 32-bit)
            "snapshot_id": MetadataValue.text(str(info.snapshot_id)),
            "head_snapshot_id": MetadataValue.text(str(head)),
            "mode": MetadataValue.text(mode),
            "incremental": MetadataValue.bool(bool(info.incremental)),
            "reused": MetadataValue.bool(reused),
            "base_build": MetadataValue.text(str(info.base_build or "")),
            "users": MetadataValue.int(int(info.users)),
            "events": MetadataValue.int(int(info.events)),
            "dagster/row_count": MetadataValue.int(int(info.events)),
            "new_events": MetadataValue.int(int(info.new_events)),
            "affected_users": MetadataValue.int(int(info.affected_users)),
            "chunks": MetadataValue.int(int(info.chunks)),
            "layers": MetadataValue.int(len(info.layers)),
            "chunk_events": MetadataValue.int(int(info.chunk_events)),
            "bytes": MetadataValue.int(int(info.bytes)),
            "store_bytes": MetadataValue.int(int(info.store_bytes)),
            "build_seconds": MetadataValue.float(float(info.seconds)),
            "column_groups": MetadataValue.text(
                " | ".join(", ".join(g) for g in info.column_groups)
            ),
            # builds on disk; those no retained snapshot needs go with garbage collection
            "builds": MetadataValue.int(len(builds)),
            "path": MetadataValue.path(str(info.path)),
            "seconds": MetadataValue.float(round(seconds, 4)),
            **path_metadata(ray_path, info.tasks),
        })
    )


sequence_assets = [user_events, sequence_store]

sequence_job = define_asset_job(
    "sequence_job",
    selection=AssetSelection.assets(sequence_store),
    description=f"Rebuild the sequence store of {EVENTS_TABLE} from its main-branch head "
    "(unpartitioned; the daily main_job also builds it after appending the day's events).",
)

__all__ = [
    "EVENTS_TABLE",
    "user_events",
    "sequence_store",
    "sequence_assets",
    "sequence_job",
    "day_events",
    "day_event_batches",
    "ensure_events_table",
    "impressions_users",
]
