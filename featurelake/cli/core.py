"""The ``featurelake`` Typer app: global options, the lake they open, shared argument types.

Why a module of its own: every command module registers on :data:`app` and
reads the global options (``--home``, ``--json``) through :func:`_opts` and
:func:`_wants_json`; keeping them here, apart from the commands and the
output helpers, lets each command group import them without importing the
others. :class:`_Group` turns a :class:`FeatureLakeError` or
:class:`~featurelake.cli.output.CLIError` into one red line and exit status 1,
for the app and every sub-command group.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from typer.core import TyperGroup

from featurelake import __version__
from featurelake.cli.output import CLIError, _print_error
from featurelake.errors import FeatureLakeError
from featurelake.lake import DEFAULT_HOME, Lake

MAIN = "main"


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
