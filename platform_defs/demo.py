"""End-to-end demo: materialize the ``main`` group for a few days, then summarize.

Each day runs ``raw_impressions`` -> ``samples`` (features) -> ``labels`` (the
click label and per-user features backfilled by merge-on-read) in one run.

``run_demo`` uses a persistent Dagster instance in ``<home>/dagster``, so
``make ui`` (``dagster dev -w workspace.yaml`` with DAGSTER_HOME=<home>/dagster and
FEATURELAKE_HOME=<home>) shows the demo's runs and materializations.

The summary is built by :func:`build_summary` from a list of *sections*
(:data:`SUMMARY_SECTIONS`); later features (labels, branches, sequences,
maintenance) add a section with :func:`summary_section` and appear in both the
returned dict and the printed report without touching ``run_demo``.
"""
from __future__ import annotations

import contextlib
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from dagster import DagsterInstance

from assets import main as main_group
from platform_defs.runs import run_job
from resources import LakeResource

DAGSTER_YAML = """\
# Written by featurelake's run_demo: a local, persistent Dagster instance.
telemetry:
  enabled: false
"""

# -- environment ----------------------------------------------------------------------
@contextlib.contextmanager
def _env(**values: Optional[str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    try:
        for k, v in values.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def prepare_dagster_home(home: Path) -> Path:
    """Create ``<home>/dagster`` with a minimal dagster.yaml (kept if present)."""
    dagster_home = Path(home) / "dagster"
    dagster_home.mkdir(parents=True, exist_ok=True)
    cfg = dagster_home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text(DAGSTER_YAML)
    return dagster_home


def default_days() -> int:
    """The demo's days: every daily partition when they are bounded (FEATURELAKE_PARTITIONS_DAYS), else 3."""
    return main_group.PARTITION_DAYS or main_group.DEFAULT_PARTITION_DAYS


def demo_partition_keys(days: Optional[int] = None) -> list[str]:
    """The first ``days`` daily partitions of the main group (default :func:`default_days`)."""
    days = default_days() if days is None else days
    if days < 1:
        raise ValueError(f"days must be >= 1, got {days}")
    keys = [(main_group.START + timedelta(days=i)).isoformat() for i in range(days)]
    missing = [k for k in keys if not main_group.daily_partitions.has_partition_key(k)]
    if missing:
        bound = (f"there are {main_group.PARTITION_DAYS} daily partitions from {main_group.START}: set "
                 f"FEATURELAKE_PARTITIONS_DAYS={days} (for `make ui` too)" if main_group.PARTITION_DAYS else
                 f"daily partitions start {main_group.START} and end yesterday")
        raise ValueError(f"partitions {missing[0]}..{missing[-1]} do not exist ({bound}); use fewer days "
                         "or another FEATURELAKE_PARTITIONS_START")
    return keys


# -- summary --------------------------------------------------------------------------
SummarySection = Callable[[Any, dict], Optional[dict]]
SUMMARY_SECTIONS: list[tuple[str, SummarySection]] = []


def summary_section(name: str) -> Callable[[SummarySection], SummarySection]:
    """Register ``fn(lake, context) -> dict | None`` as summary section ``name``.

    ``context`` holds what the demo knows (home, partitions, runs, ...). A section
    returning None is left out. Sections appear in registration order.
    """

    def register(fn: SummarySection) -> SummarySection:
        SUMMARY_SECTIONS[:] = [(n, f) for n, f in SUMMARY_SECTIONS if n != name]
        SUMMARY_SECTIONS.append((name, fn))
        return fn

    return register


def table_summary(table) -> dict:
    """Rows, files, bytes and snapshots of one table's main branch."""
    stats = dict(table.stats())
    out = {
        "rows": int(stats.get("rows", 0)),
        "data_files": int(stats.get("data_files", 0)),
        "small_files": int(stats.get("small_files", 0)),
        "update_files": int(stats.get("update_files", 0)),
        "bytes": int(stats.get("bytes", 0)),
        "snapshots": _count(stats.get("snapshots", 0)),
        "snapshot_id": stats.get("snapshot_id"),
    }
    branches = getattr(table, "branches", None)
    if callable(branches):
        try:
            out["branches"] = sorted(str(b) for b in branches())
        except Exception:  # an engine without branches yet: leave the key out
            pass
    return out


def _count(value: Any) -> int:
    if isinstance(value, (list, tuple, set, dict)):
        return len(value)
    return int(value or 0)


@summary_section("tables")
def _tables_section(lake, context: dict) -> dict:
    return {name: table_summary(lake.table(name)) for name in sorted(lake.tables())}


@summary_section("landing")
def _landing_section(lake, context: dict) -> Optional[dict]:
    root = context.get("landing_dir")
    if not root:
        return None
    files = sorted(Path(root).glob("impressions/*.parquet"))
    return {
        "impressions": {
            "files": len(files),
            "bytes": sum(f.stat().st_size for f in files),
        }
    }


def _run_metadata(context: dict, node: str) -> dict[str, dict]:
    """Partition -> the metadata ``node`` reported in the demo's runs."""
    out = {}
    for run in context.get("runs") or []:
        md = (run.get("materializations") or {}).get(node)
        if md is not None:
            out[run["partition"]] = md
    return out


@summary_section("labels")
def _labels_section(lake, context: dict) -> Optional[dict]:
    """Rows labelled and bytes written per day; labelled rows read back from the table."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    per_run = _run_metadata(context, "labels")
    if not per_run or not lake.table_exists(main_group.SAMPLES_TABLE):
        return None
    table = lake.table(main_group.SAMPLES_TABLE)
    stats = dict(table.stats())
    landing = context.get("landing_dir")
    per_day: dict[str, dict] = {}
    landed_positives = read_back = 0
    for key, md in per_run.items():
        day = main_group.partition_day(key)
        row = {
            "rows": int(md.get("rows_updated", 0)),
            "positives": int(md.get("positives", 0)),
            "update_files": int(md.get("update_files", 0)),
            "bytes_written": int(md.get("bytes_written", 0)),
            "table_bytes": int(md.get("table_bytes", 0)),
            # written / the table's data bytes at that commit
            "write_ratio": float(md.get("write_ratio", 0.0)),
        }
        # the labels as the table serves them now (merge-on-read) vs the landing file
        filt = f"{main_group.day_filter(day)} and {main_group.LABEL_COLUMN} = 1"
        row["read_back"] = table.read(columns=[main_group.LABEL_COLUMN], filter=filt).num_rows
        read_back += row["read_back"]
        if landing:
            path = main_group.landing_path(Path(landing), day)
            if path.exists():
                clicks = pq.read_table(path, columns=[main_group.LABEL_COLUMN]).column(0)
                landed_positives += int(pc.sum(clicks).as_py() or 0)
        per_day[key] = row
    data_bytes = int(stats.get("data_bytes", 0))
    update_bytes = int(stats.get("update_bytes", 0))
    return {
        "columns": ", ".join(main_group.LABEL_COLUMNS),
        "rows_labelled": sum(r["rows"] for r in per_day.values()),
        "bytes_written": sum(r["bytes_written"] for r in per_day.values()),
        "table_update_files": int(stats.get("update_files", 0)),
        "table_update_bytes": update_bytes,
        "table_data_bytes": data_bytes,
        "update_bytes_ratio": round(update_bytes / data_bytes, 4) if data_bytes else 0.0,
        "landed_positives": landed_positives if landing else None,
        "positives_read_back": read_back,
        "read_back_ok": (read_back == landed_positives) if landing else None,
        "per_day": per_day,
    }


@summary_section("timings")
def _timings_section(lake, context: dict) -> Optional[dict]:
    runs = context.get("runs") or []
    if not runs:
        return None
    per_asset: dict[str, float] = {}
    per_partition: dict[str, dict] = {}
    for run in runs:
        row = {}
        for step, seconds in run["steps"].items():
            per_asset[step] = per_asset.get(step, 0.0) + seconds
            row[f"{step}_s"] = round(seconds, 3)
        row["run_s"] = round(run["seconds"], 3)
        per_partition[run["partition"]] = row
    total = sum(r["seconds"] for r in runs)
    rows = sum(r.get("rows", 0) for r in runs)
    return {
        "total_seconds": round(total, 3),
        "rows_per_second": round(rows / total, 1) if total > 0 else None,
        "per_asset_seconds": {k: round(v, 3) for k, v in per_asset.items()},
        "per_partition": per_partition,
    }


def build_summary(lake, context: Optional[dict] = None) -> dict:
    """The demo summary: ``context`` plus one entry per registered section."""
    context = dict(context or {})
    summary = dict(context)
    for name, fn in SUMMARY_SECTIONS:
        value = fn(lake, context)
        if value is not None:
            summary[name] = value
    return summary


#: Column headers shortened in the printed report (the dict keeps the full names).
COLUMN_LABELS = {
    "data_files": "files",
    "small_files": "small",
    "update_files": "updates",
    "snapshots": "snaps",
    "positives": "clicks",
    "bytes_written": "written",
    "table_bytes": "table",
    "write_ratio": "of data",
    "read_back": "read",
}
#: Keys left out of the printed report (still in the returned dict).
HIDDEN_KEYS = {"snapshot_id", "landing_dir", "runs"}


def _human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:,.0f} {unit}" if unit == "B" else f"{size:,.1f} {unit}"
        size /= 1024
    return str(n)


def _fmt(value: Any, key: str = "") -> str:
    if isinstance(value, bool) or value is None:
        return "" if value is None else str(value)
    if isinstance(value, int) and "bytes" in key:
        return _human_bytes(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float) and key.endswith("ratio"):
        return f"{value:.2%}"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


def _is_records(value: Any) -> bool:
    return isinstance(value, dict) and bool(value) and all(isinstance(v, dict) for v in value.values())


def _records_table(title: str, records: dict):
    from rich.table import Table

    columns: list[str] = []
    for record in records.values():
        columns += [c for c in record if c not in columns and c not in HIDDEN_KEYS
                    and not isinstance(record[c], dict)]
    grid = Table(title=title, title_justify="left", pad_edge=False, min_width=len(title) + 2)
    grid.add_column("", no_wrap=True)
    for c in columns:
        grid.add_column(COLUMN_LABELS.get(c, c), justify="right", no_wrap=True)
    for key, record in records.items():
        grid.add_row(str(key), *(_fmt(record.get(c), c) for c in columns))
    return grid


def _mapping_table(title: str, mapping: dict):
    from rich.table import Table

    grid = Table(title=title, title_justify="left", show_header=False, min_width=len(title) + 2)
    grid.add_column("key", no_wrap=True)
    grid.add_column("value", justify="right")
    for key, value in mapping.items():
        if key not in HIDDEN_KEYS:
            grid.add_row(str(key), _fmt(value, str(key)))
    return grid


def print_summary(summary: dict, console=None) -> None:
    """Render ``summary`` with rich, generically over each section's shape.

    A section mapping names to dicts prints as one grid (a row per name); a
    section of scalars prints as key/value pairs; nested mappings inside a section
    print as their own grid or key/value table titled ``section · key``.
    """
    from rich.console import Console

    console = console or Console()
    head = [f"lake home: {summary.get('home')}"]
    if summary.get("dagster_home"):
        head.append(f"dagster home: {summary['dagster_home']}  (`make ui` shows these runs)")
    if summary.get("partitions"):
        p = summary["partitions"]
        per_day = summary.get("rows_per_day")
        head.append(
            f"partitions: {p[0]} .. {p[-1]} ({len(p)} days"
            + (f", {per_day:,} rows/day)" if per_day is not None else ")")
        )
    console.print("\n".join(head))

    for name, _ in SUMMARY_SECTIONS:
        section = summary.get(name)
        if not section:
            continue
        if not isinstance(section, dict):
            console.print(f"{name}: {_fmt(section, name)}")
            continue
        if _is_records(section) and not any(_is_records(v) for v in section.values()):
            console.print(_records_table(name, section))
            continue
        scalars = {k: v for k, v in section.items() if not isinstance(v, dict)}
        if scalars:
            console.print(_mapping_table(name, scalars))
        for key, value in section.items():
            if not isinstance(value, dict) or not value or key in HIDDEN_KEYS:
                continue
            title = f"{name} · {key}"
            if _is_records(value):
                console.print(_records_table(title, value))
            else:
                console.print(_mapping_table(title, value))


# -- the demo -------------------------------------------------------------------------
def _step_seconds(result) -> dict[str, float]:
    """Seconds per asset step of ``result`` (the steps of asset checks left out)."""
    assets = {e.step_key for e in result.get_asset_materialization_events()}
    steps: dict[str, float] = {}
    for event in result.get_step_success_events():
        data = event.event_specific_data
        ms = getattr(data, "duration_ms", None)
        if ms is not None and event.step_key in assets:
            steps[event.step_key] = ms / 1000.0
    return steps


def _materializations(result) -> dict[str, dict]:
    """Node -> the metadata (plain values) of its materialization in ``result``."""
    out: dict[str, dict] = {}
    for event in result.get_asset_materialization_events():
        mat = event.step_materialization_data.materialization
        node = mat.asset_key.to_user_string()
        out[node] = {k: v.value for k, v in mat.metadata.items()}
    return out


def run_demo(
    home: str | Path,
    days: Optional[int] = None,
    rows_per_day: int = 20_000,
    console=None,
    *,
    seed: int = 0,
    print_report: bool = True,
    log_level: str = "WARNING",
) -> dict:
    """Run ``main_job`` (``raw_impressions``, ``samples``, ``labels`` and their checks) for ``days``
    days into ``home`` (default: every daily partition, see :func:`default_days`).

    Every run is a run of a named job of the code location (platform_defs.runs), so the UI
    files it under its job. Runs are recorded in the persistent Dagster instance at ``<home>/dagster``
    (DAGSTER_HOME is set to it while the demo runs, and restored afterwards).
    Returns the summary dict (see :func:`build_summary`) and prints it with rich
    (on ``console``, default a new ``rich.console.Console``) unless
    ``print_report`` is False. ``log_level`` is Dagster's console log level.
    """
    home = Path(home).expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    dagster_home = prepare_dagster_home(home)
    keys = demo_partition_keys(days)
    resource = LakeResource(home=str(home))
    run_config = {
        "ops": {"raw_impressions": {"config": {"rows_per_day": int(rows_per_day), "seed": int(seed)}}},
        # events still go to the instance (the UI); only the console stays quiet
        "loggers": {"console": {"config": {"log_level": log_level}}},
    }

    runs: list[dict] = []
    with _env(DAGSTER_HOME=str(dagster_home)):
        instance = DagsterInstance.get()
        try:
            for key in keys:
                started = time.perf_counter()
                result = run_job(
                    "main_job",
                    instance,
                    {"lake": resource},
                    partition_key=key,
                    run_config=run_config,
                    tags={"featurelake/demo": "true"},
                    asset_selection=[a.key.to_user_string() for a in main_group.main_assets],
                )
                runs.append(
                    {
                        "partition": key,
                        "run_id": result.run_id,
                        "success": result.success,
                        "seconds": time.perf_counter() - started,
                        "steps": _step_seconds(result),
                        "rows": int(rows_per_day),
                        "materializations": _materializations(result),
                    }
                )
        finally:
            instance.dispose()

    context = {
        "home": str(home),
        "dagster_home": str(dagster_home),
        "partitions": keys,
        "rows_per_day": int(rows_per_day),
        "runs": runs,
        "landing_dir": str(resource.landing_dir()),
    }
    summary = build_summary(resource.lake(), context)
    if print_report:
        print_summary(summary, console)
    return summary


# -- user sequences (platform_defs/demo_sequences.py): after labels, before research --------
@summary_section("sequences")
def _sequences_section(lake, context: dict) -> Optional[dict]:
    """user_events + sequence_store per day, then training batches with a joined history."""
    from platform_defs.demo_sequences import run_sequences

    return run_sequences(lake, context)


COLUMN_LABELS.update({"table_events": "in table", "store_events": "in store", "new_bytes": "new",
                      "store_bytes": "store"})


# -- labels arriving later, upserted by key (platform_defs/demo_upsert.py) ------------------
@summary_section("late labels")
def _late_labels_section(lake, context: dict) -> Optional[dict]:
    """A conversion label for one sample in twenty, arriving two weeks late, upserted by key."""
    from platform_defs.demo_upsert import run_late_labels

    return run_late_labels(lake)


# -- research branches, training targets, storage per branch (platform_defs/demo_research.py) --
@summary_section("research")
def _research_section(lake, context: dict) -> Optional[dict]:
    """Research branch ctr-v2: one candidate blocked by the quality gate, one merged into main."""
    from platform_defs.demo_research import run_research

    return run_research(lake, context)


@summary_section("training targets")
def _targets_section(lake, context: dict) -> Optional[dict]:
    """Two training targets, each labelled on its own label branch (main untouched)."""
    from platform_defs.demo_research import run_targets

    return run_targets(lake, context)


@summary_section("storage")
def _storage_section(lake, context: dict) -> Optional[dict]:
    """Per branch of ml.samples: bytes owned alone vs shared with other refs."""
    from platform_defs.demo_research import storage_per_branch

    return storage_per_branch(lake, context)


COLUMN_LABELS.update({"exclusive_bytes": "exclusive", "shared_bytes": "shared", "exclusive_ratio": "owned"})
HIDDEN_KEYS.add("attempts")  # the research section's structured attempts (JSON only)


# -- maintenance (registered last: the demo ends with it) ---------------------------------
@summary_section("maintenance")
def _maintenance_section(lake, context: dict) -> Optional[dict]:
    """The compaction sensor's logic requests compaction of main, it runs; then a GC dry run."""
    from platform_defs.sensors import demo_maintenance

    return demo_maintenance(lake, context)


__all__ = [
    "run_demo",
    "build_summary",
    "print_summary",
    "summary_section",
    "table_summary",
    "SUMMARY_SECTIONS",
    "prepare_dagster_home",
    "demo_partition_keys",
]
