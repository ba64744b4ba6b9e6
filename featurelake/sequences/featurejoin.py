"""Joining entity features onto reads: ``Table.read/batches(features={name: view})``, next to ``sequences=``.

A :class:`FeatureView` (from ``FeatureTable.view()``) pairs one build of a
feature table's store with the training table's key column and, optionally,
its time column. Each row gets the entity's feature values of the last
version strictly before the row's time (``as_of``), or of the latest version
(no ``as_of``). The lookup is the sequence store's own
(:meth:`featurelake.sequences.lookup.SequenceStore.lookup` with ``max_len=1``):
heads of the batch's unique entities, the one chunk holding the version
wanted, batched multi-gets.

Output: **one column per feature**, named ``"<view name>.<feature>"``
(``item.price``, ``item.emb``), appended after the read's columns (and after
the sequence columns). A row whose key is null, unknown, or has no version
before its time gets nulls. Embedding columns (declared as fixed-size lists)
come back as ``pa.FixedSizeListArray`` whose values buffer has no nulls
(missing rows hold zeros under a null slot), so
``col.values.to_numpy(zero_copy_only=True).reshape(-1, dim)`` is a view.

The helpers at the bottom (:func:`plan_joins`, :func:`apply_joins`,
:func:`apply_joins_batches`) are what ``Table.read/batches`` and the training
reader call for both kinds of join: sequences first (unchanged), then
features; in a stream each kind runs one batch ahead in its own thread.
"""
from __future__ import annotations

import threading
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa

from featurelake.errors import FeatureLakeError, SchemaMismatchError
from featurelake.sequences.join import (
    JOIN_SLICE_ROWS,
    SequenceView,
    columns_for_join,
    join_sequences,
    join_sequences_batches,
    pipelined,
)
from featurelake.sequences.arguments import as_array
from featurelake.sequences.lookup import SequenceStore


class FeatureView:
    """What ``Table.read/batches(features={name: view})`` joins: a feature store build plus the join's columns.

    ``key`` is the training table's column holding the entity key, ``time``
    (``as_of``) its time column or None for the latest version. ``columns``
    are the feature columns joined (the version time column may be one of
    them); ``embeddings`` maps embedding columns to their dimension.
    """

    def __init__(self, store: SequenceStore, table: str, key: str, time: str | None, columns: list[str],
                 embeddings: dict[str, int], threads: int, batch_keys: int) -> None:
        self.store = store
        self.table = table
        self.key = key
        self.time = time
        self.columns = columns
        self.embeddings = {c: d for c, d in embeddings.items() if c in columns}
        self.threads = threads
        self.batch_keys = batch_keys
        self.stats: dict[str, int] = {}
        self._stats_lock = threading.Lock()

    def __repr__(self) -> str:
        return (f"FeatureView({self.table}@{self.store.info.snapshot_id}, key={self.key!r}, as_of={self.time!r}, "
                f"columns={self.columns})")

    def field(self, col: str) -> pa.Field:
        """The output field of feature ``col`` (unnamed: the view's name is prefixed by the join)."""
        f = self.store._field(col)
        if col in self.embeddings:
            return pa.field(col, pa.list_(f.type.value_type, self.embeddings[col]))
        return pa.field(col, f.type)

    def output_fields(self, name: str) -> list[pa.Field]:
        return [pa.field(f"{name}.{c}", self.field(c).type) for c in self.columns]

    def check(self, name: str, schema: pa.Schema, taken: Sequence[str]) -> None:
        """A clear error when the read lacks the key or time column, has the wrong types, or clashes."""
        names = schema.names
        clash = [f.name for f in self.output_fields(name) if f.name in taken]
        if clash:
            raise SchemaMismatchError(f"feature column(s) {clash} of view {name!r} clash with columns of the read", clash)
        missing = [c for c in (self.key, self.time) if c is not None and c not in names]
        if missing:
            raise SchemaMismatchError(f"the read has no column(s) {missing} for features {name!r}", missing)
        kt = schema.field(self.key).type
        int_store = pa.types.is_integer(self.store.key_type)
        ok = pa.types.is_integer(kt) if int_store else (pa.types.is_string(kt) or pa.types.is_large_string(kt))
        if not ok and not pa.types.is_null(kt):
            raise SchemaMismatchError(
                f"features {name!r}: key column {self.key!r} is {kt}, but {self.table} is keyed by "
                f"{'integers' if int_store else 'strings'} ({self.store.key_type})", [self.key])
        if self.time is not None:
            tt, st = schema.field(self.time).type, self.store.time_type
            ok = (pa.types.is_timestamp(tt) or pa.types.is_date(tt)) if pa.types.is_timestamp(st) else pa.types.is_integer(tt)
            if not ok:
                raise SchemaMismatchError(
                    f"features {name!r}: as_of column {self.time!r} is {tt}, but {self.table}'s versions are timed by {st}",
                    [self.time])

    def join(self, keys: pa.Array, times: pa.Array | None) -> list[pa.Array]:
        """The feature columns for one batch of training rows, in ``columns`` order."""
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        if isinstance(times, pa.ChunkedArray):
            times = times.combine_chunks()
        n = len(keys)
        found, stats = self.store.lookup_stats(as_array(keys, self.store.key_type), times, self.columns, 1, None,
                                               self.threads, self.batch_keys)
        with self._stats_lock:  # the background join workers share the view
            for k, v in stats.items():
                self.stats[k] = self.stats.get(k, 0) + v
        offsets = found.offsets.to_numpy()
        has = offsets[1:] > offsets[:-1]
        idx = pa.array(offsets[:-1].astype(np.int64), mask=None if has.all() else ~has)
        values = found.values
        out = []
        for i, col in enumerate(self.columns):
            child = values.field(i)
            picked = child.take(idx) if len(child) or not n else pa.nulls(n, child.type)
            out.append(_fixed_size(picked, self.embeddings[col], col) if col in self.embeddings else picked)
        return out


