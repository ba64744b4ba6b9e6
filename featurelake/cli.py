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
