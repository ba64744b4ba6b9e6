"""Read throughput with merge-on-read update layers vs the compacted table, plain pyiceberg and raw pyarrow.

Setup: one wide table (``sample_id`` int64 + features, every third float64,
the rest float32; appended in ``files`` commits, one data file each). Update
layers are added one backfill at a time, alternating:

* odd layers (1, 3, 5, ...): a NEW float32 column ``new_<k>`` set densely
  (every row; by key, input in random key order);
* even layers (2, 4, 6, ...): an EXISTING column rewritten sparsely, 10% of
  the rows chosen at random; the column cycles f000, f001, f002, so at 20
  layers f000 has 4 stacked layers and f001/f002 have 3 each.

At 0, 1, 5 and 20 layers the full table and a projection (``sample_id``,
f000, f001 and one never-updated feature) are read with featurelake. For the
same state a zero-copy branch is compacted (``t.compact(branch=...)``: update
files folded into rewritten data files) and read three ways: featurelake,
plain ``ice.scan().to_arrow()``, and ``pyarrow.parquet.read_table`` of the
same data files (the floor). Repetitions are interleaved: each repetition
shuffles the readers' order (seeded per repetition) and a short read (under
SHORT_READ_S) runs SHORT_ROUNDS rounds in that order and its reverse
(ABBA), so no reader always runs first or last; rates use the best run of
each reader. The first-read reader (``featurelake_cold_layers``) forgets
everything derived from the snapshot's update files right before each read,
untimed (decoded layers, footers, kept-open readers:
``readfiles.forget_files``), as a first read of a snapshot finds them.

Peers (at 0 layers): featurelake vs Lance (``pylance``, the same rows) vs a
pyarrow dataset scan of the same Parquet files, full table, 5 columns, and
streaming 5 columns. Writer settings: appends and reads of the same rows as
featurelake writes them (delta-packed integers, the codec only where it pays)
vs the codec on every column.
"""
from __future__ import annotations

import os
import random
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import (
    KEY,
    Config,
    Timing,
    build_wide_table,
    data_file_paths,
    feature_names,
    fmt_rate,
    fmt_s,
    goal,
    paired_ratio,
    print_goals,
    print_profile,
    profile_summary,
    ratio,
    timed,
    wide_chunks,
    wide_schema,
    work_dir,
    write_result,
)

NAME = "read"
DEFAULT_REPEAT = 7
CHECKPOINTS = (0, 1, 5, 20)
SPARSE_FRACTION = 0.10
SPARSE_COLUMNS = ("f000", "f001", "f002")
GOAL_LAYERED = 0.7
SHORT_READ_S = 0.1  # a read faster than this is timed SHORT_ROUNDS times per repetition
SHORT_ROUNDS = 5
GOAL_VS_PYICEBERG = 1.0


