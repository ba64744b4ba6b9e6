"""The bad-input catalogue: every bad input gets its featurelake error and writes nothing.

Each case runs against one small lake built once for the module and asserts
the exact featurelake error class and that the lake is unchanged: the
recursive listing of the home (paths and sizes) and the snapshot id of every
ref of every table are the same before and after. Iceberg metadata holds
absolute paths, so a copied home would still write to the original: the
cases share the lake instead, each checking its own before/after.

On REST + S3, one API case per error class (and a few more on the write
paths) runs against a module lake on the session's SeaweedFS: the bucket is
listed (keys and sizes) with the test's own pyarrow S3 client, and the
catalog's namespaces, tables and refs are compared before and after.

Damaged files, a read-only warehouse and a full disk need a lake of their
own; they follow the catalogue (local disk only: they damage files or the
disk underneath the lake).
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from featurelake import Lake
from featurelake.cli import app
from featurelake.errors import (
    BranchNotFoundError,
    CorruptFileError,
    DuplicateKeyError,
    FeatureLakeError,
    InvalidArgumentError,
    InvalidNameError,
    NullKeyError,
    PrimaryKeyError,
    SchemaMismatchError,
    StorageError,
    TableExistsError,
    TableNotFoundError,
    UnknownKeyError,
)

TABLE = "ns.t"
N = 20
SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("x", pa.float64()),
        pa.field("req", pa.int32(), nullable=False),
        pa.field("lab", pa.int64()),
        pa.field("ts", pa.timestamp("us")),
    ]
)
runner = CliRunner()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for var in ("FEATURELAKE_CATALOG_URI", "FEATURELAKE_WAREHOUSE", "FEATURELAKE_HOME"):
        monkeypatch.delenv(var, raising=False)


def rows(ids, **overrides) -> pa.Table:
    """Rows of SCHEMA for ``ids`` (all columns valid), with columns replaced by ``overrides``."""
    ids = list(ids)
    cols = {
        "id": pa.array(ids, pa.int64()),
        "x": pa.array([float(i) for i in ids]),
        "req": pa.array([i % 7 for i in ids], pa.int32()),
        "lab": pa.array([i % 2 for i in ids], pa.int64()),
        "ts": pa.array([1_700_000_000_000_000 + i for i in ids], pa.timestamp("us")),
    }
    cols.update(overrides)
    return pa.table(cols)


def build_lake(home: Path | Lake) -> Lake:
    """The catalogue's lake: the embedded one at ``home``, or the given (empty) lake."""
    lake = home if isinstance(home, Lake) else Lake(home)
    t = lake.create_table(TABLE, SCHEMA, primary_key="id")
    t.append(rows(range(N)).cast(SCHEMA))
    t.backfill(pa.table({"id": pa.array([1, 2], pa.int64()), "lab": pa.array([5, 6], pa.int64())}))
    t.create_branch("dev")
    t.create_tag("v1")
    return lake


def fingerprint(home: Path) -> tuple:
    """Every file under ``home`` with its size, and every ref's snapshot id of every table."""
    files = sorted(
        (os.path.relpath(os.path.join(d, f), home), os.path.getsize(os.path.join(d, f)))
        for d, _, fs in os.walk(home)
        for f in fs
    )
    lake = Lake(home)
    refs = {}
    for name in lake.tables():
        meta = lake.table(name).iceberg.metadata
        refs[name] = {r: ref.snapshot_id for r, ref in meta.refs.items()}
    return files, refs


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The module's lake and a folder of input files outside it."""
    root = tmp_path_factory.mktemp("bad_input")
    home = root / "lake"
    build_lake(home)
    inputs = root / "inputs"
    inputs.mkdir()
    return home, inputs


def parquet(inputs: Path, name: str, table: pa.Table) -> str:
    path = inputs / f"{name}.parquet"
    pq.write_table(table, path)
    return str(path)


def cli(home: Path, *args: str):
    return runner.invoke(app, ["--home", str(home), *args])


