"""Fixtures for the Dagster layer tests: every test gets its own lake and instance."""
from pathlib import Path

import pytest

import dagster_test_helpers  # noqa: F401  (puts the repository root on sys.path)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    """No lake configuration leaks in from the environment or between tests."""
    from resources import clear_lake_cache

    for name in ("FEATURELAKE_HOME", "FEATURELAKE_CATALOG_URI", "FEATURELAKE_WAREHOUSE",
                 "FEATURELAKE_LANDING"):
        monkeypatch.delenv(name, raising=False)
    clear_lake_cache()
    yield
    clear_lake_cache()


@pytest.fixture
def lake_home(tmp_path) -> Path:
    home = tmp_path / "lake"
    home.mkdir()
    return home


@pytest.fixture
def dagster_home(tmp_path) -> Path:
    from platform_defs.demo import DAGSTER_YAML

    home = tmp_path / "dagster"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    return home


@pytest.fixture
def instance(dagster_home):
    from dagster import DagsterInstance

    inst = DagsterInstance.from_config(str(dagster_home))
    try:
        yield inst
    finally:
        inst.dispose()
