"""The demo's ``late labels`` section: labels that arrive weeks later, upserted by key.

A conversion label for one sample in twenty arrives two weeks after the
impression. ``Table.upsert`` finds each key's row through the global key
index and writes the label as update files: no data file is rewritten, and
although the late rows carry a later ``ts`` (the partition source), each key
keeps the day partition it was first written to. The section reports the
time, rows updated and inserted, bytes written, that the data files are the
same before and after, and the index check.
"""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

TABLE = "ml.samples"
EVERY = 20


def run_late_labels(lake) -> Optional[dict]:
    if TABLE not in lake.tables():
        return None
    t = lake.table(TABLE)
    rows = t.read(columns=["sample_id", "ts"])
    late = rows.take(pa.array(np.arange(0, rows.num_rows, EVERY)))
    rng = np.random.default_rng(7)
    labels = pa.table(
        {
            "sample_id": late["sample_id"],
            "ts": pc.add(late["ts"], pa.scalar(timedelta(days=14), pa.duration("us"))),
            "converted": pa.array((rng.random(late.num_rows) < 0.2).astype(np.int32)),
        }
    )
    files_before = {task.file.file_path for task in t.scan().tasks()}
    t0 = time.perf_counter()
    t.upsert(labels)
    seconds = time.perf_counter() - t0
    report = t.last_update_report
    after = t.read(columns=["sample_id", "ts", "converted"], filter="converted is not null").sort_by("sample_id")
    expected = labels.sort_by("sample_id")
    check = t.verify_index()
    return {
        "labels_arrived": labels.num_rows,
        "rows_updated": report.rows_updated,
        "rows_inserted": report.rows_inserted,
        "upsert_seconds": round(seconds, 3),
        "update_files": report.update_files,
        "bytes_written": report.bytes_written,
        "data_files_unchanged": {task.file.file_path for task in t.scan().tasks()} == files_before,
        "labels_read_back": after["converted"].equals(expected["converted"]),
        "partition_kept": after["ts"].equals(late.sort_by("sample_id")["ts"]),
        "index_ok": check["ok"],
        "index_segments": check["segments"],
    }
