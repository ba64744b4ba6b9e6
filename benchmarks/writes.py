"""Writes at the floor: loading a day-partitioned table and adding a whole column, side by side with peers.

Data: ``sample_id`` int64, ``ts`` (one day per data file) and ``columns - 2``
random float features (every third float64, the rest float32), ``rows``
rows over ``files`` days.

Append (a fresh table per repetition, peers interleaved in each repetition):

* ``<peer>_1``: one commit per day (one data file per commit);
* ``<peer>_8``: all days in one commit (``files`` data files per commit);
* peers: featurelake (``t.append``, partitioned by ``day(ts)``), plain
  pyiceberg (``ice.append`` on its own SqlCatalog, same partition spec),
  Lance (``lance.write_dataset``), Delta (``deltalake.write_deltalake``; Lance
  and Delta unpartitioned), and the floor: ``pyarrow.parquet.write_table`` of
  each day's batch (zstd, pyarrow defaults), no table, no commit;
  ``floor_same_settings``: the same with featurelake's writer settings
  (featurelake.writer_settings: codec, no dictionaries, key/ts statistics).

Whole new column (every row, float32), on a featurelake table and a Lance
dataset loaded with the same days:

* ``featurelake_scan_order``: ``t.add_column(name, values, snapshot_id)``,
  values in the table's scan order (``key_read`` times the read of the key
  that gives that order, separately);
* ``featurelake_by_key``: ``t.add_column(name, values, snapshot_id, keys=...)``
  with the keys in random order (sort-merge); ``featurelake_backfill_by_key``:
  the general ``t.backfill`` of the same input, for comparison;
* ``lance_add_columns`` (values in Lance's row order) and ``lance_merge``
  (``ds.merge`` on the key, random order);
* ``column_floor``: ``pq.write_table`` of the column alone (zstd);
  ``column_floor_same_settings``: the same with featurelake's codec.

Commit overhead: a one-row append to featurelake and to plain pyiceberg, and a
metadata-only pyiceberg commit (a table property), on tables holding the data;
``commit_breakdown`` splits each into its steps (cProfile), plus the
scan-order column write. ``data_mb_one_day_per_commit``: each peer's bytes.
"""
from __future__ import annotations

import gc
import os
import statistics
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.common import (
    KEY,
    Config,
    Timing,
    fmt_s,
    goal,
    paired_ratio,
    print_goals,
    print_profile,
    profile_summary,
    ratio,
    work_dir,
    write_result,
)

class CpuTiming(Timing):
    """Wall times plus the process CPU time of each run (all threads: Lance's and Delta's Rust threads count too).

    On a shared 2-core machine the wall time of a write waits on other users; its CPU time is the work done.
    """

    def __init__(self) -> None:
        super().__init__()
        self.cpu: list[float] = []

    def as_dict(self) -> dict[str, Any]:
        return {**super().as_dict(), "cpu_median_s": round(statistics.median(self.cpu), 6) if self.cpu else None,
                "cpu_runs_s": [round(c, 6) for c in self.cpu]}


def timed(fn, timing: CpuTiming | None = None) -> tuple[float, Any]:
    """Run ``fn`` once after a garbage collection; return (wall seconds, result), recording wall and CPU."""
    gc.collect()
    c0, t0 = time.process_time(), time.perf_counter()
    result = fn()
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    if timing is not None:
        timing.add(dt)
        timing.cpu.append(cpu)
    return dt, result


NAME = "writes"
DEFAULT_REPEAT = 3
TS = "ts"
PEERS = ("featurelake", "pyiceberg", "lance", "delta")


def schema(columns: int) -> pa.Schema:
    fields = [pa.field(KEY, pa.int64(), nullable=False), pa.field(TS, pa.timestamp("us"), nullable=False)]
    for i in range(columns - 2):
        fields.append(pa.field(f"f{i:03d}", pa.float64() if i % 3 == 2 else pa.float32()))
    return pa.schema(fields)


