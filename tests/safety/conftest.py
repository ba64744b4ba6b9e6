"""Fixtures of the safety suite: a PostgreSQL catalog behind a real role with a password,
and the ``--long`` switch (registered in tests/conftest.py) that runs every crash point."""
from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the Dagster code location (resources, assets, platform_defs) lives at the root
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def long_run(request) -> bool:
    """True under ``pytest --long``: every crash point and more random trials."""
    return bool(request.config.getoption("--long"))


@pytest.fixture
def secret_catalog(pg_database):
    """``(uri, password)``: a catalog URI for a fresh role that owns the test database.

    The password is unique per test, so finding it anywhere means it leaked from this test.
    """
    import sqlalchemy as sa
    from sqlalchemy.engine import make_url

    role = f"fl_secret_{uuid.uuid4().hex[:10]}"
    password = f"Pw{uuid.uuid4().hex}Zq"
    url = make_url(pg_database)
    admin = sa.create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.execute(sa.text(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'"))
        c.execute(sa.text(f'ALTER DATABASE "{url.database}" OWNER TO {role}'))
    uri = url.set(username=role, password=password).render_as_string(hide_password=False)
    try:
        yield uri, password
    finally:
        inside = sa.create_engine(url, isolation_level="AUTOCOMMIT")
        with inside.connect() as c:
            c.execute(sa.text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{role}'"))
            c.execute(sa.text(f"REASSIGN OWNED BY {role} TO postgres"))
            c.execute(sa.text(f"DROP OWNED BY {role}"))
        inside.dispose()
        with admin.connect() as c:
            c.execute(sa.text(f'ALTER DATABASE "{url.database}" OWNER TO postgres'))
            c.execute(sa.text(f"DROP ROLE IF EXISTS {role}"))
        admin.dispose()


def pytest_terminal_summary(terminalreporter):
    """How many kill -9 trials ran, by write kind and the state each left (this process only)."""
    ops = sys.modules.get("crash_ops")
    if ops is not None and ops.TRIALS:
        total = sum(ops.TRIALS.values())
        terminalreporter.write_line(f"crash suite: {total} kill -9 trials: {dict(sorted(ops.TRIALS.items()))}")
