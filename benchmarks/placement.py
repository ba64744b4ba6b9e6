"""Column placement: I/O of a 50-of-500-column projection before and after compact(placement=True).

Setup: a table of ``sample_id`` + 499 float32 features (rows scaled by
--rows, one data file); a training reader projects 50 columns spread evenly
over the schema, so the platform records that projection; then
``compact(placement=True)`` rewrites the file with those columns first. Each
layout's projection is read with pre-buffering (Arrow coalesces adjacent
column chunks) through a file object that counts the read calls and bytes
reaching the file, and timed.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import Config, Timing, ratio, timed, work_dir, write_result

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
        "notes": ["local disk; read calls are those reaching the file through pyarrow's pre-buffered (coalescing) reader"],
    }
    path = write_result(NAME, cfg, result)
    print(f"  read calls {before['read_calls']} -> {after['read_calls']}, bytes {before['bytes_read']:,} -> {after['bytes_read']:,}, "
          f"best {before['best_s']*1e3:.1f} -> {after['best_s']*1e3:.1f} ms  -> {path}")
    return result
