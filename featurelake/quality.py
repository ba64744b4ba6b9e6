"""Data-quality expectations for features, validated with great_expectations.

Each feature declares its :class:`Expectations` next to its definition (see
:mod:`featurelake.features`). Four kinds exist:

* ``null_fraction``  -- at most ``max_null_fraction`` of the values are null
  (GE ``ExpectColumnValuesToNotBeNull`` with ``mostly = 1 - max_null_fraction``);
* ``value_range``    -- every non-null value lies in ``[min_value, max_value]``
  (GE ``ExpectColumnValuesToBeBetween``; nulls are not counted as out of range);
* ``distinct_count`` -- the number of distinct non-null values lies in
  ``[min_distinct, max_distinct]`` (GE ``ExpectColumnUniqueValueCountToBeBetween``);
* ``drift``          -- the feature's distribution stays close to a *reference*
  distribution read from main: the two-sample Kolmogorov-Smirnov statistic
  (largest distance between the two empirical CDFs) is at most ``max_ks``.

Why KS for drift: it needs no binning (GE's KL-divergence expectation needs a
partition object and is infinite as soon as a bin is empty on one side), it is
bounded in [0, 1] so one tolerance means the same thing for every feature, it
sees shifts of location, scale and shape, and a handful of outliers move it by
at most their share of the rows. The statistic is used as an *effect size*
with a tolerance, never as a p-value (on a million rows any tiny difference is
"significant"). The reference is either one related main column (a feature
meant to keep the scale of what it replaces, e.g. a clipped or re-normalized
version) or ``reference(main_columns) -> array``, a derivation of several
related columns. It is computed with numpy on at most ``sample_rows`` values
per side (a seeded sample, so a verdict is reproducible); the mean shift in
reference standard deviations is reported alongside. On small samples the
tolerance widens to the KS critical value at ``alpha`` (default 0.001), so
sampling noise alone never fails the expectation.

The three column expectations run in one great_expectations suite per
validation (ephemeral context, progress bars off, imported lazily: importing
GE costs seconds). :func:`validate` returns a :class:`QualityResult` with the
observed value of every expectation and the names of the failing ones;
:func:`gate` raises :class:`~featurelake.errors.QualityGateError` when a branch
fails, for engine users who do not run Dagster.
"""
from __future__ import annotations

import math
import threading
import uuid
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from featurelake.errors import QualityGateError

if TYPE_CHECKING:
    from featurelake.features import FeatureRegistry
    from featurelake.table import Table

NULL_FRACTION = "null_fraction"
VALUE_RANGE = "value_range"
DISTINCT_COUNT = "distinct_count"
DRIFT = "drift"
KINDS = (NULL_FRACTION, VALUE_RANGE, DISTINCT_COUNT, DRIFT)

_GE_TYPES = {
    NULL_FRACTION: "expect_column_values_to_not_be_null",
    VALUE_RANGE: "expect_column_values_to_be_between",
    DISTINCT_COUNT: "expect_column_unique_value_count_to_be_between",
}
DRIFT_EXPECTATION = "ks_statistic_at_most"


# ---------------------------------------------------------------- declarations
@dataclass(frozen=True)
class Drift:
    """Distribution drift of a feature against ``related`` column(s) read from main.

    Without ``reference`` exactly one related column is the reference
    distribution; with it, ``reference(table of the related columns)`` returns
    the reference values (e.g. the same derivation on main's current rows).
    """

    related: tuple[str, ...]
    max_ks: float = 0.1
    reference: Optional[Callable[[pa.Table], Any]] = None
    sample_rows: int = 200_000
    seed: int = 0
    #: small samples: the tolerance widens to the KS critical value at this level
    alpha: float = 0.001

    def __post_init__(self) -> None:
        related = (self.related,) if isinstance(self.related, str) else tuple(self.related)
        object.__setattr__(self, "related", related)
        if not related:
            raise ValueError("Drift needs at least one related column")
        if self.reference is None and len(related) != 1:
            raise ValueError(f"Drift over several related columns {related} needs a reference function")
        if not 0 <= self.max_ks <= 1:
            raise ValueError(f"max_ks must lie in [0, 1], got {self.max_ks}")
        if self.sample_rows < 1:
            raise ValueError("sample_rows must be >= 1")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must lie in (0, 1), got {self.alpha}")


