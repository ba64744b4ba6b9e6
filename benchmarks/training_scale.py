"""Training reads on many cores and into a GPU: the shuffled reader over N worker processes, a DataLoader feeding CUDA.

The issue's figure is the shuffled reader "with 8 workers where the machine
allows, else 2" against the unshuffled ``batches``. On the 2-core machines
the other benchmarks run on, worker processes only share two cores
(benchmarks/training.py measures that case); this one is for a machine with
cores to spare (16 on the GPU machine). ``workers`` is 8 where the machine
has 16 cores or more, else 2 (``FEATURELAKE_BENCH_WORKERS`` overrides).

Setup: the wide benchmark table (``sample_id`` + float features in
``files`` data files). Readers, each one full epoch of all columns in
batches of ``BATCH`` rows, the consumer counting rows:

* ``batches``: ``t.batches(batch_size=BATCH)``, one process (its own decode threads);
* ``shuffled_{N}proc`` / ``unshuffled_{N}proc``: ``TrainingReader`` with and
  without shuffling, split over N forked processes (``worker_id`` 0..N-1 of
  N, as ``DataLoader(num_workers=N)`` splits it), timed from the fork until
  every process has finished its share;
* ``shuffled_1proc``: the shuffled reader in this process.

Ratios are paired medians over interleaved repetitions (the order alternates).

With torch: ``TrainingDataset`` (all features and the key, batch
``TORCH_BATCH``) through ``DataLoader(batch_size=None)``, once with
``num_workers=0`` (``in_process``: the reader's own threads decode and
shuffle) and once with ``num_workers=N`` (worker processes; each batch
reaches this process through shared memory):

* ``loader``: the batches on the host (rows/s into the training process);
* ``loader_to_cuda``: each batch moved to the GPU with
  :func:`featurelake.torch.to_device` (one pinned copy per batch) and waited for;
* ``training_loop_cuda``: a two-layer model (features-64-1, Adam, BCE on the
  sign of ``f000``, which it learns) trained on the GPU from the loader, one
  epoch; its loss must fall.

Skipped without torch; the CUDA parts are skipped without a GPU.
"""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import numpy as np

from benchmarks.common import (
    KEY,
    Config,
    Timing,
    build_wide_table,
    feature_names,
    fmt_rate,
    goal,
    paired_ratio,
    print_goals,
    work_dir,
    write_result,
)
from benchmarks.training import BATCH, GOAL_SHUFFLED_OVER_UNSHUFFLED, _count, _forked

NAME = "training_scale"
DEFAULT_REPEAT = 5
TORCH_BATCH = 4096


def workers() -> int:
    """8 worker processes where the machine has 16 cores or more, else 2 (FEATURELAKE_BENCH_WORKERS overrides)."""
    if os.environ.get("FEATURELAKE_BENCH_WORKERS"):
        return int(os.environ["FEATURELAKE_BENCH_WORKERS"])
    return 8 if (os.cpu_count() or 1) >= 16 else 2


def _timed_runs(readers: dict[str, Callable[[], int]], repeat: int, expect: int) -> dict[str, Timing]:
    timings = {name: Timing() for name in readers}
    names = list(readers)
    for rep in range(repeat):
        for name in names if rep % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            rows = readers[name]()
            timings[name].add(time.perf_counter() - t0)
            if rows != expect:
                raise AssertionError(f"{name} read {rows} rows, expected {expect}")
    return timings