def days(cfg: Config) -> list[pa.Table]:
    """One batch per day: consecutive sample ids, times within the day, random normal features."""
    sch = schema(cfg.columns)
    rng = np.random.default_rng(cfg.seed)
    bounds = np.linspace(0, cfg.rows, cfg.files + 1).astype(np.int64)
    out = []
    for d, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        n = int(hi - lo)
        ts = np.datetime64("2024-01-01T00:00:00", "us") + np.timedelta64(d, "D") + rng.integers(0, 86_400_000_000, n).astype("timedelta64[us]")
        arrays = [pa.array(np.arange(lo, hi, dtype=np.int64)), pa.array(ts)]
        for f in sch.names[2:]:
            arrays.append(pa.array(rng.standard_normal(n, dtype=np.float64 if sch.field(f).type == pa.float64() else np.float32)))
        out.append(pa.Table.from_arrays(arrays, schema=sch))
    return out


def _plain_catalog(wd):
    from pyiceberg.catalog.sql import SqlCatalog

    (wd / "plain").mkdir(exist_ok=True)
    cat = SqlCatalog("plain", uri=f"sqlite:///{wd}/plain.db", warehouse=f"file://{wd}/plain")
    cat.create_namespace("bench")
    return cat


def run(cfg: Config) -> dict[str, Any]:
    import deltalake
    import lance
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import DayTransform

    from featurelake import Lake

    print(f"writes: {cfg.rows:,} rows x {cfg.columns} columns over {cfg.files} days, {cfg.repeat} repetitions")
    batches = days(cfg)
    whole = pa.concat_tables(batches)
    raw_mb = whole.nbytes / 1e6
    modes = {"1": batches, str(cfg.files): [whole]}
    timings: dict[str, CpuTiming] = {f"{p}_{m}": CpuTiming() for m in modes for p in PEERS}
    timings["floor"] = CpuTiming()
    timings["floor_same_settings"] = CpuTiming()
    for k in ("key_read", "featurelake_scan_order", "featurelake_by_key", "featurelake_backfill_by_key",
              "lance_add_columns", "lance_merge", "column_floor", "column_floor_same_settings",
              "featurelake_one_row_append", "pyiceberg_one_row_append", "pyiceberg_metadata_commit"):
        timings[k] = CpuTiming()
    profile = None
    with work_dir(NAME, cfg.keep) as wd:
        lake = Lake(wd / "lake")
        plain = _plain_catalog(wd)
        floor_dir = wd / "floor"
        floor_dir.mkdir()

        def load(peer: str, rep: int, mode: str, parts: list[pa.Table]):
            tag = f"{peer}_{mode}_{rep}"
            if peer == "featurelake":
                t = lake.create_table(f"bench.{tag}", schema(cfg.columns), primary_key=KEY, partition_by=[f"day({TS})"])
                return lambda: [t.append(p) for p in parts], t
            if peer == "pyiceberg":
                fl_schema = lake.table("bench.dense").iceberg.schema()
                spec = PartitionSpec(PartitionField(source_id=fl_schema.find_field(TS).field_id, field_id=1000, transform=DayTransform(), name="ts_day"))
                ice = plain.create_table(f"bench.{tag}", schema=fl_schema, partition_spec=spec)
                return lambda: [ice.append(p) for p in parts], ice
            if peer == "lance":
                path = str(wd / "lance" / tag)
                return lambda: [lance.write_dataset(p, path, mode="append" if i else "create") for i, p in enumerate(parts)], path
            path = str(wd / "delta" / tag)
            return lambda: [deltalake.write_deltalake(path, p, mode="append") for p in parts], path

        # the dense-column tables (also the schema plain pyiceberg copies)
        dense = lake.create_table("bench.dense", schema(cfg.columns), primary_key=KEY, partition_by=[f"day({TS})"])
        codec = _writer_settings(dense)["codec"]
        for b in batches:
            dense.append(b)
        lance_path = str(wd / "lance_dense")
        for i, b in enumerate(batches):
            lance.write_dataset(b, lance_path, mode="append" if i else "create")

        rng = np.random.default_rng(cfg.seed + 1)
        handles: dict[str, Any] = {}  # the tables loaded one day per commit in repetition 0 (for their bytes)
        for rep in range(cfg.repeat):
            for mode, parts in modes.items():
                for peer in PEERS:
                    fn, handle = load(peer, rep, mode, parts)
                    dt, _ = timed(fn, timings[f"{peer}_{mode}"])
                    if rep == 0 and mode == "1":
                        handles[peer] = handle
                    print(f"  rep {rep}: append {peer:<12} {mode} file(s)/commit {fmt_s(dt):>10}  {raw_mb / dt:8.1f} MB/s")

            def floor() -> None:
                for d, b in enumerate(batches):
                    pq.write_table(b, floor_dir / f"{rep}-{d}.parquet", compression="zstd")

            dt, _ = timed(floor, timings["floor"])
            print(f"  rep {rep}: append floor (pyarrow)     {fmt_s(dt):>10}  {raw_mb / dt:8.1f} MB/s")

            def floor_same_settings() -> None:  # featurelake's settings: its codec, no dictionary, key/ts statistics
                for d, b in enumerate(batches):
                    pq.write_table(b, floor_dir / f"same-{rep}-{d}.parquet", compression=codec, use_dictionary=False,
                                   write_statistics=[KEY, TS])

            dt, _ = timed(floor_same_settings, timings["floor_same_settings"])
            print(f"  rep {rep}: append floor, same settings {fmt_s(dt):>9}  {raw_mb / dt:8.1f} MB/s")

            # whole new column
            values = rng.standard_normal(cfg.rows + 1000, dtype=np.float32)  # value of sample_id i is values[i]
            name = f"new_{rep}"
            dt, key_order = timed(lambda: dense.read(columns=[KEY]), timings["key_read"])
            snapshot = dense.scan_order().snapshot_id
            present = key_order.column(KEY).to_numpy()  # the data plus the one-row appends of earlier repetitions
            in_scan_order = pa.array(values[present])
            dt, _ = timed(lambda: dense.add_column(name, in_scan_order, snapshot_id=snapshot), timings["featurelake_scan_order"])
            print(f"  rep {rep}: column featurelake scan order {fmt_s(dt):>10}")
            perm = rng.permutation(present)
            head = dense.scan_order().snapshot_id
            key_values, key_keys = pa.array(values[perm]), pa.array(perm.astype(np.int64))  # input built untimed, as for Lance
            dt, _ = timed(lambda: dense.add_column(name + "_k", key_values, snapshot_id=head, keys=key_keys),
                          timings["featurelake_by_key"])
            print(f"  rep {rep}: column featurelake by key     {fmt_s(dt):>10}")
            by_key = pa.table({KEY: pa.array(perm.astype(np.int64)), name + "_b": pa.array(values[perm])})
            dt, _ = timed(lambda: dense.backfill(by_key), timings["featurelake_backfill_by_key"])
            print(f"  rep {rep}: column featurelake backfill   {fmt_s(dt):>10}")
            ds = lance.dataset(lance_path)
            lance_order = ds.to_table(columns=[KEY]).column(KEY).to_numpy()  # not timed, like the scan-order read
            reader = pa.table({name: pa.array(values[lance_order])}).to_reader()
            dt, _ = timed(lambda: ds.add_columns(reader), timings["lance_add_columns"])
            print(f"  rep {rep}: column lance add_columns      {fmt_s(dt):>10}")
            ds = lance.dataset(lance_path)
            lperm = rng.permutation(cfg.rows)
            merged = pa.table({KEY: pa.array(lperm.astype(np.int64)), name + "_k": pa.array(values[lperm])})
            dt, _ = timed(lambda: ds.merge(merged, left_on=KEY), timings["lance_merge"])
            print(f"  rep {rep}: column lance merge            {fmt_s(dt):>10}")
            col = pa.table({name: in_scan_order})
            dt, _ = timed(lambda: pq.write_table(col, floor_dir / f"col-{rep}.parquet", compression="zstd"), timings["column_floor"])
            print(f"  rep {rep}: column floor (pyarrow, zstd)  {fmt_s(dt):>10}")
            dt, _ = timed(lambda: pq.write_table(col, floor_dir / f"col-same-{rep}.parquet", compression=codec, use_dictionary=False),
                          timings["column_floor_same_settings"])
            print(f"  rep {rep}: column floor (pyarrow, {codec})   {fmt_s(dt):>10}")
            if rep == 0:
                _check(dense, [name, name + "_k", name + "_b"], values)

            # fixed cost of a commit
            one = batches[0].slice(0, 1).set_column(0, pa.field(KEY, pa.int64(), nullable=False), pa.array([cfg.rows + 10 + rep], pa.int64()))
            dt, _ = timed(lambda: dense.append(one), timings["featurelake_one_row_append"])
            ice = plain.load_table(f"bench.pyiceberg_1_{rep}")
            timed(lambda: ice.append(one), timings["pyiceberg_one_row_append"])
            timed(lambda: ice.transaction().set_properties({"benchmarks.noop": str(rep)}).commit_transaction(), timings["pyiceberg_metadata_commit"])

        tm = timings
        m1, m8 = "1", str(cfg.files)
        rates = {k: {"rows_per_s": round(cfg.rows / v.median), "mb_per_s": round(raw_mb / v.median, 1)}
                 for k, v in tm.items() if k.split("_")[-1] in (m1, m8) or k in ("floor", "floor_same_settings")}
        ratios = {
            "featurelake_1_time_over_pyiceberg_1_paired": paired_ratio(tm[f"featurelake_{m1}"], tm[f"pyiceberg_{m1}"]),
            "featurelake_8_time_over_pyiceberg_8_paired": paired_ratio(tm[f"featurelake_{m8}"], tm[f"pyiceberg_{m8}"]),
            "featurelake_1_time_over_lance_1_paired": paired_ratio(tm[f"featurelake_{m1}"], tm[f"lance_{m1}"]),
            "featurelake_8_time_over_lance_8_paired": paired_ratio(tm[f"featurelake_{m8}"], tm[f"lance_{m8}"]),
            "featurelake_1_time_over_delta_1_paired": paired_ratio(tm[f"featurelake_{m1}"], tm[f"delta_{m1}"]),
            "featurelake_1_time_over_floor_paired": paired_ratio(tm[f"featurelake_{m1}"], tm["floor"]),
            "column_scan_order_over_lance_add_columns_paired": paired_ratio(tm["featurelake_scan_order"], tm["lance_add_columns"]),
            "column_scan_order_over_floor_paired": paired_ratio(tm["featurelake_scan_order"], tm["column_floor"]),
            "column_by_key_over_floor_paired": paired_ratio(tm["featurelake_by_key"], tm["column_floor"]),
            "column_scan_order_over_floor_same_settings_paired": paired_ratio(tm["featurelake_scan_order"], tm["column_floor_same_settings"]),
            "column_by_key_over_floor_same_settings_paired": paired_ratio(tm["featurelake_by_key"], tm["column_floor_same_settings"]),
            "featurelake_1_time_over_floor_same_settings_paired": paired_ratio(tm[f"featurelake_{m1}"], tm["floor_same_settings"]),
            "column_by_key_over_lance_merge_paired": paired_ratio(tm["featurelake_by_key"], tm["lance_merge"]),
            "column_backfill_by_key_over_floor_paired": paired_ratio(tm["featurelake_backfill_by_key"], tm["column_floor"]),
            "one_row_append_over_pyiceberg_metadata_commit_paired": paired_ratio(tm["featurelake_one_row_append"], tm["pyiceberg_metadata_commit"]),
            "one_row_append_over_pyiceberg_one_row_append_paired": paired_ratio(tm["featurelake_one_row_append"], tm["pyiceberg_one_row_append"]),
            "pyiceberg_1_time_over_featurelake_1_best": ratio(tm[f"pyiceberg_{m1}"].best, tm[f"featurelake_{m1}"].best),
        }
        cpu_ratios = {  # the same pairs by process CPU time (the work done, whatever else the machine ran)
            "featurelake_1_cpu_over_lance_1_paired": _paired_cpu(tm[f"featurelake_{m1}"], tm[f"lance_{m1}"]),
            "featurelake_8_cpu_over_lance_8_paired": _paired_cpu(tm[f"featurelake_{m8}"], tm[f"lance_{m8}"]),
            "featurelake_1_cpu_over_pyiceberg_1_paired": _paired_cpu(tm[f"featurelake_{m1}"], tm[f"pyiceberg_{m1}"]),
            "featurelake_1_cpu_over_floor_same_settings_paired": _paired_cpu(tm[f"featurelake_{m1}"], tm["floor_same_settings"]),
            "column_scan_order_cpu_over_lance_add_columns_paired": _paired_cpu(tm["featurelake_scan_order"], tm["lance_add_columns"]),
            "column_scan_order_cpu_over_floor_paired": _paired_cpu(tm["featurelake_scan_order"], tm["column_floor"]),
            "column_by_key_cpu_over_floor_paired": _paired_cpu(tm["featurelake_by_key"], tm["column_floor"]),
            "one_row_append_cpu_over_pyiceberg_metadata_commit_paired": _paired_cpu(tm["featurelake_one_row_append"], tm["pyiceberg_metadata_commit"]),
            "one_row_append_cpu_over_pyiceberg_one_row_append_paired": _paired_cpu(tm["featurelake_one_row_append"], tm["pyiceberg_one_row_append"]),
        }
        goals = [
            goal("append, 1 file/commit: pyiceberg time / featurelake time (paired)", _inv(ratios["featurelake_1_time_over_pyiceberg_1_paired"]), 1.0),
            goal(f"append, {m8} files/commit: pyiceberg time / featurelake time (paired)", _inv(ratios["featurelake_8_time_over_pyiceberg_8_paired"]), 1.0),
            goal("append, 1 file/commit: featurelake time / Lance time (paired)", ratios["featurelake_1_time_over_lance_1_paired"], 1.5, higher_is_better=False),
            goal(f"append, {m8} files/commit: featurelake time / Lance time (paired)", ratios["featurelake_8_time_over_lance_8_paired"], 1.5, higher_is_better=False),
            goal("new column, scan order: featurelake / Lance add_columns (paired)", ratios["column_scan_order_over_lance_add_columns_paired"], 1.2, higher_is_better=False),
            goal("new column, scan order: featurelake / floor, pyarrow zstd (paired)", ratios["column_scan_order_over_floor_paired"], 1.5, higher_is_better=False),
            goal("new column, scan order: featurelake / floor, same codec (paired)", ratios["column_scan_order_over_floor_same_settings_paired"], 1.5, higher_is_better=False),
            goal("new column, by key: featurelake / floor, pyarrow zstd (paired)", ratios["column_by_key_over_floor_paired"], 2.0, higher_is_better=False),
            goal("new column, by key: featurelake / floor, same codec (paired)", ratios["column_by_key_over_floor_same_settings_paired"], 2.0, higher_is_better=False),
            goal("commit: featurelake one-row append / pyiceberg metadata-only commit (paired)",
                 ratios["one_row_append_over_pyiceberg_metadata_commit_paired"], 1.5, higher_is_better=False),
        ]
        breakdown = {  # the column write first: one-row appends add data files it would write update files for
            "featurelake_add_column_scan_order": commit_breakdown(
                lambda i: _add_scan_order(dense, f"bd_{i}", rng), FEATURELAKE_PHASES, 3),
            "featurelake_one_row_append": commit_breakdown(
                lambda i: dense.append(_one_row(batches[0], cfg.rows * 4 + i)), FEATURELAKE_PHASES, BREAKDOWN_COMMITS),
            "pyiceberg_metadata_commit": commit_breakdown(
                lambda i: ice.transaction().set_properties({"benchmarks.breakdown": str(i)}).commit_transaction(),
                PYICEBERG_PHASES, BREAKDOWN_COMMITS),
            "pyiceberg_one_row_append": commit_breakdown(
                lambda i: ice.append(_one_row(batches[0], cfg.rows * 5 + i)), PYICEBERG_PHASES, BREAKDOWN_COMMITS),
        }
        stored = {peer: _data_bytes(h) for peer, h in handles.items()}
        stored["floor"] = sum(f.stat().st_size for f in floor_dir.glob("0-*.parquet"))
        if cfg.profile or (not cfg.quick and not all(g["met"] for g in goals)):
            profile = {}
            extra = batches[0].set_column(0, pa.field(KEY, pa.int64(), nullable=False), pa.array(np.arange(cfg.rows * 2, cfg.rows * 2 + batches[0].num_rows, dtype=np.int64)))
            _, profile["featurelake append of one day"] = profile_summary(lambda: dense.append(extra))
            snap = dense.scan_order().snapshot_id
            vals = pa.array(rng.standard_normal(dense.scan_order().total_rows, dtype=np.float32))
            _, profile["featurelake add_column in scan order"] = profile_summary(lambda: dense.add_column("prof", vals, snapshot_id=snap))
            one = batches[0].slice(0, 1).set_column(0, pa.field(KEY, pa.int64(), nullable=False), pa.array([cfg.rows * 3], pa.int64()))
            _, profile["featurelake one-row append"] = profile_summary(lambda: dense.append(one))

    result = {
        "description": __doc__.strip().splitlines()[0],
        "setup": {"rows": cfg.rows, "columns": cfg.columns, "days": cfg.files, "raw_arrow_mb": round(raw_mb, 1)},
        "timings": {k: v.as_dict() for k, v in timings.items()},
        "append_rates_median": rates,
        "ratios": ratios,
        "cpu_ratios": cpu_ratios,
        "goals": goals,
        "commit_breakdown": breakdown,
        "data_mb_one_day_per_commit": {k: round(v / 1e6, 1) for k, v in stored.items()},
        "writer_settings": _writer_settings(dense),
        "notes": [
            "ratios are paired: the median over repetitions of the two sides' times in that repetition; goals use them",
            "MB/s = the input's Arrow bytes / time; rows/s and MB/s use the median run",
            "append: a fresh table per repetition; featurelake and pyiceberg partition by day(ts), Lance and Delta are unpartitioned",
            "plain pyiceberg runs on its own SqlCatalog (pyiceberg's, without featurelake's metadata cache)",
            "floor (append) = pq.write_table of each day's batch with pyarrow defaults (zstd, dictionaries, statistics)",
            "column floor = pq.write_table of the one new float32 column (zstd); column_floor_same_settings: the same with featurelake's codec and no dictionary; key_read (the read that gives the scan order) is not in the column times",
            "floor_same_settings (append) = pq.write_table of each day's batch with featurelake's codec, no dictionaries, statistics for key and ts only",
            "by key: the permuted values and keys are built before the timed call (as Lance merge's input is)",
            "commit_breakdown: each step of one commit, by cProfile (cumulative, per commit); wall/cpu medians are from unprofiled runs",
            "Lance add_columns gets the values in its own row order (read beforehand, not timed)",
        ],
    }
    if profile:
        result["profile"] = profile
    path = write_result(NAME, cfg, result)
    _summary(result, path)
    return result


