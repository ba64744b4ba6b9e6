"""The lake a demo left behind, checked from outside against the generators (not the demo's verdicts).

Imported by name (tests/dagster is on sys.path). Every check reads the lake
with the engine or pyarrow and recomputes the expected values itself.
"""
from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

KEY = "sample_id"


def _by_key(table: pa.Table) -> dict:
    return {r[KEY]: r for r in table.to_pylist()}


def check_demo_lake(home: Path, days: int, rows_per_day: int, seed: int = 0) -> dict:
    """Assert what the demo must have left in ``home``; returns a few facts for further checks."""
    from assets.main import LABEL_COLUMNS, SAMPLES_TABLE, START, label_rows, landing_path, partition_day
    from featurelake import Lake
    from featurelake.synthetic import impressions_for_day
    from platform_defs.demo import demo_partition_keys
    from test_dagster_sequences import _assert_joined_matches

    lake = Lake(home)
    t = lake.table(SAMPLES_TABLE)
    keys = demo_partition_keys(days)

    # the landing files are exactly the generator's days
    landed = []
    for i, key in enumerate(keys):
        day = pq.read_table(landing_path(home / "landing", partition_day(key)))
        generated = pa.Table.from_batches(list(impressions_for_day(i, rows_per_day, start=START, seed=seed)))
        assert day.equals(generated), key
        landed.append(day)
    raw = pa.concat_tables(landed)
    n = raw.num_rows
    assert n == days * rows_per_day

    # main holds every generated row once, its columns as generated (features) ...
    main = t.read().sort_by(KEY)
    assert main.num_rows == n and pc.count_distinct(main[KEY]).as_py() == n
    got = _by_key(main)
    for r in raw.to_pylist():
        row = got[r[KEY]]
        assert {c: row[c] for c in r if c != "click"} == {c: v for c, v in r.items() if c != "click"}, r[KEY]
    # ... and the labels and per-user features computed from the landing files, day by day
    labels = pa.concat_tables([label_rows(day) for day in landed])
    for r in labels.to_pylist():
        assert {c: got[r[KEY]][c] for c in LABEL_COLUMNS} == {c: r[c] for c in LABEL_COLUMNS}, r[KEY]

    # late labels: one row in twenty got `converted`, by an upsert that rewrote no data file
    converted = main.filter(pc.is_valid(main["converted"]))
    assert converted.num_rows == math.ceil(n / 20)
    assert set(converted["converted"].to_pylist()) <= {0, 1}
    history = t.snapshots()
    upserts = [s for s in history if s["operation"] == "upsert"]
    assert upserts  # one per demo run

    def data_files(snapshot_id: int) -> set[str]:
        return {task.file.file_path for task in t.iceberg.scan(snapshot_id=snapshot_id).plan_files()}

    for upsert in upserts:
        assert data_files(upsert["snapshot_id"]) == data_files(upsert["parent_id"])

    # training targets: labelled on their own branches; main never got their columns
    branches = t.branches()
    targets = sorted(b for b in branches if b.startswith("labels/"))
    assert targets == ["labels/ctr", "labels/long_dwell"]
    for b in targets:
        labelled = t.read(branch=b)
        assert labelled.num_rows == n
        own = [c for c in labelled.column_names if labelled[c].null_count < n and main[c].null_count == n]
        assert own, b  # values only on the branch: main never saw them

    # research: the merged candidate has values on main, the blocked one none
    assert main["f0_f1_blend"].null_count < n
    assert "f2_norm" not in main.column_names or main["f2_norm"].null_count == n

    # the key index is right on every branch
    for b in branches:
        report = t.verify_index(b)
        assert report["ok"] and report["rows"] == n, (b, report)

    # nothing unreferenced is left behind (every retained snapshot is kept: the demo expires none);
    # the only garbage is a store build superseded by a rebuild of the same snapshot, never the serving one
    garbage = lake.collect_garbage(older_than=timedelta(0), dry_run=True)
    events = lake.sequence_table("ml.user_events")
    dead = {b for builds in garbage.builds.values() for b in builds}
    assert events.build_for("main").build_id not in dead
    dead_folders = [str(events.store_root / b) + "/" for b in dead]
    assert all(any(f.removeprefix("file://").startswith(d) for d in dead_folders) for f in garbage.files), garbage.files

    # sequences: each row's joined history is the events table's, strictly before the row
    _assert_joined_matches(lake, max_len=64, sample=min(n, 150))
    return {"rows": n, "branches": branches, "snapshots": len(history)}
