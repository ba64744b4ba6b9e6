"""Run the benchmarks: ``python -m benchmarks [NAME ...] [--rows N] [--quick]``.

The registry maps a benchmark name to the module that implements it (a
module with ``run(cfg: Config) -> dict``); later benchmarks (branches,
maintenance, upsert, sequences) plug in by adding one line.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import sys
import time
import traceback
from pathlib import Path

from benchmarks.common import (
    DEFAULT_COLUMNS,
    DEFAULT_FILES,
    DEFAULT_ROWS,
    QUICK_COLUMNS,
    QUICK_ROWS,
    RESULTS_DIR,
    Config,
    git_info,
)

REGISTRY: dict[str, str] = {
    "backfill": "benchmarks.backfill",
    "read": "benchmarks.read",
    "branches": "benchmarks.branches",
    "upsert": "benchmarks.upsert",
    "maintenance": "benchmarks.maintenance",
    "sequences": "benchmarks.sequences",
    "sequence_storage": "benchmarks.sequence_storage",
    "training": "benchmarks.training",
    "training_scale": "benchmarks.training_scale",
    "requests": "benchmarks.requests",
    "placement": "benchmarks.placement",
    "ray_scale": "benchmarks.ray_scale",
    "writes": "benchmarks.writes",
    "sequence_tiering": "benchmarks.sequence_tiering",
}


def parse_args(argv: list[str] | None = None) -> tuple[list[str], Config]:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    p.add_argument("names", nargs="*", metavar="NAME", help=f"benchmarks to run (default: all of {', '.join(REGISTRY)})")
    p.add_argument("--rows", type=int, help=f"table rows (default {DEFAULT_ROWS:,}; --quick: {QUICK_ROWS:,})")
    p.add_argument("--columns", type=int, help=f"table columns incl. the key (default {DEFAULT_COLUMNS}; --quick: {QUICK_COLUMNS})")
    p.add_argument("--files", type=int, help=f"data files the table is written as (default {DEFAULT_FILES}; --quick: 4)")
    p.add_argument("--repeat", type=int, help="repetitions per timing (default: the benchmark's DEFAULT_REPEAT, else 3; --quick: 2)")
    p.add_argument("--quick", action="store_true", help="small sizes for a smoke run (< 60 s); results go to <name>.quick.json")
    p.add_argument("--profile", action="store_true", help="always add a cProfile of the featurelake side (done anyway when a goal is missed)")
    p.add_argument("--keep", action="store_true", help="keep the work folder under benchmarks/.work/")
    p.add_argument("--out", type=Path, default=RESULTS_DIR, help="folder for the JSON results")
    p.add_argument("--list", action="store_true", help="list the registered benchmarks and exit")
    a = p.parse_args(argv)
    if a.list:
        print("\n".join(REGISTRY))
        sys.exit(0)
    unknown = [n for n in a.names if n not in REGISTRY]
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; known: {', '.join(REGISTRY)}")
    cfg = Config(
        rows=a.rows or (QUICK_ROWS if a.quick else DEFAULT_ROWS),
        columns=a.columns or (QUICK_COLUMNS if a.quick else DEFAULT_COLUMNS),
        files=a.files or (4 if a.quick else DEFAULT_FILES),
        repeat=a.repeat or (2 if a.quick else 0),  # 0: each benchmark's DEFAULT_REPEAT (else 3)
        quick=a.quick,
        keep=a.keep,
        profile=a.profile,
        out=a.out,
    )
    if cfg.columns < 5 or cfg.rows < cfg.files or cfg.repeat < 0:
        p.error("need at least 5 columns, one row per data file and one repetition")
    return a.names or list(REGISTRY), cfg


def main(argv: list[str] | None = None) -> int:
    names, cfg = parse_args(argv)
    # The engine is imported once, by the first benchmark: that is the revision every result measures.
    cfg = dataclasses.replace(cfg, git_at_start=git_info())
    failed = []
    for name in names:
        t0 = time.perf_counter()
        try:
            module = importlib.import_module(REGISTRY[name])
            repeat = cfg.repeat or getattr(module, "DEFAULT_REPEAT", 3)
            module.run(dataclasses.replace(cfg, repeat=repeat).started())
        except Exception:
            traceback.print_exc()
            failed.append(name)
        print(f"[{name}] {time.perf_counter() - t0:.1f} s\n")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
