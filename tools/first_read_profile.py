"""Where a first read of a layered snapshot spends its time: the read benchmark's 5-layer state, profiled.

Why: the goal "5-layer first read / compacted read >= 0.8x" (benchmarks/read.py) depends on
what loading one small update file costs, and that is spread over pyarrow's Parquet open, its
decode and featurelake's own per-file Python. This tool builds the benchmark's state once
(1M rows x 100 columns in 8 data files, layers 1-5, a compacted twin branch; kept under
``--dir`` between runs) and prints:

* paired medians of compacted / first read / cached read (projection sample_id, f000, f001,
  f049), with process CPU time next to wall time (on 2 cores the first read is CPU-bound);
* the single-thread CPU cost of loading the projection's update layers (``Scan._load_layer``
  on each, everything forgotten first), per file;
* pure-pyarrow floors for the same files: whole-file read, ``ParquetFile`` open from memory,
  ``read_column`` per column.

Usage (wrap timing runs in the shared lock)::

    flock /tmp/featurelake-bench.lock .venv/bin/python tools/first_read_profile.py [--dir D] [--rounds N]
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROJECTION = ["sample_id", "f000", "f001", "f049"]
LAYERS = 5
BRANCH = "compacted_5"


def build(root: Path):
    """The benchmark's 5-layer table and its compacted twin branch, built once under ``root``."""
    import numpy as np

    from benchmarks.common import Config, build_wide_table
    from benchmarks.read import add_layer
    from featurelake import Lake

    lake = Lake(root)
    if "bench.wide" in [str(n) for n in lake.tables()]:
        return lake.table("bench.wide")
    cfg = Config()
    t = build_wide_table(lake, "bench.wide", cfg)
    rng = np.random.default_rng(cfg.seed + 2)  # the benchmark's seed: the same layers
    for k in range(1, LAYERS + 1):
        add_layer(t, k, cfg.rows, rng)
    t.create_branch(BRANCH)
    t.compact(branch=BRANCH)
    return t


def paired_reads(t, rounds: int) -> None:
    """Compacted, first and cached reads interleaved (order shuffled per round), paired medians."""
    from featurelake import readfiles

    files = sorted({e.update_file for e in t.scan().state.entries()})
    readers: dict[str, tuple[Callable[[], pa.Table], Callable[[], None] | None]] = {
        "compacted": (lambda: t.read(columns=PROJECTION, branch=BRANCH), None),
        "first": (lambda: t.read(columns=PROJECTION), lambda: readfiles.forget_files(files)),
        "cached": (lambda: t.read(columns=PROJECTION), None),
    }
    assert readers["first"][0]().sort_by("sample_id").equals(readers["compacted"][0]().sort_by("sample_id"))
    wall: dict[str, list[float]] = {k: [] for k in readers}
    cpu: dict[str, list[float]] = {k: [] for k in readers}
    for i in range(rounds + 2):
        order = list(readers)
        random.Random(i).shuffle(order)
        for name in order:
            read, prepare = readers[name]
            if prepare is not None:
                prepare()
            c0, w0 = time.process_time(), time.perf_counter()
            read()
            if i >= 2:  # two warm-up rounds
                wall[name].append(time.perf_counter() - w0)
                cpu[name].append(time.process_time() - c0)
    for name in readers:
        ratio = statistics.median(c / x for c, x in zip(wall["compacted"], wall[name]))
        print(f"  {name:<10} wall {statistics.median(wall[name]) * 1e3:6.2f} ms  cpu {statistics.median(cpu[name]) * 1e3:6.2f} ms"
              f"  compacted/{name} (paired) {ratio:.3f}")


def layer_loading(t, rounds: int) -> list[str]:
    """Single-thread CPU of loading the projection's update layers from nothing; returns their paths."""
    from featurelake import readfiles

    scan = t.scan(columns=PROJECTION)
    entries = [e for e in scan.state.entries() if any(i in scan.read_ids for i in e.field_ids)]
    files = sorted({e.update_file for e in entries})  # a shared update file holds several layers
    runs = []
    for _ in range(rounds):
        readfiles.forget_files(files)
        scan = t.scan(columns=PROJECTION)  # a new read: nothing opened (a shared file is opened once per read)
        c0 = time.thread_time()
        for e in entries:
            scan._load_layer(e)
        runs.append(time.thread_time() - c0)
    per = statistics.median(runs) / max(1, len(entries))
    print(f"  {len(entries)} update layers in {len(files)} update files touch the projection; loading them:"
          f" {statistics.median(runs) * 1e3:.2f} ms cpu ({per * 1e6:.0f} us per layer)")
    return [scan._resolve(f)[1] for f in files]


def pyarrow_floors(paths: list[str], rounds: int) -> None:
    """What pyarrow alone costs for the same files (best of ``rounds``, per file)."""
    blobs = [Path(p).read_bytes() for p in paths]

    def per_file(fn: Callable[[], object]) -> float:
        best = min(_timed(fn) for _ in range(rounds))
        return best / len(paths) * 1e6

    def read_bytes() -> None:
        for p in paths:
            Path(p).read_bytes()

    def open_memory() -> None:
        for b in blobs:
            pq.ParquetFile(pa.BufferReader(b), pre_buffer=False)

    def open_read_columns() -> None:
        for b in blobs:
            pf = pq.ParquetFile(pa.BufferReader(b), pre_buffer=False)
            for i in range(len(pf.schema_arrow)):
                pf.reader.read_column(i)

    def file_read() -> None:
        for p in paths:
            pq.ParquetFile(pa.OSFile(p)).read(use_threads=False)

    print(f"  pyarrow floors per file (best): read bytes {per_file(read_bytes):.0f} us, ParquetFile from memory"
          f" {per_file(open_memory):.0f} us, + read_column each {per_file(open_read_columns):.0f} us,"
          f" ParquetFile(OSFile).read {per_file(file_read):.0f} us")


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, default=Path("/tmp/featurelake-first-read"), help="where the table is built (kept)")
    p.add_argument("--rounds", type=int, default=30)
    args = p.parse_args(argv)
    t = build(args.dir)
    print(f"first read of the {LAYERS}-layer state, projection {PROJECTION}")
    paired_reads(t, args.rounds)
    paths = layer_loading(t, args.rounds)
    pyarrow_floors(paths, args.rounds)


if __name__ == "__main__":
    main()
