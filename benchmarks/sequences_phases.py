"""Where a sequence lookup's time goes beyond the raw multi-get: phase wall times paired with the floor, one process.

``python -m benchmarks.sequences_phases [--threads 4] [--rounds 5] [--data DIR]``

Builds (or, with ``--data``, reuses) the full-size store of
:mod:`benchmarks.sequences` and its 4096-row batches, then per round looks
every batch up and replays the raw multi-gets of exactly the keys those
lookups fetched (heads and chunks: :func:`benchmarks.sequences.lookups_vs_floor`'s
floor), back to back. Prints ms per batch of the lookup's phases (heads,
chunk fetch + decode, the rest of the chunk selection, output assembly,
what is left) next to the two floor multi-gets, and the CPU time of each
side. Why: the benchmark's goal is one ratio; this says which phase to cut.
The phases are timed by wrapping the lookup's methods (a few microseconds a call).
"""
from __future__ import annotations

import argparse
import collections
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import Config
from benchmarks.sequences import BATCH, DAYS, GROUPS, HOT, MAX_LEN, REPEAT_RATE, START, sizes, steady_allocator, training_rows


def build(data: Path) -> None:
    """The benchmark's event table, store build and first 8 full batches of training rows, under ``data``."""
    from featurelake import Lake
    from featurelake.synthetic import user_events, user_events_schema

    cfg = Config()
    sz = sizes(cfg)
    lake = Lake(data / "lake")
    log = user_events(sz["users"], sz["history"], days=DAYS, start=START, seed=cfg.seed, batch_size=1 << 20,
                      repeat_rate=REPEAT_RATE)
    st = lake.create_sequence_table("bench.events", user_events_schema(), key="user_id", time="ts")
    st.append(log)
    st.build(column_groups=GROUPS)
    rows = training_rows(sz["users"], cfg.seed)
    batches = [b for b in rows.to_batches(max_chunksize=BATCH) if b.num_rows == BATCH][:8]
    pq.write_table(pa.Table.from_batches(batches), data / "batches.parquet")


def phases(data: Path, threads: int, rounds: int) -> dict[str, float]:
    """ms per batch of each lookup phase and of the floor's multi-gets (heads, chunks), and both sides' CPU ms."""
    import featurelake.sequences.heads as heads_mod
    import featurelake.sequences.lookup as lookup_mod
    from featurelake import Lake

    spent: dict[str, float] = collections.defaultdict(float)

    def timed(owner: Any, name: str, label: str) -> Callable[[], None]:
        f = getattr(owner, name)

        def g(*a: Any, **k: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[label] += time.perf_counter() - t0

        setattr(owner, name, g)
        return lambda: setattr(owner, name, f)

    undo = [timed(heads_mod.Heads, "__init__", "heads"), timed(lookup_mod, "fetch_chunks", "fetch"),
            timed(lookup_mod, "assemble", "assemble"), timed(lookup_mod.SequenceStore, "_select", "select"),
            timed(lookup_mod.SequenceStore, "lookup_stats", "lookup")]
    try:
        store = Lake(data / "lake").sequence_table("bench.events").open_store()
        batches = pq.read_table(data / "batches.parquet").to_batches(max_chunksize=BATCH)
        store.recorder = []
        for b in batches:
            store.lookup(b.column("user_id"), b.column("ts"), HOT, MAX_LEN, None, threads=threads)
        recorded, store.recorder = store.recorder, None
        spent.clear()
        cpu = {"lookup_cpu": 0.0, "floor_cpu": 0.0}
        for _ in range(rounds):
            c0 = time.process_time()
            for b in batches:
                store.lookup(b.column("user_id"), b.column("ts"), HOT, MAX_LEN, None, threads=threads)
            c1 = time.process_time()
            for i, keys in enumerate(recorded):  # a lookup's head keys, then its chunk keys
                t0 = time.perf_counter()
                store.multi_get(keys, threads)
                spent["floor_heads" if i % 2 == 0 else "floor_chunks"] += time.perf_counter() - t0
            cpu["lookup_cpu"] += c1 - c0
            cpu["floor_cpu"] += time.process_time() - c1
    finally:
        for u in undo:
            u()
    n = rounds * len(batches)
    out = {k: 1000 * v / n for k, v in {**spent, **cpu}.items()}
    out["select_rest"] = out["select"] - out["heads"] - out["fetch"]
    out["lookup_rest"] = out["lookup"] - out["select"] - out["assemble"]
    out["floor"] = out["floor_heads"] + out["floor_chunks"]
    out["lookup_over_floor"] = out["lookup"] / out["floor"]
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.sequences_phases", description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--data", type=Path, help="a folder to build the store in once and reuse (default: a temporary one)")
    a = p.parse_args(argv)
    steady_allocator()
    with tempfile.TemporaryDirectory(prefix="seq-phases-") as tmp:
        data = a.data or Path(tmp)
        if not (data / "batches.parquet").exists():
            data.mkdir(parents=True, exist_ok=True)
            build(data)
        got = phases(data, a.threads, a.rounds)
    order = ["heads", "fetch", "select_rest", "assemble", "lookup_rest", "lookup", "floor_heads", "floor_chunks", "floor",
             "lookup_cpu", "floor_cpu"]
    print(f"threads {a.threads}, {a.rounds} rounds, load {os.getloadavg()[0]:.2f}: ms per {BATCH}-row batch")
    for k in order:
        print(f"  {k:14s} {got[k]:7.2f}")
    print(f"  lookup / floor {got['lookup_over_floor']:.3f}")


if __name__ == "__main__":
    main()
