"""featurelake: a training-sample and feature platform on an Apache Iceberg lake.

    from featurelake import Lake
    lake = Lake("path/to/home")
    t = lake.create_table("ml.samples", schema, primary_key="sample_id", partition_by=["day(ts)"])
    t.append(batch); t.backfill(new_columns); t.read(columns=[...], filter="click = 1")

The engine never imports Dagster: notebooks and training jobs use it directly.
"""
from featurelake import _compat, errors  # noqa: F401  (_compat patches pyiceberg first)
from featurelake.lake import Lake
from featurelake.table import Table

__version__ = "0.1.0"
__all__ = ["Lake", "Table", "errors", "__version__"]
