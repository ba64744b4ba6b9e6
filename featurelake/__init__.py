"""featurelake: a training-sample and feature platform on an Apache Iceberg lake.

    from featurelake import Lake
    lake = Lake("path/to/home")
    t = lake.create_table("ml.samples", schema, primary_key="sample_id", partition_by=["day(ts)"])
    t.append(batch); t.backfill(new_columns); t.read(columns=[...], filter="click = 1")

The engine never imports Dagster: notebooks and training jobs use it directly.
"""
from __future__ import annotations

from typing import Any

from featurelake import errors  # noqa: F401  (imports nothing heavy)

__version__ = "0.1.0"
__all__ = ["Lake", "Table", "errors", "__version__"]


def __getattr__(name: str) -> Any:
    """``Lake`` and ``Table`` load pyiceberg and pyarrow on first use, so ``featurelake --version`` stays fast."""
    if name == "Lake":
        from featurelake.lake import Lake

        return Lake
    if name == "Table":
        from featurelake.table import Table

        return Table
    raise AttributeError(f"module 'featurelake' has no attribute {name!r}")
