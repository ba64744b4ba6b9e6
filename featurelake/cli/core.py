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
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from typer.core import TyperGroup

from featurelake import __version__
from featurelake.cli.output import CLIError, _emit_error_json, _print_error
from featurelake.errors import FeatureLakeError
from featurelake.home import DEFAULT_HOME

if TYPE_CHECKING:
    from featurelake.lake import Lake

MAIN = "main"


class _Group(TyperGroup):
    """Turns expected errors into one red message (or a JSON error under --json) and exit status 1."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (FeatureLakeError, CLIError) as e:
            opts = ctx.find_object(_Options)
            if opts is not None and opts.json:
                _emit_error_json(e)
            else:
                _print_error(e)
            raise typer.Exit(1) from None


app = typer.Typer(
    cls=_Group,
    name="featurelake",
    help="featurelake: training samples and features on an Apache Iceberg lake.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,  # plain help: flags show as flags, and --help needs no rich
)


def sub_app(help: str) -> typer.Typer:
    """A command group (branch, columns, index, seq) formatted and guarded like the app."""
    return typer.Typer(cls=_Group, help=help, no_args_is_help=True, rich_markup_mode=None)


@dataclasses.dataclass
class _Options:
    home: Optional[Path]
    json: bool
    _lake: Optional["Lake"] = None

    def lake(self, create: bool = False) -> "Lake":
        """The lake the options name; only ``create`` (the create command) may make a new embedded one."""
        if self._lake is None:
            self._lake = _open_lake(self.home, create)
        return self._lake


def _open_lake(home: Optional[Path], create: bool = False) -> "Lake":
    from featurelake.lake import Lake

    try:
        if home is not None:
            return Lake(home, create=create)
        if os.environ.get("FEATURELAKE_CATALOG_URI"):
            return Lake.from_env()
        return Lake(create=create)  # FEATURELAKE_HOME, else ./.featurelake
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

def _json_requested(ctx: typer.Context, value: bool) -> bool:
    """A command's own --json also makes its errors JSON (the group reads the shared options)."""
    if value:
        _opts(ctx).json = True
    return value


# ------------------------------------------------------------------ options
JsonFlag = Annotated[
    bool, typer.Option("--json", callback=_json_requested, help="Machine output (same as the global --json).")
]
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
