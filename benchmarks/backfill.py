"""Backfill one new feature column into a wide table: merge-on-read vs copy-on-write.

Setup: two identical tables (``sample_id`` int64 + features, every third
float64, the rest float32; appended in ``files`` commits, one data file each).

Measured, interleaved per repetition (each repetition backfills a fresh column
``new_<rep>`` of float32 values, so every run does the same amount of work):

* ``featurelake_by_key``: ``t.backfill(sample_id, new)``; the input is in
  random key order (as labels or features usually arrive), so the engine has to
  find every key.
* ``featurelake_by_locator``: ``t.read(columns=[], with_locator=True)`` (timed
  separately as ``locator_read``) then ``t.backfill(_file, _pos, new)``; only
  the backfill call is timed.
* ``copy_on_write``: plain pyiceberg on the twin table: ``scan().to_arrow()``,
  map the input values onto the rows by key (``index_in`` + ``take``), add the
  column, ``update_schema().union_by_name``, ``overwrite``.
* ``floor``: ``pyarrow.parquet.write_table`` of just the new column (zstd).

Bytes written are the sizes of the files that appeared under the table's
folder during the operation (data, update, manifest, metadata and platform
state files all count); featurelake's own ``bytes_written`` report (update
files only) is recorded too.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.common import (
    KEY,
    Config,
    Timing,
    build_wide_table,
    fmt_bytes,
    fmt_s,
    goal,
    new_files,
    paired_ratio,
    print_goals,
    print_profile,
    profile_summary,
    ratio,
    table_root,
    timed,
    work_dir,
    write_result,
)

NAME = "backfill"
DEFAULT_REPEAT = 3
GOAL_SPEEDUP = 20.0
GOAL_BYTES = 50.0
GOAL_FLOOR = 2.0


def _cow_backfill(cow_table, data: pa.Table, column: str) -> None:
    """Copy-on-write with plain pyiceberg: rewrite every data file with the new column."""
    ice = cow_table.iceberg
    current = ice.scan().to_arrow()
    where = pc.index_in(current.column(KEY), value_set=data.column(KEY))
    values = data.column(column).take(where)
    new_field = pa.field(column, data.schema.field(column).type, nullable=True)
    new_table = current.append_column(new_field, values)
    with ice.update_schema() as us:
        us.union_by_name(pa.schema([new_field]))
    ice.overwrite(new_table)


def _check(t, column: str, expected: pa.Table, reader: str) -> None:
    """The column reads back with the expected value for every key (not timed)."""
    if reader == "featurelake":
        got = t.read(columns=[KEY, column])
    else:
        got = t.iceberg.scan(selected_fields=(KEY, column)).to_arrow()
    got = got.sort_by(KEY)
    want = expected.sort_by(KEY)
    if got.num_rows != want.num_rows or not got.column(column).equals(want.column(column)):
        raise AssertionError(f"{reader} read of {column} does not match the backfilled values")


def _check_locator(t, column: str, expected: pa.Table) -> None:
    got = t.read(columns=[column], with_locator=True)
    joined = got.join(expected, keys=["_file", "_pos"], join_type="inner", right_suffix="_want")
    if joined.num_rows != expected.num_rows or not joined.column(column).equals(joined.column(column + "_want")):
        raise AssertionError(f"featurelake read of {column} does not match the values backfilled by locator")


def run(cfg: Config) -> dict[str, Any]:
    from featurelake import Lake

    print(f"backfill: {cfg.rows:,} rows x {cfg.columns} columns in {cfg.files} data files, {cfg.repeat} repetitions")
    timings = {k: Timing() for k in ("featurelake_by_key", "locator_read", "featurelake_by_locator", "copy_on_write", "floor", "iceberg_metadata_commit")}
    bytes_: dict[str, list[dict[str, Any]]] = {k: [] for k in ("featurelake_by_key", "featurelake_by_locator", "copy_on_write", "floor")}
    reports: dict[str, list[dict[str, Any]]] = {"featurelake_by_key": [], "featurelake_by_locator": []}
    profile = None
    with work_dir(NAME, cfg.keep) as wd:
        lake = Lake(wd / "lake")
        _, t = timed(lambda: build_wide_table(lake, "bench.wide", cfg))
        _, cow = timed(lambda: build_wide_table(lake, "bench.wide_cow", cfg))
        root, cow_root = table_root(t), table_root(cow)
        setup = t.stats()
        print(f"  table: {setup['data_files']} data files, {fmt_bytes(setup['data_bytes'])}")
        rng = np.random.default_rng(cfg.seed + 1)
        ids = np.arange(cfg.rows, dtype=np.int64)
        floor_dir = wd / "floor"
        floor_dir.mkdir()

        for rep in range(cfg.repeat):
            values = pa.array(rng.standard_normal(cfg.rows, dtype=np.float32))
            perm = pa.array(rng.permutation(cfg.rows))
            by_key = pa.table({KEY: pa.array(ids).take(perm), f"new_{rep}": values.take(perm)})
            loc_col = f"loc_{rep}"

            # featurelake, by key (random key order)
            with new_files(root) as nf:
                dt, _ = timed(lambda: t.backfill(by_key), timings["featurelake_by_key"])
            bytes_["featurelake_by_key"].append(nf.summary(root))
            reports["featurelake_by_key"].append(_report(t.last_update_report))
            print(f"  rep {rep}: featurelake by key       {fmt_s(dt):>10}  {fmt_bytes(nf.bytes):>10}")

            # featurelake, by locator (locator read timed on its own)
            dt, loc = timed(lambda: t.read(columns=[], with_locator=True), timings["locator_read"])
            print(f"  rep {rep}: locator read             {fmt_s(dt):>10}")
            # Values follow the locator order: the natural use is read, compute, write back.
            by_loc = loc.append_column(loc_col, values)
            with new_files(root) as nf:
                dt, _ = timed(lambda: t.backfill(by_loc), timings["featurelake_by_locator"])
            bytes_["featurelake_by_locator"].append(nf.summary(root))
            reports["featurelake_by_locator"].append(_report(t.last_update_report))
            print(f"  rep {rep}: featurelake by locator   {fmt_s(dt):>10}  {fmt_bytes(nf.bytes):>10}")

            # copy-on-write, plain pyiceberg
            with new_files(cow_root) as nf:
                dt, _ = timed(lambda: _cow_backfill(cow, by_key, f"new_{rep}"), timings["copy_on_write"])
            bytes_["copy_on_write"].append(nf.summary(cow_root))
            print(f"  rep {rep}: copy-on-write (pyiceberg){fmt_s(dt):>10}  {fmt_bytes(nf.bytes):>10}")

            # floor: the new column alone, one Parquet file
            path = floor_dir / f"new_{rep}.parquet"
            single = pa.table({f"new_{rep}": values})
            dt, _ = timed(lambda: pq.write_table(single, path, compression="zstd"), timings["floor"])
            size = os.path.getsize(path)
            bytes_["floor"].append({"files": 1, "bytes": size, "data_bytes": size, "metadata_bytes": 0})
            print(f"  rep {rep}: floor (pyarrow 1 column) {fmt_s(dt):>10}  {fmt_bytes(size):>10}")

            # context for the floor goal: the fixed cost of one metadata-only Iceberg commit on this table
            def metadata_commit() -> None:
                t.iceberg.transaction().set_properties({"benchmarks.noop": str(rep)}).commit_transaction()

            dt, _ = timed(metadata_commit, timings["iceberg_metadata_commit"])
            print(f"  rep {rep}: pyiceberg metadata-only commit {fmt_s(dt):>6}")

            if rep == 0:  # correctness, not timed
                _check(t, "new_0", by_key, "featurelake")
                _check_locator(t, loc_col, by_loc)
                _check(cow, "new_0", by_key, "pyiceberg")

        best = {k: v.best for k, v in timings.items()}
        mean_bytes = {k: float(np.mean([b["bytes"] for b in v])) for k, v in bytes_.items()}
        tm = timings
        ratios = {
            # paired: median over repetitions of the per-repetition ratio (the goal verdicts use these)
            "cow_time_over_featurelake_by_key_paired": paired_ratio(tm["copy_on_write"], tm["featurelake_by_key"]),
            "cow_time_over_featurelake_by_locator_paired": paired_ratio(tm["copy_on_write"], tm["featurelake_by_locator"]),
            "featurelake_by_key_time_over_floor_paired": paired_ratio(tm["featurelake_by_key"], tm["floor"]),
            "featurelake_by_locator_time_over_floor_paired": paired_ratio(tm["featurelake_by_locator"], tm["floor"]),
            # best: ratio of the best run of each side
            "cow_time_over_featurelake_by_key": ratio(best["copy_on_write"], best["featurelake_by_key"]),
            "cow_time_over_featurelake_by_locator": ratio(best["copy_on_write"], best["featurelake_by_locator"]),
            "cow_time_over_featurelake_locator_read_plus_backfill": ratio(
                best["copy_on_write"], best["locator_read"] + best["featurelake_by_locator"]
            ),
            "cow_bytes_over_featurelake_by_key": ratio(mean_bytes["copy_on_write"], mean_bytes["featurelake_by_key"]),
            "cow_bytes_over_featurelake_by_locator": ratio(mean_bytes["copy_on_write"], mean_bytes["featurelake_by_locator"]),
            "cow_bytes_over_featurelake_update_files_only": ratio(
                mean_bytes["copy_on_write"], float(np.mean([r["bytes_written"] for r in reports["featurelake_by_key"]]))
            ),
            "featurelake_by_key_time_over_floor": ratio(best["featurelake_by_key"], best["floor"]),
            "featurelake_by_locator_time_over_floor": ratio(best["featurelake_by_locator"], best["floor"]),
            "featurelake_bytes_over_floor_bytes": ratio(mean_bytes["featurelake_by_key"], mean_bytes["floor"]),
            "featurelake_by_key_time_over_floor_plus_metadata_commit": ratio(
                best["featurelake_by_key"], best["floor"] + best["iceberg_metadata_commit"]
            ),
            "featurelake_by_locator_time_over_floor_plus_metadata_commit": ratio(
                best["featurelake_by_locator"], best["floor"] + best["iceberg_metadata_commit"]
            ),
        }
        goals = [
            goal("by key: copy-on-write time / featurelake time (paired median)", ratios["cow_time_over_featurelake_by_key_paired"], GOAL_SPEEDUP),
            goal("by key: copy-on-write bytes / featurelake bytes", ratios["cow_bytes_over_featurelake_by_key"], GOAL_BYTES),
            goal("by key: featurelake time / floor time (paired median)", ratios["featurelake_by_key_time_over_floor_paired"], GOAL_FLOOR, higher_is_better=False),
            goal("by locator: copy-on-write time / featurelake time (paired median)", ratios["cow_time_over_featurelake_by_locator_paired"], GOAL_SPEEDUP),
            goal("by locator: copy-on-write bytes / featurelake bytes", ratios["cow_bytes_over_featurelake_by_locator"], GOAL_BYTES),
            goal("by locator: featurelake time / floor time (paired median)", ratios["featurelake_by_locator_time_over_floor_paired"], GOAL_FLOOR, higher_is_better=False),
        ]

        if cfg.profile or (not cfg.quick and not all(g["met"] for g in goals)):
            profile = {}
            values = pa.array(rng.standard_normal(cfg.rows, dtype=np.float32))
            perm = pa.array(rng.permutation(cfg.rows))
            data = pa.table({KEY: pa.array(ids).take(perm), "prof_key": values.take(perm)})
            _, profile["featurelake_by_key"] = profile_summary(lambda: t.backfill(data))
            loc = t.read(columns=[], with_locator=True)
            data = loc.append_column("prof_loc", values)
            _, profile["featurelake_by_locator"] = profile_summary(lambda: t.backfill(data))

    result = {
        "description": __doc__.strip().splitlines()[0],
        "setup": {k: setup[k] for k in ("rows", "data_files", "data_bytes", "columns")},
        "timings": {k: v.as_dict() for k, v in timings.items()},
        "bytes_written": bytes_,
        "featurelake_reports": reports,
        "ratios": ratios,
        "goals": goals,
        "notes": [
            "time goals use the paired ratio: the median over repetitions of the two sides' times in that repetition "
            "(measured back to back, so drifting load on the shared machine cancels); ratios without _paired use "
            "the best run of each side; bytes are the mean over repetitions",
            "bytes = every file that appeared under the table folder (data/update + manifests + metadata + platform state)",
            "by-key input is in random key order; copy-on-write maps values by key with index_in + take",
            "floor = pyarrow.parquet.write_table of the single new column (zstd, pyarrow defaults), no key, no commit",
            "iceberg_metadata_commit = one metadata-only pyiceberg commit (set a table property) on the featurelake table: "
            "the fixed cost any commit pays, for context on the floor goal (not part of the goal)",
        ],
    }
    if profile:
        result["profile"] = profile
    path = write_result(NAME, cfg, result)
    _summary(result, path)
    return result


def _report(r) -> dict[str, Any]:
    return {
        "rows_updated": r.rows_updated,
        "update_files": r.update_files,
        "bytes_written": r.bytes_written,
        "data_files_touched": r.data_files_touched,
    }


def _summary(result: dict[str, Any], path) -> None:
    t = result["timings"]
    b = {k: np.mean([x["bytes"] for x in v]) for k, v in result["bytes_written"].items()}
    print("\nbackfill summary (best of runs; bytes = all new files)")
    for k, label in (
        ("featurelake_by_key", "featurelake backfill by key"),
        ("locator_read", "locator read (read(columns=[], with_locator=True))"),
        ("featurelake_by_locator", "featurelake backfill by locator"),
        ("copy_on_write", "copy-on-write (plain pyiceberg)"),
        ("floor", "floor: pyarrow write of the one column"),
        ("iceberg_metadata_commit", "context: pyiceberg metadata-only commit"),
    ):
        extra = f"  {fmt_bytes(b[k]):>10}" if k in b else ""
        print(f"  {label:<52} {fmt_s(t[k]['best_s']):>10}{extra}")
    r = result["ratios"]
    print(
        f"  CoW / featurelake time:   by key {r['cow_time_over_featurelake_by_key_paired']}x paired"
        f" ({r['cow_time_over_featurelake_by_key']}x best-of), by locator {r['cow_time_over_featurelake_by_locator_paired']}x paired"
        f" ({r['cow_time_over_featurelake_by_locator']}x best-of)"
    )
    print(f"  CoW / featurelake bytes:  by key {r['cow_bytes_over_featurelake_by_key']}x, by locator {r['cow_bytes_over_featurelake_by_locator']}x")
    print(
        f"  featurelake / floor time: by key {r['featurelake_by_key_time_over_floor_paired']}x paired"
        f" ({r['featurelake_by_key_time_over_floor']}x best-of), by locator {r['featurelake_by_locator_time_over_floor_paired']}x paired"
        f" ({r['featurelake_by_locator_time_over_floor']}x best-of)"
    )
    print(
        f"  featurelake / (floor + metadata-only commit) time: by key {r['featurelake_by_key_time_over_floor_plus_metadata_commit']}x,"
        f" by locator {r['featurelake_by_locator_time_over_floor_plus_metadata_commit']}x"
    )
    print_goals(result["goals"])
    for variant, p in result.get("profile", {}).items():
        print_profile(variant, p)
    print(f"  -> {path}")
