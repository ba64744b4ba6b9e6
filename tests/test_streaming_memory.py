"""``batches`` streams with bounded memory: peak RSS in a fresh process, over a table ~10x the bound.

The table: 40 daily files of ~3 MiB each in memory (2 KiB strings that compress to
almost nothing on disk). The bound is what streaming a tenth of the table (its
first 4 files) costs: a few files in flight plus the reader's fixed overhead.
Streaming the whole table, ten times as much data, must stay within it; the
same process then reads the table whole, which shows the measure does see it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta

import pyarrow as pa
import pytest

from featurelake import Lake

DAYS, ROWS_PER_DAY, PAYLOAD = 40, 1_500, 2_048
MIB = 2**20

STREAM = """
import json, sys
from featurelake import Lake

def rss(field):  # bytes; VmHWM is the peak since the last reset
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024

def reset_peak():
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")

t = Lake(sys.argv[1]).table("ml.wide")
t.read(columns=["k"], filter="k < 10")  # imports and metadata caches in place
base = rss("VmRSS")
reset_peak()
tenth = sum(b.num_rows for b in t.batches(batch_size=4096, filter=f"k < {sys.argv[2]}"))
bound = rss("VmHWM") - base
reset_peak()
rows = sum(b.num_rows for b in t.batches(batch_size=4096))
streamed = rss("VmHWM") - base
reset_peak()
whole = t.read()
read = rss("VmHWM") - base
print(json.dumps({"tenth": tenth, "rows": rows, "whole_rows": whole.num_rows, "arrow_bytes": whole.nbytes,
                  "bound": bound, "streamed": streamed, "read": read}))
"""


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads and resets the peak RSS in /proc")
def test_batches_peak_memory_is_bounded(tmp_path):
    lake = Lake(tmp_path / "lake")
    schema = pa.schema([pa.field("k", pa.int64(), nullable=False), pa.field("ts", pa.timestamp("us")), pa.field("payload", pa.string())])
    t = lake.create_table("ml.wide", schema, primary_key="k", partition_by=["day(ts)"])
    filler = "x" * (PAYLOAD - 8)
    for d in range(DAYS):
        ids = range(d * ROWS_PER_DAY, (d + 1) * ROWS_PER_DAY)
        t.append(pa.table({
            "k": pa.array(ids, pa.int64()),
            "ts": pa.array([datetime(2026, 1, 1) + timedelta(days=d)] * ROWS_PER_DAY, pa.timestamp("us")),
            "payload": [f"{i:08d}{filler}" for i in ids],
        }, schema=schema))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", STREAM, str(tmp_path / "lake"), str(DAYS // 10 * ROWS_PER_DAY)], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = json.loads(proc.stdout)
    assert m["rows"] == m["whole_rows"] == DAYS * ROWS_PER_DAY and m["tenth"] * 10 == m["rows"]
    table_bytes = m["arrow_bytes"]
    assert table_bytes > DAYS * ROWS_PER_DAY * PAYLOAD  # ~120 MiB in memory
    assert m["streamed"] < 1.25 * m["bound"] + 8 * MIB, m  # ten times the data, the same memory
    assert m["streamed"] < m["read"] / 2, m  # and well below what reading it whole costs
    assert m["read"] > 0.8 * table_bytes, m  # reading it whole does show up in the measure