def _torch_runs(t, cfg: Config, n_workers: int) -> dict[str, Any]:
    try:
        import torch
        from featurelake.torch import TrainingDataset, to_device
    except ImportError as e:
        return {"skipped": f"torch is not installed ({e})"}
    features = feature_names(cfg.columns)
    data = TrainingDataset(t, columns=[KEY, *features], batch_size=TORCH_BATCH, seed=cfg.seed)
    modes = {"in_process": 0, f"{n_workers}workers": n_workers}  # DataLoader(num_workers=...)

    def loader(mode: str):
        n = modes[mode]
        return torch.utils.data.DataLoader(data, batch_size=None, num_workers=n, prefetch_factor=4 if n else None)

    runs: dict[str, Callable[[], int]] = {
        f"loader_{mode}": (lambda mode=mode: sum(len(b[KEY]) for b in loader(mode))) for mode in modes
    }
    out: dict[str, Any] = {"torch": torch.__version__, "workers": n_workers, "batch_size": TORCH_BATCH}
    losses: dict[str, list] = {}
    if torch.cuda.is_available():
        dev = torch.device("cuda")
        out["gpu"] = torch.cuda.get_device_name(0)

        def to_cuda(mode: str) -> int:
            n = 0
            for b in loader(mode):
                g = to_device(b, dev, pin=True)
                n += len(g[KEY])
            torch.cuda.synchronize()
            return n

        def trainer(mode: str) -> Callable[[], int]:
            torch.manual_seed(cfg.seed)  # the same model, trained afresh per mode
            model = torch.nn.Sequential(torch.nn.Linear(len(features), 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).to(dev)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            losses[mode] = []

            def train() -> int:
                n = 0
                for b in loader(mode):
                    g = to_device(b, dev, pin=True)
                    x = torch.nan_to_num(torch.stack([g[f].float() for f in features], dim=1))
                    y = (g[features[0]] > 0).float()
                    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    losses[mode].append(loss.detach())
                    n += len(x)
                torch.cuda.synchronize()
                return n

            return train

        for mode in modes:
            runs[f"loader_to_cuda_{mode}"] = lambda mode=mode: to_cuda(mode)
            runs[f"training_loop_cuda_{mode}"] = trainer(mode)
    else:
        out["cuda"] = "not available: loader_to_cuda and training_loop_cuda skipped"
    timings = {name: Timing() for name in runs}
    names = list(runs)
    for rep in range(cfg.repeat):
        data.set_epoch(rep)
        for name in names if rep % 2 == 0 else names[::-1]:
            t0 = time.perf_counter()
            rows = runs[name]()
            timings[name].add(time.perf_counter() - t0)
            if rows != cfg.rows:
                raise AssertionError(f"torch {name} gave {rows} rows, expected {cfg.rows}")
    out["rates"] = {name: {**tm.as_dict(), "rows_per_s": round(cfg.rows / tm.best),
                           "median_rows_per_s": round(cfg.rows / tm.median)} for name, tm in timings.items()}
    out["loss"] = {}
    for mode, values in losses.items():
        floats = [float(v) for v in values]
        first, last = float(np.mean(floats[:10])), float(np.mean(floats[-10:]))
        if not last < first:
            raise AssertionError(f"the loss did not fall ({mode}): {first:.4f} -> {last:.4f}")
        out["loss"][mode] = {"first_10_batches": round(first, 4), "last_10_batches": round(last, 4)}
    return out


def run(cfg: Config) -> dict[str, Any]:
    from featurelake import Lake
    from featurelake.training import TrainingReader

    n = workers()
    print(f"{NAME}: {cfg.rows:,} rows x {cfg.columns} columns in {cfg.files} data files, batch {BATCH}, "
          f"{n} worker processes, {os.cpu_count()} cores, {cfg.repeat} repetitions")
    with work_dir(NAME, cfg.keep) as wd:
        t = build_wide_table(Lake(wd / "lake"), "bench.wide", cfg)
        shuffled = TrainingReader(t, batch_size=BATCH, seed=cfg.seed)
        unshuffled = TrainingReader(t, batch_size=BATCH, shuffle=False)
        readers: dict[str, Callable[[], int]] = {
            "batches": lambda: _count(t.batches(batch_size=BATCH)),
            f"shuffled_{n}proc": lambda: _forked(shuffled, n),
            f"unshuffled_{n}proc": lambda: _forked(unshuffled, n),
            "shuffled_1proc": lambda: _count(shuffled),
        }
        timings = _timed_runs(readers, cfg.repeat, cfg.rows)
        torch_runs = _torch_runs(t, cfg, n)
    rates = {name: {**tm.as_dict(), "rows_per_s": round(cfg.rows / tm.best), "median_rows_per_s": round(cfg.rows / tm.median)}
             for name, tm in timings.items()}
    ratios = {
        f"shuffled_{n}proc_over_batches_paired": paired_ratio(timings["batches"], timings[f"shuffled_{n}proc"]),
        f"shuffled_{n}proc_over_unshuffled_{n}proc_paired": paired_ratio(timings[f"unshuffled_{n}proc"], timings[f"shuffled_{n}proc"]),
        "shuffled_1proc_over_batches_paired": paired_ratio(timings["batches"], timings["shuffled_1proc"]),
    }
    goals = [goal(f"shuffled training reader, {n} worker processes / unshuffled batches (throughput, paired median)",
                  ratios[f"shuffled_{n}proc_over_batches_paired"], GOAL_SHUFFLED_OVER_UNSHUFFLED)]
    result = {
        "description": __doc__.strip().splitlines()[0],
        "batch_size": BATCH,
        "workers": n,
        "cores": os.cpu_count(),
        "rates": rates,
        "ratios": ratios,
        "torch": torch_runs,
        "goals": goals,
        "notes": ["rows_per_s from the best repetition, ratios are paired medians (throughput: higher = the first named faster)",
                  "forked readers are timed from the fork until every process has read its share"],
    }
    path = write_result(NAME, cfg, result)
    print(f"\n{NAME} summary")
    for name, r in rates.items():
        print(f"  {name:<24} {fmt_rate(r['rows_per_s'])} best, {fmt_rate(r['median_rows_per_s'])} median")
    for name, v in ratios.items():
        print(f"  {name:<44} {v}")
    if "rates" in torch_runs:
        for name, r in torch_runs["rates"].items():
            print(f"  torch {name:<22} {fmt_rate(r['rows_per_s'])} best, {fmt_rate(r['median_rows_per_s'])} median")
        for mode, loss in torch_runs.get("loss", {}).items():
            print(f"  loss ({mode}) {loss['first_10_batches']} -> {loss['last_10_batches']}")
    else:
        print(f"  torch: {torch_runs.get('skipped')}")
    print_goals(goals)
    print(f"  -> {path}")
    return result
