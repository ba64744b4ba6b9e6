"""Dagster asset definitions, one module per group."""
import warnings

# The Ray cluster is bound per asset (resource_defs), so runs and tests that pass only the lake
# keep working; Dagster marks that parameter beta, which is a note for us, not for every CLI run.
warnings.filterwarnings("ignore", message="Parameter `resource_defs` of function `asset`")

from . import main  # noqa: E402
from .main import daily_partitions, labels, main_assets, raw_impressions, samples

__all__ = ["main", "daily_partitions", "labels", "main_assets", "raw_impressions", "samples"]
