"""The ``sql`` command: DuckDB over lake tables read with their update files merged.

The one correct way to query an un-compacted table with SQL from a shell
(other engines miss the update files). Table names are ``ns.table`` (at
``--branch``) or ``"ns.table@ref"`` for a branch, tag or snapshot id; see
:mod:`featurelake.sql`.
"""
from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from featurelake.cli.core import MAIN, BranchOpt, JsonFlag, _opts, _wants_json, app
from featurelake.cli.output import _emit_rows_json, _out, _print_rows


@app.command("sql")
def sql_cmd(
    ctx: typer.Context,
    query: Annotated[str, typer.Argument(help='The query, e.g. "select click, count(*) from ml.samples group by 1".',
                                         show_default=False)],
    branch: BranchOpt = MAIN,
    json_lines: Annotated[bool, typer.Option("--jsonl", help="One JSON object per line (implies --json).")] = False,
    json_flag: JsonFlag = False,
) -> None:
    """Run SQL (DuckDB) over lake tables with update files merged: correct before compaction too.

    Name a table ns.table (at --branch), or "ns.table@REF" for a branch, tag or snapshot id,
    e.g. 'select count(*) from "ml.samples@research/ctr"'.
    """
    result = _opts(ctx).lake().sql(query, branch=branch)
    rows = result.to_pylist()
    if _emit_rows_json(rows, json_lines, _wants_json(ctx, json_flag)):
        return
    out = _out()
    _print_rows(out, rows, result.schema.names, title="Result")
    out.print(Text(f"{len(rows)} row(s)", style="dim"))
