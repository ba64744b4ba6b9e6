"""The catalog password never reaches Dagster storage, logs, the CLI or featurelake's errors.

A real PostgreSQL role with a unique password backs the catalog; the deployment is configured
the production way (FEATURELAKE_CATALOG_URI in the environment), real materializations run on
a persistent DagsterInstance (one succeeds, one fails on the compaction Failure path), and then
every byte Dagster stored (all files under DAGSTER_HOME, every SQLite cell, zlib-compressed
snapshots decompressed), the captured console output and the CLI's output are searched.
"""
from __future__ import annotations

import json
import sqlite3
import zlib
from pathlib import Path

import pyarrow as pa
import pytest

from featurelake import Lake
from featurelake.errors import CatalogUnavailableError
from featurelake.secrets import MASK, redact, redact_properties, scrub, secrets_in

pytestmark = pytest.mark.postgres

TABLE = "ml.samples"


def _cell_texts(value) -> list[str]:
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        texts = [raw.decode("utf-8", "replace")]
        try:
            texts.append(zlib.decompress(raw).decode("utf-8", "replace"))
        except zlib.error:
            pass
        return texts
    return [str(value)]


def _files_holding(root: Path, secret: str) -> list[str]:
    """Every file under ``root`` whose bytes, or whose SQLite cells (decompressed), hold ``secret``."""
    found = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if secret.encode() in path.read_bytes():
            found.append(str(path))
            continue
        if path.suffix == ".db":
            con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                tables = [r[0] for r in con.execute("select name from sqlite_master where type = 'table'")]
                for table in tables:
                    for row in con.execute(f'select * from "{table}"'):
                        if any(secret in text for cell in row for text in _cell_texts(cell)):
                            found.append(f"{path}:{table}")
                            break
            finally:
                con.close()
    return found


def _cli(*args: str, **env: str):
    """The CLI in-process, with the current environment plus ``env``; its whole output is returned
    as ``.text`` (stdout, stderr, and an escaped exception's text)."""
    from typer.testing import CliRunner

    from featurelake.cli import app

    result = CliRunner().invoke(app, list(args), env=env or None)
    result.text = result.stdout + result.stderr + (repr(result.exception) if result.exception else "")
    return result


def _seed(uri: str, warehouse: Path) -> None:
    from featurelake.synthetic import impressions_for_day, impressions_schema

    lake = Lake.from_uri(uri, str(warehouse))
    t = lake.create_table(TABLE, impressions_schema(), primary_key="sample_id")
    for b in range(3):
        rows = pa.Table.from_batches(list(impressions_for_day(0, 20, seed=b)))
        t.append(rows.set_column(0, "sample_id", pa.array([b * 100 + j for j in range(20)], pa.int64())))


