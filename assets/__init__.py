"""Dagster asset definitions, one module per group."""
from . import main
from .main import daily_partitions, labels, main_assets, raw_impressions, samples

__all__ = ["main", "daily_partitions", "labels", "main_assets", "raw_impressions", "samples"]
