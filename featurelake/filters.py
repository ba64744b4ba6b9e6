"""Row filters: pyiceberg's filter syntax, parsed with errors in words, bound to a table schema,
and relaxed where file statistics may be stale.

Pruning may only use statistics that no update file can have made stale
(invariant 4): :func:`relax_stale` turns predicates on ever-updated columns
into ``true`` before planning; the reader checks them on merged values.
"""
from __future__ import annotations

import re

from pyiceberg.expressions import AlwaysTrue, And, BooleanExpression, BoundPredicate, Not, Or
from pyiceberg.expressions.parser import parse as parse_expression
from pyiceberg.expressions.visitors import bind
from pyiceberg.schema import Schema

from featurelake.errors import InvalidArgumentError, SchemaMismatchError

FILTER_SYNTAX = (
    "a filter is conditions 'column <comparison> value' (comparisons =, !=, <, <=, >, >=, in (...), "
    "not in (...), is null, is not null, like 'prefix%'; strings in single quotes), joined by and, or, not"
)


def parse_filter(filter: str | BooleanExpression | None) -> BooleanExpression:
    """A filter string (pyiceberg's syntax) as an expression; a typo is an InvalidArgumentError in words."""
    if filter is None:
        return AlwaysTrue()
    if isinstance(filter, BooleanExpression):
        return filter
    try:
        return parse_expression(filter)
    except Exception as e:  # the parser raises pyparsing's exceptions: say it in words, with the position
        raise InvalidArgumentError(_filter_error(filter, getattr(e, "loc", 0) or 0)) from None


def _filter_error(text: str, loc: int) -> str:
    """Where a filter stops parsing, in words (positions count from 1)."""
    if not text.strip():
        return f"the filter is empty; {FILTER_SYNTAX}"
    # the parser often backtracks to the start: find the first condition that does not parse on its own
    start = 0
    for m in re.finditer(r"\s+(?:and|or)\s+|$", text, re.IGNORECASE):
        part = text[start:m.start()]
        try:
            parse_expression(part.strip())
        except Exception:  # noqa: BLE001 - pyparsing's exceptions
            first = start + len(part) - len(part.lstrip())
            if first < loc < len(text):
                return _unexpected(text, loc)
            return (
                f"cannot parse filter {text!r}: condition {part.strip()!r} at position {first + 1} is not valid; "
                + FILTER_SYNTAX
            )
        start = m.end()
    if 0 < loc < len(text):
        return _unexpected(text, loc)
    return f"cannot parse filter {text!r}; {FILTER_SYNTAX}"


def _unexpected(text: str, loc: int) -> str:
    return f"cannot parse filter {text!r}: unexpected {text[loc:].split()[0]!r} at position {loc + 1}; {FILTER_SYNTAX}"


def bind_filter(schema: Schema, filter: str | BooleanExpression | None) -> BooleanExpression:
    """The filter bound to ``schema``; a column the table lacks is a SchemaMismatchError."""
    expr = parse_filter(filter)
    try:
        return bind(schema, expr, case_sensitive=True)
    except ValueError as e:
        raise SchemaMismatchError(f"filter {filter!r} does not fit the table: {e}") from e


def relax_stale(expr: BooleanExpression, stale_ids: frozenset[int]) -> BooleanExpression:
    """Replace predicates on columns whose statistics may be stale by ``true``.

    Valid because ``expr`` has no NOT (rewritten away first): the result is
    implied by the original, so it only prunes files the original prunes.
    """
    if isinstance(expr, And):
        return And(relax_stale(expr.left, stale_ids), relax_stale(expr.right, stale_ids))
    if isinstance(expr, Or):
        return Or(relax_stale(expr.left, stale_ids), relax_stale(expr.right, stale_ids))
    if isinstance(expr, BoundPredicate):
        return AlwaysTrue() if expr.term.ref().field.field_id in stale_ids else expr
    return expr


def referenced_ids(expr: BooleanExpression) -> set[int]:
    """Field ids a bound filter reads."""
    if isinstance(expr, (And, Or)):
        return referenced_ids(expr.left) | referenced_ids(expr.right)
    if isinstance(expr, Not):
        return referenced_ids(expr.child)
    if isinstance(expr, BoundPredicate):
        return {expr.term.ref().field.field_id}
    return set()