# ----------------------------------------------------------------- the catalogue
# Each case: (id, error class, action). An action gets (lake, table, inputs folder, home).
def _create(name=TABLE + "x", schema=SCHEMA, primary_key="id", **kw):
    return lambda lake, t, i, h: lake.create_table(name, schema, primary_key=primary_key, **kw)


def _locator_rows(t, **cols):
    located = t.read(columns=["id"], with_locator=True).slice(0, 3)
    return pa.table({"_file": located["_file"], "_pos": located["_pos"], **cols})


U64_BIG = pa.array([2**63 + 5], pa.uint64())
TS_NS_LOSSY = pa.array([1_700_000_000_000_000_001], pa.timestamp("ns"))
API_CASES: list[tuple[str, type[FeatureLakeError], Callable[..., Any]]] = [
    # names: a trailing newline must not pass ($ matches before it)
    ("table-name-trailing-newline", InvalidNameError, _create(name="ns.t\n")),
    ("namespace-trailing-newline", InvalidNameError, _create(name="ns\n.q")),
    ("table-name-three-parts", InvalidNameError, _create(name="ns.q.r")),
    ("table-name-dash", InvalidNameError, _create(name="ns.bad-name")),
    ("open-table-trailing-newline", InvalidNameError, lambda lake, t, i, h: lake.table("ns.t\n")),
    ("open-missing-table", TableNotFoundError, lambda lake, t, i, h: lake.table("ns.nothere")),
    ("branch-trailing-newline", InvalidNameError, lambda lake, t, i, h: t.create_branch("x\n")),
    ("tag-trailing-newline", InvalidNameError, lambda lake, t, i, h: t.create_tag("x\n")),
    ("branch-dotdot", InvalidNameError, lambda lake, t, i, h: t.create_branch("a..b")),
    ("branch-empty", InvalidNameError, lambda lake, t, i, h: t.create_branch("")),
    ("column-newline", InvalidNameError, _create(schema=SCHEMA.append(pa.field("a\nb", pa.int64())))),
    ("column-reserved", InvalidNameError, _create(schema=SCHEMA.append(pa.field("_x", pa.int64())))),
    # create_table arguments
    ("bucket-zero", InvalidArgumentError, _create(partition_by=["bucket(0, id)"])),
    ("truncate-zero", InvalidArgumentError, _create(partition_by=["truncate(0, id)"])),
    ("partition-trailing-junk", InvalidNameError, _create(partition_by=["day(ts) x"])),
    ("partition-unknown-transform", InvalidNameError, _create(partition_by=["bogus(ts)"])),
    ("partition-unknown-column", SchemaMismatchError, _create(partition_by=["day(nope)"])),
    ("primary-key-repeated", InvalidArgumentError, _create(primary_key=["id", "id"])),
    ("primary-key-missing", SchemaMismatchError, _create(primary_key="nope")),
    ("primary-key-float", SchemaMismatchError, _create(primary_key="x")),
    ("property-primary-key", InvalidArgumentError, _create(properties={"featurelake.primary-key": "x"})),
    ("property-format-version-1", InvalidArgumentError, _create(properties={"format-version": "1"})),
    ("property-not-a-string", InvalidArgumentError, _create(properties={"write.x": 3})),
    ("create-existing", TableExistsError, _create(name=TABLE)),
    # append
    ("append-null-required", SchemaMismatchError, lambda lake, t, i, h: t.append(rows([100], req=pa.array([None], pa.int32())))),
    ("append-missing-required", SchemaMismatchError, lambda lake, t, i, h: t.append(rows([100]).drop_columns(["req"]))),
    ("append-null-key", NullKeyError, lambda lake, t, i, h: t.append(rows([100, 101], id=pa.array([None, 101], pa.int64())))),
    ("append-repeated-key", DuplicateKeyError, lambda lake, t, i, h: t.append(rows([100, 100]))),
    ("append-existing-key", DuplicateKeyError, lambda lake, t, i, h: t.append(rows([3]))),
    ("append-string-key", SchemaMismatchError, lambda lake, t, i, h: t.append(rows([100], id=pa.array(["100"])))),
    ("append-timestamp-key", SchemaMismatchError, lambda lake, t, i, h: t.append(rows([100], id=pa.array([100], pa.timestamp("us"))))),
    ("append-nan-key", SchemaMismatchError, lambda lake, t, i, h: t.append(rows([100], id=pa.array([float("nan")])))),
    ("append-unknown-column", SchemaMismatchError, lambda lake, t, i, h: t.append(rows([100]).append_column("zz", pa.array([1])))),
    ("append-duplicate-columns", SchemaMismatchError, lambda lake, t, i, h: t.append(rows([100]).append_column("x", pa.array([1.0])))),
    ("append-uint64-overflow", SchemaMismatchError, lambda lake, t, i, h: t.append(rows([100], lab=U64_BIG))),
    ("append-timestamp-ns-lossy", SchemaMismatchError, lambda lake, t, i, h: t.append(rows([100], ts=TS_NS_LOSSY))),
    ("append-unknown-branch", BranchNotFoundError, lambda lake, t, i, h: t.append(rows([100]), branch="nope")),
    ("append-to-tag", BranchNotFoundError, lambda lake, t, i, h: t.append(rows([100]), branch="v1")),
    ("append-not-a-table", SchemaMismatchError, lambda lake, t, i, h: t.append(42)),
    # backfill
    ("backfill-null-required", SchemaMismatchError, lambda lake, t, i, h: t.backfill(pa.table({"id": [1], "req": pa.array([None], pa.int32())}))),
    ("backfill-on-unknown-bogus", InvalidArgumentError, lambda lake, t, i, h: t.backfill(pa.table({"id": [1], "x": [1.0]}), on_unknown="whatever")),
    ("backfill-unknown-key", UnknownKeyError, lambda lake, t, i, h: t.backfill(pa.table({"id": [999], "x": [1.0]}))),
    ("backfill-uint64-overflow-new-column", SchemaMismatchError, lambda lake, t, i, h: t.backfill(pa.table({"id": [1], "big": U64_BIG}))),
    ("backfill-uint32-overflow", SchemaMismatchError, lambda lake, t, i, h: t.backfill(pa.table({"id": [1], "req": pa.array([2**32 - 1], pa.uint32())}))),
    ("backfill-timestamp-ns-lossy", SchemaMismatchError, lambda lake, t, i, h: t.backfill(pa.table({"id": [1], "ts2": TS_NS_LOSSY}))),
    ("backfill-duplicate-columns", SchemaMismatchError, lambda lake, t, i, h: t.backfill(pa.Table.from_arrays([pa.array([1]), pa.array([1.0]), pa.array([2.0])], names=["id", "x", "x"]))),
    ("backfill-nan-key", SchemaMismatchError, lambda lake, t, i, h: t.backfill(pa.table({"id": [float("nan")], "x": [1.0]}))),
    ("backfill-string-key", SchemaMismatchError, lambda lake, t, i, h: t.backfill(pa.table({"id": ["1"], "x": [1.0]}))),
    ("backfill-null-key", NullKeyError, lambda lake, t, i, h: t.backfill(pa.table({"id": pa.array([1, None], pa.int64()), "x": [1.0, 2.0]}))),
    ("backfill-repeated-key", DuplicateKeyError, lambda lake, t, i, h: t.backfill(pa.table({"id": [1, 1], "x": [1.0, 2.0]}))),
    ("backfill-locator-changed-key", PrimaryKeyError, lambda lake, t, i, h: t.backfill(_locator_rows(t, id=pa.array([500, 501, 502]), x=[1.0, 2.0, 3.0]))),
    ("backfill-locator-bad-file", UnknownKeyError, lambda lake, t, i, h: t.backfill(pa.table({"_file": ["nope.parquet"], "_pos": [0], "x": [1.0]}))),
    ("backfill-no-value-column", SchemaMismatchError, lambda lake, t, i, h: t.backfill(pa.table({"id": [1]}))),
    ("backfill-reserved-column", SchemaMismatchError, lambda lake, t, i, h: t.backfill(pa.table({"id": [1], "_y": [1.0]}))),
    ("backfill-wrong-type", SchemaMismatchError, lambda lake, t, i, h: t.backfill(pa.table({"id": [1], "x": ["a"]}))),
    # upsert
    ("upsert-new-key-missing-required", SchemaMismatchError, lambda lake, t, i, h: t.upsert(pa.table({"id": [1, 100], "lab": [1, 1]}))),
    ("upsert-new-key-null-required", SchemaMismatchError, lambda lake, t, i, h: t.upsert(rows([100], req=pa.array([None], pa.int32())))),
    ("upsert-uint64-overflow", SchemaMismatchError, lambda lake, t, i, h: t.upsert(pa.table({"id": [1], "lab": U64_BIG}))),
    ("upsert-uint32-overflow", SchemaMismatchError, lambda lake, t, i, h: t.upsert(pa.table({"id": [1], "req": pa.array([2**32 - 1], pa.uint32())}))),
    ("upsert-duplicate-columns", SchemaMismatchError, lambda lake, t, i, h: t.upsert(pa.Table.from_arrays([pa.array([1]), pa.array([1.0]), pa.array([2.0])], names=["id", "x", "x"]))),
    ("upsert-nan-key", SchemaMismatchError, lambda lake, t, i, h: t.upsert(pa.table({"id": [float("nan")], "x": [1.0]}))),
    ("upsert-timestamp-key", SchemaMismatchError, lambda lake, t, i, h: t.upsert(pa.table({"id": pa.array([1], pa.timestamp("us")), "x": [1.0]}))),
    ("upsert-string-key", SchemaMismatchError, lambda lake, t, i, h: t.upsert(pa.table({"id": ["1"], "x": [1.0]}))),
    ("upsert-missing-key", SchemaMismatchError, lambda lake, t, i, h: t.upsert(pa.table({"x": [1.0]}))),
    ("upsert-timestamp-ns-lossy", SchemaMismatchError, lambda lake, t, i, h: t.upsert(pa.table({"id": [1], "ts": TS_NS_LOSSY}))),
    ("upsert-unknown-branch", BranchNotFoundError, lambda lake, t, i, h: t.upsert(rows([100]), branch="nope")),
    # reads and refs
    ("batches-size-zero", InvalidArgumentError, lambda lake, t, i, h: list(t.batches(batch_size=0))),
    ("read-unknown-branch", BranchNotFoundError, lambda lake, t, i, h: t.read(branch="nope")),
    ("read-unknown-snapshot", BranchNotFoundError, lambda lake, t, i, h: t.read(snapshot_id=12345)),
    ("merge-unknown-source", BranchNotFoundError, lambda lake, t, i, h: t.merge("nope")),
    ("drop-unknown-branch", BranchNotFoundError, lambda lake, t, i, h: t.drop_branch("nope")),
]


