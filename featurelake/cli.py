"""The ``featurelake`` command line: a thin shell over the engine.

Every command parses its arguments, calls one engine method and formats the
result -- a rich table for people, ``--json`` for machines::

    featurelake --home ./lake tables
    featurelake --home ./lake --json stats ml.samples --branch research
    featurelake --home ./lake read ml.samples --columns sample_id,click --filter "click = 1" --limit 5
    featurelake --home ./lake append ml.samples new_rows.parquet

The lake is ``--home DIR`` when given; otherwise ``FEATURELAKE_CATALOG_URI``
(+ ``FEATURELAKE_WAREHOUSE``) when set, else the embedded lake at
``FEATURELAKE_HOME`` (default ``./.featurelake``). A :class:`FeatureLakeError`
prints one red line on stderr and exits with status 1. The CLI never imports
Dagster: only ``demo`` reaches for it, inside the command.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as _dt
import decimal
import inspect
import json
import math
import os
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Optional

import pyarrow as pa
import typer
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text
from typer.core import TyperGroup

from featurelake import __version__
from featurelake.errors import FeatureLakeError
from featurelake.lake import DEFAULT_HOME, Lake


MAIN = "main"
READ_BATCH = 8192
MAX_ERROR_CHARS = 400
MAX_CELL_CHARS = 48
MAX_WIDE_CELL_CHARS = 160


class CLIError(Exception):
    """A bad command-line input the engine never saw (unreadable file, missing feature)."""


class _Group(TyperGroup):
    """Turns expected errors into one red line and exit status 1 (no traceback)."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (FeatureLakeError, CLIError) as e:
            _print_error(e)
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=_Group,
    name="featurelake",
    help="featurelake: training samples and features on an Apache Iceberg lake.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@dataclasses.dataclass
class _Options:
    home: Optional[Path]
    json: bool
    _lake: Optional[Lake] = None

    def lake(self) -> Lake:
        if self._lake is None:
            self._lake = _open_lake(self.home)
        return self._lake


def _open_lake(home: Optional[Path]) -> Lake:
    try:
        if home is not None:
            return Lake(home)
        if os.environ.get("FEATURELAKE_CATALOG_URI"):
            return Lake.from_env()
        return Lake()  # FEATURELAKE_HOME, else ./.featurelake
    except FeatureLakeError:
        raise
    except (ValueError, OSError, ImportError) as e:
        raise CLIError(f"cannot open the lake: {e}") from e


def _opts(ctx: typer.Context) -> _Options:
    obj = ctx.find_object(_Options)
    if obj is None:  # a command invoked without the group callback (embedding)
        obj = ctx.obj = _Options(home=None, json=False)
    return obj


def _wants_json(ctx: typer.Context, local_flag: bool) -> bool:
    return local_flag or _opts(ctx).json


# ------------------------------------------------------------------ options
JsonFlag = Annotated[bool, typer.Option("--json", help="Machine output (same as the global --json).")]
BranchOpt = Annotated[str, typer.Option("--branch", "-b", help="Branch (or tag, for reads).")]
TableArg = Annotated[str, typer.Argument(help="Table name, namespace.table.", show_default=False)]
ParquetArg = Annotated[
    Path,
    typer.Argument(
        help="A Parquet file.", exists=True, dir_okay=False, readable=True, resolve_path=True, show_default=False
    ),
]


def _version(value: bool) -> None:
    if value:
        typer.echo(f"featurelake {__version__}")
        raise typer.Exit()