def test_password_never_reaches_dagster_logs_or_cli(secret_catalog, tmp_path, monkeypatch, capfd):
    from dagster import DagsterInstance

    from platform_defs import build_defs
    from platform_defs.demo import DAGSTER_YAML
    from resources import clear_lake_cache

    uri, password = secret_catalog
    dagster_home = tmp_path / "dagster"
    dagster_home.mkdir()
    (dagster_home / "dagster.yaml").write_text(DAGSTER_YAML)
    warehouse = tmp_path / "warehouse"
    for name in ("FEATURELAKE_HOME", "FEATURELAKE_LANDING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
    monkeypatch.setenv("FEATURELAKE_CATALOG_URI", uri)
    monkeypatch.setenv("FEATURELAKE_WAREHOUSE", str(warehouse))
    clear_lake_cache()
    _seed(uri, warehouse)

    defs = build_defs()
    job = defs.resolve_job_def("compaction_job")
    instance = DagsterInstance.get()
    try:
        instance.add_dynamic_partitions("compaction_targets", [f"{TABLE}|main", "ml.missing|main"])
        ok = job.execute_in_process(instance=instance, partition_key=f"{TABLE}|main")
        assert ok.success
        [mat] = ok.get_asset_materialization_events()
        shown = mat.step_materialization_data.materialization.metadata["lake"].value
        assert MASK in shown and "fl_secret_" in shown and "127.0.0.1" in shown  # still useful
        assert mat.step_materialization_data.materialization.metadata["files_in"].value == 3

        failed = job.execute_in_process(instance=instance, partition_key="ml.missing|main", raise_on_error=False)
        assert not failed.success
        [failure] = [e for e in failed.all_events if e.event_type_value == "STEP_FAILURE"]
        message = failure.step_failure_data.error.message
        assert "no table 'ml.missing'" in message and MASK in message
        runs = instance.get_runs()
        assert len(runs) == 2
        snapshot = instance.get_job_snapshot(runs[0].job_snapshot_id)
        from dagster._serdes import serialize_value

        assert password not in serialize_value(snapshot)  # the URI is bound by name, resolved at run time
    finally:
        instance.dispose()
        clear_lake_cache()

    cli = [_cli("--json", "tables"), _cli("--json", "stats", TABLE), _cli("tables")]
    assert all(r.exit_code == 0 for r in cli), [r.text for r in cli]
    assert TABLE in json.dumps(json.loads(cli[0].stdout))
    assert json.loads(cli[1].stdout)["rows"] == 60
    assert "fl_secret_" in cli[2].stdout and MASK in cli[2].stdout  # the human listing names the catalog
    down = _cli("--json", "tables", FEATURELAKE_CATALOG_URI=uri.replace("127.0.0.1:5432", "127.0.0.1:1"))
    assert down.exit_code == 1 and "cannot open the catalog" in down.text and "Traceback" not in down.text

    captured = capfd.readouterr()
    outputs = [captured.out, captured.err] + [r.text for r in (*cli, down)]
    assert captured.err  # Dagster's console log was captured: the search below looks at something
    assert not [o for o in outputs if password in o]
    assert not _files_holding(dagster_home, password)
    assert len(list(dagster_home.rglob("*.db"))) >= 1


@pytest.mark.parametrize(
    "change",
    [
        lambda uri: uri.replace("127.0.0.1:5432", "127.0.0.1:1"),  # nothing listens
        lambda uri: uri.rsplit("/", 1)[0] + "/no_such_database",  # the server refuses
        lambda uri: uri.replace("127.0.0.1:5432", "127.0.0.1:notaport"),  # unparseable
        lambda uri: uri.replace("postgresql+psycopg2", "postgresql+nodriver"),  # no such driver
    ],
    ids=["unreachable", "no-database", "bad-port", "bad-driver"],
)
def test_catalog_errors_carry_no_password(secret_catalog, tmp_path, change):
    uri, password = secret_catalog
    with pytest.raises(CatalogUnavailableError) as err:
        Lake.from_uri(change(uri), str(tmp_path / "warehouse"))
    text = str(err.value)
    assert password not in text and "cannot open the catalog" in text and MASK in text
    assert err.value.__context__ is None and err.value.__cause__ is None  # the driver's text is not chained


def test_redaction_helpers():
    uri = "postgresql+psycopg2://app:p%40ss@db:5432/lake?sslmode=require&password=q1"
    assert redact(uri) == "postgresql+psycopg2://app:***@db:5432/lake?sslmode=require&password=***"
    assert redact("sqlite:////tmp/lake/catalog.db") == "sqlite:////tmp/lake/catalog.db"
    assert redact("embedded lake at /tmp/a:b@c") == "embedded lake at /tmp/a:b@c"
    assert set(secrets_in(uri)) == {"p%40ss", "p@ss", "q1"}
    assert scrub("auth failed for p@ss on db", secrets_in(uri)) == "auth failed for *** on db"
    props = {"uri": "http://h:1", "credential": "k:s", "s3.secret-access-key": "S", "s3.endpoint": "http://x"}
    assert redact_properties(props) == {
        "uri": "http://h:1", "credential": MASK, "s3.secret-access-key": MASK, "s3.endpoint": "http://x"
    }
    assert "S" not in redact(str({"s3.secret-access-key": "S"})).replace("s3.secret", "")