def _cli_case(args: Callable[[Path], list[str]]):
    def run(lake, t, inputs, home):
        result = cli(home, *args(inputs))
        assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
        assert "Traceback" not in result.output
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error"), result.stderr
        return lines[0]

    return run


def _file_case(name: str, table: Callable[[], pa.Table], command: str = "append", *extra: str):
    return _cli_case(lambda inputs: [command, TABLE, parquet(inputs, name, table()), *extra])


CLI_CASES = [
    ("cli-append-null-required", SchemaMismatchError, _file_case("null_req", lambda: rows([100], req=pa.array([None], pa.int32())))),
    ("cli-append-existing-key", DuplicateKeyError, _file_case("existing", lambda: rows([3]))),
    ("cli-append-string-key", SchemaMismatchError, _file_case("strkey", lambda: rows([100], id=pa.array(["100"])))),
    ("cli-append-overflow", SchemaMismatchError, _file_case("overflow", lambda: rows([100], lab=U64_BIG))),
    ("cli-append-to-tag", BranchNotFoundError, _file_case("totag", lambda: rows([100]), "append", "--branch", "v1")),
    ("cli-backfill-null-required", SchemaMismatchError, _file_case("bf_null", lambda: pa.table({"id": [1], "req": pa.array([None], pa.int32())}), "backfill")),
    ("cli-backfill-unknown-key", UnknownKeyError, _file_case("bf_unknown", lambda: pa.table({"id": [999], "x": [1.0]}), "backfill")),
    ("cli-backfill-overflow", SchemaMismatchError, _file_case("bf_overflow", lambda: pa.table({"id": [1], "big": U64_BIG}), "backfill")),
    ("cli-upsert-new-key-missing-required", SchemaMismatchError, _file_case("up_missing", lambda: pa.table({"id": [100], "lab": [1]}), "upsert")),
    ("cli-upsert-nan-key", SchemaMismatchError, _file_case("up_nan", lambda: pa.table({"id": [float("nan")], "x": [1.0]}), "upsert")),
    ("cli-branch-trailing-newline", InvalidNameError, _cli_case(lambda i: ["branch", "create", TABLE, "x\n"])),
    ("cli-tag-trailing-newline", InvalidNameError, _cli_case(lambda i: ["tag", TABLE, "x\n"])),
    ("cli-stats-table-trailing-newline", InvalidNameError, _cli_case(lambda i: ["stats", TABLE + "\n"])),
    ("cli-stats-missing-table", TableNotFoundError, _cli_case(lambda i: ["stats", "ns.nothere"])),
    ("cli-read-unknown-branch", BranchNotFoundError, _cli_case(lambda i: ["read", TABLE, "--branch", "nope"])),
    ("cli-merge-unknown-source", BranchNotFoundError, _cli_case(lambda i: ["merge", TABLE, "nope"])),
]


