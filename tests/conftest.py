"""Shared fixtures: an embedded lake per test, and the catalogs to run the table suite on."""
from __future__ import annotations

import os
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


PG_URL = os.environ.get("FEATURELAKE_TEST_PG", "postgresql+psycopg2://postgres@127.0.0.1:5432/{db}")


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake(tmp_path / "lake")


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


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_lake(request, tmp_path) -> Lake:
    """The same lake API on the embedded SQLite catalog and on a PostgreSQL catalog."""
    if request.param == "sqlite":
        return Lake(tmp_path / "lake")
    url = request.getfixturevalue("pg_database")
    return Lake.from_uri(url, str(tmp_path / "warehouse"))