BREAKDOWN_COMMITS = 10
# phase -> (file suffix, function, calling function or None): disjoint steps of one commit, timed by cProfile
FEATURELAKE_PHASES = {
    "load table (catalog row, cached metadata parse)": ("featurelake/table.py", "refresh", None),
    "input checks (conform, null and duplicate keys in the batch)": ("featurelake/appends.py", "prepare_rows", None),
    "data file write (Parquet)": ("featurelake/rewrite.py", "write_files", None),
    "scan order (plan the snapshot)": ("featurelake/dense.py", "scan_order", None),
    "update files write (Parquet)": ("featurelake/updatefiles.py", "start_update_files", None),
    "schema change (new column)": ("featurelake/updates.py", "add_columns", None),
    "keys already in the table (index probe)": ("featurelake/appends.py", "refuse_existing", None),
    "platform state read": ("featurelake/table.py", "_state", "attempt"),
    "live files of the parent": ("featurelake/livefiles.py", "snapshot_files", "attempt"),
    "index segment write": ("featurelake/index.py", "extend", None),
    "platform state write (shards, root)": ("featurelake/state.py", "write", None),
    "manifests + manifest list + summary (pyiceberg snapshot producer)": ("pyiceberg/table/update/snapshot.py", "_commit", None),
    # the lake's catalog writes metadata.json with featurelake.metadata_json (its own _write_metadata)
    "catalog commit: metadata.json serialise + write": ("featurelake/lake.py", "_write_metadata", None),
    "catalog commit: SQLite transaction (fsync)": ("sqlalchemy/engine/default.py", "do_commit", None),
    "catalog commit: read current row + apply updates": ("pyiceberg/catalog/sql.py", "commit_table", None),
    "remember live files": ("featurelake/livefiles.py", "remember_files", None),
}
PYICEBERG_PHASES = {
    "load table": ("pyiceberg/catalog/sql.py", "load_table", None),
    "data file write (Parquet)": ("pyiceberg/io/pyarrow.py", "write_file", None),
    "manifests + manifest list + summary (pyiceberg snapshot producer)": ("pyiceberg/table/update/snapshot.py", "_commit", None),
    "catalog commit: metadata.json serialise + write": ("pyiceberg/catalog/__init__.py", "_write_metadata", None),
    "catalog commit: SQLite transaction (fsync)": ("sqlalchemy/engine/default.py", "do_commit", None),
    "catalog commit: read current row + apply updates": ("pyiceberg/catalog/sql.py", "commit_table", None),
}
# nested phases: their time is inside the first one's, so it is subtracted from it
_NESTED = {"catalog commit: read current row + apply updates": ("catalog commit: metadata.json serialise + write",
                                                               "catalog commit: SQLite transaction (fsync)")}


