"""The CLI on REST + S3: the lake named by the environment exactly as the README says
(``FEATURELAKE_CATALOG_URI``, ``FEATURELAKE_WAREHOUSE``, ``PYICEBERG_CATALOG__FEATURELAKE__*``).

One session of commands against SeaweedFS: create, append, upsert, backfill, read with a
filter, stats, compact, index verify, expire and gc. Each result is checked against a
pandas oracle read through the Python API, the gc against the bucket listed before and after
with an independent client, and the secret against every byte the CLI printed.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from featurelake import Lake
from featurelake.cli import app

pytestmark = pytest.mark.s3
runner = CliRunner()
TABLE = "ml.events"


@pytest.fixture
def s3_env(s3_lake, seaweed, monkeypatch, tmp_path):
    for var in ("FEATURELAKE_HOME", "FEATURELAKE_CATALOG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FEATURELAKE_CATALOG_URI", seaweed.catalog_uri)
    monkeypatch.setenv("FEATURELAKE_WAREHOUSE", seaweed.warehouse)
    for key, value in seaweed.catalog_properties().items():
        monkeypatch.setenv("PYICEBERG_CATALOG__FEATURELAKE__" + key.replace(".", "__").replace("-", "_").upper(), value)
    monkeypatch.setenv("FEATURELAKE_CACHE_DIR", str(tmp_path / "cache"))
    return seaweed


def _rows(ids, day: int, x) -> pa.Table:
    ids = np.asarray(ids, dtype=np.int64)
    ts = np.datetime64(f"2026-01-0{day}", "us") + ids.astype("timedelta64[s]").astype("timedelta64[us]")
    return pa.table({"id": ids, "ts": ts, "x": np.asarray(x, dtype=np.float64)})


def test_cli_session_on_rest_and_s3(s3_env, tmp_path):
    from seaweed import SECRET_KEY

    printed: list[str] = []

    def run(*args: str):
        result = runner.invoke(app, ["--json", *args])
        printed.append(result.output)
        assert result.exit_code == 0, (args, result.output, result.exception)
        return json.loads(result.stdout) if result.stdout.strip() else None

    first = tmp_path / "first.parquet"
    pq.write_table(pa.concat_tables([_rows(range(0, 50), 1, np.arange(50) * 1.0), _rows(range(50, 100), 2, np.arange(50, 100) * 1.0)]), first)
    created = run("create", TABLE, "--schema", str(first), "--key", "id", "--partition", "day(ts)")
    assert created["table"] == TABLE and created["primary_key"] == ["id"]
    run("append", TABLE, str(first))
    oracle = pq.read_table(first).to_pandas().set_index("id")

    changes = tmp_path / "changes.parquet"
    pq.write_table(pa.concat_tables([_rows([3], 1, [-3.0]), _rows([60], 2, [-60.0]), _rows([200], 2, [200.0])]), changes)
    up = run("upsert", TABLE, str(changes))
    assert up["rows_updated"] == 2 and up["rows_inserted"] == 1
    oracle.loc[[3, 60], "x"] = [-3.0, -60.0]
    oracle.loc[200] = pq.read_table(changes).to_pandas().set_index("id").loc[200]

    scores = tmp_path / "scores.parquet"
    pq.write_table(pa.table({"id": pa.array([1, 2, 200], pa.int64()), "score": [0.5, 0.25, 0.125]}), scores)
    run("backfill", TABLE, str(scores))
    oracle["score"] = np.nan
    oracle.loc[[1, 2, 200], "score"] = [0.5, 0.25, 0.125]

    got = pd.DataFrame(run("read", TABLE, "--filter", "id >= 50", "-n", "0")).set_index("id").sort_index()
    want = oracle[oracle.index >= 50].sort_index()
    assert list(got.index) == list(want.index)
    np.testing.assert_allclose(got["x"].to_numpy(float), want["x"].to_numpy(float))

    stats = run("stats", TABLE)
    assert stats["rows"] == len(oracle) and stats["update_files"] > 0
    compacted = run("compact", TABLE)
    assert compacted["table"] == TABLE
    assert run("stats", TABLE)["update_files"] == 0
    assert run("index", "verify", TABLE)["ok"] is True

    expired = run("expire", TABLE, "--older-than", "0s")
    assert expired["expired"]
    fs = s3_env.filesystem()

    def listing() -> set[str]:
        infos = fs.get_file_info(pafs.FileSelector("warehouse/", recursive=True))
        return {"s3://" + i.path for i in infos if i.type == pafs.FileType.File}

    before = listing()
    dry = run("gc", "--older-than", "0s", "--dry-run")
    assert dry["files"] and listing() == before
    gone = run("gc", "--older-than", "0s")
    assert set(gone["files"]) == set(dry["files"])
    assert listing() == before - set(gone["files"])

    t = Lake.from_env().table(TABLE)  # the same lake through the API: the oracle holds
    got = t.read().to_pandas().set_index("id").sort_index()
    want = oracle.sort_index()
    np.testing.assert_allclose(got["x"].to_numpy(float), want["x"].to_numpy(float))
    np.testing.assert_allclose(got["score"].to_numpy(float), want["score"].to_numpy(float), equal_nan=True)
    assert t.iceberg.location().startswith("s3://")
    assert not any(SECRET_KEY in out for out in printed)
