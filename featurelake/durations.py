"""One duration syntax for every interface: ``30s``, ``15m``, ``12h``, ``7d``, ``2w``.

Why: expiry, garbage collection and the external-reader staleness policy all
take an age; one parser keeps the CLI options and the table properties alike.
"""
from __future__ import annotations

import re
from datetime import timedelta

from featurelake.errors import InvalidArgumentError

_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw])\s*", re.IGNORECASE)


def parse_duration(text: str, what: str = "duration") -> timedelta:
    """``"7d"`` -> 7 days; a number with one unit s, m, h, d or w, or ``0`` (InvalidArgumentError otherwise)."""
    if str(text).strip() == "0":
        return timedelta(0)
    m = _DURATION.fullmatch(str(text))
    if not m:
        raise InvalidArgumentError(
            f"{what} {text!r} is not a duration: give a number and a unit, e.g. 30m, 12h, 7d (units s, m, h, d, w)"
        )
    return timedelta(**{_UNITS[m.group(2).lower()]: float(m.group(1))})


def format_duration(delta: timedelta) -> str:
    """A short human form: ``2d 3h``, ``45m``, ``12s``."""
    seconds = int(delta.total_seconds())
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    if seconds or not parts:
        parts.append(f"{seconds}s")
    return " ".join(parts[:2])