@pytest.mark.parametrize("error, action", [c[1:] for c in API_CASES + CLI_CASES], ids=[c[0] for c in API_CASES + CLI_CASES])
def test_bad_input_is_refused_and_writes_nothing(shared, error, action):
    home, inputs = shared
    before = fingerprint(home)
    lake = Lake(home)
    t = lake.table(TABLE)
    if action.__name__ == "run":  # a CLI case: the error class is named on its one line
        line = action(lake, t, inputs, home)
        assert f"({error.__name__})" in line, line
    else:
        with pytest.raises(error) as info:
            action(lake, t, inputs, home)
        assert type(info.value) is error, type(info.value)
    assert fingerprint(home) == before


def test_catalogue_is_large_enough():
    assert len(API_CASES) + len(CLI_CASES) >= 60


# ------------------------------------------------------- the catalogue on S3
# Every error class of the API catalogue once, plus more write paths (create on the
# REST catalog, append/backfill/upsert that would upload before the refusal).
S3_CASE_IDS = [
    "table-name-trailing-newline", "open-missing-table", "bucket-zero", "create-existing",
    "append-null-required", "append-null-key", "append-existing-key", "append-to-tag",
    "backfill-unknown-key", "backfill-locator-changed-key", "upsert-new-key-missing-required",
]
S3_CASES = [c for c in API_CASES if c[0] in S3_CASE_IDS]


