"""The embedded lake's home folder: where it is by default and whether a lake exists there.

Why a module of its own: the CLI must answer ``--version`` and ``--help`` and
refuse a mistyped ``--home`` without importing pyiceberg or pyarrow, so what it
needs to know about a home folder lives here, free of heavy imports.
"""
from __future__ import annotations

import os
from pathlib import Path

DEFAULT_HOME = ".featurelake"
CATALOG_FILE = "catalog.db"
WAREHOUSE_DIR = "warehouse"


def lake_exists(home: str | os.PathLike) -> bool:
    """Whether ``home`` holds an embedded lake (its SQLite catalog)."""
    return (Path(home) / CATALOG_FILE).is_file()
