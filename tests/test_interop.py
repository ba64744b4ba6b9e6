"""After ``compact`` a table is plain Iceberg: other engines read exactly what featurelake reads.

On the embedded lake and on REST + S3, a table goes through every kind of write that leaves
featurelake-only state (update files from a backfill and an upsert, a delete, a soft-deleted
column), then ``compact``. Three readers that share no code with featurelake's reader must
then return featurelake's rows: plain pyiceberg through a catalog opened on its own, DuckDB's
``iceberg_scan`` of the metadata file and, on S3, DuckDB attached to the REST catalog
(tests/interop.py runs DuckDB 1.5.5 with its Iceberg extension in a child process).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from backends import both_backends
from featurelake.synthetic import impressions_for_day, impressions_table
from interop import duckdb_read

KEY = "sample_id"


def _rows(table: pa.Table, like: pa.Table) -> list[dict]:
    """Rows in key order, with the other reader's types cast to featurelake's (list sizes, nullability)."""
    return table.select(like.column_names).cast(like.schema).sort_by(KEY).to_pylist()


def _plain_catalog(backend):
    """A pyiceberg catalog opened from the lake's catalog properties alone, without featurelake."""
    from pyiceberg.catalog import load_catalog

    props = dict(backend.lake.catalog.properties)
    kind = "rest" if props["uri"].startswith("http") else "sql"
    return load_catalog(backend.lake.catalog.name, **{**props, "type": kind})  # the SQL catalog scopes rows by name


def _s3(backend) -> dict | None:
    if backend.name != "s3":
        return None
    props = backend.lake.catalog.properties
    return {
        "endpoint": props["s3.endpoint"].removeprefix("http://"), "key_id": props["s3.access-key-id"],
        "secret": props["s3.secret-access-key"], "region": props["s3.region"],
    }


@both_backends
def test_other_engines_read_what_featurelake_reads_after_compact(backend, tmp_path):
    lake = backend.lake
    t = lake.create_table("ml.samples", impressions_table(1, days=1).schema, primary_key=KEY, partition_by=["day(ts)"])
    data = impressions_table(600, days=3, seed=13)
    t.append(data.slice(0, 300))
    t.append(data.slice(300))
    ids = data[KEY]
    t.backfill(pa.table({KEY: ids, "ctr": pc.multiply(data["f0"], 0.1)}))  # a new column
    t.backfill(pa.table({KEY: ids.slice(0, 40), "click": pa.array([7] * 40, pa.int32())}))  # an existing one
    late = pa.Table.from_batches(list(impressions_for_day(5, 20, seed=3)))
    t.upsert(pa.concat_tables([late, data.slice(100, 10).set_column(data.schema.get_field_index("f1"), "f1",
                                                                   pa.array([9.5] * 10, pa.float32()))]))
    t.delete("user_id < 20")
    t.soft_delete_column("f7")  # hidden from readers: a rename, which every engine sees by field id

    merged = t.read()
    assert merged.num_rows > 0 and "f7" not in merged.column_names
    plain = t.iceberg.scan().to_arrow()
    assert _rows(plain, merged) != _rows(merged, merged)  # before compaction the updates are featurelake's own

    report = t.compact()
    assert not report.skipped and t.stats()["update_files"] == 0
    assert _rows(t.read(), merged) == _rows(merged, merged)
    expected = _rows(merged, merged)

    ice = _plain_catalog(backend).load_table("ml.samples")
    assert _rows(ice.scan().to_arrow(), merged) == expected

    s3 = _s3(backend)
    scanned = duckdb_read(tmp_path / "scan.parquet", metadata=ice.metadata_location, s3=s3)
    assert scanned.num_rows == merged.num_rows
    assert _rows(scanned, merged) == expected
    if backend.name == "s3":
        props = lake.catalog.properties
        client_id, client_secret = props["credential"].split(":", 1)
        rest = {"uri": props["uri"], "warehouse": "warehouse", "client_id": client_id, "client_secret": client_secret}
        attached = duckdb_read(tmp_path / "rest.parquet", rest=rest, table="ml.samples", s3=s3)
        assert _rows(attached, merged) == expected

