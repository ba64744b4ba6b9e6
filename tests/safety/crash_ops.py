"""The crash suite's pieces: a base lake, one operation per write kind, their pyarrow oracles, and
the instrumentation that SIGKILLs the process at its Nth file create or catalog commit.

The instrumentation wraps the real calls, without engine changes: pyiceberg's FileIO output
``create`` (every data, update, index, state, manifest and metadata file the platform writes goes
through it), FileIO ``delete``, and the SQL and REST catalogs' ``commit_table`` and
``create_table``. Each call is two events, one before and one after; the process kills itself at
event ``kill_at`` (its 1-based number, or the first event of that name).
A lake is named by ``where``: the home folder of an embedded lake, or a dict of
``Lake.from_uri`` arguments (REST + S3: ``uri``, ``warehouse`` and the catalog properties).
This module is imported by the forkserver's children, so it keeps to the engine and pyarrow.
"""
from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

TABLE = "ns.t"
NEW_TABLE = "ns.t2"
KEY = "id"
SCHEMA = pa.schema([pa.field(KEY, pa.int64(), nullable=False), pa.field("v", pa.int64()), pa.field("s", pa.string())])

TRIALS: Counter = Counter()  # "<kind>:<pre|post>" -> trials run in this process

KINDS = (
    "append", "backfill", "upsert", "delete", "merge", "rebase", "revert", "compact",
    "expire_gc", "create_table", "create_branch",
)


def rows(ids, v=None, s: str = "a") -> pa.Table:
    ids = list(ids)
    values = [i if v is None else v(i) for i in ids]
    return pa.table({KEY: pa.array(ids, pa.int64()), "v": pa.array(values, pa.int64()), "s": [f"{s}{i}" for i in ids]}, schema=SCHEMA)


def replace(table: pa.Table, new: pa.Table) -> pa.Table:
    """``table`` with the rows of ``new`` replacing those of the same key (and new keys added)."""
    kept = table.filter(pc.invert(pc.is_in(table[KEY], value_set=new[KEY])))
    return pa.concat_tables([kept, new.select(table.column_names).cast(table.schema)])


def set_column(table: pa.Table, ids, column: str, fn) -> pa.Table:
    """``table`` with ``column`` set to ``fn(id)`` for the rows whose key is in ``ids``."""
    hit = pc.is_in(table[KEY], value_set=pa.array(list(ids), pa.int64()))
    values = pa.array([fn(i) for i in table[KEY].to_pylist()], table.schema.field(column).type)
    return table.set_column(table.schema.get_field_index(column), column, pc.if_else(hit, values, table[column]))


# ----------------------------------------------------------------------------- the base lake
A1, A2, A3 = rows(range(0, 200)), rows(range(200, 300)), rows(range(1000, 1020))
DEV_BACKFILL = (range(0, 50), lambda i: -i)  # on branch dev, after the fork
U1 = rows(range(290, 310), v=lambda i: i * 10, s="u")  # on main, last


def open_lake(where: "str | Path | dict"):
    """The lake at ``where``: an embedded home folder, or ``Lake.from_uri`` arguments (a dict)."""
    from featurelake import Lake

    if isinstance(where, dict):
        args = dict(where)
        return Lake.from_uri(args.pop("uri"), args.pop("warehouse"), **args)
    return Lake(where)


def build_base(where: "str | Path | dict") -> dict:
    """The lake every trial starts from; returns the snapshot ids to name (``u1``)."""
    lake = open_lake(where)
    t = lake.create_table(TABLE, SCHEMA, primary_key=KEY)
    t.append(A1)
    t.append(A2)
    t.create_branch("dev")
    ids, fn = DEV_BACKFILL
    t.backfill(pa.table({KEY: pa.array(list(ids), pa.int64()), "v": pa.array([fn(i) for i in ids], pa.int64())}), branch="dev")
    t.append(A3)
    u1 = t.upsert(U1)
    return {"u1": u1}


def base_oracles() -> dict[str, pa.Table]:
    """Each ref's rows in the base lake, computed with pyarrow from the inputs."""
    main = replace(pa.concat_tables([A1, A2, A3]), U1)
    dev = set_column(pa.concat_tables([A1, A2]), DEV_BACKFILL[0], "v", DEV_BACKFILL[1])
    return {"main": main, "dev": dev}


# ----------------------------------------------------------------------------- operations
APPENDED = rows(range(400, 450), s="n")
BACKFILLED = (range(150, 250), lambda i: 7)  # rows of A1 and A2: two small layers in one shared update file
# rows of A1 and A2 (two small sparse layers: one shared update file), all of U1's new file (dense), new keys
UPSERTED = rows([*range(190, 210), *range(280, 320)], v=lambda i: i + 5, s="x")