@dataclass(frozen=True)
class Expectations:
    """The quality suite of one feature; None leaves an expectation out."""

    max_null_fraction: Optional[float] = None
    min_value: Optional[float] = None
    max_value: Optional[float] = None
    min_distinct: Optional[int] = None
    max_distinct: Optional[int] = None
    drift: Optional[Drift] = None

    def __post_init__(self) -> None:
        if self.max_null_fraction is not None and not 0 <= self.max_null_fraction <= 1:
            raise ValueError(f"max_null_fraction must lie in [0, 1], got {self.max_null_fraction}")
        if self.min_value is not None and self.max_value is not None and self.min_value > self.max_value:
            raise ValueError(f"min_value {self.min_value} > max_value {self.max_value}")
        if self.min_distinct is not None and self.max_distinct is not None and self.min_distinct > self.max_distinct:
            raise ValueError(f"min_distinct {self.min_distinct} > max_distinct {self.max_distinct}")

    def kinds(self) -> list[str]:
        out = []
        if self.max_null_fraction is not None:
            out.append(NULL_FRACTION)
        if self.min_value is not None or self.max_value is not None:
            out.append(VALUE_RANGE)
        if self.min_distinct is not None or self.max_distinct is not None:
            out.append(DISTINCT_COUNT)
        if self.drift is not None:
            out.append(DRIFT)
        return out

    def describe(self) -> dict[str, Any]:
        """Plain thresholds per kind (for metadata and reports)."""
        out: dict[str, Any] = {}
        if self.max_null_fraction is not None:
            out[NULL_FRACTION] = {"max": self.max_null_fraction}
        if VALUE_RANGE in self.kinds():
            out[VALUE_RANGE] = {"min": self.min_value, "max": self.max_value}
        if DISTINCT_COUNT in self.kinds():
            out[DISTINCT_COUNT] = {"min": self.min_distinct, "max": self.max_distinct}
        if self.drift is not None:
            out[DRIFT] = {"related": list(self.drift.related), "max_ks": self.drift.max_ks,
                          "reference": "derived" if self.drift.reference else self.drift.related[0]}
        return out


# --------------------------------------------------------------------- results
@dataclass
class Outcome:
    """One expectation of one feature: did it hold, and what was observed."""

    feature: str
    kind: str
    expectation: str
    success: bool
    observed: dict[str, Any] = field(default_factory=dict)
    expected: dict[str, Any] = field(default_factory=dict)
    error: Optional[str] = None

    @property
    def name(self) -> str:
        return f"{self.feature}.{self.kind}"


@dataclass
class QualityResult:
    """The outcome of validating some features: ``success`` only if every expectation held."""

    outcomes: list[Outcome]
    rows: int = 0
    branch: Optional[str] = None
    reference_branch: Optional[str] = None

    @property
    def success(self) -> bool:
        return all(o.success for o in self.outcomes)

    @property
    def failing(self) -> list[str]:
        """``feature.kind`` of every failing expectation."""
        return [o.name for o in self.outcomes if not o.success]

    @property
    def features(self) -> list[str]:
        return list(dict.fromkeys(o.feature for o in self.outcomes))

    def for_feature(self, feature: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.feature == feature]

    def for_kind(self, kind: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.kind == kind]

    def feature_passed(self, feature: str) -> bool:
        return all(o.success for o in self.for_feature(feature))

    def observed(self) -> dict[str, dict[str, Any]]:
        """Feature -> kind -> observed values."""
        out: dict[str, dict[str, Any]] = {}
        for o in self.outcomes:
            out.setdefault(o.feature, {})[o.kind] = o.observed if o.error is None else {"error": o.error}
        return out

    def summary(self) -> str:
        if self.success:
            return f"{len(self.outcomes)} expectation(s) on {len(self.features)} feature(s) passed"
        parts = []
        for o in self.outcomes:
            if not o.success:
                what = o.error or ", ".join(f"{k}={_short(v)}" for k, v in o.observed.items())
                parts.append(f"{o.name} ({what}; expected {o.expected})")
        return f"{len(parts)} of {len(self.outcomes)} expectation(s) failed: " + "; ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {
            "success": self.success,
            "rows": self.rows,
            "branch": self.branch,
            "reference_branch": self.reference_branch,
            "failing": self.failing,
            "outcomes": [asdict(o) for o in self.outcomes],
        }


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


