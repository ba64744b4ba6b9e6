"""Deterministic, streaming synthetic recommendation impressions.

Why: featurelake's tests, demos and benchmarks need training-sample data that
looks like a real ML sample workload -- a primary key, a user pointer plus an
event time (the Sequence Storage join key), a day-partitioned timestamp, dense
float features, a sparse id-list feature, a nested list<struct> feature and a
label -- at any size from a few rows to tens of millions, reproducibly and
without materializing it all in memory.

What: each impression is one row of :func:`impressions_schema`.

* ``sample_id`` is ``day * 10**10 + row_index``: globally unique across days and
  increasing within a day, so it doubles as the table's primary key.
* ``user_id`` follows a bounded power law (Zipf-like; P(rank k) ~ k**-user_skew,
  default 0.8: over 10k users the top 1% get ~30% of the impressions and the
  single heaviest user ~4%). Ranks are mapped to ids through a fixed seeded
  permutation, so the heavy users are scattered over the id space instead of
  being id 0, 1, 2. ``item_id`` (and the item ids inside the list features) is
  skewed the same way (``item_skew``, default 0.8) with its own permutation.
  Exponents above 1 (e.g. the textbook 1.2) concentrate a fifth of all traffic
  on one user, which is more skew than real sample tables show.
* ``ts`` is uniform within the day (not sorted).
* ``f0..fN`` are standard-normal float32 with ~1% nulls each (``null_rate``).
* ``clicked_items`` holds 0..20 recent clicked item ids; ``context`` holds
  0..5 ``{slot, item_id, weight}`` structs where ``slot`` is the position in
  the list. Lists are never null and hold no null elements.
* ``click`` is a 0/1 label, ~5% positive, drawn from
  ``sigmoid(-3.37 + f0)`` (a null ``f0`` counts as 0), so a model or a quality
  check can find the signal in ``f0``.

Everything is vectorized numpy/pyarrow. Rows are produced in fixed internal
blocks of :data:`BLOCK_ROWS` rows, each drawn from
``np.random.default_rng([seed, day, block_index])``; output batches are cut from
(or glued from) those blocks, so the data depends only on the generator
arguments and *not* on ``batch_size``. Memory stays flat: at most one batch plus
one block is alive at a time, whatever the total row count.
"""
from __future__ import annotations

import datetime as _dt
import functools
import itertools
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

__all__ = [
    "BLOCK_ROWS",
    "impressions_schema",
    "impressions_for_day",
    "generate_impressions",
    "impressions_table",
]

#: Rows per internal random block; each block has its own seeded Generator.
BLOCK_ROWS = 65_536
#: sample_id = day * SAMPLE_ID_DAY_STRIDE + row index within the day.
SAMPLE_ID_DAY_STRIDE = 10**10

USER_SKEW = 0.8
ITEM_SKEW = 0.8
MAX_CLICKED_ITEMS = 20
MAX_CONTEXT = 5
CONTEXT_SLOTS = 5
# Label model: P(click) = sigmoid(CLICK_BIAS + CLICK_WEIGHT * f0); with f0 ~ N(0, 1)
# the bias below gives a 5% mean click rate.
CLICK_BIAS = -3.3713
CLICK_WEIGHT = 1.0

_US_PER_DAY = 86_400 * 1_000_000
_EPOCH_ORDINAL = _dt.date(1970, 1, 1).toordinal()
_CONTEXT_STRUCT = pa.struct(
    [
        pa.field("slot", pa.int32()),
        pa.field("item_id", pa.int64()),
        pa.field("weight", pa.float32()),
    ]
)


def impressions_schema(dense_features: int = 8) -> pa.Schema:
    """The Arrow schema of the impressions, fields in a fixed order.

    ``sample_id``, ``user_id``, ``item_id`` (int64) and ``ts`` (timestamp[us],
    no time zone) are NOT NULL; then ``f0..f{dense_features-1}`` (float32),
    ``clicked_items`` (list<int64>), ``context``
    (list<struct<slot: int32, item_id: int64, weight: float32>>) and the label
    ``click`` (int32), all nullable.
    """
    _check_dense(dense_features)
    fields = [
        pa.field("sample_id", pa.int64(), nullable=False),
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("item_id", pa.int64(), nullable=False),
        pa.field("ts", pa.timestamp("us"), nullable=False),
    ]
    fields += [pa.field(f"f{i}", pa.float32()) for i in range(int(dense_features))]
    fields += [
        pa.field("clicked_items", pa.list_(pa.int64())),
        pa.field("context", pa.list_(_CONTEXT_STRUCT)),
        pa.field("click", pa.int32()),
    ]
    return pa.schema(fields)


