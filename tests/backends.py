"""The two deployments every table operation is tested on, and an independent view of their files.

* ``local``: the embedded lake (SQLite catalog + a warehouse folder on local disk);
* ``s3``: an Iceberg REST catalog with an S3 warehouse (SeaweedFS ``weed mini``), the
  sequence store in a local cache folder (``cache_dir``).

A test runs on both with ``@both_backends`` (it must use the ``lake`` or ``backend``
fixture); without it, ``lake`` is the embedded lake. Files are listed, read and damaged
with a client of their own (``os``, or a pyarrow S3 client configured explicitly), never
through featurelake's I/O layer, so a test sees what is really stored.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from featurelake import Lake

both_backends = pytest.mark.parametrize(
    "backend", ["local", pytest.param("s3", marks=pytest.mark.s3)], indirect=True
)


@dataclass
class Backend:
    """A lake on one deployment and an independent client of its store."""

    name: str
    lake: Lake
    fs: pafs.FileSystem | None = None  # the S3 client; None on local disk

    @property
    def root(self) -> str:
        """The warehouse as this backend's files are named (a folder, or ``s3://bucket``)."""
        return str(self.lake.warehouse).rstrip("/")

    def files(self, suffix: str = "") -> set[str]:
        """Every stored file of the warehouse ending with ``suffix``: local paths, or ``s3://`` URIs."""
        if self.fs is None:
            return {str(Path(d) / f) for d, _, fs in os.walk(self.root) for f in fs if f.endswith(suffix)}
        bucket = self.root.removeprefix("s3://")
        infos = self.fs.get_file_info(pafs.FileSelector(bucket + "/", recursive=True))
        return {"s3://" + i.path for i in infos if i.type == pafs.FileType.File and i.path.endswith(suffix)}

    def name_of(self, location: str) -> str:
        """A location as :meth:`files` names it (``file://`` dropped on local disk)."""
        return location.removeprefix("file://") if self.fs is None else location

    def _path(self, location: str) -> str:
        if self.fs is None:
            return location.removeprefix("file://")
        return location.removeprefix("s3://")

    def read_bytes(self, location: str) -> bytes:
        """A stored file's bytes (a location as the table's metadata names it)."""
        if self.fs is None:
            return Path(self._path(location)).read_bytes()
        with self.fs.open_input_stream(self._path(location)) as f:
            return f.read()

    def parquet(self, location: str) -> pq.ParquetFile:
        """A stored Parquet file (footer and all), its bytes fetched with this backend's own client."""
        return pq.ParquetFile(pa.BufferReader(self.read_bytes(location)))

    def overwrite(self, location: str, data: bytes) -> None:
        """Replace a stored file's bytes behind the lake's back (damage it)."""
        if self.fs is None:
            Path(self._path(location)).write_bytes(data)
            return
        with self.fs.open_output_stream(self._path(location)) as f:
            f.write(data)

    def remove(self, location: str) -> None:
        """Delete a stored file behind the lake's back."""
        if self.fs is None:
            os.remove(self._path(location))
        else:
            self.fs.delete_file(self._path(location))