# ------------------------------------------------------------- great_expectations
_GE_LOCK = threading.Lock()
_GE: dict[str, Any] = {}


def _ge():
    """(gx module, expectations module, context, batch definition), created once per process."""
    if not _GE:
        import great_expectations as gx
        import great_expectations.expectations as gxe
        from great_expectations.data_context.types.base import ProgressBarsConfig

        ctx = gx.get_context(mode="ephemeral")
        ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
        batch = (
            ctx.data_sources.add_pandas("featurelake")
            .add_dataframe_asset("features")
            .add_batch_definition_whole_dataframe("whole")
        )
        _GE.update(gx=gx, gxe=gxe, ctx=ctx, batch=batch)
    return _GE["gx"], _GE["gxe"], _GE["ctx"], _GE["batch"]


def _ge_expectations(gxe, column: str, exp: Expectations) -> list[tuple[str, Any]]:
    out = []
    if exp.max_null_fraction is not None:
        out.append((NULL_FRACTION, gxe.ExpectColumnValuesToNotBeNull(column=column, mostly=1.0 - exp.max_null_fraction)))
    if VALUE_RANGE in exp.kinds():
        out.append((VALUE_RANGE, gxe.ExpectColumnValuesToBeBetween(column=column, min_value=exp.min_value, max_value=exp.max_value)))
    if DISTINCT_COUNT in exp.kinds():
        out.append((DISTINCT_COUNT, gxe.ExpectColumnUniqueValueCountToBeBetween(
            column=column, min_value=exp.min_distinct, max_value=exp.max_distinct)))
    return out


def _run_ge(frame, declared: list[tuple[str, str, Any]]) -> dict[tuple[str, str], Any]:
    """Validate ``frame`` against (feature, kind, expectation) triples; (feature, kind) -> GE result."""
    with _GE_LOCK:
        gx, _, ctx, batch = _ge()
        name = f"featurelake-{uuid.uuid4().hex[:12]}"
        suite = ctx.suites.add(gx.ExpectationSuite(name=name))
        try:
            for _, _, expectation in declared:
                suite.add_expectation(expectation)
            vd = ctx.validation_definitions.add(gx.ValidationDefinition(name=name, data=batch, suite=suite))
            try:
                res = vd.run(batch_parameters={"dataframe": frame}, result_format="BASIC")
            finally:
                ctx.validation_definitions.delete(name)
        finally:
            ctx.suites.delete(name)
    by_type = {(t, f): kind for f, kind, _ in declared for k, t in _GE_TYPES.items() if k == kind}
    out: dict[tuple[str, str], Any] = {}
    for r in res.results:
        cfg = r.expectation_config
        kind = by_type.get((cfg.type, cfg.kwargs.get("column")))
        if kind is not None:
            out[(cfg.kwargs["column"], kind)] = r
    return out


def _ge_outcome(feature: str, kind: str, exp: Expectations, r: Any, rows: int, values: Optional[pa.ChunkedArray]) -> Outcome:
    expected = exp.describe()[kind]
    info = getattr(r, "exception_info", None) or {}
    error = None
    if info.get("raised_exception"):
        error = info.get("exception_message") or "great_expectations raised"
    else:  # results keyed by metric id when several metrics failed
        for v in info.values() if isinstance(info, dict) else []:
            if isinstance(v, dict) and v.get("raised_exception"):
                error = v.get("exception_message") or "great_expectations raised"
                break
    result = dict(r.result or {})
    observed: dict[str, Any] = {}
    if kind == NULL_FRACTION:
        count = int(result.get("unexpected_count", 0) or 0)
        observed = {"null_fraction": round(count / rows, 6) if rows else 0.0, "nulls": count}
    elif kind == VALUE_RANGE:
        observed = {
            "out_of_range": int(result.get("unexpected_count", 0) or 0),
            "out_of_range_fraction": round(float(result.get("unexpected_percent", 0.0) or 0.0) / 100.0, 6),
        }
        if values is not None and values.length() - values.null_count > 0:
            mm = pc.min_max(values).as_py()
            observed["min"] = _num(mm["min"])
            observed["max"] = _num(mm["max"])
    elif kind == DISTINCT_COUNT:
        observed = {"distinct": result.get("observed_value")}
    return Outcome(feature, kind, _GE_TYPES[kind], bool(r.success) and error is None, observed, expected, error)


