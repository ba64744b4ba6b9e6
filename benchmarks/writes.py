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
  each day's batch (zstd, pyarrow defaults), no table, no commit.

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
* ``floor``: ``pq.write_table`` of the column alone (zstd).

Commit overhead: a one-row append to featurelake and to plain pyiceberg, and a
metadata-only pyiceberg commit (a table property), on tables holding the data.
"""
from __future__ import annotations

import os
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
    timed,
    work_dir,
    write_result,
)

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
    timings: dict[str, Timing] = {f"{p}_{m}": Timing() for m in modes for p in PEERS}
    timings["floor"] = Timing()
    for k in ("key_read", "featurelake_scan_order", "featurelake_by_key", "featurelake_backfill_by_key",
              "lance_add_columns", "lance_merge", "column_floor",
              "featurelake_one_row_append", "pyiceberg_one_row_append", "pyiceberg_metadata_commit"):
        timings[k] = Timing()
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
        for b in batches:
            dense.append(b)
        lance_path = str(wd / "lance_dense")
        for i, b in enumerate(batches):
            lance.write_dataset(b, lance_path, mode="append" if i else "create")

        rng = np.random.default_rng(cfg.seed + 1)
        for rep in range(cfg.repeat):
            for mode, parts in modes.items():
                for peer in PEERS:
                    fn, _ = load(peer, rep, mode, parts)
                    dt, _ = timed(fn, timings[f"{peer}_{mode}"])
                    print(f"  rep {rep}: append {peer:<12} {mode} file(s)/commit {fmt_s(dt):>10}  {raw_mb / dt:8.1f} MB/s")

            def floor() -> None:
                for d, b in enumerate(batches):
                    pq.write_table(b, floor_dir / f"{rep}-{d}.parquet", compression="zstd")

            dt, _ = timed(floor, timings["floor"])
            print(f"  rep {rep}: append floor (pyarrow)     {fmt_s(dt):>10}  {raw_mb / dt:8.1f} MB/s")

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
            dt, _ = timed(lambda: dense.add_column(name + "_k", pa.array(values[perm]), snapshot_id=head, keys=pa.array(perm.astype(np.int64))),
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
            print(f"  rep {rep}: column floor (pyarrow)        {fmt_s(dt):>10}")
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
                 for k, v in tm.items() if k.split("_")[-1] in (m1, m8) or k == "floor"}
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
            "column_by_key_over_lance_merge_paired": paired_ratio(tm["featurelake_by_key"], tm["lance_merge"]),
            "column_backfill_by_key_over_floor_paired": paired_ratio(tm["featurelake_backfill_by_key"], tm["column_floor"]),
            "one_row_append_over_pyiceberg_metadata_commit_paired": paired_ratio(tm["featurelake_one_row_append"], tm["pyiceberg_metadata_commit"]),
            "one_row_append_over_pyiceberg_one_row_append_paired": paired_ratio(tm["featurelake_one_row_append"], tm["pyiceberg_one_row_append"]),
            "pyiceberg_1_time_over_featurelake_1_best": ratio(tm[f"pyiceberg_{m1}"].best, tm[f"featurelake_{m1}"].best),
        }
        goals = [
            goal("append, 1 file/commit: pyiceberg time / featurelake time (paired)", _inv(ratios["featurelake_1_time_over_pyiceberg_1_paired"]), 1.0),
            goal(f"append, {m8} files/commit: pyiceberg time / featurelake time (paired)", _inv(ratios["featurelake_8_time_over_pyiceberg_8_paired"]), 1.0),
            goal("append, 1 file/commit: featurelake time / Lance time (paired)", ratios["featurelake_1_time_over_lance_1_paired"], 1.5, higher_is_better=False),
            goal(f"append, {m8} files/commit: featurelake time / Lance time (paired)", ratios["featurelake_8_time_over_lance_8_paired"], 1.5, higher_is_better=False),
            goal("new column, scan order: featurelake / Lance add_columns (paired)", ratios["column_scan_order_over_lance_add_columns_paired"], 1.2, higher_is_better=False),
            goal("new column, scan order: featurelake / floor (paired)", ratios["column_scan_order_over_floor_paired"], 1.5, higher_is_better=False),
            goal("new column, by key: featurelake / floor (paired)", ratios["column_by_key_over_floor_paired"], 2.0, higher_is_better=False),
            goal("commit: featurelake one-row append / pyiceberg metadata-only commit (paired)",
                 ratios["one_row_append_over_pyiceberg_metadata_commit_paired"], 1.5, higher_is_better=False),
        ]
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
        "goals": goals,
        "notes": [
            "ratios are paired: the median over repetitions of the two sides' times in that repetition; goals use them",
            "MB/s = the input's Arrow bytes / time; rows/s and MB/s use the median run",
            "append: a fresh table per repetition; featurelake and pyiceberg partition by day(ts), Lance and Delta are unpartitioned",
            "plain pyiceberg runs on its own SqlCatalog (pyiceberg's, without featurelake's metadata cache)",
            "floor (append) = pq.write_table of each day's batch with pyarrow defaults (zstd, dictionaries, statistics)",
            "column floor = pq.write_table of the one new float32 column (zstd); key_read (the read that gives the scan order) is not in the column times",
            "Lance add_columns gets the values in its own row order (read beforehand, not timed)",
        ],
    }
    if profile:
        result["profile"] = profile
    path = write_result(NAME, cfg, result)
    _summary(result, path)
    return result


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
        print(f"  {k:<34} {fmt_s(v['median_s']):>10}  spread {v['spread']:.2f}{extra}")
    print_goals(result["goals"])
    for variant, p in result.get("profile", {}).items():
        print_profile(variant, p)
    print(f"  -> {path}")
