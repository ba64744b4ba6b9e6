"""The feature registry and the great_expectations quality wrapper, against numpy/pandas oracles."""
from __future__ import annotations

from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from featurelake.errors import FeatureLakeError, InvalidNameError, QualityGateError, SchemaMismatchError
from featurelake.features import FeatureRegistry, compute_features
from featurelake.quality import (
    DISTINCT_COUNT,
    DRIFT,
    NULL_FRACTION,
    VALUE_RANGE,
    Drift,
    Expectations,
    gate,
    ks_critical,
    ks_statistic,
    validate,
    validate_features,
)

ROWS = 4000


def _column(seed=0, n=ROWS, null_rate=0.1, scale=1.0, shift=0.0):
    rng = np.random.default_rng(seed)
    values = (rng.normal(size=n) * scale + shift).astype(np.float32)
    mask = rng.random(n) < null_rate
    return pa.array(values, mask=mask), values, mask


def _ks_oracle(a, b) -> float:
    """KS statistic by brute force over every candidate threshold (independent of the implementation)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    grid = np.unique(np.concatenate([a, b]))
    fa = (a[None, :] <= grid[:, None]).mean(axis=1)
    fb = (b[None, :] <= grid[:, None]).mean(axis=1)
    return float(np.abs(fa - fb).max())


def test_validate_matches_numpy_oracle():
    arr, values, mask = _column(seed=1, null_rate=0.12)
    rounded = pa.array(np.round(values * 2), mask=mask)
    exp = {
        "x": Expectations(max_null_fraction=0.1, min_value=-2.0, max_value=2.0, min_distinct=10),
        "y": Expectations(max_null_fraction=0.2, min_value=-10, max_value=10, max_distinct=8),
    }
    res = validate(pa.table({"x": arr, "y": rounded}), exp)

    live = values[~mask]
    oracle = {
        ("x", NULL_FRACTION): {"null_fraction": round(mask.mean(), 6), "nulls": int(mask.sum())},
        ("x", VALUE_RANGE): {"out_of_range": int(((live < -2) | (live > 2)).sum())},
        ("x", DISTINCT_COUNT): {"distinct": len(np.unique(live))},
        ("y", DISTINCT_COUNT): {"distinct": len(np.unique(np.round(live * 2)))},
    }
    got = {(o.feature, o.kind): o for o in res.outcomes}
    assert set(got) == {("x", k) for k in (NULL_FRACTION, VALUE_RANGE, DISTINCT_COUNT)} | {
        ("y", k) for k in (NULL_FRACTION, VALUE_RANGE, DISTINCT_COUNT)
    }
    for key, want in oracle.items():
        for k, v in want.items():
            assert got[key].observed[k] == pytest.approx(v), (key, k)
    assert got[("x", VALUE_RANGE)].observed["min"] == pytest.approx(float(live.min()), rel=1e-6)
    assert got[("x", VALUE_RANGE)].observed["max"] == pytest.approx(float(live.max()), rel=1e-6)
    # verdicts follow the thresholds
    assert not got[("x", NULL_FRACTION)].success  # 12% > 10%
    assert not got[("x", VALUE_RANGE)].success and got[("x", DISTINCT_COUNT)].success
    assert got[("y", NULL_FRACTION)].success and got[("y", VALUE_RANGE)].success
    assert not got[("y", DISTINCT_COUNT)].success  # round(2x) spans more than 8 values
    assert not res.success
    assert res.failing == ["x.null_fraction", "x.value_range", "y.distinct_count"]
    assert "x.null_fraction" in res.summary()
    d = res.to_dict()
    assert d["success"] is False and len(d["outcomes"]) == 6 and d["rows"] == ROWS


def test_validate_all_pass_and_pandas_input():
    arr, values, mask = _column(seed=2, null_rate=0.01)
    exp = {"x": Expectations(max_null_fraction=0.05, min_value=-10, max_value=10, min_distinct=100)}
    res = validate(pa.table({"x": arr}).to_pandas(), exp)
    assert res.success and res.failing == [] and len(res.outcomes) == 3


def test_missing_column_fails_with_error():
    res = validate(pa.table({"x": [1.0, 2.0]}), {"nope": Expectations(max_null_fraction=0.0)})
    [o] = res.outcomes
    assert not o.success and "missing" in o.error and res.failing == ["nope.null_fraction"]


@pytest.mark.parametrize("shift,scale", [(0.0, 1.0), (0.3, 1.0), (0.0, 2.0), (1.5, 0.5)])
def test_ks_statistic_matches_oracle(shift, scale):
    rng = np.random.default_rng(7)
    a = rng.normal(size=700)
    b = rng.normal(size=500) * scale + shift
    assert ks_statistic(a, b) == pytest.approx(_ks_oracle(a, b), abs=1e-12)
    from scipy.stats import ks_2samp

    assert ks_statistic(a, b) == pytest.approx(ks_2samp(a, b).statistic, abs=1e-12)


def test_drift_expectation_threshold_and_nulls():
    arr, values, mask = _column(seed=3, null_rate=0.2)
    same = np.random.default_rng(4).normal(size=3000)
    shifted = same + 0.5
    exp = {"x": Expectations(drift=Drift(("ref",), max_ks=0.08))}
    ok = validate(pa.table({"x": arr}), exp, {"x": pa.array(same)})
    bad = validate(pa.table({"x": arr}), exp, {"x": pa.array(shifted)})
    [o_ok], [o_bad] = ok.outcomes, bad.outcomes
    live = values[~mask]
    assert o_ok.observed["ks"] == pytest.approx(_ks_oracle(live, same), abs=1e-6)
    assert o_bad.observed["ks"] == pytest.approx(_ks_oracle(live, shifted), abs=1e-6)
    assert o_ok.success and not o_bad.success and o_ok.kind == DRIFT
    assert o_bad.observed["mean_shift_sd"] == pytest.approx((live.mean() - shifted.mean()) / shifted.std(), abs=1e-4)
    # no reference given: the expectation fails, explaining why
    [o] = validate(pa.table({"x": arr}), exp).outcomes
    assert not o.success and "reference" in o.error


def test_drift_tolerance_widens_for_small_samples_only():
    from scipy.special import kolmogorov

    # the critical value is the asymptotic KS quantile: P(D > c) = alpha for two samples of one law
    for n, m in ((600, 600), (5000, 3000)):
        c = ks_critical(n, m, 0.001)
        assert kolmogorov(c * np.sqrt(n * m / (n + m))) == pytest.approx(0.001, rel=1e-3)
    rng = np.random.default_rng(11)
    exp = {"x": Expectations(drift=Drift("r", max_ks=0.05))}
    # 600 rows a side from one distribution: KS noise ~0.05-0.08 must not fail a 0.05 tolerance
    failures = 0
    for _ in range(20):
        [o] = validate(pa.table({"x": rng.normal(size=600)}), exp, {"x": rng.normal(size=600)}).outcomes
        failures += not o.success
        assert o.observed["tolerance"] == pytest.approx(ks_critical(600, 600, 0.001), abs=1e-6)
    assert failures == 0
    # large samples: the tolerance is max_ks itself, and a real shift fails
    [o] = validate(pa.table({"x": rng.normal(size=50_000) + 0.2}), exp, {"x": rng.normal(size=50_000)}).outcomes
    assert o.observed["tolerance"] == 0.05 and not o.success and o.observed["ks"] > 0.05


def test_declarations_are_checked():
    with pytest.raises(ValueError):
        Expectations(max_null_fraction=1.5)
    with pytest.raises(ValueError):
        Expectations(min_value=3, max_value=1)
    with pytest.raises(ValueError):
        Drift(("a", "b"))  # several related columns need a reference function
    assert Drift("f0").related == ("f0",)
    assert Expectations(min_value=0).kinds() == [VALUE_RANGE]


# ------------------------------------------------------------------ with a lake
def _lake_with_samples(lake, rows=2000):
    from featurelake.synthetic import impressions_for_day, impressions_schema

    data = pa.Table.from_batches(list(impressions_for_day(0, rows, start=date(2026, 1, 1))), schema=impressions_schema())
    t = lake.create_table("ml.samples", schema=data.schema, primary_key="sample_id", partition_by=["day(ts)"])
    t.append(data)
    return t, data


def _registry() -> FeatureRegistry:
    reg = FeatureRegistry()

    @reg.feature("blend", inputs=["f0", "f1"], expect=Expectations(
        max_null_fraction=0.05, min_value=-6, max_value=6, min_distinct=100, drift=Drift("f0", max_ks=0.06)))
    def blend(t):
        return pc.divide(pc.add(t["f0"], t["f1"]), np.sqrt(2))

    @reg.feature("broken", inputs=["f2"], expect=Expectations(
        max_null_fraction=0.05, min_value=-5, max_value=5, drift=Drift("f2", max_ks=0.1)))
    def broken(t):
        f2 = t["f2"]
        return pc.if_else(pc.less(f2, -0.25), pa.scalar(None, pa.float32()), pc.multiply(f2, 10))

    @reg.feature("as_int", inputs=["user_id"], dtype=pa.int32())
    def as_int(t):
        return pc.cast(pc.bit_wise_and(t["user_id"], 0xFF), pa.int64())

    return reg


def test_registry_and_compute_features(lake):
    t, data = _lake_with_samples(lake)
    reg = _registry()
    assert reg.names() == ["as_int", "blend", "broken"] and "blend" in reg and len(reg) == 3
    out = compute_features(t, ["blend", "as_int"], registry=reg)
    assert out.column_names == ["sample_id", "blend", "as_int"]
    assert out.schema.field("blend").type == pa.float32() and out.schema.field("as_int").type == pa.int32()
    df = data.to_pandas().set_index("sample_id")
    got = out.to_pandas().set_index("sample_id").loc[df.index]
    want = ((df["f0"] + df["f1"]) / np.sqrt(2)).astype(np.float32)
    np.testing.assert_allclose(got["blend"].to_numpy(), want.to_numpy(), rtol=1e-6, equal_nan=True)
    assert (got["as_int"].to_numpy() == (df["user_id"].to_numpy() & 0xFF)).all()

    with pytest.raises(FeatureLakeError, match="unknown feature"):
        compute_features(t, ["nope"], registry=reg)
    with pytest.raises(InvalidNameError):
        reg.feature("f0", inputs=["f0"])(lambda t: t["f0"])
    bad = FeatureRegistry()
    bad.feature("needs_x", inputs=["x"])(lambda t: t["x"])
    with pytest.raises(SchemaMismatchError):
        compute_features(t, ["needs_x"], registry=bad)
    short = FeatureRegistry()
    short.feature("short", inputs=["f0"])(lambda t: t["f0"].slice(0, 3))
    with pytest.raises(FeatureLakeError, match="returned 3 values"):
        compute_features(t, ["short"], registry=short)


def test_gate_on_branches(lake):
    t, data = _lake_with_samples(lake)
    reg = _registry()
    main_head = t.stats()["snapshot_id"]
    for branch, name in (("research/good", "blend"), ("research/bad", "broken")):
        t.create_branch(branch)
        t.backfill(compute_features(t, [name], branch=branch, registry=reg), branch=branch)

    good = validate_features(t, ["blend"], "research/good", registry=reg)
    assert good.success, good.summary()
    assert {o.kind for o in good.outcomes} == {NULL_FRACTION, VALUE_RANGE, DISTINCT_COUNT, DRIFT}

    bad = validate_features(t, ["broken"], "research/bad", registry=reg)
    assert not bad.success
    assert set(bad.failing) == {"broken.null_fraction", "broken.value_range", "broken.drift"}
    f2 = data.column("f2").to_numpy(zero_copy_only=False)
    expected_nulls = (np.isnan(f2) | (f2 < -0.25)).mean()
    assert bad.for_kind(NULL_FRACTION)[0].observed["null_fraction"] == pytest.approx(expected_nulls, abs=1e-6)

    with pytest.raises(QualityGateError) as info:
        gate(t, ["broken"], "research/bad", registry=reg, merge=True)
    assert info.value.result.failing == bad.failing
    assert t.stats()["snapshot_id"] == main_head  # nothing merged

    gate(t, ["blend"], "research/good", registry=reg, merge=True)
    assert t.stats()["snapshot_id"] != main_head
    merged = t.read(columns=["blend"]).column(0)
    assert merged.null_count < 0.05 * len(merged)
    assert t.read(columns=["broken"]).column(0).null_count == len(merged)  # main never got its values


def test_drift_reference_missing_on_main(lake):
    t, _ = _lake_with_samples(lake, rows=300)
    reg = FeatureRegistry()
    reg.feature("copy0", inputs=["f0"], expect=Expectations(drift=Drift("not_there")))(lambda t: t["f0"])
    t.create_branch("research/x")
    t.backfill(compute_features(t, ["copy0"], branch="research/x", registry=reg), branch="research/x")
    res = validate_features(t, ["copy0"], "research/x", registry=reg)
    [o] = res.outcomes
    assert not o.success and "not_there" in o.error