def _num(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 6)
    return v


# ------------------------------------------------------------------------ drift
def _finite(values: Any) -> np.ndarray:
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        values = pc.drop_null(values)
        arr = np.asarray(values.to_numpy(zero_copy_only=False) if isinstance(values, pa.Array)
                         else values.to_numpy(), dtype=np.float64)
    else:
        arr = np.asarray(values, dtype=np.float64).ravel()
    return arr[np.isfinite(arr)]


def _sample(arr: np.ndarray, n: int, seed: int) -> np.ndarray:
    if arr.size <= n:
        return arr
    return np.random.default_rng(seed).choice(arr, size=n, replace=False)


def ks_statistic(a: Any, b: Any) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    a = np.sort(_finite(a))
    b = np.sort(_finite(b))
    if a.size == 0 or b.size == 0:
        return 1.0
    both = np.concatenate([a, b])
    cdf_a = np.searchsorted(a, both, side="right") / a.size
    cdf_b = np.searchsorted(b, both, side="right") / b.size
    return float(np.max(np.abs(cdf_a - cdf_b)))


def ks_critical(n: int, m: int, alpha: float) -> float:
    """The KS statistic two samples of sizes n and m exceed with probability ``alpha`` when drawn
    from one distribution (asymptotic: sqrt(-ln(alpha / 2) / 2) * sqrt((n + m) / (n m)))."""
    return math.sqrt(-0.5 * math.log(alpha / 2.0)) * math.sqrt((n + m) / (n * m))


def drift_outcome(feature: str, values: Any, reference: Any, drift: Drift) -> Outcome:
    """The drift expectation of ``feature``: KS(values, reference) <= the tolerance.

    The tolerance is ``drift.max_ks``, widened to the KS critical value at
    ``drift.alpha`` when the samples are so small that sampling noise alone
    could exceed ``max_ks`` (600 rows a side: ~0.11), so a check never fails
    on noise; on large samples it is exactly ``max_ks``.
    """
    expected = {"max_ks": drift.max_ks, "related": list(drift.related)}
    cand = _sample(_finite(values), drift.sample_rows, drift.seed)
    ref = _sample(_finite(reference), drift.sample_rows, drift.seed + 1)
    if ref.size == 0:
        return Outcome(feature, DRIFT, DRIFT_EXPECTATION, False, {}, expected,
                       f"reference from {list(drift.related)} has no finite values")
    if cand.size == 0:
        return Outcome(feature, DRIFT, DRIFT_EXPECTATION, False, {"ks": 1.0, "values": 0}, expected,
                       "the feature has no finite values")
    ks = ks_statistic(cand, ref)
    tolerance = max(drift.max_ks, ks_critical(cand.size, ref.size, drift.alpha))
    ref_std = float(np.std(ref))
    shift = (float(np.mean(cand)) - float(np.mean(ref))) / ref_std if ref_std > 0 else 0.0
    observed = {
        "ks": round(ks, 6),
        "tolerance": round(tolerance, 6),
        "mean": round(float(np.mean(cand)), 6),
        "reference_mean": round(float(np.mean(ref)), 6),
        "mean_shift_sd": round(shift, 6),
        "std_ratio": round(float(np.std(cand)) / ref_std, 6) if ref_std > 0 else None,
        "values": int(cand.size),
        "reference_values": int(ref.size),
    }
    return Outcome(feature, DRIFT, DRIFT_EXPECTATION, ks <= tolerance, observed, expected)


