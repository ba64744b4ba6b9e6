"""Fixtures shared by the CLI tests: a clean environment and a small lake with ml.samples."""
from __future__ import annotations

from pathlib import Path

import pytest

from featurelake import Lake
from featurelake.synthetic import impressions_table

TABLE = "ml.samples"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("FEATURELAKE_CATALOG_URI", "FEATURELAKE_WAREHOUSE", "FEATURELAKE_HOME"):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture
def home(tmp_path) -> Path:
    home = tmp_path / "lake"
    data = impressions_table(200, days=2)
    lake = Lake(home)
    t = lake.create_table(TABLE, data.schema, primary_key="sample_id", partition_by=["day(ts)"])
    t.append(data)
    return home
