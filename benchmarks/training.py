"""Training reads: the sharded, shuffled TrainingReader vs unshuffled ``batches`` vs a plain pyarrow dataset scan.

Setup: the wide benchmark table (``sample_id`` + float features, ``files``
data files). Every reader streams one full epoch of all columns in batches of
``BATCH`` rows and the consumer only counts rows:

* ``training_shuffled``: ``TrainingReader`` (shuffle on, one worker);
* ``training_shuffled_2proc``: the same reader split over 2 forked worker
  processes (``worker_id`` 0 and 1 of 2, as ``DataLoader(num_workers=2)``
  does), timed until both finish;
* ``training_unshuffled``: ``TrainingReader(shuffle=False)``;
* ``batches``: ``t.batches(batch_size=BATCH)`` (unshuffled);
* ``pyarrow_dataset``: ``pyarrow.dataset.dataset(files).to_batches(batch_size=BATCH)``.

Repetitions are interleaved; ratios are paired medians (each repetition's two
readers ran back to back). Shuffle quality (distinct source files per batch,
correlation of stream position with key) is measured for the reader, for the
old ``batches(shuffle=True)`` and for a full random permutation of the rows.
"""
from __future__ import annotations

import multiprocessing as mp
from typing import Any, Callable

import pyarrow.dataset as pads

from benchmarks.common import (
    KEY,
    Config,
    Timing,
    build_wide_table,
    data_file_paths,
    fmt_rate,
    goal,
    paired_ratio,
    print_goals,
    timed,
    work_dir,
    write_result,
)

NAME = "training"
DEFAULT_REPEAT = 5
BATCH = 1024
GOAL_SHUFFLED_OVER_UNSHUFFLED = 0.8


def _count(batches) -> int:
    return sum(b.num_rows for b in batches)


def _child(reader, worker: int, workers: int, out) -> None:
    reader.set_worker(worker, workers)
    out.put(_count(reader))


def _forked(reader, workers: int) -> int:
    """One epoch split over ``workers`` forked processes (as a DataLoader does); the rows they read."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(reader, w, workers, out)) for w in range(workers)]
    for p in procs:
        p.start()
    rows = sum(out.get() for _ in procs)
    for p in procs:
        p.join()
    return rows


def run(cfg: Config) -> dict[str, Any]:
    from featurelake.training import TrainingReader, shuffle_quality

    print(f"training: {cfg.rows:,} rows x {cfg.columns} columns in {cfg.files} data files, batch {BATCH}, {cfg.repeat} repetitions")
    with work_dir(NAME, cfg.keep) as wd:
        from featurelake import Lake

        t = build_wide_table(Lake(wd / "lake"), "bench.wide", cfg)
        paths = data_file_paths(t.iceberg)
        shuffled = TrainingReader(t, batch_size=BATCH, seed=cfg.seed)
        readers: dict[str, Callable[[], int]] = {
            "training_shuffled": lambda: _count(shuffled),
            "training_shuffled_2proc": lambda: _forked(shuffled, 2),
            "training_unshuffled": lambda: _count(TrainingReader(t, batch_size=BATCH, shuffle=False)),
            "batches": lambda: _count(t.batches(batch_size=BATCH)),
            "pyarrow_dataset": lambda: _count(pads.dataset(paths, format="parquet").to_batches(batch_size=BATCH)),
        }
        timings = {name: Timing() for name in readers}
        for rep in range(cfg.repeat):
            shuffled.set_epoch(rep)
            for name, fn in readers.items():
                _, rows = timed(fn, timings[name])
                if rows != cfg.rows:
                    raise AssertionError(f"{name} read {rows} rows, expected {cfg.rows}")

        quality_reader = TrainingReader(t, columns=[KEY], batch_size=BATCH, seed=cfg.seed, with_locator=True)
        quality = {
            "training_reader": shuffle_quality(quality_reader, KEY, seed=cfg.seed),
            "batches_shuffle_true": shuffle_quality(
                t.batches(columns=[KEY], batch_size=BATCH, shuffle=True, seed=cfg.seed, with_locator=True), KEY, seed=cfg.seed
            ),
        }
        units = len(shuffled.units)

    rates = {name: {**tm.as_dict(), "rows_per_s": round(cfg.rows / tm.best)} for name, tm in timings.items()}
    ratios = {
        "shuffled_over_batches_paired": paired_ratio(timings["batches"], timings["training_shuffled"]),
        "shuffled_over_unshuffled_reader_paired": paired_ratio(timings["training_unshuffled"], timings["training_shuffled"]),
        "shuffled_2proc_over_batches_paired": paired_ratio(timings["batches"], timings["training_shuffled_2proc"]),
        "batches_over_pyarrow_paired": paired_ratio(timings["pyarrow_dataset"], timings["batches"]),
        "shuffled_over_pyarrow_paired": paired_ratio(timings["pyarrow_dataset"], timings["training_shuffled"]),
    }
    goals = [
        goal("shuffled training reader / unshuffled batches (throughput, paired median)",
             ratios["shuffled_over_batches_paired"], GOAL_SHUFFLED_OVER_UNSHUFFLED),
    ]
    result = {
        "description": __doc__.strip().splitlines()[0],
        "batch_size": BATCH,
        "units": units,
        "rates": rates,
        "ratios": ratios,
        "shuffle_quality": quality,
        "goals": goals,
        "notes": [
            "rows_per_s from the best repetition; ratios are paired medians (throughput, higher = first reader faster)",
            "training_shuffled_2proc forks 2 processes that each read half the epoch (the machine has 2 shared cores)",
            "shuffle quality: 'reader' is the stream as read, 'random' the same rows fully permuted and cut at the same batch sizes",
            f"reader defaults: shuffle_buffer={shuffled.shuffle_buffer} rows, interleave={shuffled.interleave} units at once",
        ],
    }
    path = write_result(NAME, cfg, result)
    _summary(result, path)
    return result


def _summary(result: dict[str, Any], path) -> None:
    print("\ntraining summary (best run)")
    for name, r in result["rates"].items():
        print(f"  {name:<26} {fmt_rate(r['rows_per_s'])}  (spread {r['spread']})")
    for name, v in result["ratios"].items():
        print(f"  {name:<40} {v}")
    for name, q in result["shuffle_quality"].items():
        print(f"  quality {name:<22} reader {q['reader']}  random {q['random']}")
    print_goals(result["goals"])
    print(f"  -> {path}")