def test_s3_cases_cover_every_error_class_of_the_catalogue():
    assert len(S3_CASES) == len(S3_CASE_IDS)
    assert {c[1] for c in S3_CASES} == {c[1] for c in API_CASES}


@pytest.fixture(scope="module")
def shared_s3(seaweed, tmp_path_factory):
    """The catalogue's lake on the session's REST catalog + S3 (emptied first), and the bucket's own client."""
    lake = Lake.from_uri(seaweed.catalog_uri, seaweed.warehouse, cache_dir=tmp_path_factory.mktemp("bad_input_s3"),
                         **seaweed.catalog_properties())
    for name in lake.tables():
        lake.drop_table(name, purge=True)
    return build_lake(lake), seaweed.filesystem()


def s3_fingerprint(lake: Lake, fs) -> tuple:
    """Every object of the warehouse bucket with its size (listed by ``fs``), and the catalog's
    namespaces, tables and every ref's snapshot id."""
    import pyarrow.fs as pafs

    bucket = str(lake.warehouse).removeprefix("s3://").strip("/")
    infos = fs.get_file_info(pafs.FileSelector(bucket, recursive=True))
    objects = sorted((i.path, i.size) for i in infos if i.type == pafs.FileType.File)
    refs = {name: {r: ref.snapshot_id for r, ref in lake.table(name).iceberg.metadata.refs.items()} for name in lake.tables()}
    return objects, sorted(lake.catalog.list_namespaces()), refs