# --------------------------------------------------------------------- validate
def validate(
    data: Any,
    expectations: Mapping[str, Expectations],
    references: Optional[Mapping[str, Any]] = None,
) -> QualityResult:
    """Validate the feature columns of ``data`` (Arrow table or pandas frame).

    ``references`` maps a feature with a drift expectation to its reference
    values (an array read from main); a missing reference fails that
    expectation with an error, as does a missing feature column.
    """
    if not isinstance(data, pa.Table):
        data = pa.Table.from_pandas(data, preserve_index=False)
    references = references or {}
    rows = data.num_rows
    present = [f for f in expectations if f in data.column_names]
    declared: list[tuple[str, str, Any]] = []
    ge_results: dict[tuple[str, str], Any] = {}
    if any(_GE_TYPES.keys() & set(expectations[f].kinds()) for f in present):
        _, gxe, _, _ = _ge()
        for f in present:
            declared += [(f, kind, e) for kind, e in _ge_expectations(gxe, f, expectations[f])]
        if declared:
            frame = data.select(present).to_pandas()
            ge_results = _run_ge(frame, declared)

    outcomes: list[Outcome] = []
    for f, exp in expectations.items():
        kinds = exp.kinds()
        if f not in data.column_names:
            for kind in kinds:
                name = _GE_TYPES.get(kind, DRIFT_EXPECTATION)
                outcomes.append(Outcome(f, kind, name, False, {}, exp.describe()[kind], f"column {f!r} is missing"))
            continue
        for kind in kinds:
            if kind == DRIFT:
                if f not in references:
                    outcomes.append(Outcome(f, DRIFT, DRIFT_EXPECTATION, False, {}, exp.describe()[DRIFT],
                                            "no reference values given"))
                else:
                    outcomes.append(drift_outcome(f, data.column(f), references[f], exp.drift))
                continue
            r = ge_results.get((f, kind))
            if r is None:
                outcomes.append(Outcome(f, kind, _GE_TYPES[kind], False, {}, exp.describe()[kind],
                                        "great_expectations returned no result"))
            else:
                outcomes.append(_ge_outcome(f, kind, exp, r, rows, data.column(f)))
    return QualityResult(outcomes, rows=rows)


def reference_values(table: "Table", drift: Drift, branch: str = "main") -> Any:
    """The reference distribution of a drift expectation, read from ``branch`` (main)."""
    missing = [c for c in drift.related if c not in table.schema.names]
    if missing:
        raise KeyError(f"related column(s) {missing} are not in {table.name}")
    related = table.read(columns=list(drift.related), branch=branch)
    if drift.reference is None:
        return related.column(0)
    return drift.reference(related)


def validate_features(
    table: "Table",
    names: Sequence[str],
    branch: str,
    registry: Optional["FeatureRegistry"] = None,
    reference_branch: str = "main",
) -> QualityResult:
    """Validate features ``names`` as stored on ``branch`` against their registered expectations.

    Values are read back from the branch (what a merge would publish, after
    the backfill's casts); drift references are read from ``reference_branch``.
    Features declared without expectations yield no outcome.
    """
    from featurelake.features import REGISTRY

    registry = registry or REGISTRY
    feats = [registry.get(n) for n in names]
    expectations = {f.name: f.expect for f in feats if f.expect is not None and f.expect.kinds()}
    present = [n for n in expectations if n in table.schema.names]
    data = table.read(columns=present, branch=branch) if present else pa.table({})
    references: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for f in feats:
        if f.name in expectations and f.expect.drift is not None:
            try:
                references[f.name] = reference_values(table, f.expect.drift, reference_branch)
            except Exception as e:  # a missing related column fails the expectation, not the run
                errors[f.name] = f"reference: {type(e).__name__}: {e}"
    result = validate(data, expectations, references)
    for o in result.outcomes:
        if o.kind == DRIFT and o.feature in errors:
            o.success, o.error = False, errors[o.feature]
    result.branch, result.reference_branch = branch, reference_branch
    return result


def gate(
    table: "Table",
    names: Sequence[str],
    branch: str,
    registry: Optional["FeatureRegistry"] = None,
    reference_branch: str = "main",
    merge: bool = False,
) -> QualityResult:
    """Validate the features on ``branch``; raise QualityGateError unless every expectation holds.

    With ``merge=True`` a passing branch is merged into ``reference_branch``
    (the engine-only equivalent of the Dagster research group's gate).
    """
    result = validate_features(table, names, branch, registry, reference_branch)
    if not result.success:
        err = QualityGateError(f"{table.name}@{branch}: {result.summary()}")
        err.result = result  # type: ignore[attr-defined]
        raise err
    if merge:
        table.merge(branch, into=reference_branch)
    return result


__all__ = [
    "Drift",
    "Expectations",
    "Outcome",
    "QualityResult",
    "KINDS",
    "NULL_FRACTION",
    "VALUE_RANGE",
    "DISTINCT_COUNT",
    "DRIFT",
    "validate",
    "validate_features",
    "reference_values",
    "ks_statistic",
    "ks_critical",
    "drift_outcome",
    "gate",
]
