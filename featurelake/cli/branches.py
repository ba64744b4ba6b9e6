"""Branch and history commands: branch (create, list, diff, merge, rebase, drop), merge, rebase, tag, revert.

Branches and tags are zero-copy; ``merge`` and ``rebase`` are registered both
under ``branch`` and at the top level. On a merge conflict nothing is
written: :func:`_conflicts_reported` lists the conflicting files and columns
(JSON: under ``conflicts``) and exits with status 1.
"""
from __future__ import annotations

import contextlib
from typing import Annotated, Any, Iterator

import typer
from rich.table import Table as RichTable
from rich.text import Text

from featurelake.cli.core import MAIN, BranchOpt, JsonFlag, TableArg, _opts, _wants_json, app, sub_app
from featurelake.cli.output import _bytes, _count, _emit_json, _out, _print_error, _print_report, _print_write, _progress


branch_app = sub_app("Zero-copy branches: create, list, diff, merge, rebase, drop.")
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
    before = t.branches().get(into)
    with _conflicts_reported(ctx, json_flag, t, payload):
        with _progress(f"Merging {name} into {table}@{into}"):
            snapshot_id = t.merge(name, into)
    up_to_date = snapshot_id == before  # no new commit: `into` already holds every change of `name`
    if _wants_json(ctx, json_flag):
        return _emit_json({**payload, "snapshot_id": snapshot_id, "up_to_date": up_to_date})
    if up_to_date:
        _out().print(Text(f"Already up to date: {table}@{into} already contains {name} (snapshot {snapshot_id})."))
        return
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
            _emit_json({**payload, "error": str(e), "type": type(e).__name__, "conflicts": conflicts})
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
