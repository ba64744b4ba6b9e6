"""Dagster resources over the featurelake engine."""
from .lake import DEFAULT_HOME, LakeResource, clear_lake_cache, lake_resource_from_env

__all__ = ["DEFAULT_HOME", "LakeResource", "clear_lake_cache", "lake_resource_from_env"]