def _fixed_size(arr: pa.Array, dim: int, col: str) -> pa.FixedSizeListArray:
    """A (large) list array whose valid entries all hold ``dim`` values, as a fixed-size list array.

    The values buffer gets zeros under null entries, so it has no nulls of
    its own and converts to numpy without a copy.
    """
    n = len(arr)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool) if arr.null_count else None
    flat = arr.flatten()
    vt = flat.type
    good = n if valid is None else int(valid.sum())
    if len(flat) != good * dim or flat.null_count:
        raise SchemaMismatchError(f"embedding column {col!r} holds a value that is not {dim} non-null numbers "
                                  "(written around the feature table?)", [col])
    typ = pa.list_(vt, dim)
    if valid is None:
        return pa.FixedSizeListArray.from_arrays(flat, type=typ)
    dense = np.zeros((n, dim), dtype=vt.to_pandas_dtype())
    dense[valid] = flat.to_numpy(zero_copy_only=False).reshape(-1, dim)
    return pa.FixedSizeListArray.from_arrays(pa.array(dense.reshape(-1)), type=typ, mask=pa.array(~valid))


# ============================================================ read-time joins
def _check_feature_views(features: dict[str, Any], schema: pa.Schema, sequences: dict[str, Any] | None = None) -> None:
    taken = list(schema.names) + [n for n in (sequences or {}) if n not in schema.names]
    for name, view in features.items():
        if not isinstance(view, FeatureView):
            raise FeatureLakeError(f"features[{name!r}] must be a view from FeatureTable.view(), not {type(view).__name__}")
        if not isinstance(name, str) or not name:
            raise FeatureLakeError(f"feature view names must be non-empty strings, not {name!r}")
        view.check(name, schema, taken)
        taken += [f.name for f in view.output_fields(name)]


def _join_features_one(data, features: dict[str, Any]):
    for name, view in features.items():
        cols = view.join(data.column(view.key), data.column(view.time) if view.time is not None else None)
        for f, col in zip(view.output_fields(name), cols):
            data = data.append_column(f, col)
    return data


def _empty_with_features(schema: pa.Schema, features: dict[str, Any]) -> pa.Schema:
    for name, view in features.items():
        for f in view.output_fields(name):
            schema = schema.append(f)
    return schema


def join_features(result: pa.Table, features: dict[str, Any], drop: Sequence[str] = ()) -> pa.Table:
    """Append the feature columns of every view to ``result`` (row order kept), slice by slice."""
    _check_feature_views(features, result.schema)
    parts = [_join_features_one(pa.Table.from_batches([b]), features)
             for b in result.to_batches(max_chunksize=JOIN_SLICE_ROWS) if b.num_rows]
    out = pa.concat_tables(parts) if parts else _empty_with_features(result.schema, features).empty_table()
    return out.drop_columns(list(drop)) if drop else out


def join_features_batches(stream: Iterator[pa.RecordBatch], features: dict[str, Any], drop: Sequence[str] = (),
                          prefetch: int = 1) -> Iterator[pa.RecordBatch]:
    """Join each batch of ``stream``; the next batch is joined in the background while one is consumed."""
    def checked() -> Iterator[pa.RecordBatch]:
        first = True
        for batch in stream:
            if first:
                _check_feature_views(features, batch.schema)
                first = False
            yield batch

    return pipelined(checked(), lambda b: _join_features_one(b, features), drop, prefetch, name="featurelake-features")


def plan_joins(columns: Sequence[str] | None, sequences: dict[str, Any] | None,
               features: dict[str, Any] | None) -> tuple[list[str] | None, list[str]]:
    """The columns a read must fetch for its sequence and feature joins, and those to drop afterwards."""
    return columns_for_join(columns, {**(sequences or {}), **{f"\x00{k}": v for k, v in (features or {}).items()}})


def check_joins(schema: pa.Schema, sequences: dict[str, Any] | None, features: dict[str, Any] | None) -> None:
    """Fail before the first batch when a view does not fit the read's schema (``schema``: what the scan yields)."""
    from featurelake.sequences.join import _check_views

    if sequences:
        _check_views(sequences, schema.names)
    if features:
        _check_feature_views(features, schema, sequences)


def apply_joins(result: pa.Table, sequences: dict[str, Any] | None, features: dict[str, Any] | None,
                drop: Sequence[str] = ()) -> pa.Table:
    """``result`` with the sequence columns, then the feature columns, joined; ``drop`` removed at the end."""
    if not features:
        return join_sequences(result, sequences or {}, drop=drop)
    if sequences:
        result = join_sequences(result, sequences)
    return join_features(result, features, drop=drop)


def apply_joins_batches(stream: Iterator[pa.RecordBatch], sequences: dict[str, Any] | None,
                        features: dict[str, Any] | None, drop: Sequence[str] = (),
                        schema: pa.Schema | None = None) -> Iterator[pa.RecordBatch]:
    """The streaming :func:`apply_joins`: each kind of join runs one batch ahead in its own thread.

    With ``schema`` (the scan's output schema) the views are checked now, not
    at the first batch.
    """
    if schema is not None:
        check_joins(schema, sequences, features)
    if not features:
        return join_sequences_batches(stream, sequences or {}, drop=drop)
    if sequences:
        stream = join_sequences_batches(stream, sequences)
    return join_features_batches(stream, features, drop=drop)


__all__ = [
    "FeatureView",
    "SequenceView",
    "apply_joins",
    "apply_joins_batches",
    "check_joins",
    "join_features",
    "join_features_batches",
    "plan_joins",
]