@app.callback()
def _main_options(
    ctx: typer.Context,
    home: Annotated[
        Optional[Path],
        typer.Option(
            "--home",
            help=(
                "Lake home folder. Default: FEATURELAKE_CATALOG_URI (+ FEATURELAKE_WAREHOUSE) when set, "
                f"else FEATURELAKE_HOME, else ./{DEFAULT_HOME}."
            ),
            file_okay=False,
            show_default=False,
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable JSON output.")] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """featurelake: training samples and features on an Apache Iceberg lake."""
    ctx.obj = _Options(home=home, json=json_out)


# ----------------------------------------------------------------- commands
@app.command("tables")
def tables_cmd(ctx: typer.Context, json_flag: JsonFlag = False) -> None:
    """List the tables with their rows, files and bytes (main branch)."""
    lake = _opts(ctx).lake()
    stats = [lake.table(name).stats() for name in lake.tables()]
    if _wants_json(ctx, json_flag):
        return _emit_json(stats)
    if not stats:
        _out().print(Text(f"No tables in {_describe(lake)}.", style="dim"))
        return
    view = RichTable(title=f"Tables in {_describe(lake)}", title_justify="left")
    view.add_column("table", style="bold cyan", no_wrap=True)
    for col in ("rows", "data files", "update files", "bytes"):
        view.add_column(col, justify="right", no_wrap=True)
    for s in stats:
        view.add_row(
            s.get("table", "?"),
            _count(s.get("rows")),
            _count(s.get("data_files")),
            _count(s.get("update_files")),
            _bytes(s.get("bytes")),
        )
    _out().print(view)


@app.command("stats")
def stats_cmd(ctx: typer.Context, table: TableArg, branch: BranchOpt = MAIN, json_flag: JsonFlag = False) -> None:
    """Rows, files and bytes of one table's branch head."""
    stats = _opts(ctx).lake().table(table).stats(branch=branch)
    if _wants_json(ctx, json_flag):
        return _emit_json(stats)
    _print_report(_out(), {k: v for k, v in stats.items() if k not in ("table", "branch")}, title=f"{table}@{branch}")


@app.command("snapshots")
def snapshots_cmd(ctx: typer.Context, table: TableArg, branch: BranchOpt = MAIN, json_flag: JsonFlag = False) -> None:
    """A branch's history, newest first."""
    snaps = _opts(ctx).lake().table(table).snapshots(branch=branch)
    if _wants_json(ctx, json_flag):
        return _emit_json(snaps)
    if not snaps:
        _out().print(Text(f"{table}@{branch} has no snapshots yet.", style="dim"))
        return
    # parent_id is the next row's snapshot_id (the history is one ancestor chain): JSON only
    names = [k for k in snaps[0] if k != "parent_id"]
    _print_rows(_out(), snaps, names, title=f"Snapshots of {table}@{branch}")


@app.command("read")
def read_cmd(
    ctx: typer.Context,
    table: TableArg,
    columns: Annotated[Optional[str], typer.Option("--columns", "-c", help="Comma-separated columns.")] = None,
    filter: Annotated[
        Optional[str], typer.Option("--filter", "-f", help='Row filter, e.g. "user_id < 100 and click = 1".')
    ] = None,
    branch: BranchOpt = MAIN,
    snapshot: Annotated[Optional[int], typer.Option("--snapshot", help="Read this snapshot id (time travel).")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=0, help="Rows to show; 0 shows all.")] = 20,
    with_locator: Annotated[
        bool, typer.Option("--with-locator", help="Add _file and _pos (the row's data file and position).")
    ] = False,
    max_bad_file_ratio: Annotated[
        float,
        typer.Option(
            "--max-bad-file-ratio", min=0.0, max=1.0, help="Skip up to this share of unreadable data files (warned)."
        ),
    ] = 0.0,
    json_lines: Annotated[bool, typer.Option("--jsonl", help="One JSON object per line (implies --json).")] = False,
    json_flag: JsonFlag = False,
) -> None:
    """Show the first rows of a table (update files merged in).

    JSON output is an array of row objects (--jsonl: one object per line);
    timestamps become ISO strings, binary values base64, NaN null.
    """
    t = _opts(ctx).lake().table(table)
    cols = [c.strip() for c in columns.split(",") if c.strip()] if columns else None
    kwargs = dict(columns=cols, filter=filter, branch=branch, snapshot_id=snapshot, with_locator=with_locator)
    if max_bad_file_ratio:
        kwargs["max_bad_file_ratio"] = max_bad_file_ratio
    data, more = _first_rows_reported(t, limit, kwargs)
    rows = data.to_pylist()
    if json_lines:
        for row in rows:
            typer.echo(json.dumps(_jsonable(row), ensure_ascii=False))
        return
    if _wants_json(ctx, json_flag):
        return _emit_json(rows)
    where = f"{table}@{branch}" if snapshot is None else f"{table}@snapshot {snapshot}"
    out = _out()
    _print_rows(out, rows, data.schema.names, title=where)
    note = f"{len(rows)} row(s)" + (f"; more match (use --limit N, 0 for all)" if more else "")
    out.print(Text(note, style="dim"))


@app.command("append")
def append_cmd(
    ctx: typer.Context, table: TableArg, file: ParquetArg, branch: BranchOpt = MAIN, json_flag: JsonFlag = False
) -> None:
    """Append the rows of a Parquet file (keys must be new); prints the snapshot id."""
    t = _opts(ctx).lake().table(table)
    pf = _parquet(file)
    total = pf.metadata.num_rows
    with _progress(f"Appending {file.name} to {table}@{branch}", total) as progress:
        snapshot_id = t.append(_stream(pf, file, progress.advance), branch=branch)
    _report_write(ctx, json_flag, "append", table, branch, snapshot_id, total, f"Appended {_count(total)} row(s)")


@app.command("backfill")
def backfill_cmd(
    ctx: typer.Context,
    table: TableArg,
    file: ParquetArg,
    branch: BranchOpt = MAIN,
    skip_unknown: Annotated[
        bool, typer.Option("--skip-unknown", help="Skip keys that are not in the table instead of failing.")
    ] = False,
    json_flag: JsonFlag = False,
) -> None:
    """Set columns of existing rows from a Parquet file: the key (or _file/_pos) plus the columns to set.

    Columns not yet in the table are added; no data file is rewritten.
    """
    t = _opts(ctx).lake().table(table)
    backfill = _engine_method(t, "backfill")
    data = _read_parquet(file)
    kwargs = {"on_unknown": "skip"} if skip_unknown else {}
    with _progress(f"Backfilling {table}@{branch} from {file.name}"):
        snapshot_id = backfill(data, branch=branch, **kwargs)
    report = getattr(t, "last_update_report", None)
    details = _as_dict(report) if report is not None else {}
    if _wants_json(ctx, json_flag):
        payload = {"operation": "backfill", "table": table, "branch": branch, "rows": data.num_rows}
        return _emit_json({**payload, **details, "snapshot_id": snapshot_id})
    _print_write(f"Backfilled {_count(details.get('rows_updated', data.num_rows))} row(s)", table, branch, snapshot_id)
    if details:
        _print_report(_out(), details, title=None)


@app.command("compact")
def compact_cmd(ctx: typer.Context, table: TableArg, branch: BranchOpt = MAIN, json_flag: JsonFlag = False) -> None:
    """Fold update files and small files into new data files (the table becomes plain Iceberg)."""
    t = _opts(ctx).lake().table(table)
    compact = _engine_method(t, "compact")
    with _progress(f"Compacting {table}@{branch}") as progress:
        kwargs = {"progress": progress.update} if progress.live and _accepts(compact, "progress") else {}
        report = _as_dict(compact(branch=branch, **kwargs))
    if _wants_json(ctx, json_flag):
        return _emit_json(report)
    _print_report(_out(), report, title=f"Compacted {table}@{branch}")


@app.command("demo")
def demo_cmd(
    ctx: typer.Context,
    days: Annotated[Optional[int], typer.Option("--days", min=1, help="Days (partitions) to materialize.")] = None,
    rows_per_day: Annotated[Optional[int], typer.Option("--rows-per-day", min=1, help="Impressions per day.")] = None,
    json_flag: JsonFlag = False,
) -> None:
    """Run the Dagster pipeline on the embedded lake for a few days and summarize it."""
    opts = _opts(ctx)
    home = opts.home
    if home is None:
        if os.environ.get("FEATURELAKE_CATALOG_URI"):
            raise CLIError("demo runs on an embedded lake: pass --home DIR (FEATURELAKE_CATALOG_URI is set)")
        home = Path(os.environ.get("FEATURELAKE_HOME", DEFAULT_HOME))
    try:
        from platform_defs.demo import run_demo  # Dagster is imported here only
    except ImportError as e:
        raise CLIError(f"the demo needs the Dagster layer (platform_defs): {e}") from e
    as_json = _wants_json(ctx, json_flag)
    kwargs: dict[str, Any] = {}
    if days is not None:
        kwargs["days"] = days
    if rows_per_day is not None:
        kwargs["rows_per_day"] = rows_per_day
    if as_json and _accepts(run_demo, "print_report"):
        kwargs["print_report"] = False
    summary = run_demo(home, **kwargs)
    if as_json:
        _emit_json(summary)


# ------------------------------------------- upsert, branches, tags, maintenance
@app.command("upsert")
def upsert_cmd(
    ctx: typer.Context, table: TableArg, file: ParquetArg, branch: BranchOpt = MAIN, json_flag: JsonFlag = False
) -> None:
    """Update rows whose key exists and insert the others, from a Parquet file (one commit)."""
    t = _opts(ctx).lake().table(table)
    upsert = _engine_method(t, "upsert")
    data = _read_parquet(file)
    with _progress(f"Upserting {file.name} into {table}@{branch}"):
        snapshot_id = upsert(data, branch=branch)
    report = getattr(t, "last_update_report", None)
    details = _as_dict(report) if report is not None else {}
    details.pop("snapshot_id", None)
    if _wants_json(ctx, json_flag):
        payload = {"operation": "upsert", "table": table, "branch": branch, "rows": data.num_rows}
        return _emit_json({**payload, **details, "snapshot_id": snapshot_id})
    what = (
        f"Upserted {_count(data.num_rows)} row(s): {_count(details.get('rows_updated', 0))} updated, "
        f"{_count(details.get('rows_inserted', 0))} inserted"
    )
    _print_write(what, table, branch, snapshot_id)
    shown = ("rows_updated", "rows_inserted", "bytes_written")
    _print_report(_out(), {k: details[k] for k in shown if k in details}, title=None)


branch_app = typer.Typer(
    cls=_Group, help="Zero-copy branches: create, list, diff, merge, rebase, drop.", no_args_is_help=True
)
app.add_typer(branch_app, name="branch")

NameArg = Annotated[str, typer.Argument(help="Branch name.", show_default=False)]


@branch_app.command("create")
def branch_create_cmd(
    ctx: typer.Context,
    table: TableArg,
    name: NameArg,
    from_ref: Annotated[str, typer.Option("--from", help="Branch, tag or snapshot id to start at.")] = MAIN,
    json_flag: JsonFlag = False,
) -> None:
    """Create a branch (no data is copied); prints the snapshot it starts at."""
    snapshot_id = _opts(ctx).lake().table(table).create_branch(name, from_ref)
    if _wants_json(ctx, json_flag):
        return _emit_json(
            {"operation": "create_branch", "table": table, "branch": name, "from": from_ref, "snapshot_id": snapshot_id}
        )
    _print_done(f"Created branch {name} of {table} from {from_ref}", snapshot_id)


@branch_app.command("list")
def branch_list_cmd(ctx: typer.Context, table: TableArg, json_flag: JsonFlag = False) -> None:
    """Branches and tags with their head snapshot, rows and bytes (exclusive: what dropping it frees)."""
    t = _opts(ctx).lake().table(table)
    named = [(name, "branch", sid) for name, sid in t.branches().items()]
    named += [(name, "tag", sid) for name, sid in t.tags().items()]
    rows = []
    with _progress(f"Measuring the branches of {table}", len(named)) as progress:
        for name, kind, sid in named:
            stats = t.stats(name)
            rows.append(
                {
                    "name": name,
                    "type": kind,
                    "snapshot_id": sid,
                    "rows": stats.get("rows"),
                    "exclusive_bytes": stats.get("exclusive_bytes"),
                    "shared_bytes": stats.get("shared_bytes"),
                }
            )
            progress.advance(1)
    if _wants_json(ctx, json_flag):
        return _emit_json(rows)
    if not rows:
        _out().print(Text(f"{table} has no snapshots yet: no branches.", style="dim"))
        return
    view = RichTable(title=f"Branches and tags of {table}", title_justify="left")
    view.add_column("name", style="bold cyan", no_wrap=True)
    view.add_column("type", no_wrap=True)
    for col in ("snapshot", "rows", "exclusive bytes", "shared bytes"):
        view.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        view.add_row(
            r["name"], r["type"], str(r["snapshot_id"]), _count(r["rows"]),
            _bytes(r["exclusive_bytes"]), _bytes(r["shared_bytes"]),
        )
    _out().print(view)


@branch_app.command("diff")
def branch_diff_cmd(
    ctx: typer.Context,
    table: TableArg,
    name: NameArg,
    against: Annotated[str, typer.Option("--against", help="The branch it is compared with.")] = MAIN,
    json_flag: JsonFlag = False,
) -> None:
    """What a branch changed since it forked: rows, columns, files and bytes."""
    report = _opts(ctx).lake().table(table).diff(name, against)
    if _wants_json(ctx, json_flag):
        return _emit_json(report)
    shown = {k: v for k, v in report.items() if k not in ("branch", "against")}
    _print_report(_out(), shown, title=f"{table}: {name} since it forked from {against}")


def merge_cmd(
    ctx: typer.Context,
    table: TableArg,
    name: Annotated[str, typer.Argument(help="Branch, tag or snapshot id to merge.", show_default=False)],
    into: Annotated[str, typer.Option("--into", help="The branch that receives the changes.")] = MAIN,
    json_flag: JsonFlag = False,
) -> None:
    """Merge a branch into another (fast-forward or three-way, one commit).

    On a conflict nothing is written: the conflicting data files and columns
    are listed (JSON: under "conflicts") and the exit status is 1.
    """
    t = _opts(ctx).lake().table(table)
    payload = {"operation": "merge", "table": table, "source": name, "into": into}
    with _conflicts_reported(ctx, json_flag, t, payload):
        with _progress(f"Merging {name} into {table}@{into}"):
            snapshot_id = t.merge(name, into)
    if _wants_json(ctx, json_flag):
        return _emit_json({**payload, "snapshot_id": snapshot_id})
    _print_done(f"Merged {name} into {table}@{into}", snapshot_id)


def rebase_cmd(
    ctx: typer.Context,
    table: TableArg,
    name: NameArg,
    onto: Annotated[str, typer.Option("--onto", help="The branch whose head it moves onto.")] = MAIN,
    json_flag: JsonFlag = False,
) -> None:
    """Replay a branch's changes on another branch's head and move the branch there.

    On a conflict nothing is written: the conflicts are listed and the exit status is 1.
    """
    t = _opts(ctx).lake().table(table)
    payload = {"operation": "rebase", "table": table, "branch": name, "onto": onto}
    with _conflicts_reported(ctx, json_flag, t, payload):
        with _progress(f"Rebasing {table}@{name} onto {onto}"):
            snapshot_id = t.rebase(name, onto)
    if _wants_json(ctx, json_flag):
        return _emit_json({**payload, "snapshot_id": snapshot_id})
    _print_done(f"Rebased {table}@{name} onto {onto}", snapshot_id)


branch_app.command("merge")(merge_cmd)
branch_app.command("rebase")(rebase_cmd)
app.command("merge")(merge_cmd)
app.command("rebase")(rebase_cmd)


@branch_app.command("drop")
def branch_drop_cmd(ctx: typer.Context, table: TableArg, name: NameArg, json_flag: JsonFlag = False) -> None:
    """Drop a branch (its files are reclaimed by expire + gc)."""
    _opts(ctx).lake().table(table).drop_branch(name)
    if _wants_json(ctx, json_flag):
        return _emit_json({"operation": "drop_branch", "table": table, "branch": name})
    _out().print(Text(f"Dropped branch {name} of {table}", style="green"))


@app.command("tag")
def tag_cmd(
    ctx: typer.Context,
    table: TableArg,
    name: Annotated[str, typer.Argument(help="Tag name.", show_default=False)],
    ref: Annotated[str, typer.Option("--ref", help="Branch, tag or snapshot id to tag.")] = MAIN,
    drop: Annotated[bool, typer.Option("--drop", help="Drop the tag instead of creating it.")] = False,
    json_flag: JsonFlag = False,
) -> None:
    """Tag a snapshot (an immutable name for a training set), or drop a tag with --drop."""
    t = _opts(ctx).lake().table(table)
    if drop:
        t.drop_tag(name)
        if _wants_json(ctx, json_flag):
            return _emit_json({"operation": "drop_tag", "table": table, "tag": name})
        _out().print(Text(f"Dropped tag {name} of {table}", style="green"))
        return
    snapshot_id = t.create_tag(name, ref)
    if _wants_json(ctx, json_flag):
        return _emit_json({"operation": "create_tag", "table": table, "tag": name, "ref": ref, "snapshot_id": snapshot_id})
    _print_done(f"Tagged {table}@{ref} as {name}", snapshot_id)


@app.command("revert")
def revert_cmd(
    ctx: typer.Context,
    table: TableArg,
    snapshot: Annotated[int, typer.Argument(help="The snapshot whose change is undone.", show_default=False)],
    branch: BranchOpt = MAIN,
    json_flag: JsonFlag = False,
) -> None:
    """Undo one snapshot's change in a new snapshot, keeping every later one."""
    t = _opts(ctx).lake().table(table)
    with _progress(f"Reverting snapshot {snapshot} of {table}@{branch}"):
        snapshot_id = t.revert(snapshot, branch=branch)
    if _wants_json(ctx, json_flag):
        return _emit_json(
            {"operation": "revert", "table": table, "branch": branch, "reverted": snapshot, "snapshot_id": snapshot_id}
        )
    _print_write(f"Reverted snapshot {snapshot}", table, branch, snapshot_id)


@app.command("expire")
def expire_cmd(
    ctx: typer.Context,
    table: TableArg,
    older_than: Annotated[
        float, typer.Option("--older-than", min=0, help="Expire snapshots older than this many days.", show_default=False)
    ],
    retain_last: Annotated[
        int, typer.Option("--retain-last", min=1, help="Snapshots every branch keeps whatever their age.")
    ] = 1,
    json_flag: JsonFlag = False,
) -> None:
    """Expire old snapshots (ref heads stay); gc then deletes the files only they referenced."""
    t = _opts(ctx).lake().table(table)
    cutoff = _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(days=older_than)
    with _progress(f"Expiring snapshots of {table}"):
        expired = list(t.expire_snapshots(cutoff, retain_last))
    if _wants_json(ctx, json_flag):
        return _emit_json(
            {"operation": "expire", "table": table, "older_than": cutoff, "retain_last": retain_last, "expired": expired}
        )
    _out().print(
        Text.assemble((f"Expired {_count(len(expired))} snapshot(s)", "green"), f" of {table} older than {cutoff:%Y-%m-%d %H:%M} UTC")
    )
    if expired:
        _out().print(Text(", ".join(map(str, expired)), style="dim"), soft_wrap=True)


GC_LISTED_FILES = 20


@app.command("gc")
def gc_cmd(
    ctx: typer.Context,
    older_than_hours: Annotated[
        float, typer.Option("--older-than-hours", min=0, help="Only files older than this go (writes in flight are younger).")
    ] = 72.0,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would go; delete nothing.")] = False,
    json_flag: JsonFlag = False,
) -> None:
    """Delete the files no retained snapshot of any branch or tag references, in every table."""
    lake = _opts(ctx).lake()
    with _progress("Collecting garbage" + (" (dry run)" if dry_run else "")):
        report = lake.collect_garbage(older_than=_dt.timedelta(hours=older_than_hours), dry_run=dry_run)
    details = _as_dict(report)
    if _wants_json(ctx, json_flag):
        return _emit_json(details)
    files, size = details.get("files", []), details.get("bytes", 0)
    verb = "Would delete" if dry_run else "Deleted"
    out = _out()
    out.print(Text.assemble((f"{verb} {_count(len(files))} file(s)", "green"), f", {_bytes(size)}"))
    summary = {k: v for k, v in details.items() if k not in ("files", "bytes", "tables", "dry_run")}
    if summary:
        _print_report(out, summary, title=None)
    if dry_run:
        for path in files[:GC_LISTED_FILES]:
            out.print(Text(str(path), style="dim"), soft_wrap=True)
        if len(files) > GC_LISTED_FILES:
            out.print(Text(f"… and {len(files) - GC_LISTED_FILES} more (--json lists them all)", style="dim"))

columns_app = typer.Typer(
    cls=_Group, help="Feature columns: soft delete, restore, purge.", no_args_is_help=True
)
app.add_typer(columns_app, name="columns")

ColumnArg = Annotated[str, typer.Argument(help="Column name.", show_default=False)]


@columns_app.command("delete")
def columns_delete_cmd(ctx: typer.Context, table: TableArg, name: ColumnArg, json_flag: JsonFlag = False) -> None:
    """Hide a feature column (nothing is rewritten; restore brings it back)."""
    hidden = _opts(ctx).lake().table(table).soft_delete_column(name)
    if _wants_json(ctx, json_flag):
        return _emit_json({"operation": "soft_delete_column", "table": table, "column": name, "hidden_name": hidden})
    _out().print(Text.assemble((f"Deleted column {name}", "green"), f" of {table} (hidden as {hidden}; restore undoes it)"))


@columns_app.command("restore")
def columns_restore_cmd(ctx: typer.Context, table: TableArg, name: ColumnArg, json_flag: JsonFlag = False) -> None:
    """Bring a soft-deleted column back with its data and updates."""
    _opts(ctx).lake().table(table).restore_column(name)
    if _wants_json(ctx, json_flag):
        return _emit_json({"operation": "restore_column", "table": table, "column": name})
    _out().print(Text.assemble((f"Restored column {name}", "green"), f" of {table}"))


@columns_app.command("purge")
def columns_purge_cmd(
    ctx: typer.Context,
    table: TableArg,
    name: ColumnArg,
    grace_days: Annotated[
        float, typer.Option("--grace-days", min=0, help="Days it must have been soft-deleted for.")
    ] = 7.0,
    json_flag: JsonFlag = False,
) -> None:
    """Drop a soft-deleted column from the schema once the grace period is over."""
    _opts(ctx).lake().table(table).purge_column(name, grace=_dt.timedelta(days=grace_days))
    if _wants_json(ctx, json_flag):
        return _emit_json({"operation": "purge_column", "table": table, "column": name})
    _out().print(Text.assemble((f"Purged column {name}", "green"), f" of {table} (compact and gc reclaim its bytes)"))


index_app = typer.Typer(cls=_Group, help="The primary-key index: rebuild, verify.", no_args_is_help=True)
app.add_typer(index_app, name="index")


@index_app.command("rebuild")
def index_rebuild_cmd(ctx: typer.Context, table: TableArg, branch: BranchOpt = MAIN, json_flag: JsonFlag = False) -> None:
    """Rebuild a branch's key index from its data files (a metadata-only commit)."""
    t = _opts(ctx).lake().table(table)
    with _progress(f"Rebuilding the key index of {table}@{branch}"):
        report = _as_dict(t.rebuild_index(branch))
    if _wants_json(ctx, json_flag):
        return _emit_json(report)
    _print_report(_out(), {k: v for k, v in report.items() if k != "branch"}, title=f"Rebuilt the key index of {table}@{branch}")


@index_app.command("verify")
def index_verify_cmd(ctx: typer.Context, table: TableArg, branch: BranchOpt = MAIN, json_flag: JsonFlag = False) -> None:
    """Check the key index against the data; exit status 1 when it is wrong."""
    t = _opts(ctx).lake().table(table)
    with _progress(f"Verifying the key index of {table}@{branch}"):
        report = _as_dict(t.verify_index(branch))
    if _wants_json(ctx, json_flag):
        _emit_json(report)
    else:
        shown = {k: v for k, v in report.items() if k not in ("branch", "ok")}
        _print_report(_out(), shown, title=f"Key index of {table}@{branch}: " + ("ok" if report.get("ok") else "WRONG"))
    if not report.get("ok"):
        problems = ", ".join(f"{k} {report[k]}" for k in ("missing", "wrong", "duplicate_keys") if report.get(k))
        _print_error(CLIError(f"the key index of {table}@{branch} is wrong ({problems or 'see the report'}); "
                              "run 'featurelake index rebuild'"))
        raise typer.Exit(1)


# ------------------------------------------------------------ sequences
seq_app = typer.Typer(
    cls=_Group, help="Normalized user sequences: build the serving store, look up, stats.", no_args_is_help=True
)
app.add_typer(seq_app, name="seq")

_SEQ_BUILD_SHOWN = ("build_id", "snapshot_id", "incremental", "users", "events", "chunks", "new_events",
                    "affected_users", "chunk_events", "bytes", "store_bytes", "seconds", "path")


@seq_app.command("build")
def seq_build_cmd(
    ctx: typer.Context,
    table: TableArg,
    branch: BranchOpt = MAIN,
    snapshot: Annotated[Optional[int], typer.Option("--snapshot", help="Build this snapshot instead of the head.")] = None,
    full: Annotated[bool, typer.Option("--full", help="Re-encode every user (no incremental build).")] = False,
    chunk_events: Annotated[
        Optional[int], typer.Option("--chunk-events", min=1, help="Events per stored chunk (default: as before, else 128).")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Build even when a build of that snapshot exists.")] = False,
    json_flag: JsonFlag = False,
) -> None:
    """Build the sequence store for a branch head (sorted files, bulk-loaded; incremental when it can)."""
    st = _opts(ctx).lake().sequence_table(table)
    with _progress(f"Building the sequence store of {table}@{branch}"):
        info = st.build(branch=branch, snapshot_id=snapshot, incremental=not full, chunk_events=chunk_events, force=force)
    report = info.to_dict()
    if _wants_json(ctx, json_flag):
        return _emit_json(report)
    _print_report(_out(), {k: report[k] for k in _SEQ_BUILD_SHOWN}, title=f"Sequence store of {table}@{branch}")


@seq_app.command("lookup")
def seq_lookup_cmd(
    ctx: typer.Context,
    table: TableArg,
    keys: Annotated[list[str], typer.Argument(help="User keys.", show_default=False)],
    before: Annotated[
        Optional[str], typer.Option("--before", help="Only events strictly before this ISO time (or integer time).")
    ] = None,
    columns: Annotated[Optional[str], typer.Option("--columns", "-c", help="Comma-separated event columns.")] = None,
    max_len: Annotated[Optional[int], typer.Option("--max-len", "-n", min=0, help="The last N events.")] = None,
    window: Annotated[
        Optional[float], typer.Option("--window", min=0, help="Only events within this many seconds (integer times: units) before --before.")
    ] = None,
    branch: BranchOpt = MAIN,
    snapshot: Annotated[Optional[int], typer.Option("--snapshot", help="Use the build of this snapshot.")] = None,
    json_flag: JsonFlag = False,
) -> None:
    """Show users' events: before a time, projected, the last N, oldest first."""
    st = _opts(ctx).lake().sequence_table(table)
    key_type = st.schema.field(st.key).type
    time_type = st.schema.field(st.time).type
    if pa.types.is_integer(key_type):
        try:
            parsed: list[Any] = [int(k) for k in keys]
        except ValueError as e:
            raise CLIError(f"keys of {table} are integers: {e}") from e
    else:
        parsed = list(keys)
    bound: Any = None
    if before is not None:
        try:
            bound = int(before) if before.lstrip("-").isdigit() else _dt.datetime.fromisoformat(before)
        except ValueError as e:
            raise CLIError(f"--before must be an ISO time or an integer: {e}") from e
    span: Any = None
    if window is not None:
        span = _dt.timedelta(seconds=window) if pa.types.is_timestamp(time_type) else int(window)
    cols = [c.strip() for c in columns.split(",") if c.strip()] if columns else None
    out = st.lookup(parsed, before=bound, columns=cols, max_len=max_len, window=span, branch=branch, snapshot_id=snapshot)
    rows = [{"key": k, "events": events} for k, events in zip(parsed, out.to_pylist())]
    if _wants_json(ctx, json_flag):
        return _emit_json(rows)
    console = _out()
    names = list(out.type.value_type.names)
    for row in rows:
        _print_rows(console, row["events"], names, title=f"{st.key} {row['key']}: {len(row['events'])} event(s)")


@seq_app.command("stats")
def seq_stats_cmd(ctx: typer.Context, table: TableArg, branch: BranchOpt = MAIN, json_flag: JsonFlag = False) -> None:
    """Events, files and bytes of a sequence table, and its store builds."""
    stats = _opts(ctx).lake().sequence_table(table).store_stats(branch)
    if _wants_json(ctx, json_flag):
        return _emit_json(stats)
    out = _out()
    _print_report(out, {k: v for k, v in stats.items() if k not in ("table", "branch", "builds")}, title=f"{table}@{branch}")
    builds = stats["builds"]
    if builds:
        _print_rows(out, builds, list(builds[0]), title=f"Builds of {table} (oldest first)")
    else:
        out.print(Text(f"No builds yet: run 'featurelake seq build {table}'.", style="dim"))


def _print_done(what: str, snapshot_id: Any) -> None:
    _out().print(Text.assemble((what, "green"), ": snapshot ", (str(snapshot_id), "bold")), soft_wrap=True)


@contextlib.contextmanager
def _conflicts_reported(ctx: typer.Context, json_flag: bool, t: Any, payload: dict[str, Any]) -> Iterator[None]:
    """A MergeConflictError becomes the list of conflicts (file, column, reason), one red line and exit 1."""
    from featurelake.errors import MergeConflictError

    try:
        yield
    except MergeConflictError as e:
        conflicts = [{"file": f, "column": c, "reason": r} for f, c, r in e.conflicts]
        if _wants_json(ctx, json_flag):
            _emit_json({**payload, "error": str(e), "conflicts": conflicts})
        else:
            location = _table_location(t)
            view = RichTable(title=f"{len(conflicts)} conflict(s); nothing was written", title_justify="left")
            view.add_column("file", overflow="fold")
            view.add_column("column", style="bold", no_wrap=True)
            view.add_column("reason")
            for c in conflicts:
                view.add_row(_short_path(c["file"], location), c["column"], c["reason"])
            _out().print(view)
        _print_error(e)
        raise typer.Exit(1) from None


def _table_location(t: Any) -> str:
    try:
        return str(t.iceberg.location()).rstrip("/") + "/"
    except Exception:  # only used to shorten paths for display
        return ""


def _short_path(path: str, location: str) -> str:
    return path[len(location):] if location and path.startswith(location) else path


def _first_rows_reported(t: Any, limit: int, kwargs: dict[str, Any]) -> tuple[pa.Table, bool]:
    """``_first_rows``, then one warning line on stderr naming the bad files a read skipped."""
    import warnings

    with warnings.catch_warnings():  # the engine's warning per file becomes the one line below
        warnings.filterwarnings("ignore", message="skipping bad file", category=UserWarning)
        result = _first_rows(t, limit, kwargs)
    report = getattr(t, "last_read_report", None)
    skipped = list(getattr(report, "skipped_files", None) or [])
    if skipped:
        rows = getattr(report, "skipped_rows", 0)
        _err().print(
            Text.assemble(
                ("Warning: ", "bold yellow"),
                (f"skipped {len(skipped)} bad file(s) ({_count(rows)} row(s)): {', '.join(skipped)}", "yellow"),
            ),
            soft_wrap=True,
        )
    return result


# ------------------------------------------------------------------ helpers
def _out() -> Console:
    return Console(highlight=False)


def _err() -> Console:
    return Console(stderr=True, highlight=False)


def _print_error(e: BaseException) -> None:
    message = " ".join(str(e).split()) or type(e).__name__
    if len(message) > MAX_ERROR_CHARS:  # keep the tail too: parsers put the position there
        half = MAX_ERROR_CHARS // 2
        message = f"{message[:half]} … {message[-half:]}"
    label = type(e).__name__ if isinstance(e, FeatureLakeError) and type(e) is not FeatureLakeError else "error"
    _err().print(Text.assemble((f"Error ({label}): " if label != "error" else "Error: ", "bold red"), (message, "red")),
                 soft_wrap=True)


def _describe(lake: Lake) -> str:
    return str(lake.home) if lake.home is not None else getattr(lake.catalog, "name", "the configured catalog")


def _engine_method(t: Any, name: str) -> Callable[..., Any]:
    method = getattr(t, name, None)
    if not callable(method):
        raise CLIError(f"this featurelake engine has no Table.{name}() yet: '{name}' is not available")
    return method


def _accepts(fn: Callable[..., Any], name: str) -> bool:
    """Whether ``fn`` takes keyword ``name`` (directly or through ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _first_rows(t: Any, limit: int, kwargs: dict[str, Any]) -> tuple[pa.Table, bool]:
    """The first ``limit`` rows (all when 0) and whether more rows exist; streams when it can."""
    if limit == 0 or not callable(getattr(t, "batches", None)):
        data = t.read(**kwargs)
        return (data, False) if limit == 0 else (data.slice(0, limit), data.num_rows > limit)
    stream = t.batches(batch_size=max(min(limit + 1, READ_BATCH), 1), **kwargs)
    got: list[pa.RecordBatch] = []
    count = 0
    try:
        for batch in stream:
            got.append(batch)
            count += batch.num_rows
            if count > limit:
                break
    finally:
        close = getattr(stream, "close", None)
        if close:
            close()
    if not got:
        return t.read(**kwargs).slice(0, 0), False  # the empty result with its schema
    data = pa.Table.from_batches(got)
    return data.slice(0, limit), count > limit


def _parquet(path: Path) -> "Any":
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise CLIError(f"cannot read {path} as Parquet: {e}") from e


def _read_parquet(path: Path) -> pa.Table:
    pf = _parquet(path)
    try:
        return pf.read()
    except (pa.ArrowException, OSError) as e:
        raise CLIError(f"cannot read {path} as Parquet: {e}") from e


def _stream(pf: Any, path: Path, advance: Callable[[int], None]) -> Iterator[pa.RecordBatch]:
    try:
        for batch in pf.iter_batches(batch_size=65_536):
            advance(batch.num_rows)
            yield batch
    except (pa.ArrowException, OSError) as e:
        raise CLIError(f"cannot read {path} as Parquet: {e}") from e


class _Progress:
    """Progress callbacks for the engine; no-ops unless stderr is a terminal."""

    def __init__(self, bar: Any = None, task: Any = None, label: str = "") -> None:
        self.bar, self.task, self.label = bar, task, label

    @property
    def live(self) -> bool:
        return self.bar is not None

    def advance(self, n: int) -> None:
        if self.bar is not None:
            self.bar.advance(self.task, n)
            task = self.bar.tasks[0]
            if task.total and task.completed >= task.total:
                self.bar.update(self.task, description=f"{self.label}: committing")

    def update(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done, total=total or None)


@contextlib.contextmanager
def _progress(label: str, total: Optional[int] = None) -> Iterator[_Progress]:
    """A rich progress bar with a spinner on stderr, only when stderr is a terminal."""
    if not _stderr_is_terminal():
        yield _Progress()
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=_err(), transient=True) as bar:
        yield _Progress(bar, bar.add_task(label, total=total or None), label)


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _report_write(
    ctx: typer.Context, json_flag: bool, op: str, table: str, branch: str, snapshot_id: Any, rows: int, what: str
) -> None:
    if _wants_json(ctx, json_flag):
        return _emit_json({"operation": op, "table": table, "branch": branch, "rows": rows, "snapshot_id": snapshot_id})
    _print_write(what, table, branch, snapshot_id)


def _print_write(what: str, table: str, branch: str, snapshot_id: Any) -> None:
    _out().print(
        Text.assemble((what, "green"), f" to {table}@{branch}: snapshot ", (str(snapshot_id), "bold")), soft_wrap=True
    )


def _print_report(out: Console, report: dict[str, Any], title: Optional[str]) -> None:
    view = RichTable(title=title, title_justify="left", show_header=False)
    view.add_column("key", style="bold")
    view.add_column("value", justify="right")
    for key, value in report.items():
        key = str(key)
        if "bytes" in key.split("_"):
            shown = _bytes(value)
        elif key.endswith("_id") or not isinstance(value, int) or isinstance(value, bool):
            shown = _cell(value)
        else:
            shown = _count(value)
        view.add_row(key.replace("_", " "), shown)
    out.print(view)


def _as_dict(report: Any) -> dict[str, Any]:
    if isinstance(report, dict):
        return report
    if dataclasses.is_dataclass(report) and not isinstance(report, type):
        return dataclasses.asdict(report)
    for name in ("to_dict", "as_dict", "_asdict"):
        fn = getattr(report, name, None)
        if callable(fn):
            return dict(fn())
    if hasattr(report, "__dict__"):
        return {k: v for k, v in vars(report).items() if not k.startswith("_")}
    return {"result": report}


def _jsonable(v: Any) -> Any:
    """Plain JSON values: ISO timestamps, base64 bytes, NaN/inf as null, nested values recursively."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_jsonable(x) for x in v]
    if isinstance(v, (_dt.datetime, _dt.date, _dt.time)):
        return v.isoformat()
    if isinstance(v, _dt.timedelta):
        return v.total_seconds()
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, (uuid.UUID, Path)):
        return str(v)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return _jsonable(dataclasses.asdict(v))
    if hasattr(v, "item") and callable(v.item):  # numpy scalars
        try:
            return _jsonable(v.item())
        except (TypeError, ValueError):
            pass
    if hasattr(v, "tolist") and callable(v.tolist):
        return _jsonable(v.tolist())
    return str(v)


def _emit_json(value: Any) -> None:
    typer.echo(json.dumps(_jsonable(value), indent=2, ensure_ascii=False))


def _print_rows(out: Console, rows: list[dict[str, Any]], names: list[str], title: str) -> None:
    """A table when it fits the console, else one key/value block per row (like psql's \\x)."""
    cells = [[_cell(r.get(n)) for n in names] for r in rows]
    values = [max([0] + [len(str(c[i])) for c in cells]) for i in range(len(names))]
    for headers in (names, [n.replace("_", "\n") for n in names]):
        widths = [max(max(map(len, h.split("\n"))), v) for h, v in zip(headers, values)]
        if sum(widths) + 3 * len(names) + 1 <= out.width:
            view = RichTable(title=title, title_justify="left")
            for header, width, name in zip(headers, widths, names):
                numeric = bool(rows) and all(isinstance(r.get(name), (int, float)) or r.get(name) is None for r in rows)
                view.add_column(header, justify="right" if numeric else "left", no_wrap=True, min_width=width)
            for row in cells:
                view.add_row(*row)
            out.print(view)
            return
    out.print(Text(title, style="italic"))
    key_width = max(map(len, names), default=1)
    for number, r in enumerate(rows, 1):
        out.rule(f"row {number}", align="left", style="dim")
        grid = RichTable.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True, min_width=key_width)
        grid.add_column(overflow="ellipsis", no_wrap=True)
        for name in names:
            grid.add_row(name, _cell(r.get(name), MAX_WIDE_CELL_CHARS))
        out.print(grid)


def _cell(v: Any, width: int = MAX_CELL_CHARS) -> Text | str:
    if v is None:
        return Text("null", style="dim")
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, _dt.datetime):
        return v.isoformat(sep=" ")
    if isinstance(v, (list, tuple, dict)):
        s = json.dumps(_jsonable(v), separators=(",", ":"), ensure_ascii=False)
    else:
        s = str(v)
    return s if len(s) <= width else s[: width - 1] + "…"


def _count(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else ("" if v is None else str(v))


def _bytes(v: Any) -> str:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return "" if v is None else str(v)
    size = float(v)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(v)  # pragma: no cover


def main() -> None:
    """Console-script entry point."""
    app(prog_name="featurelake")


if __name__ == "__main__":
    main()
