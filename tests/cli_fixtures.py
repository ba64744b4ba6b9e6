"""Shared by the CLI tests: a clean environment, a small lake with ml.samples, and invoke helpers."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from featurelake import Lake
from featurelake.cli import app
from featurelake.synthetic import impressions_table
from featurelake.table import Table

TABLE = "ml.samples"
runner = CliRunner()


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


def table(home: Path) -> Table:
    return Lake(home).table(TABLE)


def cli(home: Path, *args: str, json_out: bool = False):
    argv = ["--home", str(home)] + (["--json"] if json_out else []) + list(args)
    return runner.invoke(app, argv)


def ok(result) -> str:
    assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
    return result.stdout


def failed(result) -> str:
    """A clean failure: exit 1, one red line on stderr, no traceback."""
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error"), result.stderr
    return lines[0]