@pytest.mark.s3
@pytest.mark.parametrize("error, action", [c[1:] for c in S3_CASES], ids=[c[0] for c in S3_CASES])
def test_bad_input_on_s3_is_refused_and_writes_nothing(shared_s3, error, action):
    lake, fs = shared_s3
    before = s3_fingerprint(lake, fs)
    assert before[0] and TABLE in before[2]  # the bucket holds the module's table
    with pytest.raises(error) as info:
        action(lake, lake.table(TABLE), None, None)
    assert type(info.value) is error, type(info.value)
    assert s3_fingerprint(lake, fs) == before


# ------------------------------------------------------- named item checks
def test_trailing_newline_name_does_not_write_into_the_other_table(tmp_path):
    lake = build_lake(tmp_path / "lake")
    before = fingerprint(tmp_path / "lake")
    with pytest.raises(InvalidNameError):
        lake.create_table("ns.t\n", SCHEMA, primary_key="id")
    with pytest.raises(InvalidNameError):
        lake.table(TABLE + "\n")
    assert fingerprint(tmp_path / "lake") == before


def test_mixed_upsert_keeps_required_values_of_existing_keys_and_compacts(tmp_path):
    """Existing keys carry only a label (null in the required column): they keep their values."""
    lake = build_lake(tmp_path / "lake")
    t = lake.table(TABLE)
    expected = t.read().sort_by("id")
    mixed = pa.table(
        {
            "id": pa.array([0, 1, 2, 100, 101], pa.int64()),
            "lab": pa.array([7, 7, 7, 1, 1], pa.int64()),
            "req": pa.array([None, None, 3, 4, 5], pa.int32()),
        }
    )
    t.upsert(mixed)
    got = t.read().sort_by("id")
    assert got["req"].null_count == 0
    old = got.filter(pc.less(got["id"], 100))
    want_req = expected["req"].to_pylist()
    want_req[2] = 3  # the one existing key that did give a value
    assert old["req"].to_pylist() == want_req
    assert old["lab"].to_pylist()[:3] == [7, 7, 7]
    new = got.filter(pc.greater_equal(got["id"], 100))
    assert new["req"].to_pylist() == [4, 5] and new["x"].null_count == 2
    t.compact()
    assert t.read().sort_by("id").equals(got)
    assert t.iceberg.scan().to_arrow().sort_by("id").select(got.column_names).cast(got.schema).equals(got)


def test_append_null_in_required_column_leaves_no_files(tmp_path):
    lake = build_lake(tmp_path / "lake")
    t = lake.table(TABLE)
    before = fingerprint(tmp_path / "lake")
    with pytest.raises(SchemaMismatchError, match="req"):
        t.append(rows(range(100, 200), req=pa.array([None] * 100, pa.int32())))
    assert fingerprint(tmp_path / "lake") == before