def impressions_for_day(
    day: int,
    rows: int,
    *,
    start: _dt.date = _dt.date(2026, 1, 1),
    users: int = 10_000,
    items: int = 100_000,
    dense_features: int = 8,
    seed: int = 0,
    batch_size: int = 65_536,
    null_rate: float = 0.01,
    user_skew: float = USER_SKEW,
    item_skew: float = ITEM_SKEW,
) -> Iterator[pa.RecordBatch]:
    """Stream the ``rows`` impressions of day ``day`` (0-based offset from ``start``).

    Yields record batches of at most ``batch_size`` rows with
    :func:`impressions_schema` ``(dense_features)``. The same arguments always
    give identical data; ``batch_size`` only changes how the rows are cut into
    batches, never their values. ``user_id`` lies in ``[0, users)``, ``item_id``
    in ``[0, items)``, ``ts`` in ``[start + day, start + day + 1 day)``.
    ``null_rate`` is the fraction of nulls in each dense feature;
    ``user_skew``/``item_skew`` are the power-law exponents of user activity and
    item popularity (0 = uniform; larger = more skewed).

    Arguments are checked when this is called (``ValueError``), before any
    batch is requested.
    """
    _check_args(day, rows, users, items, dense_features, seed, batch_size, null_rate)
    for name, value in (("user_skew", user_skew), ("item_skew", item_skew)):
        if not 0.0 <= float(value) <= 10.0:
            raise ValueError(f"{name} must be within [0, 10], got {value!r}")
    if not isinstance(start, _dt.date):
        raise ValueError(f"start must be a datetime.date, got {start!r}")
    if isinstance(start, _dt.datetime):
        start = start.date()
    schema = impressions_schema(dense_features)
    day_start_us = (start.toordinal() - _EPOCH_ORDINAL + int(day)) * _US_PER_DAY
    n_blocks = -(-int(rows) // BLOCK_ROWS)

    def blocks() -> Iterator[pa.RecordBatch]:
        for b in range(n_blocks):
            lo = b * BLOCK_ROWS
            yield _block(
                schema, int(seed), int(day), b, lo, min(BLOCK_ROWS, int(rows) - lo), day_start_us,
                int(users), int(items), dense_features, float(null_rate),
                float(user_skew), float(item_skew),
            )

    return _batches(schema, blocks(), int(batch_size))


def generate_impressions(rows: int, days: int = 1, **kwargs: Any) -> Iterator[pa.RecordBatch]:
    """Stream ``rows`` impressions spread evenly over days ``0..days-1``.

    Each day gets ``rows // days`` rows and the first ``rows % days`` days one
    more. Keyword arguments go to :func:`impressions_for_day`.
    """
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 0:
        raise ValueError(f"rows must be a non-negative int, got {rows!r}")
    if isinstance(days, bool) or not isinstance(days, (int, np.integer)) or days < 1:
        raise ValueError(f"days must be a positive int, got {days!r}")
    base, extra = divmod(rows, days)
    # Build every day's (lazy) iterator now so bad arguments fail right away.
    per_day = [impressions_for_day(d, base + (1 if d < extra else 0), **kwargs) for d in range(days)]
    return itertools.chain.from_iterable(per_day)


def impressions_table(rows: int, days: int = 1, **kwargs: Any) -> pa.Table:
    """All of :func:`generate_impressions` as one ``pa.Table`` (small data only)."""
    schema = impressions_schema(kwargs.get("dense_features", 8))
    return pa.Table.from_batches(list(generate_impressions(rows, days, **kwargs)), schema=schema)


# ---------------------------------------------------------------- internals


def _check_dense(dense_features: int) -> None:
    if (
        isinstance(dense_features, bool)
        or not isinstance(dense_features, (int, np.integer))
        or dense_features < 1
    ):
        raise ValueError(f"dense_features must be an int >= 1 (the label depends on f0), got {dense_features!r}")


def _check_args(
    day: int, rows: int, users: int, items: int, dense_features: int,
    seed: int, batch_size: int, null_rate: float,
) -> None:
    def pos_int(name: str, value: Any, minimum: int) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")

    pos_int("day", day, 0)
    pos_int("rows", rows, 0)
    pos_int("users", users, 1)
    pos_int("items", items, 1)
    pos_int("seed", seed, 0)
    pos_int("batch_size", batch_size, 1)
    _check_dense(dense_features)
    if rows >= SAMPLE_ID_DAY_STRIDE:
        raise ValueError(f"rows per day must be < {SAMPLE_ID_DAY_STRIDE} to keep sample_id unique, got {rows}")
    if not 0.0 <= float(null_rate) <= 1.0:
        raise ValueError(f"null_rate must be within [0, 1], got {null_rate!r}")


@functools.lru_cache(maxsize=32)
def _permutation(seed: int, n: int, tag: int) -> np.ndarray:
    """A fixed permutation of ``range(n)`` mapping popularity rank to id."""
    perm = np.random.default_rng([seed, n, tag, 0x5EED]).permutation(n).astype(np.int64)
    perm.setflags(write=False)
    return perm


def _power_law_ranks(rng: np.random.Generator, size: int, n: int, a: float) -> np.ndarray:
    """``size`` ranks in ``[0, n)`` with P(rank k) roughly proportional to (k+1)**-a.

    Inverse-CDF sampling of a continuous power law truncated to ``[1, n+1)`` and
    floored: a bounded Zipf that costs one uniform draw and one pow per value.
    """
    if n == 1:
        return np.zeros(size, dtype=np.int64)
    u = rng.random(size)
    e = 1.0 - a
    if abs(e) < 1e-9:  # a == 1: density 1/x, inverse CDF (n+1)**u
        x = np.exp(u * np.log(n + 1.0))
    else:
        x = (1.0 + u * ((n + 1.0) ** e - 1.0)) ** (1.0 / e)
    ranks = x.astype(np.int64) - 1
    np.clip(ranks, 0, n - 1, out=ranks)
    return ranks


def _ids(rng: np.random.Generator, size: int, n: int, a: float, seed: int, tag: int) -> np.ndarray:
    return _permutation(seed, n, tag)[_power_law_ranks(rng, size, n, a)]


def _offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.empty(lengths.size + 1, dtype=np.int32)
    offsets[0] = 0
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _block(
    schema: pa.Schema, seed: int, day: int, block: int, lo: int, n: int, day_start_us: int,
    users: int, items: int, dense_features: int, null_rate: float,
    user_skew: float, item_skew: float,
) -> pa.RecordBatch:
    rng = np.random.default_rng([seed, day, block])

    sample_id = np.arange(lo, lo + n, dtype=np.int64) + day * SAMPLE_ID_DAY_STRIDE
    user_id = _ids(rng, n, users, user_skew, seed, 1)
    item_id = _ids(rng, n, items, item_skew, seed, 2)
    ts = rng.integers(0, _US_PER_DAY, size=n, dtype=np.int64) + day_start_us

    dense = rng.standard_normal((dense_features, n), dtype=np.float32)
    null_masks = rng.random((dense_features, n), dtype=np.float32) < null_rate if null_rate > 0 else None
    f0 = dense[0] if null_masks is None else np.where(null_masks[0], np.float32(0), dense[0])
    p_click = 1.0 / (1.0 + np.exp(-(CLICK_BIAS + CLICK_WEIGHT * f0.astype(np.float64))))
    click = (rng.random(n) < p_click).astype(np.int32)

    clicked_len = rng.integers(0, MAX_CLICKED_ITEMS + 1, size=n, dtype=np.int32)
    clicked_off = _offsets(clicked_len)
    clicked_vals = _ids(rng, int(clicked_off[-1]), items, item_skew, seed, 2)

    ctx_len = rng.integers(0, MAX_CONTEXT + 1, size=n, dtype=np.int32)
    ctx_off = _offsets(ctx_len)
    m = int(ctx_off[-1])
    slot = (np.arange(m, dtype=np.int32) - np.repeat(ctx_off[:-1], ctx_len)).astype(np.int32)
    ctx_item = _ids(rng, m, items, item_skew, seed, 2)
    ctx_weight = rng.random(m, dtype=np.float32)
    ctx_struct = pa.StructArray.from_arrays(
        [pa.array(slot), pa.array(ctx_item), pa.array(ctx_weight)],
        fields=list(_CONTEXT_STRUCT),
    )

    arrays = [
        pa.array(sample_id),
        pa.array(user_id),
        pa.array(item_id),
        pa.array(ts, type=pa.timestamp("us")),
    ]
    for i in range(dense_features):
        mask = None if null_masks is None else null_masks[i]
        arrays.append(pa.array(dense[i], type=pa.float32(), mask=mask))
    arrays += [
        pa.ListArray.from_arrays(pa.array(clicked_off), pa.array(clicked_vals)),
        pa.ListArray.from_arrays(pa.array(ctx_off), ctx_struct),
        pa.array(click),
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _batches(
    schema: pa.Schema, blocks: Iterator[pa.RecordBatch], batch_size: int
) -> Iterator[pa.RecordBatch]:
    """Cut a stream of blocks into batches of at most ``batch_size`` rows."""
    if batch_size <= BLOCK_ROWS:
        # Zero-copy slices of each block; a batch never straddles two blocks.
        for block in blocks:
            for off in range(0, block.num_rows, batch_size):
                yield block.slice(off, batch_size)
        return

    # Large batches: glue whole blocks together (and split a block when needed).
    pending: list[pa.RecordBatch] = []
    pending_rows = 0
    for block in blocks:
        off = 0
        while off < block.num_rows:
            take = min(block.num_rows - off, batch_size - pending_rows)
            pending.append(block.slice(off, take))
            pending_rows += take
            off += take
            if pending_rows == batch_size:
                yield _concat(schema, pending)
                pending, pending_rows = [], 0
    if pending:
        yield _concat(schema, pending)


def _concat(schema: pa.Schema, batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    if len(batches) == 1:
        return batches[0]
    concat = getattr(pa, "concat_batches", None)
    if concat is not None:
        return concat(batches)
    return pa.Table.from_batches(batches, schema=schema).combine_chunks().to_batches()[0]


# ------------------------------------------------------------ user events
#
# Event histories for normalized sequences (featurelake.sequences): one row per
# user event, streamed in time order like an event log, users interleaved.

EVENT_TYPES = ("view", "click", "cart", "purchase")
EVENT_TYPE_P = (0.70, 0.22, 0.06, 0.02)
MAX_EVENT_TAGS = 3
EVENT_TAG_VALUES = 1_000


def user_events_schema(nested: bool = True) -> pa.Schema:
    """The Arrow schema of :func:`user_events`.

    ``user_id`` (int64) and ``ts`` (timestamp[us]) are NOT NULL; then
    ``item_id`` (int64), ``event_type`` (string, one of :data:`EVENT_TYPES`),
    ``dwell`` (float32 seconds) and, when ``nested``, ``tags``
    (list<int32>, 0..3 values).
    """
    fields = [
        pa.field("user_id", pa.int64(), nullable=False),
        pa.field("ts", pa.timestamp("us"), nullable=False),
        pa.field("item_id", pa.int64()),
        pa.field("event_type", pa.string()),
        pa.field("dwell", pa.float32()),
    ]
    if nested:
        fields.append(pa.field("tags", pa.list_(pa.int32())))
    return pa.schema(fields)


def user_events(
    users: int,
    events_per_user: int,
    *,
    days: int = 30,
    start: _dt.date = _dt.date(2026, 1, 1),
    items: int = 100_000,
    seed: int = 0,
    batch_size: int = 65_536,
    nested: bool = True,
    first_user: int = 0,
    item_skew: float = ITEM_SKEW,
    repeat_rate: float = 0.0,
    favorites: int = 32,
) -> Iterator[pa.RecordBatch]:
    """Stream exactly ``events_per_user`` events for each of ``users`` users, in time order.

    Users are ``first_user .. first_user + users - 1``; each user's events are
    spread over ``days`` days from ``start`` (a seeded multinomial split per
    user, uniform times within a day); within a day the stream is sorted by
    ``ts`` with users interleaved, as an event log arrives. ``item_id`` is
    power-law popular (``item_skew``), ``event_type`` mostly views, ``dwell``
    exponential (mean 20 s). With ``repeat_rate`` > 0 that share of a user's
    events revisits one of the user's ``favorites`` items (repeat consumption,
    as in real logs), so a user's events resemble each other. Memory holds one
    day of events at a time; the same arguments always give the same events,
    whatever ``batch_size``.
    """
    for name, value, minimum in (("users", users, 1), ("events_per_user", events_per_user, 0), ("days", days, 1),
                                 ("items", items, 1), ("seed", seed, 0), ("batch_size", batch_size, 1),
                                 ("first_user", first_user, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
            raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    if not 0.0 <= float(repeat_rate) <= 1.0:
        raise ValueError(f"repeat_rate must be within [0, 1], got {repeat_rate!r}")
    if isinstance(favorites, bool) or not isinstance(favorites, (int, np.integer)) or favorites < 1:
        raise ValueError(f"favorites must be an int >= 1, got {favorites!r}")
    if isinstance(start, _dt.datetime):
        start = start.date()
    schema = user_events_schema(nested)
    fav = (
        _ids(np.random.default_rng([seed, 0xFA, first_user, users]), int(users) * int(favorites), int(items),
             float(item_skew), int(seed), 2).reshape(int(users), int(favorites))
        if repeat_rate > 0 else None
    )
    counts = np.random.default_rng([seed, 0xC0, users, events_per_user, days]).multinomial(
        int(events_per_user), [1.0 / days] * int(days), size=int(users)
    )
    ids = np.arange(first_user, first_user + users, dtype=np.int64)
    day0 = (start.toordinal() - _EPOCH_ORDINAL) * _US_PER_DAY
    codes = pa.array(list(EVENT_TYPES))

    def day_batches() -> Iterator[pa.RecordBatch]:
        for d in range(int(days)):
            per_user = counts[:, d]
            n = int(per_user.sum())
            if n == 0:
                continue
            rng = np.random.default_rng([seed, 0xE7E7, d])
            uid = np.repeat(ids, per_user)
            ts = rng.integers(0, _US_PER_DAY, size=n, dtype=np.int64) + day0 + d * _US_PER_DAY
            order = np.argsort(ts, kind="stable")
            item = _ids(rng, n, int(items), float(item_skew), int(seed), 2)
            if fav is not None:
                again = rng.random(n) < repeat_rate
                pick = rng.integers(0, int(favorites), size=n)
                item = np.where(again, fav[uid - first_user, pick], item)
            etype = rng.choice(len(EVENT_TYPES), size=n, p=EVENT_TYPE_P).astype(np.int8)
            dwell = rng.exponential(20.0, size=n).astype(np.float32)
            arrays = [
                pa.array(uid[order]),
                pa.array(ts[order], type=pa.timestamp("us")),
                pa.array(item[order]),
                pa.DictionaryArray.from_arrays(pa.array(etype[order]), codes).cast(pa.string()),
                pa.array(dwell[order]),
            ]
            if nested:
                lens = rng.integers(0, MAX_EVENT_TAGS + 1, size=n, dtype=np.int32)[order]
                vals = rng.integers(0, EVENT_TAG_VALUES, size=int(lens.sum()), dtype=np.int32)
                arrays.append(pa.ListArray.from_arrays(pa.array(_offsets(lens)), pa.array(vals)))
            yield pa.RecordBatch.from_arrays(arrays, schema=schema)

    return _batches(schema, day_batches(), int(batch_size))


def user_events_table(users: int, events_per_user: int, **kwargs: Any) -> pa.Table:
    """All of :func:`user_events` as one ``pa.Table`` (small data only)."""
    schema = user_events_schema(kwargs.get("nested", True))
    return pa.Table.from_batches(list(user_events(users, events_per_user, **kwargs)), schema=schema)


__all__ += ["user_events_schema", "user_events", "user_events_table", "EVENT_TYPES"]
