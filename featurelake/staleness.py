"""What external readers (engines that ignore update files) may be shown: the staleness policy in table properties.

Validated when table properties are set (``schema``) and applied by ``health`` and the compaction sensor.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from featurelake.durations import parse_duration
from featurelake.errors import InvalidArgumentError

MAX_PENDING_LAYERS_PROPERTY = "external-readers.max-pending-layers"
MAX_STALENESS_PROPERTY = "external-readers.max-staleness"


@dataclass(frozen=True)
class StalenessPolicy:
    """How stale a table may look to engines that ignore update files (table properties).

    ``external-readers.max-pending-layers=N``: at most N update files stacked on
    any data file (0: external readers must always see final values).
    ``external-readers.max-staleness=12h``: no update may stay pending longer.
    Unset: no bound. The compaction sensor requests compaction on a violation.
    """

    max_pending_layers: int | None = None
    max_staleness: timedelta | None = None

    @property
    def bounded(self) -> bool:
        return self.max_pending_layers is not None or self.max_staleness is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "max_pending_layers": self.max_pending_layers,
            "max_staleness_seconds": self.max_staleness.total_seconds() if self.max_staleness else None,
        }


def staleness_policy(properties: dict[str, str]) -> StalenessPolicy:
    """The policy set in a table's properties; InvalidArgumentError for a value it cannot use."""
    layers = properties.get(MAX_PENDING_LAYERS_PROPERTY)
    age = properties.get(MAX_STALENESS_PROPERTY)
    if layers is not None and not (layers.strip().isdigit()):
        raise InvalidArgumentError(f"{MAX_PENDING_LAYERS_PROPERTY} must be a whole number >= 0, not {layers!r}")
    return StalenessPolicy(
        max_pending_layers=int(layers) if layers is not None else None,
        max_staleness=parse_duration(age, MAX_STALENESS_PROPERTY) if age is not None else None,
    )