def test_upsert_of_zero_rows_commits_nothing(tmp_path):
    lake = build_lake(tmp_path / "lake")
    t = lake.table(TABLE)
    head = t.branches()["main"]
    before = fingerprint(tmp_path / "lake")
    assert t.upsert(rows([]).cast(SCHEMA)) == head
    assert fingerprint(tmp_path / "lake") == before
    empty = lake.create_table("ns.empty", SCHEMA, primary_key="id")
    assert empty.upsert(rows([]).cast(SCHEMA)) is None


def test_lossless_timestamp_ns_is_stored_as_microseconds(tmp_path):
    lake = build_lake(tmp_path / "lake")
    t = lake.table(TABLE)
    ns = pa.array([1_700_000_000_000_000_000, None], pa.timestamp("ns"))
    t.backfill(pa.table({"id": [1, 2], "seen": ns}))
    got = t.read(columns=["id", "seen"]).sort_by("id")
    assert got.schema.field("seen").type == pa.timestamp("us")
    assert got["seen"].to_pylist()[1:3] == ns.cast(pa.timestamp("us")).to_pylist()
    ns_schema = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("when", pa.timestamp("ns"))])
    t2 = lake.create_table("ns.nanos", ns_schema, primary_key="k")
    t2.append(pa.table({"k": [1], "when": pa.array([1_000_000_000], pa.timestamp("ns"))}))
    assert t2.read()["when"].type == pa.timestamp("us")


def test_backfill_by_locator_with_unchanged_key_works(tmp_path):
    lake = build_lake(tmp_path / "lake")
    t = lake.table(TABLE)
    located = t.read(columns=["id"], with_locator=True).slice(0, 3)
    t.backfill(pa.table({"_file": located["_file"], "_pos": located["_pos"], "id": located["id"], "x": [9.0] * 3}))
    got = t.read(columns=["id", "x"]).sort_by("id")
    ids = set(located["id"].to_pylist())
    assert [x for i, x in zip(got["id"].to_pylist(), got["x"].to_pylist()) if i in ids] == [9.0] * 3


# ------------------------------------------------------- damaged files
def _damaged_lake(tmp_path) -> tuple[Path, Lake]:
    home = tmp_path / "lake"
    return home, build_lake(home)


def _clear_caches():
    from featurelake import index, manifest_cache, merge, read, state

    index.clear_caches()
    manifest_cache.clear()
    read.clear_caches()
    state.clear_caches()
    merge._FILES_CACHE.clear()


@pytest.mark.parametrize("damage", ["missing", "garbage"])
def test_damaged_index_segment_names_the_path(tmp_path, damage):
    home, lake = _damaged_lake(tmp_path)
    (segment,) = glob.glob(str(home / "warehouse/ns/t/data/_featurelake/index/*.parquet"))
    if damage == "missing":
        os.remove(segment)
    else:
        Path(segment).write_bytes(b"not an arrow file" * 8)
    _clear_caches()
    before = fingerprint(home)
    with pytest.raises(CorruptFileError) as info:
        Lake(home).table(TABLE).upsert(rows([1, 100]))
    assert info.value.path and os.path.basename(segment) in info.value.path and os.path.basename(segment) in str(info.value)
    assert fingerprint(home) == before


def test_state_root_with_missing_fields_names_the_file(tmp_path):
    home, lake = _damaged_lake(tmp_path)
    for root in glob.glob(str(home / "warehouse/ns/t/data/_featurelake/state-*.parquet")):
        Path(root).write_text('{"format": 1}')
    _clear_caches()
    with pytest.raises(CorruptFileError) as info:
        Lake(home).table(TABLE).read()
    assert "state-" in info.value.path and info.value.path in str(info.value)


@pytest.mark.parametrize("damage", [b"", b"Obj\x01garbage", b"garbage-no-header", None])
def test_corrupt_manifest_list_is_a_clear_error(tmp_path, damage):
    home, lake = _damaged_lake(tmp_path)
    head = lake.table(TABLE).iceberg.current_snapshot()
    path = head.manifest_list.removeprefix("file://")
    if damage is None:
        os.remove(path)
    else:
        Path(path).write_bytes(damage)
    _clear_caches()
    before = fingerprint(home)
    t = Lake(home).table(TABLE)
    with pytest.raises(CorruptFileError) as info:
        t.read()
    assert os.path.basename(path) in str(info.value)
    with pytest.raises(CorruptFileError):
        t.append(rows([100]))
    assert fingerprint(home) == before


