"""Fixtures for the Dagster layer tests: every test gets its own lake and instance."""
from pathlib import Path

import pytest

import dagster_test_helpers  # noqa: F401  (puts the repository root on sys.path)


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    """No lake configuration leaks in from the environment or between tests."""
    from resources import clear_lake_cache

    import os

    for name in ("FEATURELAKE_HOME", "FEATURELAKE_CATALOG", "FEATURELAKE_CATALOG_URI", "FEATURELAKE_WAREHOUSE",
                 "FEATURELAKE_LANDING", "FEATURELAKE_CACHE_DIR", "FEATURELAKE_SEQUENCE_HOME"):
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith("PYICEBERG_CATALOG__FEATURELAKE__")]:
        monkeypatch.delenv(name)
    clear_lake_cache()
    yield
    clear_lake_cache()


@pytest.fixture
def lake_home(tmp_path) -> Path:
    home = tmp_path / "lake"
    home.mkdir(exist_ok=True)  # the local backend's lake (tests/conftest.py) lives here too
    return home


@pytest.fixture
def lake_env(backend, lake_home, tmp_path, monkeypatch, request):
    """The backend's lake named by the environment, as a deployment names it (the backend).

    local: ``FEATURELAKE_HOME``. s3: ``FEATURELAKE_CATALOG_URI`` + ``FEATURELAKE_WAREHOUSE``, the
    S3 FileIO and REST credential as ``PYICEBERG_CATALOG__FEATURELAKE__*`` (pyiceberg's own
    convention), ``FEATURELAKE_CACHE_DIR`` for the sequence store, ``FEATURELAKE_LANDING``.
    """
    if backend.name == "local":
        assert backend.lake.home == lake_home.resolve()
        monkeypatch.setenv("FEATURELAKE_HOME", str(lake_home))
        return backend
    seaweed = request.getfixturevalue("seaweed")
    monkeypatch.setenv("FEATURELAKE_CATALOG_URI", seaweed.catalog_uri)
    monkeypatch.setenv("FEATURELAKE_WAREHOUSE", seaweed.warehouse)
    for key, value in seaweed.catalog_properties().items():
        monkeypatch.setenv("PYICEBERG_CATALOG__FEATURELAKE__" + key.replace(".", "__").replace("-", "_").upper(), value)
    monkeypatch.setenv("FEATURELAKE_CACHE_DIR", str(backend.lake.cache_dir))
    monkeypatch.setenv("FEATURELAKE_LANDING", str(tmp_path / "landing"))
    return backend


@pytest.fixture
def env_resource(lake_env):
    """The ``LakeResource`` production builds from that environment (``lake_resource_from_env``)."""
    from resources import lake_resource_from_env

    return lake_resource_from_env()


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