def run(where: "str | Path | dict", kind: str, names: dict) -> None:
    """The write of ``kind`` on the base lake at ``where``."""
    lake = open_lake(where)
    if kind == "create_table":
        lake.create_table(NEW_TABLE, SCHEMA, primary_key=KEY)
        return
    t = lake.table(TABLE)
    if kind == "append":
        t.append(APPENDED)
    elif kind == "backfill":
        ids, fn = BACKFILLED
        t.backfill(pa.table({KEY: pa.array(list(ids), pa.int64()), "v": pa.array([fn(i) for i in ids], pa.int64())}))
    elif kind == "upsert":
        t.upsert(UPSERTED)
    elif kind == "delete":
        t.delete("id < 50")
    elif kind == "merge":
        t.merge("dev", into="main")
    elif kind == "rebase":
        t.rebase("dev", onto="main")
    elif kind == "revert":
        t.revert(names["u1"], branch="main")
    elif kind == "compact":
        t.compact()
    elif kind == "expire_gc":
        t.expire_snapshots(datetime.now(timezone.utc) + timedelta(seconds=1), retain_last=1)
        lake.collect_garbage(older_than=timedelta(0))
    elif kind == "create_branch":
        t.create_branch("feat")
    else:
        raise ValueError(kind)


def post_oracles(kind: str) -> dict[str, pa.Table]:
    """Each ref's rows once ``kind`` has committed (refs the kind does not touch keep theirs)."""
    refs = base_oracles()
    main = refs["main"]
    merged = set_column(main, DEV_BACKFILL[0], "v", DEV_BACKFILL[1])
    refs.update(
        {
            "append": {"main": pa.concat_tables([main, APPENDED])},
            "backfill": {"main": set_column(main, BACKFILLED[0], "v", BACKFILLED[1])},
            "upsert": {"main": replace(main, UPSERTED)},
            "delete": {"main": main.filter(pc.greater_equal(main[KEY], 50))},
            "merge": {"main": merged},
            "rebase": {"dev": merged},
            "revert": {"main": pa.concat_tables([A1, A2, A3])},
            "create_branch": {"feat": main},
        }.get(kind, {})
    )
    return refs


MOVES = {
    "append": {"main"}, "backfill": {"main"}, "upsert": {"main"}, "delete": {"main"}, "merge": {"main"},
    "rebase": {"dev"}, "revert": {"main"}, "compact": {"main"}, "expire_gc": set(), "create_table": set(),
    "create_branch": {"feat"},
}


# ----------------------------------------------------------------------------- instrumentation
class Tripwire:
    """Counts file creates/deletes and catalog commits; SIGKILLs this process at event ``kill_at``
    (its 1-based number, or the first event named ``kill_at``)."""

    def __init__(self, kill_at: int | str) -> None:
        self.kill_at = kill_at
        self.events: list[str] = []

    def event(self, name: str) -> None:
        self.events.append(name)
        if len(self.events) == self.kill_at or name == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    def install(self) -> None:
        from pyiceberg.catalog.rest import RestCatalog
        from pyiceberg.catalog.sql import SqlCatalog
        from pyiceberg.io.pyarrow import PyArrowFile, PyArrowFileIO

        wire = self

        def around(cls, method: str, label) -> None:
            original = getattr(cls, method)

            def wrapped(*args, **kwargs):
                name = label(*args, **kwargs)
                wire.event(f"before {name}")
                result = original(*args, **kwargs)
                wire.event(f"after {name}")
                return result

            setattr(cls, method, wrapped)

        around(PyArrowFile, "create", lambda f, *a, **k: f"create {_kind_of(f.location)}")
        around(PyArrowFileIO, "delete", lambda io, loc, *a, **k: f"delete {_kind_of(str(getattr(loc, 'location', loc)))}")
        for catalog in (SqlCatalog, RestCatalog):
            around(catalog, "commit_table", lambda *a, **k: "commit_table")
            around(catalog, "create_table", lambda *a, **k: "create_table")


def _kind_of(location: str) -> str:
    name = location.rsplit("/", 1)[-1]
    if name.endswith(".metadata.json"):
        return "metadata.json"
    if name.startswith("snap-"):
        return "manifest-list"
    if name.endswith(".avro"):
        return "manifest"
    return location.rsplit("/", 2)[-2] + "/" + name.rsplit(".", 1)[-1]


def child(where: "str | dict", kind: str, names: dict, kill_at: int | str, report: str, started=None) -> None:
    """Entry point of a trial's process: instrument, signal start, run ``kind``, write the events."""
    wire = Tripwire(kill_at)
    wire.install()
    if started is not None:
        started.set()
    t0 = time.perf_counter()
    run(where, kind, names)
    Path(report).write_text(json.dumps({"events": wire.events, "seconds": time.perf_counter() - t0}))
