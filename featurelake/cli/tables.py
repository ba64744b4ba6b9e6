"""Table commands: tables, stats, snapshots, read, append, backfill, compact, demo, upsert.

Each parses its arguments, calls one engine method on a table and prints the
result (see :mod:`featurelake.cli.output`). Writes read their input from a
Parquet file (streamed for ``append``); ``read`` streams only the first rows
it shows. Commands whose engine method may be missing or may not take a
keyword (``backfill``, ``compact``, ``upsert``, ``demo``) probe for it and
fail with a clean error. ``demo`` is the only command that reaches for
Dagster, inside the function, so importing the CLI never imports it.
"""
from __future__ import annotations

import inspect
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Iterator, Optional

import typer
from rich.table import Table as RichTable
from rich.text import Text

from featurelake.cli.core import MAIN, BranchOpt, JsonFlag, ParquetArg, TableArg, _opts, _wants_json, app
from featurelake.cli.output import (
    CLIError,
    _as_dict,
    _bytes,
    _count,
    _emit_json,
    _emit_rows_json,
    _err,
    _jsonable,
    _out,
    _print_report,
    _print_rows,
    _print_write,
    _progress,
)
from featurelake.home import DEFAULT_HOME

if TYPE_CHECKING:  # pyarrow and the engine load inside the commands: --help and --version stay fast
    import pyarrow as pa

    from featurelake.lake import Lake


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


SchemaFileOpt = Annotated[
    Path,
    typer.Option(
        "--schema",
        "--like",
        help="A Parquet or Arrow IPC (.arrow, .feather) file whose columns and types the table takes; "
        "only its schema is read.",
        exists=True,
        dir_okay=False,
        readable=True,
        resolve_path=True,
        show_default=False,
    ),
]


@app.command("create")
def create_cmd(
    ctx: typer.Context,
    table: TableArg,
    schema_file: SchemaFileOpt,
    key: Annotated[str, typer.Option("--key", "-k", help="Primary-key column(s), comma-separated.", show_default=False)],
    partition: Annotated[
        Optional[list[str]],
        typer.Option("--partition", "-p", help="A partition transform, e.g. 'day(ts)' or 'bucket(16, user_id)'; repeat for more."),
    ] = None,
    sort_by: Annotated[
        Optional[str], typer.Option("--sort-by", help="Comma-separated sort columns ('-' before a name: descending).")
    ] = None,
    json_flag: JsonFlag = False,
) -> None:
    """Create a table with the schema of a data file (the lake is created too when it does not exist)."""
    schema = _schema_of(schema_file)
    keys = [k.strip() for k in key.split(",") if k.strip()]
    sort = [c.strip() for c in sort_by.split(",") if c.strip()] if sort_by else []
    lake = _opts(ctx).lake(create=True)
    lake.create_table(table, schema, primary_key=keys, partition_by=list(partition or []), sort_by=sort)
    if _wants_json(ctx, json_flag):
        return _emit_json(
            {"operation": "create", "table": table, "columns": schema.names, "primary_key": keys,
             "partition_by": list(partition or []), "sort_by": sort}
        )
    _out().print(
        Text.assemble((f"Created table {table}", "green"), f" with {len(schema)} column(s), key {', '.join(keys)}"),
    )


def _schema_of(path: Path) -> pa.Schema:
    """The Arrow schema of a Parquet or Arrow IPC file (reads the footer or header only)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        if path.suffix.lower() in (".arrow", ".feather", ".ipc"):
            with pa.memory_map(str(path)) as source:
                return pa.ipc.open_file(source).schema.remove_metadata()
        return pq.read_schema(path).remove_metadata()
    except (pa.ArrowException, OSError) as e:
        raise CLIError(f"cannot read a schema from {path} (a Parquet or Arrow IPC file): {e}") from e


@app.command("stats")
def stats_cmd(ctx: typer.Context, table: TableArg, branch: BranchOpt = MAIN, json_flag: JsonFlag = False) -> None:
    """Rows, files and bytes of one table's branch head, and what other engines see of it.

    "final for external readers" is yes when no update file is pending: then any Iceberg
    reader (DuckDB, Spark, plain pyiceberg) given the metadata location reads the same values
    as featurelake; otherwise run compact first, or query with 'featurelake sql'.
    """
    stats = _opts(ctx).lake().table(table).stats(branch=branch)
    if _wants_json(ctx, json_flag):
        return _emit_json(stats)
    out = _out()
    shown = {k: v for k, v in stats.items() if k not in ("table", "branch", "metadata_location", "final_for_external_readers")}
    _print_report(out, shown, title=f"{table}@{branch}")
    final = stats.get("final_for_external_readers")
    out.print(Text.assemble(("metadata location: ", "bold"), str(stats.get("metadata_location"))))
    out.print(
        Text.assemble(
            ("final for external readers: ", "bold"),
            ("yes", "green") if final else
            (f"no: {_count(stats.get('update_files'))} update file(s) pending; other engines read stale values "
             "until 'featurelake compact' (featurelake read/sql see them)", "yellow"),
        )
    )


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
    if _emit_rows_json(rows, json_lines, _wants_json(ctx, json_flag)):
        return
    where = f"{table}@{branch}" if snapshot is None else f"{table}@snapshot {snapshot}"
    out = _out()
    _print_rows(out, rows, data.schema.names, title=where)
    note = f"{len(rows)} row(s)" + ("; more match (use --limit N, 0 for all)" if more else "")
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


def _describe(lake: Lake) -> str:
    return str(lake.home) if lake.home is not None else lake.describe()


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
    stream = t.batches(**kwargs)  # the engine's batch size: a small limit must not make every read tiny
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
    import pyarrow as pa

    data = pa.Table.from_batches(got)
    return data.slice(0, limit), count > limit


def _parquet(path: Path) -> "Any":
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise CLIError(f"cannot read {path} as Parquet: {e}") from e


def _read_parquet(path: Path) -> pa.Table:
    import pyarrow as pa

    pf = _parquet(path)
    try:
        return pf.read()
    except (pa.ArrowException, OSError) as e:
        raise CLIError(f"cannot read {path} as Parquet: {e}") from e


def _stream(pf: Any, path: Path, advance: Callable[[int], None]) -> Iterator[pa.RecordBatch]:
    import pyarrow as pa

    try:
        for batch in pf.iter_batches(batch_size=65_536):
            advance(batch.num_rows)
            yield batch
    except (pa.ArrowException, OSError) as e:
        raise CLIError(f"cannot read {path} as Parquet: {e}") from e


def _report_write(
    ctx: typer.Context, json_flag: bool, op: str, table: str, branch: str, snapshot_id: Any, rows: int, what: str
) -> None:
    if _wants_json(ctx, json_flag):
        return _emit_json({"operation": op, "table": table, "branch": branch, "rows": rows, "snapshot_id": snapshot_id})
    _print_write(what, table, branch, snapshot_id)
