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
    view = RichTable(title=f"{table}@{branch}", title_justify="left", show_header=False)
    view.add_column("key", style="bold")
    view.add_column("value", justify="right")
    for key, value in stats.items():
        if key in ("table", "branch"):
            continue
        if key.endswith("bytes"):
            shown = _bytes(value)
        elif key.endswith("_id"):
            shown = _cell(value)
        else:
            shown = _count(value) if isinstance(value, int) else _cell(value)
        view.add_row(key.replace("_", " "), shown)
    _out().print(view)


@app.command("snapshots")
def snapshots_cmd(ctx: typer.Context, table: TableArg, branch: BranchOpt = MAIN, json_flag: JsonFlag = False) -> None:
    """A branch's history, newest first."""
    snaps = _opts(ctx).lake().table(table).snapshots(branch=branch)
    if _wants_json(ctx, json_flag):
        return _emit_json(snaps)
    if not snaps:
        _out().print(Text(f"{table}@{branch} has no snapshots yet.", style="dim"))
        return
    _out().print(_rows_table(snaps, title=f"Snapshots of {table}@{branch}"))


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
    data, more = _first_rows(t, limit, kwargs)
    rows = data.to_pylist()
    if json_lines:
        for row in rows:
            typer.echo(json.dumps(_jsonable(row), ensure_ascii=False))
        return
    if _wants_json(ctx, json_flag):
        return _emit_json(rows)
    where = f"{table}@{branch}" if snapshot is None else f"{table}@snapshot {snapshot}"
    out = _out()
    out.print(_rows_table(rows, title=where, names=data.schema.names))
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
    with _progress(f"Appending {file.name} to {table}@{branch}", total) as advance:
        snapshot_id = t.append(_stream(pf, file, advance), branch=branch)
    _report_write(ctx, json_flag, "append", table, branch, snapshot_id, total, f"Appended {_count(total)} row(s)")


@app.command("backfill")
def backfill_cmd(
    ctx: typer.Context, table: TableArg, file: ParquetArg, branch: BranchOpt = MAIN, json_flag: JsonFlag = False
) -> None:
    """Set columns for existing keys from a Parquet file (key or _file/_pos + columns; new columns are added)."""
    t = _opts(ctx).lake().table(table)
    backfill = _engine_method(t, "backfill")
    data = _read_parquet(file)
    with _progress(f"Backfilling {table}@{branch} from {file.name}"):
        snapshot_id = backfill(data, branch=branch)
    _report_write(
        ctx, json_flag, "backfill", table, branch, snapshot_id, data.num_rows,
        f"Backfilled {_count(data.num_rows)} row(s), column(s) {', '.join(data.schema.names)}",
    )


@app.command("compact")
def compact_cmd(ctx: typer.Context, table: TableArg, branch: BranchOpt = MAIN, json_flag: JsonFlag = False) -> None:
    """Fold update files and small files into new data files (the table becomes plain Iceberg)."""
    t = _opts(ctx).lake().table(table)
    compact = _engine_method(t, "compact")
    with _progress(f"Compacting {table}@{branch}"):
        report = _as_dict(compact(branch=branch))
    if _wants_json(ctx, json_flag):
        return _emit_json(report)
    view = RichTable(title=f"Compacted {table}@{branch}", title_justify="left", show_header=False)
    view.add_column("key", style="bold")
    view.add_column("value", justify="right")
    for key, value in report.items():
        view.add_row(str(key).replace("_", " "), _bytes(value) if str(key).endswith("bytes") else _cell(value))
    _out().print(view)


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
    if as_json and "print_report" in _parameters(run_demo):
        kwargs["print_report"] = False
    summary = run_demo(home, **kwargs)
    if as_json:
        _emit_json(summary)


# ------------------------------------------------------------------ helpers
def _out() -> Console:
    return Console(highlight=False)


def _err() -> Console:
    return Console(stderr=True, highlight=False)


def _print_error(e: BaseException) -> None:
    message = " ".join(str(e).split()) or type(e).__name__
    if len(message) > MAX_ERROR_CHARS:
        message = message[: MAX_ERROR_CHARS - 1] + "…"
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


def _parameters(fn: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return set()


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


@contextlib.contextmanager
def _progress(label: str, total: Optional[int] = None) -> Iterator[Callable[[int], None]]:
    """A spinner (or a rows bar when ``total`` is known) on stderr, only when stderr is a terminal."""
    if not _stderr_is_terminal():
        yield lambda n: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if total is None:
        with _err().status(label):
            yield lambda n: None
        return
    columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=_err(), transient=True) as bar:
        task = bar.add_task(label, total=total or None)

        def advance(n: int) -> None:
            bar.advance(task, n)
            if total and bar.tasks[0].completed >= total:
                bar.update(task, description=f"{label}: committing")

        yield advance


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
    _out().print(
        Text.assemble((what, "green"), f" to {table}@{branch}: snapshot ", (str(snapshot_id), "bold")), soft_wrap=True
    )


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


def _rows_table(rows: list[dict[str, Any]], title: str, names: Optional[list[str]] = None) -> RichTable:
    names = names if names is not None else (list(rows[0]) if rows else [])
    view = RichTable(title=title, title_justify="left")
    for name in names:
        numeric = bool(rows) and all(isinstance(r.get(name), (int, float)) or r.get(name) is None for r in rows)
        view.add_column(name, justify="right" if numeric else "left", overflow="ellipsis", no_wrap=True)
    for r in rows:
        view.add_row(*(_cell(r.get(n)) for n in names))
    return view


def _cell(v: Any) -> Text | str:
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
    return s if len(s) <= MAX_CELL_CHARS else s[: MAX_CELL_CHARS - 1] + "…"


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
