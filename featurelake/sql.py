"""SQL over merged tables: DuckDB reading featurelake's merge-on-read scans.

Why: other engines read a featurelake table through its Iceberg metadata and
miss the update files, so before ``compact`` they see backfilled and upserted
columns with their old values (invariant 8 holds only after compaction). Here
DuckDB runs the query, but every lake table it names is fed by featurelake's
own reader (update files merged, snapshot-consistent), as an Arrow record-batch
stream: no DuckDB extension, no copy of the table.

Table names in a query:

* ``ns.table`` -- the table at the default ref (``branch=`` of :func:`sql`);
* ``"ns.table@ref"`` or ``ns."table@ref"`` -- at a branch, tag or snapshot id
  (quoted, since ``@`` and ``/`` are not identifier characters), e.g.
  ``select count(*) from "ml.samples@research/ctr"``.

Pushdown: the query is parsed with DuckDB's own parser (``json_serialize_sql``).
Only the columns the query mentions are read (projection pushdown; ``*``
reads all). For a single-table ``SELECT ... FROM t WHERE ...`` the conjuncts
of the WHERE clause that translate exactly (``col <op> integer|string``,
``col IN (...)``, ``IS [NOT] NULL``) are pushed into the scan as a featurelake
filter, so files are pruned and rows dropped before they reach DuckDB;
DuckDB still applies the whole WHERE clause, so pushing a part is always safe.
A table referenced more than once (a self-join, or any query with CTEs) is read
once into memory, since a stream can be consumed only once.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa
from pyiceberg.expressions import (
    And,
    BooleanExpression,
    EqualTo,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    IsNull,
    LessThan,
    LessThanOrEqual,
    NotEqualTo,
    NotNull,
)
from pyiceberg.expressions.visitors import bind
from pyiceberg.types import IntegerType, LongType, StringType

from featurelake import refs
from featurelake.errors import InvalidArgumentError, InvalidNameError, TableNotFoundError

if TYPE_CHECKING:
    from featurelake.lake import Lake
    from featurelake.table import Table

REF_SEPARATOR = "@"

_COMPARISONS = {
    "COMPARE_EQUAL": (EqualTo, EqualTo),
    "COMPARE_NOTEQUAL": (NotEqualTo, NotEqualTo),
    "COMPARE_LESSTHAN": (LessThan, GreaterThan),
    "COMPARE_GREATERTHAN": (GreaterThan, LessThan),
    "COMPARE_LESSTHANOREQUALTO": (LessThanOrEqual, GreaterThanOrEqual),
    "COMPARE_GREATERTHANOREQUALTO": (GreaterThanOrEqual, LessThanOrEqual),
}  # node type -> (expression for `col op lit`, expression for `lit op col`)


@dataclass
class TableScan:
    """How one table reference of a query is read: which table, ref, columns and pushed filter."""

    sql_schema: str  # the reference as written: schema part ('' when none) and table part
    sql_name: str
    table: str
    ref: str
    columns: list[str] | None  # None: every column
    filter: BooleanExpression | None
    references: int  # how often the query names it (more than once: materialized)

    @property
    def streamed(self) -> bool:
        return self.references == 1


def sql(lake: "Lake", query: str, branch: str = refs.MAIN) -> pa.Table:
    """Run a DuckDB query over lake tables read with update files merged; returns an Arrow table."""
    duckdb = _duckdb()
    scans = plan(lake, query, branch)
    con = duckdb.connect()
    try:
        for i, scan in enumerate(scans):
            _register(con, i, scan, lake.table(scan.table))
        try:
            result = con.sql(query)
            if result is None:  # a statement without a result
                return pa.table({})
            to_arrow = getattr(result, "to_arrow_table", None) or result.arrow
            return to_arrow()
        except duckdb.Error as e:
            raise InvalidArgumentError(f"SQL error: {e}") from e
    finally:
        con.close()


def plan(lake: "Lake", query: str, branch: str = refs.MAIN) -> list[TableScan]:
    """The scans :func:`sql` would run for ``query``: tables, refs, projected columns, pushed filters."""
    if not isinstance(query, str) or not query.strip():
        raise InvalidArgumentError("the SQL query is empty")
    statements = _parse(query)
    nodes = list(_walk(statements))
    # `*` and NATURAL joins use columns the query does not name: read them all
    star = any(n.get("class") == "STAR" or n.get("ref_type") == "NATURAL" for n in nodes)
    mentioned = {name.lower() for n in nodes if n.get("class") == "COLUMN_REF" for name in n["column_names"][-1:]}
    mentioned |= {name.lower() for n in nodes for name in n.get("using_columns") or ()}  # join ... using (c)
    counts: dict[tuple[str, str], int] = {}
    for n in nodes:
        if n.get("type") == "BASE_TABLE":
            key = (n.get("schema_name") or "", n["table_name"])
            counts[key] = counts.get(key, 0) + 1
    simple = _single_table_where(statements)
    has_cte = any(n.get("cte_map", {}).get("map") for n in nodes if isinstance(n.get("cte_map"), dict))
    scans = []
    for (schema_part, table_part), count in counts.items():
        full = f"{schema_part}.{table_part}" if schema_part else table_part
        name, _, ref = full.partition(REF_SEPARATOR)
        try:
            t = lake.table(name)
        except (TableNotFoundError, InvalidNameError):
            continue  # a CTE, a DuckDB table function or a typo: DuckDB reports it
        schema = t.iceberg.schema()
        by_lower = {f.name.lower(): f.name for f in schema.fields}
        columns = None if star else [by_lower[c] for c in by_lower if c in mentioned]
        if columns == []:  # count(*) and the like: the key column carries the row count
            columns = t.primary_key[:1]
        pushed = None
        if simple is not None and simple[0] == (schema_part, table_part) and count == 1:
            pushed = _pushable(simple[1], schema, by_lower)
        scans.append(
            TableScan(schema_part, table_part, name, ref or branch, columns, pushed, count if not has_cte else max(count, 2))
        )
    return scans


# ------------------------------------------------------------------ parsing
def _duckdb():
    try:
        import duckdb
    except ImportError as e:  # pragma: no cover - a declared dependency
        raise InvalidArgumentError("SQL needs DuckDB: pip install duckdb") from e
    return duckdb


def _parse(query: str) -> list[dict]:
    duckdb = _duckdb()
    raw = duckdb.execute("select json_serialize_sql(?::VARCHAR)", [query]).fetchone()[0]
    tree = json.loads(raw)
    if tree.get("error"):
        raise InvalidArgumentError(f"SQL error: {tree.get('error_message', 'cannot parse the query')}")
    return tree["statements"]


def _walk(node: Any) -> Iterator[dict]:
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def _single_table_where(statements: list[dict]) -> tuple[tuple[str, str], dict] | None:
    """((schema, table), where clause) of a one-statement ``SELECT ... FROM table WHERE ...``."""
    if len(statements) != 1:
        return None
    node = statements[0].get("node", {})
    source = node.get("from_table") or {}
    if node.get("type") != "SELECT_NODE" or source.get("type") != "BASE_TABLE" or not node.get("where_clause"):
        return None
    return (source.get("schema_name") or "", source["table_name"]), node["where_clause"]


def _conjuncts(expr: dict) -> Iterator[dict]:
    if expr.get("type") == "CONJUNCTION_AND":
        for child in expr["children"]:
            yield from _conjuncts(child)
    else:
        yield expr


def _pushable(where: dict, schema, by_lower: dict[str, str]) -> BooleanExpression | None:
    """The AND of the WHERE conjuncts that translate exactly into a featurelake filter."""
    parts = []
    for c in _conjuncts(where):
        expr = _translate(c, schema, by_lower)
        if expr is None:
            continue
        try:
            bind(schema, expr, case_sensitive=True)
        except Exception:  # noqa: BLE001 - a literal pyiceberg cannot convert: leave it to DuckDB
            continue
        parts.append(expr)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else And(*parts)


def _translate(node: dict, schema, by_lower: dict[str, str]) -> BooleanExpression | None:
    kind = node.get("type")
    if kind in _COMPARISONS:
        forward, backward = _COMPARISONS[kind]
        left, right = node.get("left", {}), node.get("right", {})
        if left.get("class") == "COLUMN_REF" and right.get("class") == "CONSTANT":
            column, literal, make = left, right, forward
        elif right.get("class") == "COLUMN_REF" and left.get("class") == "CONSTANT":
            column, literal, make = right, left, backward
        else:
            return None
        name = _column(column, by_lower)
        value = _literal(literal, schema, name)
        return None if name is None or value is None else make(name, value)
    if kind in ("OPERATOR_IS_NULL", "OPERATOR_IS_NOT_NULL"):
        name = _column(node["children"][0], by_lower)
        if name is None:
            return None
        return IsNull(name) if kind == "OPERATOR_IS_NULL" else NotNull(name)
    if kind == "COMPARE_IN":
        children = node.get("children", [])
        name = _column(children[0], by_lower) if children else None
        values = [_literal(c, schema, name) if c.get("class") == "CONSTANT" else None for c in children[1:]]
        if name is None or not values or any(v is None for v in values):
            return None
        return In(name, values)
    return None


def _column(node: dict, by_lower: dict[str, str]) -> str | None:
    if node.get("class") != "COLUMN_REF":
        return None
    return by_lower.get(node["column_names"][-1].lower())


def _literal(node: dict, schema, column: str | None) -> Any:
    """The constant as a Python value, only where the column's type compares exactly like DuckDB's."""
    if column is None:
        return None
    kind, text = _constant(node)
    field_type = schema.find_field(column).field_type
    if kind in ("INTEGER", "BIGINT", "HUGEINT", "SMALLINT", "TINYINT") and isinstance(field_type, (IntegerType, LongType)):
        return int(text)
    if kind in ("STRING", "VARCHAR") and isinstance(field_type, StringType):
        return str(text)
    return None


def _constant(node: dict) -> tuple[str | None, Any]:
    literal = node.get("literal")
    if isinstance(literal, dict):  # DuckDB 2.x
        return literal.get("kind"), literal.get("text")
    value = node.get("value")
    if isinstance(value, dict) and not value.get("is_null"):  # DuckDB 1.x
        return (value.get("type") or {}).get("id"), value.get("value")
    return None, None


# ------------------------------------------------------------------ running
def _register(con, i: int, scan: TableScan, t: "Table") -> None:
    """Make the reference resolve to featurelake's merged scan (a stream, or a table when read twice)."""
    s = t.scan(scan.columns, scan.filter, branch=scan.ref)
    data = pa.RecordBatchReader.from_batches(s.output_schema, s.to_batches()) if scan.streamed else s.to_table()
    if not scan.sql_schema:
        con.register(scan.sql_name, data)
        return
    source = f"__featurelake_{i}"
    con.register(source, data)
    con.execute(f"create schema if not exists {_quote(scan.sql_schema)}")
    con.execute(f"create view {_quote(scan.sql_schema)}.{_quote(scan.sql_name)} as select * from {_quote(source)}")


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'
