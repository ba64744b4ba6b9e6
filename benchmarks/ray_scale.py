"""Scale-out on Ray: distributed against single-process backfill, compaction and full read.

One table (``sample_id`` + features, ``cfg.files`` data files). For each
worker count W in (1, 2) a local Ray cluster with ``num_cpus=W`` is started
(``ray.init``; its start-up is reported, not timed), and each operation is
timed against the same operation in-process, alternating within a repetition:

* backfill: a label for every row, by key, on a fresh zero-copy branch
  (``t.backfill`` vs ``featurelake.ray.backfill``, ``tasks=W``);
* compaction: the table with one update layer per file, compacted on a fresh
  branch into bins of about a quarter of the table (``t.compact`` vs
  ``featurelake.ray.compact``);
* full read: every column of every row (``t.read()`` vs ``read_ray(t)``
  iterated as Arrow batches: rows reach the consumer, nothing is converted).

The goal: at W=1 the Ray path costs at most 1.2x the in-process time
(scheduling + serialization overhead). Speed-up is in-process time / Ray time.

Training reads (W=2): ``read_ray(...).iter_torch_batches`` (or
``iter_batches(batch_format="numpy")`` without torch) in rows/s against
``iter_batches(batch_format="pyarrow")`` (no conversion).

Per-task figures (seconds per task, files and bytes per task) feed the
100 TB model in docs/scaling.md.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa

from benchmarks.common import (
    KEY,
    Config,
    Timing,
    build_wide_table,
    goal,
    print_goals,
    ratio,
    timed,
    work_dir,
    write_result,
)

NAME = "ray_scale"
DEFAULT_REPEAT = 2
GOAL_OVERHEAD = 1.2
WORKERS = (1, 2)


def _ray_rows(ds, torch: bool = False, batch_size: int = 65_536) -> int:
    if torch:
        return sum(len(b[KEY]) for b in ds.iter_torch_batches(batch_size=batch_size))
    return sum(b.num_rows for b in ds.iter_batches(batch_size=batch_size, batch_format="pyarrow"))


def run(cfg: Config) -> dict[str, Any]:
    import ray

    from featurelake import Lake
    import featurelake.ray as flr

    started = time.perf_counter()
    with work_dir(NAME, cfg.keep) as wd:
        lake = Lake(wd / "lake")
        t = build_wide_table(lake, "bench.samples", cfg)
        stats = t.stats()
        labels = pa.table({KEY: pa.array(np.arange(cfg.rows, dtype=np.int64)), "label": np.random.default_rng(1).integers(0, 2, cfg.rows)})
        t.create_branch("layered")
        t.backfill(pa.table({KEY: pa.array(np.arange(0, cfg.rows, 2, dtype=np.int64)), "f0001": np.ones((cfg.rows + 1) // 2, np.float32)}), branch="layered")
        target = max(64 * 1024, stats["bytes"] // 4)
        counter = iter(range(10_000))

        def branch(base: str = "main") -> str:
            name = f"b{next(counter)}"
            t.create_branch(name, base)
            return name

        ops = {
            "backfill": (lambda b: t.backfill(labels, branch=b), lambda b, w: flr.backfill(t, labels, branch=b, tasks=w), "main"),
            "compaction": (
                lambda b: t.compact(branch=b, target_file_bytes=target),
                lambda b, w: flr.compact(t, b, target_file_bytes=target),
                "layered",
            ),
        }
        results: dict[str, Any] = {"table": {k: stats[k] for k in ("rows", "data_files", "bytes")}, "workers": {}}
        for workers in (WORKERS[:1] if cfg.quick else WORKERS):  # quick: one cluster start (~10 s each)
            if ray.is_initialized():
                ray.shutdown()
            t0 = time.perf_counter()
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
            ray.data.DataContext.get_current().enable_progress_bars = False
            init_s = time.perf_counter() - t0
            flr.backfill(t, labels.slice(0, 10), branch=branch(), tasks=workers)  # warm the workers up
            per: dict[str, Any] = {"ray_init_s": round(init_s, 2)}
            for op, (here, there, base) in ops.items():
                th, tr = Timing(), Timing()
                tasks = 0
                for _ in range(cfg.repeat):
                    timed(lambda: here(branch(base)), th)
                    _, rep = timed(lambda: there(branch(base), workers), tr)
                    tasks = rep.tasks
                per[op] = {
                    "in_process_s": round(th.best, 4),
                    "ray_s": round(tr.best, 4),
                    "ray_tasks": tasks,
                    "ray_per_task_s": round(tr.best / max(1, tasks) * workers, 4),
                    "speedup": ratio(th.best, tr.best),
                    "overhead": ratio(tr.best, th.best),
                }
            th, tr = Timing(), Timing()
            for _ in range(cfg.repeat):
                timed(lambda: t.read(), th)
                _, n = timed(lambda: _ray_rows(flr.read_ray(t)), tr)
                assert n == cfg.rows
            per["read"] = {
                "in_process_s": round(th.best, 4),
                "ray_s": round(tr.best, 4),
                "ray_tasks": stats["data_files"],
                "ray_per_task_s": round(tr.best / stats["data_files"] * workers, 4),
                "speedup": ratio(th.best, tr.best),
                "overhead": ratio(tr.best, th.best),
            }
            results["workers"][str(workers)] = per
            print(f"  W={workers}: " + "; ".join(f"{op} {per[op]['in_process_s']} s here vs {per[op]['ray_s']} s on Ray ({per[op]['speedup']}x)" for op in ("backfill", "compaction", "read")))

        try:
            if cfg.quick:
                raise ImportError("quick runs skip torch (its import alone takes seconds)")
            import torch  # noqa: F401

            has_torch = True
        except Exception:  # noqa: BLE001 - torch is optional (not in CI)
            has_torch = False
        tp, tn = Timing(), Timing()
        for _ in range(cfg.repeat):
            timed(lambda: _ray_rows(flr.read_ray(t)), tp)
            if has_torch:
                timed(lambda: _ray_rows(flr.read_ray(t), torch=True), tn)
            else:
                timed(lambda: sum(len(b[KEY]) for b in flr.read_ray(t).iter_batches(batch_size=65_536, batch_format="numpy")), tn)
        results["training"] = {
            "workers": workers,
            "pipeline": "iter_torch_batches" if has_torch else "iter_batches(numpy)",
            "read_ray_arrow_rows_per_s": round(cfg.rows / tp.best),
            "pipeline_rows_per_s": round(cfg.rows / tn.best),
            "pipeline_vs_arrow": ratio(tp.best, tn.best),
        }
        ray.shutdown()

    one = results["workers"]["1"]
    goals = [goal(f"Ray overhead at 1 worker, {op}", one[op]["overhead"], GOAL_OVERHEAD, higher_is_better=False) for op in ("backfill", "compaction", "read")]
    print_goals(goals)
    print(f"  training: {results['training']}")
    result = {**results, "goals": goals, "seconds": round(time.perf_counter() - started, 1)}
    path = write_result(NAME, cfg, result)
    print(f"  -> {path}")
    return result