def commit_breakdown(fn, phases: dict, n: int) -> dict[str, Any]:
    """Where one commit's time goes: ``fn(i)`` run ``n`` times plain (wall and CPU medians), then ``n``
    times under cProfile; each phase's cumulative profiled time per commit, and the rest as ``other``."""
    import cProfile
    import pstats

    wall, cpu = [], []
    for i in range(n):
        gc.collect()
        w, c = time.perf_counter(), time.process_time()
        fn(i)
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for i in range(n):
        fn(n + i)
    prof.disable()
    total = (time.perf_counter() - t0) / n
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    out: dict[str, float] = {}
    for phase, (suffix, func, caller) in phases.items():
        ms = 0.0
        for (filename, _line, name), (_cc, _nc, _tt, ct, callers) in stats.items():
            if name != func or not filename.endswith(suffix):
                continue
            if caller is None:
                ms += ct
            else:
                ms += sum(v[3] for (_f, _l, cname), v in callers.items() if cname == caller)
        if ms:
            out[phase] = ms / n * 1e3
    for outer, inner in _NESTED.items():
        if outer in out:
            out[outer] -= sum(out.get(i, 0.0) for i in inner)
    out["other (Python glue, GC, threads)"] = max(0.0, total * 1e3 - sum(out.values()))
    return {
        "commits": n,
        "wall_ms_median": round(float(np.median(wall)) * 1e3, 2),
        "cpu_ms_median": round(float(np.median(cpu)) * 1e3, 2),
        "profiled_ms_per_commit": round(total * 1e3, 2),
        "phases_profiled_ms": {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])},
        "note": "phases are cProfile cumulative times (inflated by the profiler, Python-heavy steps most); compare shares",
    }


