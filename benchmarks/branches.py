"""Label branches versus physical copies, and branch-create time versus table size.

Storage: five training targets over one feature table (``rows`` x ``columns``).
featurelake keeps one table and five label branches, each backfilling only its
label column; the baseline keeps five physical copies of the table, each with
its label column added, written by the same writer (a table of its own). With
five targets no sharing scheme can save more than 80% (one copy instead of
five); the result says how close the label branches come. Lake bytes are every file under the table's folder
(data, update, metadata, manifests, platform state) after the five targets.

Branch create: ``create_branch`` on a table of 10 data files and on one of
1,000 (same rows, smaller files); zero copy means it should not grow.
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
    fmt_bytes,
    fmt_s,
    goal,
    list_files,
    print_goals,
    ratio,
    table_root,
    wide_chunks,
    wide_schema,
    work_dir,
    write_result,
)

NAME = "branches"
DEFAULT_REPEAT = 5
TARGETS = ["ctr", "cvr", "long_dwell", "share", "follow"]
GOAL_SAVED = 0.80


def _labels(keys: pa.Array, target: str, seed: int) -> pa.Array:
    rng = np.random.default_rng([seed, len(target)])
    return pa.array((rng.random(len(keys)) < 0.05).astype(np.int32))


def _storage(cfg: Config, root) -> dict[str, Any]:
    from featurelake import Lake

    lake = Lake(root / "lake")
    t = lake.create_table("bench.features", wide_schema(cfg.columns), primary_key=KEY)
    t.append(wide_chunks(cfg.rows, cfg.columns, cfg.files, cfg.seed))
    keys = t.read(columns=[KEY])[KEY]
    base_bytes = sum(list_files(table_root(t)).values())
    per_target = {}
    for target in TARGETS:
        branch = f"labels/{target}"
        t.create_branch(branch)
        t0 = time.perf_counter()
        t.backfill(pa.table({KEY: keys, f"label_{target}": _labels(keys, target, cfg.seed)}), branch=branch)
        per_target[target] = {"seconds": round(time.perf_counter() - t0, 3), "bytes_written": t.last_update_report.bytes_written}
    lake_bytes = sum(list_files(table_root(t)).values())
    # the baseline: five physical copies, each the whole table plus its label, written by the
    # same writer (same codec, file sizes and row groups), so only the sharing differs
    copy_bytes = 0
    t0 = time.perf_counter()
    for target in TARGETS:
        copy = lake.create_table(f"bench.copy_{target}", wide_schema(cfg.columns).append(pa.field(f"label_{target}", pa.int32())), primary_key=KEY)
        copy.append(c.append_column(f"label_{target}", _labels(c[KEY], target, cfg.seed)) for c in wide_chunks(cfg.rows, cfg.columns, cfg.files, cfg.seed))
        copy_bytes += sum(list_files(table_root(copy)).values())
    copies_seconds = time.perf_counter() - t0
    saved = 1 - lake_bytes / copy_bytes
    return {
        "targets": TARGETS,
        "max_possible_saved_fraction": round(1 - 1 / len(TARGETS), 4),
        "feature_table_bytes": base_bytes,
        "lake_bytes": lake_bytes,
        "five_copies_bytes": copy_bytes,
        "saved_fraction": round(saved, 4),
        "per_target": per_target,
        "copies_write_seconds": round(copies_seconds, 2),
        "branch_exclusive_bytes": {b: t.stats(b)["exclusive_bytes"] for b in t.branches() if b != "main"},
    }


def _create_time(cfg: Config, root, files: int) -> dict[str, Any]:
    from featurelake import Lake

    rows = max(files * 20, min(cfg.rows, 200_000))
    lake = Lake(root / f"lake-{files}")
    t = lake.create_table(f"bench.f{files}", wide_schema(min(cfg.columns, 20)), primary_key=KEY)
    ice = t.iceberg
    # one commit of `files` data files: pyiceberg splits by target size
    chunks = list(wide_chunks(rows, min(cfg.columns, 20), files, cfg.seed))
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    data_files = []
    for chunk in chunks:
        data_files.extend(_dataframe_to_data_files(ice.metadata, chunk.cast(ice.schema().as_arrow()), ice.io))
    with ice.transaction() as tx:
        with tx.update_snapshot().fast_append() as op:
            for f in data_files:
                op.append_data_file(f)
    n_files = t.stats()["data_files"]
    timing = Timing()
    for i in range(cfg.repeat):
        t0 = time.perf_counter()
        t.create_branch(f"exp-{i}")
        timing.add(time.perf_counter() - t0)
    return {"data_files": n_files, "rows": rows, "create_branch": timing.as_dict()}


def run(cfg: Config) -> dict[str, Any]:
    cfg = cfg.started()
    with work_dir(NAME, cfg.keep) as root:
        print(f"branches: {len(TARGETS)} label branches over {cfg.rows:,} rows x {cfg.columns} columns")
        storage = _storage(cfg, root)
        print(
            f"  lake {fmt_bytes(storage['lake_bytes'])} vs five copies {fmt_bytes(storage['five_copies_bytes'])}: "
            f"{storage['saved_fraction'] * 100:.1f}% saved"
        )
        small = _create_time(cfg, root, 10)
        large = _create_time(cfg, root, 50 if cfg.quick else 1000)
        growth = ratio(large["create_branch"]["best_s"], small["create_branch"]["best_s"])
        print(
            f"  create_branch: {fmt_s(small['create_branch']['best_s'])} at {small['data_files']} files, "
            f"{fmt_s(large['create_branch']['best_s'])} at {large['data_files']} files (x{growth})"
        )
    goals = [
        goal("bytes saved vs five physical copies", storage["saved_fraction"], GOAL_SAVED, unit=""),
        goal("branch create time growth, 1000 vs 10 files", growth, 1.5, higher_is_better=False),
    ]
    print_goals(goals)
    result = {"description": __doc__.splitlines()[0], "storage": storage, "create_small": small, "create_large": large,
              "ratios": {"saved_fraction": storage["saved_fraction"], "create_growth_1000_vs_10": growth}, "goals": goals}
    write_result(NAME, cfg, result)
    return result
