"""Candidate features of this code location, each with its quality suite next to it.

A feature is a function from sample columns (read from the research branch) to
one Arrow array; its ``Expectations`` are the great_expectations suite the
research group's blocking checks run before the branch may be merged into main
(see featurelake/quality.py for what each expectation means).

The features register in :data:`FEATURES`, this code location's own registry
(not the engine's default one), so a notebook importing featurelake does not
get them unless it imports this module.

The demo's research branch ``ctr-v2`` (assets/research_spec.yaml) tries two:

* ``f0_f1_blend`` -- sound: the average of two unit-variance signals, rescaled
  to unit variance, so it keeps the scale of its inputs (drift against main's
  ``f0`` stays small);
* ``f2_norm``     -- carries a deliberate bug: it multiplies by the scale
  instead of dividing and drops every value below -0.25 to null (about 40 %
  nulls), so its null-fraction, range and drift expectations fail.

``f0_x_f1`` is a third candidate for branches added from the UI.
"""
import math

import pyarrow as pa
import pyarrow.compute as pc

from featurelake.features import FeatureRegistry
from featurelake.quality import Drift, Expectations

FEATURES = FeatureRegistry()
feature = FEATURES.feature


@feature(
    "f0_f1_blend",
    inputs=["f0", "f1"],
    dtype=pa.float32(),
    expect=Expectations(
        max_null_fraction=0.05,  # each input is ~1 % null
        min_value=-8.0,
        max_value=8.0,
        min_distinct=100,
        drift=Drift(related=("f0",), max_ks=0.05),
    ),
)
def f0_f1_blend(t: pa.Table) -> pa.Array:
    """(f0 + f1) / sqrt(2): a blend of two standard-normal signals, still standard normal."""
    return pc.divide(pc.add(t["f0"], t["f1"]), math.sqrt(2.0))


F2_SCALE = 10.0


@feature(
    "f2_norm",
    inputs=["f2"],
    dtype=pa.float32(),
    expect=Expectations(
        max_null_fraction=0.05,
        min_value=-5.0,
        max_value=5.0,
        min_distinct=100,
        drift=Drift(related=("f2",), max_ks=0.1),
    ),
)
def f2_norm(t: pa.Table) -> pa.Array:
    """f2 rescaled by F2_SCALE -- BUG on purpose: multiplies instead of dividing and nulls values < -0.25."""
    f2 = t["f2"]
    scaled = pc.multiply(f2, F2_SCALE)  # should be pc.divide
    return pc.if_else(pc.less(f2, -0.25), pa.scalar(None, pa.float32()), scaled)


@feature(
    "f0_x_f1",
    inputs=["f0", "f1"],
    dtype=pa.float32(),
    expect=Expectations(max_null_fraction=0.05, min_value=-40.0, max_value=40.0, min_distinct=100),
)
def f0_x_f1(t: pa.Table) -> pa.Array:
    """f0 * f1: the interaction of the two strongest signals."""
    return pc.multiply(t["f0"], t["f1"])


__all__ = ["FEATURES", "feature", "f0_f1_blend", "f2_norm", "f0_x_f1"]
