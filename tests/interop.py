"""DuckDB's own Iceberg reader: an Iceberg client independent of pyiceberg, for the interop tests.

DuckDB's Iceberg extension packages on PyPI match DuckDB 1.5.5, while featurelake's
``lake.sql`` runs on DuckDB 2.x; a 1.5.5 extension crashes DuckDB 2 (measured: SIGSEGV on
LOAD, even with ``allow_extensions_metadata_mismatch``), and two DuckDB versions cannot
share a venv. So DuckDB 1.5.5 and its extensions live in their own folder,
``.venv-interop`` at the repository root (``pip install --target``, no dependencies),
made by ``make test`` or on first use and kept while its pins are unchanged. A child
process of this interpreter with that folder first on PYTHONPATH loads the extensions
from their package folders (never from the network), reads the table and writes the
rows it read to a Parquet file, which the test reads back with pyarrow.

    python tests/interop.py ensure      # create or check the folder (the Makefile does this)
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

PINS = (
    "duckdb==1.5.5",
    "duckdb-extension-iceberg==1.5.5",
    "duckdb-extension-avro==1.5.5",
    "duckdb-extension-httpfs==1.5.5",
)
FOLDER = Path(__file__).resolve().parents[1] / ".venv-interop"
_STAMP = ".pins"


def ensure(folder: Path = FOLDER) -> Path:
    """The folder holding DuckDB 1.5.5 and its Iceberg extensions, installed once per set of pins.

    A lock file makes parallel test workers wait for one install instead of racing.
    """
    wanted = "\n".join(PINS)
    stamp = folder / _STAMP
    if stamp.exists() and stamp.read_text() == wanted:
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and stamp.read_text() == wanted:
            return folder
        shutil.rmtree(folder, ignore_errors=True)
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(folder), *PINS],
            capture_output=True, text=True,
        )
        if done.returncode != 0:
            shutil.rmtree(folder, ignore_errors=True)
            raise RuntimeError(f"installing {' '.join(PINS)} into {folder} failed:\n{done.stdout}{done.stderr}")
        stamp.write_text(wanted)
    return folder


def duckdb_read(out: Path, *, metadata: str | None = None, rest: dict | None = None, table: str | None = None,
                s3: dict | None = None, timeout: float = 120.0):
    """Rows DuckDB reads from an Iceberg table, as a pyarrow Table.

    ``metadata``: ``iceberg_scan`` of that metadata.json. ``rest`` (``uri``, ``client_id``,
    ``client_secret``, ``warehouse``) with ``table`` (``ns.name``): the table as DuckDB's
    Iceberg catalog attaches it through the REST catalog. ``s3`` (``endpoint`` as
    ``host:port``, ``key_id``, ``secret``, ``region``): the object store's credentials.
    Arguments reach the child on stdin, so no secret appears in a process listing.
    """
    import pyarrow.parquet as pq

    folder = ensure()
    args = {"folder": str(folder), "out": str(out), "metadata": metadata, "rest": rest, "table": table, "s3": s3}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, __file__, "scan"], input=json.dumps(args), env=env, capture_output=True, text=True,
        timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"DuckDB could not read the table:\n{done.stdout}{done.stderr}")
    return pq.read_table(out)


def _quote(value: str) -> str:
    return "'" + str(value).replace("'", "''") + "'"


def _scan(args: dict) -> None:
    """In the child: DuckDB 1.5.5 reads the table and copies its rows to ``out`` (Parquet)."""
    import duckdb

    assert duckdb.__version__ == "1.5.5", duckdb.__version__
    con = duckdb.connect(config={
        "allow_unsigned_extensions": "true", "autoinstall_known_extensions": "false",
        "autoload_known_extensions": "false",
    })
    folder = Path(args["folder"])
    for ext in ("httpfs", "avro", "iceberg"):
        [path] = folder.glob(f"duckdb_extension_{ext}/extensions/v{duckdb.__version__}/{ext}.duckdb_extension")
        con.execute(f"LOAD {_quote(path)}")
    if args["s3"]:
        s3 = args["s3"]
        con.execute(
            f"CREATE SECRET store (TYPE s3, KEY_ID {_quote(s3['key_id'])}, SECRET {_quote(s3['secret'])}, "
            f"ENDPOINT {_quote(s3['endpoint'])}, REGION {_quote(s3['region'])}, URL_STYLE 'path', USE_SSL false)"
        )
    if args["rest"]:
        rest = args["rest"]
        con.execute(
            f"CREATE SECRET catalog (TYPE iceberg, CLIENT_ID {_quote(rest['client_id'])}, "
            f"CLIENT_SECRET {_quote(rest['client_secret'])}, "
            f"OAUTH2_SERVER_URI {_quote(rest['uri'].rstrip('/') + '/v1/oauth/tokens')})"
        )
        con.execute(
            f"ATTACH {_quote(rest['warehouse'])} AS lake (TYPE iceberg, SECRET catalog, ENDPOINT {_quote(rest['uri'])})"
        )
        namespace, name = args["table"].split(".")
        source = f'lake."{namespace}"."{name}"'
    else:
        source = f"iceberg_scan({_quote(args['metadata'])})"
    con.execute(f"COPY (SELECT * FROM {source}) TO {_quote(args['out'])} (FORMAT parquet)")


if __name__ == "__main__":
    if sys.argv[1:] == ["ensure"]:
        print(f"DuckDB interop reader: {ensure()}")
    elif sys.argv[1:] == ["scan"]:
        _scan(json.load(sys.stdin))
    else:
        sys.exit("usage: python tests/interop.py ensure|scan")
