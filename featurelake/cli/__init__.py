"""The ``featurelake`` command line: a thin shell over the engine.

Every command parses its arguments, calls one engine method and formats the
result -- a rich table for people, ``--json`` for machines::

    featurelake --home ./lake tables
    featurelake --home ./lake --json stats ml.samples --branch research
    featurelake --home ./lake read ml.samples --columns sample_id,click --filter "click = 1" --limit 5
    featurelake --home ./lake append ml.samples new_rows.parquet

The lake is ``--home DIR`` when given; otherwise ``FEATURELAKE_CATALOG_URI``
(+ ``FEATURELAKE_WAREHOUSE``) when set, else the embedded lake at
``FEATURELAKE_HOME`` (default ``./.featurelake``); only ``create`` makes a new
embedded lake, every other command says when none exists there. A
:class:`FeatureLakeError` prints its whole message in red on stderr (under
``--json``: ``{"error": ..., "type": ...}`` on stdout) and exits with status 1.
Nothing heavy is imported until a command runs, so ``--help`` and
``--version`` answer at once. The CLI never imports
Dagster: only ``demo`` reaches for it, inside the command.

The package splits the commands by group; importing it registers them all
on :data:`app`:

* :mod:`~featurelake.cli.core` -- the Typer app, the global options
  (``--home``, ``--json``, ``--version``), the lake they open and the
  argument types the commands share.
* :mod:`~featurelake.cli.output` -- what every command prints with: JSON
  output, error lines, progress bars, rich tables and number formatting.
* :mod:`~featurelake.cli.tables` -- tables, create, stats, snapshots, read,
  append, backfill, compact, demo, upsert.
* :mod:`~featurelake.cli.sql` -- sql (DuckDB over the merge-on-read reader).
* :mod:`~featurelake.cli.branches` -- branch (create, list, diff, merge,
  rebase, drop), merge, rebase, tag, revert.
* :mod:`~featurelake.cli.maintenance` -- expire, gc, columns, index.
* :mod:`~featurelake.cli.seq` -- seq (build, lookup, stats).
"""
from __future__ import annotations

from featurelake.cli.core import app
from featurelake.cli.output import CLIError

# importing the command modules registers their commands on `app`, in this order (the order --help lists them)
from featurelake.cli import tables, sql, branches, maintenance, seq  # noqa: F401  isort: skip

__all__ = ["CLIError", "app", "main"]


def main() -> None:
    """Console-script entry point."""
    app(prog_name="featurelake")