def layer_plan(k: int) -> tuple[str, str]:
    """(kind, column) of layer ``k`` (1-based)."""
    if k % 2 == 1:
        return "dense-new", f"new_{k:02d}"
    return "sparse-existing", SPARSE_COLUMNS[(k // 2 - 1) % len(SPARSE_COLUMNS)]


def add_layer(t, k: int, rows: int, rng: np.random.Generator) -> dict[str, Any]:
    kind, column = layer_plan(k)
    if kind == "dense-new":
        keys = rng.permutation(rows).astype(np.int64)
        vals = pa.array(rng.standard_normal(rows, dtype=np.float32))
    else:
        keys = rng.choice(rows, size=max(1, int(rows * SPARSE_FRACTION)), replace=False).astype(np.int64)
        dtype = t.schema.field(column).type
        vals = pa.array(rng.standard_normal(len(keys)).astype(np.float64)).cast(dtype)
    dt, _ = timed(lambda: t.backfill(pa.table({KEY: keys, column: vals})))
    r = t.last_update_report
    return {"layer": k, "kind": kind, "column": column, "rows": r.rows_updated, "update_files": r.update_files, "bytes": r.bytes_written, "seconds": round(dt, 4)}


def _same(a: pa.Table, b: pa.Table, what: str) -> None:
    """Equal content, column by column (sorted by key; schemas may differ in nullability only)."""
    if a.num_rows != b.num_rows or a.column_names != b.column_names:
        raise AssertionError(f"{what}: {a.num_rows}x{a.column_names[:3]}.. vs {b.num_rows}x{b.column_names[:3]}..")
    a, b = a.sort_by(KEY), b.sort_by(KEY)
    bad = [c for c in a.column_names if not a.column(c).equals(b.column(c))]
    if bad:
        raise AssertionError(f"{what}: columns differ: {bad[:5]}")


def run(cfg: Config) -> dict[str, Any]:
    from featurelake import Lake

    features = feature_names(cfg.columns)
    projection = [KEY, "f000", "f001", features[len(features) // 2]]
    print(f"read: {cfg.rows:,} rows x {cfg.columns} columns in {cfg.files} data files, layers {list(CHECKPOINTS)}, {cfg.repeat} repetitions")
    checkpoints: list[dict[str, Any]] = []
    layers: list[dict[str, Any]] = []
    profile = None
    with work_dir(NAME, cfg.keep) as wd:
        lake = Lake(wd / "lake")
        t = build_wide_table(lake, "bench.wide", cfg)
        rng = np.random.default_rng(cfg.seed + 2)
        k = 0
        for target in CHECKPOINTS:
            while k < target:
                k += 1
                layers.append(add_layer(t, k, cfg.rows, rng))
            checkpoints.append(_measure(t, k, projection, cfg))
            if target == 0:
                peer = peers(t, cfg)
            cp = checkpoints[-1]
            print(
                f"  {k:>2} layers: featurelake {fmt_rate(cp['full']['featurelake']['rows_per_s'])}"
                + (f", compacted {fmt_rate(cp['full']['compacted_featurelake']['rows_per_s'])}" if "compacted_featurelake" in cp["full"] else "")
                + (f", pyiceberg {fmt_rate(cp['full']['compacted_pyiceberg']['rows_per_s'])}" if "compacted_pyiceberg" in cp["full"] else "")
                + (f", pyarrow {fmt_rate(cp['full']['compacted_pyarrow']['rows_per_s'])}" if "compacted_pyarrow" in cp["full"] else "")
            )

        by_layers = {cp["layers"]: cp for cp in checkpoints}
        five = by_layers.get(5)
        goals = []
        for mode in ("full", "projected", "streaming"):
            if mode in peer:
                goals.append(goal(f"{mode}: featurelake / pyarrow dataset on the same files (paired)",
                                  peer[mode]["featurelake_over_pyarrow_paired"], 1.0))
                if mode != "full":
                    goals.append(goal(f"{mode}: featurelake / Lance (paired)", peer[mode]["featurelake_over_lance_paired"], 0.8))
        if five:
            goals.append(goal("5-layer read / compacted read (throughput, projected, paired median)",
                              five["ratios"]["layered_over_compacted_projected_paired"], 0.8))
            goals.append(goal("5-layer read, no decoded layers kept (first read) / compacted read (throughput, projected, paired median)",
                              five["ratios"]["layered_cold_over_compacted_projected_paired"], 0.8))
        if five:
            goals.append(goal("5-layer read / compacted read (throughput, full table, paired median)", five["ratios"]["layered_over_compacted_full_paired"], GOAL_LAYERED))
        for cp in checkpoints:
            if cp["layers"] > 0:
                goals.append(
                    goal(
                        f"{cp['layers']}-layer state: compacted featurelake read / pyiceberg read (throughput, full table, paired median)",
                        cp["ratios"]["compacted_featurelake_over_pyiceberg_full_paired"],
                        GOAL_VS_PYICEBERG,
                    )
                )
        if cfg.profile or (not cfg.quick and not all(g["met"] for g in goals)):
            # cProfile sees the main thread only: profile reads that open the files one after another
            # in the main thread (Scan.read_file per planned task, as compaction does).
            profile = {}
            for label, ref in ((f"{k} layers", "main"), (f"compacted {k}-layer state", f"compacted_{k}")):
                _, profile[f"featurelake sequential read, {label}"] = profile_summary(lambda ref=ref: _sequential_read(t, ref))
            # the first read of the projection: what loading the update files costs (forgotten first, untimed)
            from featurelake import readfiles

            readfiles.forget_files(sorted({e.update_file for e in t.scan().state.entries()}))
            _, profile[f"featurelake sequential first read (projected), {k} layers"] = profile_summary(
                lambda: _sequential_read(t, "main", projection))
            ice = t.iceberg
            snap = ice.metadata.refs[f"compacted_{k}"].snapshot_id
            _, profile[f"pyiceberg read, compacted {k}-layer state"] = profile_summary(lambda: ice.scan(snapshot_id=snap).to_arrow())

    writer = writer_settings(cfg)
    result = {
        "description": __doc__.strip().splitlines()[0],
        "projection": projection,
        "layers": layers,
        "peers": peer,
        "writer_settings": writer,
        "checkpoints": checkpoints,
        "goals": goals,
        "notes": [
            "odd layers add a new float32 column densely (all rows); even layers update 10% of the rows of an existing column (f000, f001, f002 in turn)",
            "compacted = a zero-copy branch at the same snapshot, compacted with t.compact(branch=...); pyiceberg and pyarrow read that branch's data files",
            "rows_per_s uses the best of the repetitions; ratios are throughput ratios (higher = first reader faster)",
            "goal verdicts use the _paired ratios: the median over repetitions of the two readers' times in that repetition "
            "(read back to back, so drifting load on the shared machine cancels); ratios without _paired use the best run of each",
            "featurelake reads with Table.read (files read in parallel); pyarrow floor = pq.read_table(list of data files)",
            "featurelake keeps decoded update layers, footers and open readers across reads (FEATURELAKE_LAYER_CACHE_MB, "
            "FEATURELAKE_OPEN_READERS); featurelake_cold_layers (the first read) forgets all of it for every update file "
            "of the snapshot right before each read, untimed (readfiles.forget_files), as a first read of a snapshot finds them; "
            "schema projections (shared by every file of one writer's schema) stay cached",
            f"each repetition shuffles the readers' order (seeded); reads under {SHORT_READ_S} s run {SHORT_ROUNDS} rounds "
            "per repetition, alternately in that order and its reverse (ABBA); runs pair up by round",
        ],
    }
    if profile:
        result["profile"] = profile
    path = write_result(NAME, cfg, result)
    _summary(result, path)
    return result


def _measure(t, layers: int, projection: list[str], cfg: Config) -> dict[str, Any]:
    """Time every reader on the current main state and on its compacted twin branch."""
    from featurelake import readfiles

    stats = t.stats()
    cp: dict[str, Any] = {"layers": layers, "stats": {k: stats[k] for k in ("rows", "columns", "data_files", "update_files", "max_update_layers", "data_bytes", "update_bytes")}}
    rows = stats["rows"]
    ice = t.iceberg
    if layers > 0:
        branch = f"compacted_{layers}"
        t.create_branch(branch)
        dt, report = timed(lambda: t.compact(branch=branch))
        cp["compaction"] = {"seconds": round(dt, 3), "files_in": report.files_in, "files_out": report.files_out, "update_files_folded": report.update_files_folded, "bytes_out": report.bytes_out}
        ice = t.iceberg
        compacted_snapshot = ice.metadata.refs[branch].snapshot_id
    else:
        branch = "main"  # nothing to fold: the base table is its own compacted form
        compacted_snapshot = ice.metadata.refs["main"].snapshot_id
    paths = data_file_paths(ice, compacted_snapshot)
    cp["compacted_data_files"] = len(paths)

    readers: dict[str, dict[str, Callable[[], pa.Table]]] = {"full": {}, "projected": {}}
    # everything derived from the update files (decoded layers, footers, open readers) forgotten
    # before each first read, as a first read of the snapshot finds them
    update_files = sorted({e.update_file for e in t.scan().state.entries()})
    for mode, cols in (("full", None), ("projected", projection)):
        if layers > 0:
            readers[mode]["featurelake"] = lambda cols=cols: t.read(columns=cols)
            readers[mode]["featurelake_cold_layers"] = lambda cols=cols: t.read(columns=cols)
        readers[mode]["compacted_featurelake"] = lambda cols=cols: t.read(columns=cols, branch=branch)
        if cols is None:
            readers[mode]["compacted_pyiceberg"] = lambda: ice.scan(snapshot_id=compacted_snapshot).to_arrow()
            readers[mode]["compacted_pyarrow"] = lambda: pq.read_table(paths)
        else:
            readers[mode]["compacted_pyiceberg"] = lambda cols=cols: ice.scan(selected_fields=tuple(cols), snapshot_id=compacted_snapshot).to_arrow()
            readers[mode]["compacted_pyarrow"] = lambda cols=cols: pq.read_table(paths, columns=cols)

    timings = {mode: {name: Timing() for name in rs} for mode, rs in readers.items()}
    planning = {"featurelake": Timing(), "pyiceberg": Timing()}
    # untimed, right before each first read (forgetting is the set-up, not the read)
    prepare = {"featurelake_cold_layers": lambda: readfiles.forget_files(update_files)}
    short = {mode: _is_short(rs, prepare) for mode, rs in readers.items()}
    for rep in range(cfg.repeat):
        for mode, rs in readers.items():
            _interleaved(rs, timings[mode], cfg.seed, rep, short[mode], prepare=prepare)
        # fixed cost of a read before any data file is opened: catalog load, state, manifests
        timed(lambda: t.scan(branch=branch).tasks(), planning["featurelake"])
        timed(lambda: list(t.iceberg.scan(snapshot_id=compacted_snapshot).plan_files()), planning["pyiceberg"])
    cp["planning"] = {name: tm.as_dict() for name, tm in planning.items()}

    # Correctness (not timed): every reader returns the same rows.
    layered = (readers["full"].get("featurelake") or readers["full"]["compacted_featurelake"])()
    compacted = readers["full"]["compacted_featurelake"]()
    _same(layered, compacted, f"{layers} layers: layered vs compacted featurelake read")
    _same(compacted, readers["full"]["compacted_pyiceberg"](), f"{layers} layers: featurelake vs pyiceberg read of compacted files")
    del layered, compacted

    for mode, ts in timings.items():
        cp[mode] = {name: {**tm.as_dict(), "rows_per_s": round(rows / tm.best)} for name, tm in ts.items()}
    if layers == 0:
        for mode in cp.keys() & {"full", "projected"}:
            cp[mode]["featurelake"] = cp[mode]["compacted_featurelake"]
    cp["ratios"] = {}
    for mode in ("full", "projected"):
        best = {name: tm.best for name, tm in timings[mode].items()}
        best.setdefault("featurelake", best["compacted_featurelake"])
        tm = dict(timings[mode])
        tm.setdefault("featurelake", tm["compacted_featurelake"])
        cp["ratios"].update(
            {
                f"layered_over_compacted_{mode}_paired": paired_ratio(tm["compacted_featurelake"], tm["featurelake"]),
                f"layered_cold_over_compacted_{mode}_paired": paired_ratio(tm["compacted_featurelake"], tm["featurelake_cold_layers"])
                if "featurelake_cold_layers" in tm else None,
                f"compacted_featurelake_over_pyiceberg_{mode}_paired": paired_ratio(tm["compacted_pyiceberg"], tm["compacted_featurelake"]),
                f"layered_over_pyiceberg_{mode}_paired": paired_ratio(tm["compacted_pyiceberg"], tm["featurelake"]),
                f"layered_over_compacted_{mode}": ratio(best["compacted_featurelake"], best["featurelake"]),
                f"compacted_featurelake_over_pyiceberg_{mode}": ratio(best["compacted_pyiceberg"], best["compacted_featurelake"]),
                f"compacted_featurelake_over_pyarrow_{mode}": ratio(best["compacted_pyarrow"], best["compacted_featurelake"]),
                f"layered_over_pyarrow_{mode}": ratio(best["compacted_pyarrow"], best["featurelake"]),
                f"pyiceberg_over_pyarrow_{mode}": ratio(best["compacted_pyarrow"], best["compacted_pyiceberg"]),
            }
        )
    return cp


PEER_COLUMNS = 5


def peers(t, cfg: Config) -> dict[str, Any]:
    """featurelake vs Lance vs a pyarrow dataset scan of the same Parquet files (the floor), side by side.

    Lance gets the same rows (written once with ``lance.write_dataset``). Three
    reads: the full table, a 5-column projection, and streaming those 5 columns.
    """
    import pyarrow.dataset as pads

    try:
        import lance
    except ImportError:
        return {"skipped": "pylance is not installed (make bench installs the bench extra)"}
    import tempfile

    cols = [KEY] + feature_names(cfg.columns)[: PEER_COLUMNS - 1]
    paths = data_file_paths(t.iceberg)
    rows = t.stats()["rows"]
    with tempfile.TemporaryDirectory() as tmp:
        ds = lance.write_dataset(t.read(), f"{tmp}/lance")
        readers: dict[str, dict[str, Callable[[], Any]]] = {
            "full": {
                "featurelake": lambda: t.read().num_rows,
                "lance": lambda: ds.to_table().num_rows,
                "pyarrow_dataset": lambda: pads.dataset(paths).to_table().num_rows,
            },
            "projected": {
                "featurelake": lambda: t.read(columns=cols).num_rows,
                "lance": lambda: ds.to_table(columns=cols).num_rows,
                "pyarrow_dataset": lambda: pads.dataset(paths).to_table(columns=cols).num_rows,
            },
            "streaming": {
                "featurelake": lambda: sum(b.num_rows for b in t.batches(columns=cols)),
                "lance": lambda: sum(b.num_rows for b in ds.to_batches(columns=cols)),
                "pyarrow_dataset": lambda: sum(b.num_rows for b in pads.dataset(paths).to_batches(columns=cols)),
            },
        }
        timings = {mode: {name: Timing() for name in rs} for mode, rs in readers.items()}
        short = {mode: _is_short(rs) for mode, rs in readers.items()}
        for rep in range(cfg.repeat):
            for mode, rs in readers.items():
                _interleaved(rs, timings[mode], cfg.seed, rep, short[mode], expect_rows=rows)
    out: dict[str, Any] = {"columns": cols, "lance_version": lance.__version__}
    for mode, ts in timings.items():
        out[mode] = {name: {**tm.as_dict(), "rows_per_s": round(rows / tm.best)} for name, tm in ts.items()}
        out[mode]["featurelake_over_pyarrow_paired"] = paired_ratio(ts["pyarrow_dataset"], ts["featurelake"])
        out[mode]["featurelake_over_lance_paired"] = paired_ratio(ts["lance"], ts["featurelake"])
    return out


def _is_short(readers: dict[str, Callable[[], Any]], prepare: dict[str, Callable[[], Any]] | None = None) -> bool:
    """Whether every reader of a mode takes under SHORT_READ_S (one untimed warm-up call each)."""
    longest = 0.0
    for name, fn in readers.items():
        if prepare and name in prepare:
            prepare[name]()
        dt, _ = timed(fn)
        longest = max(longest, dt)
    return longest < SHORT_READ_S


def _interleaved(
    readers: dict[str, Callable[[], Any]], timings: dict[str, Timing], seed: int, rep: int, short: bool,
    expect_rows: int | None = None, prepare: dict[str, Callable[[], Any]] | None = None,
) -> None:
    """One repetition: the readers in an order shuffled for this repetition (seeded), SHORT_ROUNDS
    rounds for short reads, every other round in reverse (ABBA): a pair of readers is timed back to
    back in each round, and no reader always runs first (after the previous mode's largest read was
    freed) or always last. Every round adds one run per reader, so runs pair up by index.
    ``prepare[name]`` runs untimed right before each run of that reader."""
    order = list(readers)
    random.Random(seed * 7919 + rep).shuffle(order)
    for r in range(SHORT_ROUNDS if short else 1):
        for name in order if r % 2 == 0 else order[::-1]:
            if prepare and name in prepare:
                prepare[name]()
            _, n = timed(readers[name], timings[name])
            if expect_rows is not None and n != expect_rows:
                raise AssertionError(f"{name} read {n} rows, expected {expect_rows}")


def _rotated(names: list[str], rep: int) -> list[str]:
    """``names`` in a different order each repetition: no reader always runs first (after the previous
    mode's largest read was freed) or always last."""
    k = rep % len(names)
    return names[k:] + names[:k]


WRITER_SAMPLE_COLUMNS = 5


def writer_settings(cfg: Config) -> dict[str, Any]:
    """Read and append impact of the writer's encoding choices (featurelake.datafiles).

    The same rows appended twice, once as featurelake writes them (integers
    delta-packed, the table's codec only where a sample compresses by
    COMPRESSION_MIN_SAVING) and once with the codec on every column and plain
    integers (as before); then each is read whole and projected with a pyarrow
    dataset scan of its files. Interleaved, paired.
    """
    import pyarrow.dataset as pads

    import featurelake.datafiles as datafiles
    from featurelake import Lake

    chunks = list(wide_chunks(cfg.rows, cfg.columns, cfg.files, cfg.seed))
    cols = [KEY] + feature_names(cfg.columns)[: WRITER_SAMPLE_COLUMNS - 1]
    # featurelake's writer vs the same writer with the codec on every column and no delta packing (as before)
    modes = {"per_column_codec": (datafiles.COMPRESSION_MIN_SAVING, datafiles.delta_columns),
             "codec_everywhere": (-1.0, lambda *a, **k: [])}
    timings = {m: {k: Timing() for k in ("append", "full_read", "projected_read")} for m in modes}
    sizes: dict[str, int] = {}
    saved = datafiles.COMPRESSION_MIN_SAVING, datafiles.delta_columns
    try:
        with work_dir(NAME + "-writer", cfg.keep) as wd:
            warm = Lake(wd / "warm-up").create_table("bench.w", wide_schema(cfg.columns), primary_key=KEY, partition_by=[])
            warm.append(chunks[0])  # imports and per-schema caches in place before timing
            for rep in range(max(3, cfg.repeat // 2)):
                for mode in _rotated(list(modes), rep):
                    datafiles.COMPRESSION_MIN_SAVING, datafiles.delta_columns = modes[mode]
                    t = Lake(wd / f"{mode}-{rep}").create_table("bench.w", wide_schema(cfg.columns), primary_key=KEY, partition_by=[])
                    timed(lambda: [t.append(c) for c in chunks], timings[mode]["append"])
                    paths = data_file_paths(t.iceberg)
                    sizes[mode] = sum(os.path.getsize(p) for p in paths)
                    timed(lambda: pads.dataset(paths).to_table(), timings[mode]["full_read"])
                    timed(lambda: pads.dataset(paths).to_table(columns=cols), timings[mode]["projected_read"])
    finally:
        datafiles.COMPRESSION_MIN_SAVING, datafiles.delta_columns = saved
    out: dict[str, Any] = {"min_saving": saved[0], "projected_columns": cols,
                           "baseline": "the table codec (zstd) on every column, plain integer encoding"}
    for mode in modes:
        out[mode] = {k: tm.as_dict() for k, tm in timings[mode].items()} | {"data_bytes": sizes[mode]}
    a, b = timings["per_column_codec"], timings["codec_everywhere"]
    out["speedup_paired"] = {k: paired_ratio(b[k], a[k]) for k in a}
    out["bytes_ratio"] = round(sizes["per_column_codec"] / sizes["codec_everywhere"], 4)
    return out


def _sequential_read(t, ref: str, columns: list[str] | None = None) -> list[pa.RecordBatch]:
    scan = t.scan(columns=columns, branch=ref)
    return [b for task in scan.tasks() for b in scan.read_file(task)]


def _summary(result: dict[str, Any], path) -> None:
    print("\nread summary (M rows/s from the best run; ratio columns are paired medians)")
    header = f"  {'layers':>6} {'mode':<10} {'featurelake':>12} {'compacted fl':>13} {'pyiceberg':>10} {'pyarrow':>9} {'layered/compacted':>18} {'fl/pyiceberg':>13}"
    print(header)
    for cp in result["checkpoints"]:
        for mode in ("full", "projected"):
            m = cp[mode]
            r = cp["ratios"]
            print(
                f"  {cp['layers']:>6} {mode:<10} {m['featurelake']['rows_per_s'] / 1e6:>12.2f} {m['compacted_featurelake']['rows_per_s'] / 1e6:>13.2f}"
                f" {m['compacted_pyiceberg']['rows_per_s'] / 1e6:>10.2f} {m['compacted_pyarrow']['rows_per_s'] / 1e6:>9.2f}"
                f" {r[f'layered_over_compacted_{mode}_paired']:>18} {r[f'compacted_featurelake_over_pyiceberg_{mode}_paired']:>13}"
            )
        if "compaction" in cp:
            c = cp["compaction"]
            print(f"  {'':>6} compaction {fmt_s(c['seconds'])}: {c['files_in']} files + {c['update_files_folded']} update files -> {c['files_out']} files")
        pl = cp["planning"]
        print(f"  {'':>6} planning (compacted state): featurelake scan().tasks() {fmt_s(pl['featurelake']['best_s'])}, pyiceberg load+plan_files {fmt_s(pl['pyiceberg']['best_s'])}")
    peer = result.get("peers", {})
    for mode in ("full", "projected", "streaming"):
        if mode in peer:
            m = peer[mode]
            print(f"  peers {mode:<10} featurelake {m['featurelake']['rows_per_s'] / 1e6:.2f}  lance {m['lance']['rows_per_s'] / 1e6:.2f}"
                  f"  pyarrow dataset {m['pyarrow_dataset']['rows_per_s'] / 1e6:.2f} M rows/s")
    w = result.get("writer_settings")
    if w:
        sp = w["speedup_paired"]
        print(f"  writer: per-column codec + delta ints vs codec everywhere: append {sp['append']}x, full read {sp['full_read']}x,"
              f" projected read {sp['projected_read']}x faster; data bytes {w['bytes_ratio']}x")
    print_goals(result["goals"])
    for variant, p in result.get("profile", {}).items():
        print_profile(variant, p)
    print(f"  -> {path}")
