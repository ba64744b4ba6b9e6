"""Maintenance commands: expire, gc, columns (delete, restore, purge), index (rebuild, verify).

Expiring snapshots and collecting garbage reclaim storage; soft-deleted
columns are hidden first and purged after a grace period; the primary-key
index can be rebuilt from the data files or verified against them (exit
status 1 when it is wrong).
"""
from __future__ import annotations

import datetime as _dt
from typing import Annotated, Optional

import typer
from rich.text import Text

from featurelake.cli.core import MAIN, BranchOpt, JsonFlag, TableArg, _opts, _wants_json, app, sub_app
from featurelake.durations import parse_duration
from featurelake.cli.output import CLIError, _as_dict, _bytes, _count, _emit_json, _out, _print_error, _print_report, _progress


@app.command("expire")
def expire_cmd(
    ctx: typer.Context,
    table: TableArg,
    older_than: Annotated[
        str, typer.Option("--older-than", help="Expire snapshots older than this age, e.g. 7d, 12h, 30m.", show_default=False)
    ],
    retain_last: Annotated[
        int, typer.Option("--retain-last", min=1, help="Snapshots every branch keeps whatever their age.")
    ] = 1,
    json_flag: JsonFlag = False,
) -> None:
    """Expire old snapshots (ref heads stay); gc then deletes the files only they referenced."""
    age = parse_duration(older_than, "--older-than")
    t = _opts(ctx).lake().table(table)
    cutoff = _dt.datetime.now(_dt.timezone.utc) - age
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
    older_than: Annotated[
        str, typer.Option("--older-than", help="Only files older than this age go (writes in flight are younger), e.g. 3d, 12h.")
    ] = "3d",
    older_than_hours: Annotated[
        Optional[float], typer.Option("--older-than-hours", min=0, hidden=True, help="Deprecated: --older-than 12h.")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List what would go; delete nothing.")] = False,
    json_flag: JsonFlag = False,
) -> None:
    """Delete the files no retained snapshot of any branch or tag references, in every table, and dead sequence store builds."""
    age = _dt.timedelta(hours=older_than_hours) if older_than_hours is not None else parse_duration(older_than, "--older-than")
    lake = _opts(ctx).lake()
    with _progress("Collecting garbage" + (" (dry run)" if dry_run else "")):
        report = lake.collect_garbage(older_than=age, dry_run=dry_run)
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

columns_app = sub_app("Feature columns: soft delete, restore, purge.")
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
    grace: Annotated[
        str, typer.Option("--grace", help="How long it must have been soft-deleted for, e.g. 7d, 12h.")
    ] = "7d",
    grace_days: Annotated[
        Optional[float], typer.Option("--grace-days", min=0, hidden=True, help="Deprecated: --grace 7d.")
    ] = None,
    json_flag: JsonFlag = False,
) -> None:
    """Drop a soft-deleted column from the schema once the grace period is over."""
    period = _dt.timedelta(days=grace_days) if grace_days is not None else parse_duration(grace, "--grace")
    _opts(ctx).lake().table(table).purge_column(name, grace=period)
    if _wants_json(ctx, json_flag):
        return _emit_json({"operation": "purge_column", "table": table, "column": name})
    _out().print(Text.assemble((f"Purged column {name}", "green"), f" of {table} (compact and gc reclaim its bytes)"))


index_app = sub_app("The primary-key index: rebuild, verify.")
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
