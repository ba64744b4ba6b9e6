"""Dagster resources over the featurelake engine."""
from .lake import DEFAULT_HOME, LakeResource, clear_lake_cache, lake_resource_from_env
from .ray_cluster import RAY, RayCluster, path_metadata

__all__ = ["DEFAULT_HOME", "LakeResource", "RAY", "RayCluster", "clear_lake_cache", "lake_resource_from_env", "path_metadata"]