def _one_row(batch: pa.Table, key: int) -> pa.Table:
    return batch.slice(0, 1).set_column(0, pa.field(KEY, pa.int64(), nullable=False), pa.array([key], pa.int64()))


def _add_scan_order(t, name: str, rng: np.random.Generator) -> None:
    order = t.scan_order()
    t.add_column(name, pa.array(rng.standard_normal(order.total_rows, dtype=np.float32)), snapshot_id=order.snapshot_id)


def _data_bytes(handle) -> int:
    """Bytes of a loaded table's data: its data files (Iceberg), or its folder (Lance, Delta)."""
    from pathlib import Path

    if isinstance(handle, str):
        return sum(f.stat().st_size for f in Path(handle).rglob("*") if f.is_file())
    ice = handle.iceberg if hasattr(handle, "iceberg") else handle
    return sum(task.file.file_size_in_bytes for task in ice.scan().plan_files())


def _writer_settings(t) -> dict[str, Any]:
    from featurelake.writer_settings import WriterSettings

    s = WriterSettings.of(t.iceberg.properties)
    return {"codec": s.codec, "level": s.level, "page_bytes": s.page_bytes, "row_group_rows": s.row_group_rows}


def _paired_cpu(num: CpuTiming, den: CpuTiming) -> float | None:
    pairs = [a / b for a, b in zip(num.cpu, den.cpu) if b > 0]
    return round(statistics.median(pairs), 4) if pairs else None