def test_corrupt_catalog_db_is_a_clear_error_in_api_and_cli(tmp_path):
    home, lake = _damaged_lake(tmp_path)
    (home / "catalog.db").write_bytes(b"garbage" * 1000)
    with pytest.raises(CorruptFileError, match="catalog"):
        Lake(home)
    result = cli(home, "tables")
    assert result.exit_code == 1 and "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "CorruptFileError" in lines[0], result.stderr


def test_create_existing_table_leaves_no_metadata(tmp_path):
    home, lake = _damaged_lake(tmp_path)
    before = fingerprint(home)
    with pytest.raises(TableExistsError):
        lake.create_table(TABLE, SCHEMA, primary_key="id")
    assert fingerprint(home) == before


# ------------------------------------------------------- hostile storage
def _mount(*args: str) -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None and subprocess.run(
        ["mount", *args], capture_output=True
    ).returncode == 0


@contextmanager
def read_only(folder: Path):
    """``folder`` read-only: a read-only bind mount as root (root ignores modes), else chmod."""
    if _mount("--bind", str(folder), str(folder)):
        try:
            if not _mount("-o", "remount,ro,bind", str(folder)):
                pytest.skip("cannot remount read-only here")
            yield
        finally:
            subprocess.run(["umount", "-l", str(folder)], check=True)
        return
    if os.geteuid() == 0:
        pytest.skip("root without mount: cannot make a folder read-only")
    modes = {}
    for d, _, _ in os.walk(folder):
        modes[d] = os.stat(d).st_mode
        os.chmod(d, 0o555)
    try:
        yield
    finally:
        for d, mode in modes.items():
            os.chmod(d, mode)


WRITES = {
    "append": lambda lake, t: t.append(rows(range(100, 110))),
    "backfill": lambda lake, t: t.backfill(pa.table({"id": [1, 2], "x": [0.5, 0.25]})),
    "upsert": lambda lake, t: t.upsert(rows([1, 100])),
    "create_table": lambda lake, t: lake.create_table("ns.other", SCHEMA, primary_key="id"),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_read_only_warehouse_is_a_clear_error(tmp_path, write):
    home, lake = _damaged_lake(tmp_path)
    t = lake.table(TABLE)
    before = fingerprint(home)
    with read_only(home / "warehouse"):
        with pytest.raises(StorageError):
            WRITES[write](lake, t)
    assert fingerprint(home) == before


@pytest.mark.parametrize("write", ["append", "upsert", "backfill"])
def test_full_disk_is_a_clear_error_and_leaves_no_partial_file(tmp_path, write):
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)):
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        home = disk / "lake"
        lake = build_lake(home)
        t = lake.table(TABLE)
        before = fingerprint(home)
        free = shutil.disk_usage(disk).free
        filler = disk / "filler"
        filler.write_bytes(b"\0" * max(0, free - 48 * 1024))
        rng = np.random.default_rng(0)
        n = 40_000  # random floats: ~320 KB of Parquet, more than the disk has left
        big = {
            "append": lambda: t.append(rows(range(1000, 1000 + n), x=pa.array(rng.random(n)))),
            "upsert": lambda: t.upsert(rows(range(1000, 1000 + n), x=pa.array(rng.random(n)))),
            "backfill": lambda: t.backfill(pa.table({"id": pa.array(np.arange(N) % N, pa.int64()),
                                                     "wide": pa.array([rng.random(4000).tolist() for _ in range(N)])})),
        }[write]
        with pytest.raises(StorageError):
            big()
        filler.unlink()
        assert fingerprint(home) == before
        assert Lake(home).table(TABLE).read().num_rows == N
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)
