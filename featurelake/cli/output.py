"""What the commands print with: JSON output, error lines, progress bars, tables, numbers.

Why a module of its own: every command group formats the same way -- a rich
table or key/value report for people, ``--json`` for machines (ISO
timestamps, base64 bytes, NaN as null), one red line on stderr for an
error, a progress bar on stderr only when it is a terminal -- so the
helpers live once, here, and know nothing of the app or the lake.
"""
from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as _dt
import decimal
import json
import math
import sys
import uuid
from pathlib import Path
from typing import Any, Iterator, Optional

import typer
from rich.console import Console
from rich.table import Table as RichTable
from rich.text import Text

from featurelake.errors import FeatureLakeError

MAX_CELL_CHARS = 48
MAX_WIDE_CELL_CHARS = 160


class CLIError(Exception):
    """A bad command-line input the engine never saw (unreadable file, missing feature)."""


def _out() -> Console:
    return Console(highlight=False)


def _err() -> Console:
    return Console(stderr=True, highlight=False)


# The engine's errors name Python arguments; on the command line the same choice is an option.
_API_TO_CLI = (
    ("on_unknown='skip'", "--skip-unknown"),
    ("with_locator=True", "--with-locator"),
    ("max_bad_file_ratio", "--max-bad-file-ratio"),
    ("restore_column", "'featurelake columns restore'"),
)


def _error_message(e: BaseException) -> str:
    """The whole message on one logical line, with API argument names turned into CLI options."""
    message = " ".join(str(e).split()) or type(e).__name__
    for api, cli in _API_TO_CLI:
        message = message.replace(api, cli)
    return message


def _error_type(e: BaseException) -> str:
    return type(e).__name__ if isinstance(e, FeatureLakeError) and type(e) is not FeatureLakeError else "error"


def _print_error(e: BaseException) -> None:
    """The error in red on stderr, whole: wrapped at a terminal's width, one line when piped (logs, grep)."""
    label = _error_type(e)
    _err().print(
        Text.assemble((f"Error ({label}): " if label != "error" else "Error: ", "bold red"), (_error_message(e), "red")),
        soft_wrap=not _stderr_is_terminal(),
    )


def _emit_error_json(e: BaseException) -> None:
    """The error as JSON on stdout (``--json``): ``{"error": message, "type": class}``."""
    _emit_json({"error": _error_message(e), "type": type(e).__name__})


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


def _emit_rows_json(rows: list[dict], json_lines: bool, as_json: bool) -> bool:
    """Print ``rows`` as JSON lines or one JSON document when asked; whether they were printed."""
    if json_lines:
        import typer

        for row in rows:
            typer.echo(json.dumps(_jsonable(row), ensure_ascii=False))
        return True
    if as_json:
        _emit_json(rows)
        return True
    return False