def _inv(x: float | None) -> float | None:
    return round(1 / x, 4) if x else None


def _check(t, names: list[str], values: np.ndarray) -> None:
    """Every added column reads back as values[sample_id] (not timed)."""
    got = t.read(columns=[KEY, *names])
    want = values[got.column(KEY).to_numpy()]
    for n in names:
        if not np.array_equal(got.column(n).to_numpy(), want):
            raise AssertionError(f"column {n} does not read back as written")


def _summary(result: dict[str, Any], path: os.PathLike) -> None:
    print("\nwrites summary (median of runs)")
    for k, v in result["timings"].items():
        rate = result["append_rates_median"].get(k)
        extra = f"  {rate['rows_per_s'] / 1e6:6.2f} M rows/s {rate['mb_per_s']:8.1f} MB/s" if rate else ""
        cpu = f"  cpu {fmt_s(v['cpu_median_s']):>10}" if v.get("cpu_median_s") is not None else ""
        print(f"  {k:<34} {fmt_s(v['median_s']):>10}  spread {v['spread']:.2f}{cpu}{extra}")
    for k, v in result["cpu_ratios"].items():
        print(f"  cpu ratio {k:<60} {v}")
    for k, b in result["commit_breakdown"].items():
        print(f"  commit breakdown {k}: wall {b['wall_ms_median']} ms, cpu {b['cpu_ms_median']} ms; profiled per commit (ms):")
        for phase, ms in b["phases_profiled_ms"].items():
            print(f"      {ms:8.2f}  {phase}")
    print_goals(result["goals"])
    for variant, p in result.get("profile", {}).items():
        print_profile(variant, p)
    print(f"  -> {path}")
