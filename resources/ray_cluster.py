"""``RayCluster``: the Ray cluster big maintenance and backfills scale out to (dagster-ray's ``RayResource``).

dagster-ray 0.4.8 declares ``dagster>=1.12`` and fits this deployment's Dagster
1.13, so this is its resource: ``ray_init_options`` and the lifecycle come from
``RayResource``. What featurelake adds:

* where the cluster is: ``address``, else FEATURELAKE_RAY_ADDRESS or RAY_ADDRESS
  (production), else a local cluster (dev) — see :func:`featurelake.ray.connect`;
* when to use it: an asset takes the Ray path when the table holds at least
  ``threshold_bytes`` (else FEATURELAKE_RAY_THRESHOLD_BYTES, else 64 GiB);
  smaller tables run in-process, where a cluster only adds start-up time.

The cluster is joined lazily, on the first Ray path of a run (a run that stays
in-process starts nothing), and left at the end of the run only when this
resource started it.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator, Optional

from dagster_ray import Lifecycle, RayResource
from pydantic import Field

THRESHOLD_VARIABLE = "FEATURELAKE_RAY_THRESHOLD_BYTES"
DEFAULT_THRESHOLD_BYTES = 64 * 2**30


class RayCluster(RayResource):
    """The Ray cluster featurelake's distributed operations run on (featurelake.ray)."""

    lifecycle: Lifecycle = Field(
        default_factory=lambda: Lifecycle(connect=False),
        description="Connect lazily: only a run that takes the Ray path joins the cluster.",
    )
    address: Optional[str] = Field(
        default=None,
        description="Ray cluster address; None: FEATURELAKE_RAY_ADDRESS or RAY_ADDRESS, else a local cluster.",
    )
    threshold_bytes: Optional[int] = Field(
        default=None,
        description=f"Tables of at least this many bytes (data + update files) run on Ray; None: "
        f"{THRESHOLD_VARIABLE}, else {DEFAULT_THRESHOLD_BYTES} (64 GiB). 0: always.",
    )
    tasks: Optional[int] = Field(default=None, description="Parallel tasks per operation; None: the cluster's CPUs.")

    @property
    def host(self) -> str:
        return self.address or os.environ.get("FEATURELAKE_RAY_ADDRESS") or os.environ.get("RAY_ADDRESS") or "local"

    @property
    def name(self) -> str:
        return "featurelake-ray"

    @property
    def ray_address(self) -> Optional[str]:  # type: ignore[override]
        return None if self.host == "local" else self.host

    @property
    def created(self) -> bool:
        return True

    @property
    def ready(self) -> bool:
        return True

    def threshold(self) -> int:
        if self.threshold_bytes is not None:
            return int(self.threshold_bytes)
        return int(os.environ.get(THRESHOLD_VARIABLE, DEFAULT_THRESHOLD_BYTES))

    def chooses_ray(self, table_bytes: int) -> bool:
        """Whether a table of ``table_bytes`` takes the Ray path."""
        return int(table_bytes) >= self.threshold()

    def connect(self, context: Any) -> Any:
        """Join the cluster (featurelake.ray.connect); a cluster this process already joined is reused, not owned."""
        import ray

        from featurelake.ray import connect

        if ray.is_initialized():
            return None
        connect(self.ray_address, **self.ray_init_options)
        self._context = ray.get_runtime_context()
        return self._context

    @contextlib.contextmanager
    def yield_for_execution(self, context: Any) -> Iterator["RayCluster"]:
        """Nothing at run start (a run that stays in-process must not pay for Ray, not even
        its import); :meth:`ensure_connected` joins the cluster on the first Ray path."""
        try:
            yield self
        finally:
            self.cleanup(context, None)

    def ensure_connected(self, context: Any) -> None:
        if not self.connected:
            self.connect(context)

    def cleanup(self, context: Any, exception: Optional[BaseException]) -> None:
        if self._context is not None:  # started by this resource: stop it with the run
            import ray

            ray.shutdown()
            self._context = None


def path_metadata(ray_path: bool, tasks: int) -> dict:
    """The metadata an asset records about where it ran."""
    from dagster import MetadataValue

    return {"execution": MetadataValue.text("ray" if ray_path else "in-process"), "ray_tasks": MetadataValue.int(int(tasks))}


RAY = RayCluster()  # the assets' default binding (asset-level resource_defs): env-configured
