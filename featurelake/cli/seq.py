"""Sequence commands: seq build, seq lookup, seq stats (see :mod:`featurelake.sequences`).

``build`` makes the serving store of a sequence table's branch head
(incremental when it can), ``lookup`` shows users' events strictly before a
time, ``stats`` the table's figures and its store builds.
"""
from __future__ import annotations

import datetime as _dt
from typing import Annotated, Any, Optional

import typer
from rich.text import Text

from featurelake.cli.core import MAIN, BranchOpt, JsonFlag, TableArg, _opts, _wants_json, app, sub_app
from featurelake.cli.output import CLIError, _emit_json, _out, _print_report, _print_rows, _progress


seq_app = sub_app("Normalized user sequences: build the serving store, look up, stats.")
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
    existing = {b.build_id for b in st.builds()}
    with _progress(f"Building the sequence store of {table}@{branch}"):
        info = st.build(branch=branch, snapshot_id=snapshot, incremental=not full, chunk_events=chunk_events, force=force)
    report = info.to_dict()
    reused = info.build_id in existing
    if _wants_json(ctx, json_flag):
        return _emit_json({**report, "reused": reused})
    out = _out()
    if reused:
        out.print(
            Text(
                f"Reused build {info.build_id} of snapshot {info.snapshot_id} (created {info.created_at}): "
                "nothing changed since; --force builds again.",
                style="yellow",
            )
        )
    title = f"Sequence store of {table}@{branch}" + (" (reused)" if reused else "")
    _print_report(out, {k: report[k] for k in _SEQ_BUILD_SHOWN}, title=title)


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
    import pyarrow as pa

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
    """Events, files and bytes of a sequence table, bytes per event by component, and its store builds."""
    stats = _opts(ctx).lake().sequence_table(table).store_stats(branch)
    if _wants_json(ctx, json_flag):
        return _emit_json(stats)
    out = _out()
    shown = {k: v for k, v in stats.items() if k not in ("table", "branch", "builds", "bytes", "bytes_per_event")}
    _print_report(out, shown, title=f"{table}@{branch}")
    per_event = stats["bytes_per_event"]
    _print_rows(out, [{"component": k, "bytes": v, "bytes_per_event": per_event[k]} for k, v in stats["bytes"].items()],
                ["component", "bytes", "bytes_per_event"], title="Bytes by component (branch head)")
    builds = stats["builds"]
    if builds:
        _print_rows(out, builds, list(builds[0]), title=f"Builds of {table} (oldest first)")
    else:
        out.print(Text(f"No builds yet: run 'featurelake seq build {table}'.", style="dim"))
