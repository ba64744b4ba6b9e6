"""A small feature registry: named functions from sample columns to one Arrow array.

    from featurelake.features import feature
    from featurelake.quality import Expectations, Drift

    @feature("f0_x_f1", inputs=["f0", "f1"], dtype=pa.float32(),
             expect=Expectations(max_null_fraction=0.05, min_value=-30, max_value=30))
    def f0_x_f1(t: pa.Table) -> pa.Array:
        return pc.multiply(t["f0"], t["f1"])

    data = compute_features(table, ["f0_x_f1"], branch="research/x")  # key + features
    table.backfill(data, branch="research/x")                          # merge-on-read

A feature function receives a table holding exactly its ``inputs`` (as read
from the branch, update files merged in) and returns one value per row, in row
order: an Arrow array or chunked array, or anything ``pa.array`` accepts. The
result is cast to the declared ``dtype``. Functions see the whole column set at
once, so they may aggregate across rows (per-user statistics and the like).

The engine knows no concrete feature: projects register theirs (the Dagster
code location keeps its own in ``assets/feature_defs.py``). ``REGISTRY`` is the
default registry the module-level :func:`feature` decorator fills; tests and
notebooks can use a private :class:`FeatureRegistry`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

import pyarrow as pa

from featurelake.errors import FeatureLakeError, InvalidNameError, SchemaMismatchError

if TYPE_CHECKING:
    from featurelake.quality import Expectations
    from featurelake.table import Table

FeatureFn = Callable[[pa.Table], Any]
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,127}")


@dataclass(frozen=True)
class Feature:
    """A registered feature: how to compute it and what it must look like."""

    name: str
    fn: FeatureFn
    inputs: tuple[str, ...]
    dtype: pa.DataType
    expect: Optional[Expectations] = None
    description: str = ""

    def compute(self, data: pa.Table) -> pa.Array:
        """The feature over ``data`` (which holds at least the inputs), cast to ``dtype``."""
        missing = [c for c in self.inputs if c not in data.column_names]
        if missing:
            raise SchemaMismatchError(f"feature {self.name!r} needs input column(s) {missing}", missing)
        out = self.fn(data.select(list(self.inputs)))
        if isinstance(out, pa.ChunkedArray):
            out = out.combine_chunks()
        elif not isinstance(out, pa.Array):
            out = pa.array(out)
        if len(out) != data.num_rows:
            raise FeatureLakeError(f"feature {self.name!r} returned {len(out)} values for {data.num_rows} rows")
        if out.type != self.dtype:
            try:
                out = out.cast(self.dtype)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise SchemaMismatchError(f"feature {self.name!r} returned {out.type}, not castable to {self.dtype}: {e}",
                                          [self.name]) from e
        return out


class FeatureRegistry:
    """Feature name -> :class:`Feature`."""

    def __init__(self) -> None:
        self._features: dict[str, Feature] = {}

    def register(self, feat: Feature, replace: bool = False) -> Feature:
        if not _NAME.fullmatch(feat.name):
            raise InvalidNameError(f"invalid feature name {feat.name!r}: a letter, then letters, digits or '_'")
        if feat.name in feat.inputs:
            raise InvalidNameError(f"feature {feat.name!r} cannot be one of its own inputs")
        if not feat.inputs:
            raise InvalidNameError(f"feature {feat.name!r} declares no inputs")
        if feat.name in self._features and not replace and self._features[feat.name].fn is not feat.fn:
            raise InvalidNameError(f"feature {feat.name!r} is already registered")
        self._features[feat.name] = feat
        return feat

    def feature(
        self,
        name: Optional[str] = None,
        *,
        inputs: Sequence[str],
        dtype: pa.DataType = pa.float32(),
        expect: Optional[Expectations] = None,
        description: Optional[str] = None,
    ) -> Callable[[FeatureFn], FeatureFn]:
        """Decorator: register ``fn(table) -> array`` as feature ``name`` (default: the function's name)."""

        def register(fn: FeatureFn) -> FeatureFn:
            doc = (fn.__doc__ or "").strip().split("\n\n")[0]
            self.register(
                Feature(
                    name=name or fn.__name__,
                    fn=fn,
                    inputs=tuple([inputs] if isinstance(inputs, str) else inputs),
                    dtype=dtype,
                    expect=expect,
                    description=" ".join((description or doc).split()),
                ),
                replace=True,
            )
            return fn

        return register

    def get(self, name: str) -> Feature:
        try:
            return self._features[name]
        except KeyError:
            raise FeatureLakeError(f"unknown feature {name!r}; registered: {sorted(self._features)}") from None

    def names(self) -> list[str]:
        return sorted(self._features)

    def __contains__(self, name: object) -> bool:
        return name in self._features

    def __iter__(self) -> Iterator[Feature]:
        return iter(self._features.values())

    def __len__(self) -> int:
        return len(self._features)


REGISTRY = FeatureRegistry()


def feature(
    name: Optional[str] = None,
    *,
    inputs: Sequence[str],
    dtype: pa.DataType = pa.float32(),
    expect: Optional[Expectations] = None,
    description: Optional[str] = None,
) -> Callable[[FeatureFn], FeatureFn]:
    """Register a feature in the default :data:`REGISTRY` (see :meth:`FeatureRegistry.feature`)."""
    return REGISTRY.feature(name, inputs=inputs, dtype=dtype, expect=expect, description=description)


def compute_features(
    table: "Table",
    names: Sequence[str],
    branch: str = "main",
    registry: Optional[FeatureRegistry] = None,
    filter: Optional[str] = None,
) -> pa.Table:
    """Read the inputs of ``names`` (plus the primary key) from ``branch``; return key + features.

    The result is a ready backfill input: ``table.backfill(result, branch=branch)``.
    """
    registry = registry or REGISTRY
    if not names:
        raise FeatureLakeError("no feature to compute")
    feats = [registry.get(n) for n in dict.fromkeys(names)]
    keys = table.primary_key
    schema = table.schema.names
    inputs = list(dict.fromkeys([*keys, *(c for f in feats for c in f.inputs)]))
    missing = [c for c in inputs if c not in schema]
    if missing:
        raise SchemaMismatchError(f"{table.name} has no column(s) {missing} needed by {[f.name for f in feats]}", missing)
    data = table.read(columns=inputs, filter=filter, branch=branch)
    columns = {k: data.column(k) for k in keys}
    for f in feats:
        columns[f.name] = f.compute(data)
    return pa.table(columns)


def backfill_features(
    table: "Table",
    names: Sequence[str],
    branch: str = "main",
    registry: Optional[FeatureRegistry] = None,
    filter: Optional[str] = None,
):
    """Compute ``names`` on ``branch`` and backfill them there (one commit); returns the UpdateReport."""
    data = compute_features(table, names, branch, registry, filter)
    table.backfill(data, branch=branch)
    return table.last_update_report


def columns_in_use(table: "Table", columns: Sequence[str], exclude: Sequence[str] = ()) -> set[str]:
    """The ``columns`` some ref (branch or tag) other than ``exclude`` may hold values of.

    A column is in use on a ref when an update file of the ref's head sets it,
    or when a data file of the head stores it (conservative: with column
    metrics off a stored all-null column cannot be told from a filled one).
    Used to retire a rejected candidate column: Iceberg schemas are
    table-wide, so a column backfilled on a research branch shows up (all
    null) on main too until it is soft-deleted.
    """
    from featurelake.livefiles import snapshot_files

    ice = table.refresh()
    meta = ice.metadata
    schema = ice.schema()
    ids = {}
    for c in columns:
        try:
            ids[schema.find_field(c).field_id] = c
        except ValueError:
            continue
    used: set[int] = set()
    for name, ref in meta.refs.items():
        if name in exclude or not ids.keys() - used:
            continue
        snap = meta.snapshot_by_id(ref.snapshot_id)
        used |= ids.keys() & table._state(ice, snap).updated_field_ids
        for f in snapshot_files(ice, snap).values():
            used |= ids.keys() & set((f.column_sizes or {}).keys())
    return {ids[i] for i in used}


__all__ = [
    "Feature",
    "FeatureRegistry",
    "REGISTRY",
    "feature",
    "compute_features",
    "backfill_features",
    "columns_in_use",
]
