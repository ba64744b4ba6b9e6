"""Credentials never leave the process: redaction for every description, log line and error.

A catalog URI such as ``postgresql+psycopg2://user:PASSWORD@host/db`` or a REST catalog's
``credential`` carries a secret. featurelake reads it from the environment at run time and
shows it nowhere: descriptions of a lake (CLI, Dagster metadata) go through :func:`redact`,
and errors raised while opening a catalog go through :func:`scrub`, which also removes the
bare secret values (a driver may echo them without the URI around them).
"""
from __future__ import annotations

import re
from typing import Iterable
from urllib.parse import parse_qsl, unquote, urlsplit

MASK = "***"

# scheme://user:password@host -> the password part (user and host stay: they help debugging)
_USERINFO = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/?#@\s]*:)(?P<secret>[^@/?#\s]*)(?P<tail>@)")
# key=value pairs (URI queries, "k=v" config dumps) whose key names a secret
_SECRET_KEY = r"(?:password|passwd|pwd|secret|token|credential|access[-_]?key(?:[-_]id)?|secret[-_]access[-_]key|session[-_]token|signature)"
_PAIR = re.compile(
    rf"(?P<head>(?<![A-Za-z0-9/])[A-Za-z0-9_.\-]*{_SECRET_KEY}[A-Za-z0-9_.\-]*"
    r"(?:\s*=\s*['\"]?|['\"]?\s*:\s+['\"]?|['\"]\s*:\s*['\"]?))"  # k=v, k: v, 'k': 'v' (not user:pw@)
    r"(?P<secret>[^&\s'\",;}]+)",
    re.I,
)

SECRET_PROPERTY = re.compile(rf".*{_SECRET_KEY}.*", re.I)


def redact(text: str) -> str:
    """``text`` with the credentials of every URI and ``key=value`` secret replaced by ``***``.

    ``redact("postgresql://app:pw@db:5432/lake")`` is ``"postgresql://app:***@db:5432/lake"``;
    text without credentials comes back unchanged.
    """
    text = _USERINFO.sub(lambda m: m["head"] + MASK + m["tail"], str(text))
    return _PAIR.sub(lambda m: m["head"] + MASK, text)


def secrets_in(uri: str, properties: dict[str, str] | None = None) -> list[str]:
    """The secret values a catalog URI and its properties carry (raw and percent-decoded)."""
    found: list[str] = []
    try:
        parts = urlsplit(uri)
        if parts.password:
            found.append(parts.password)
        found.extend(v for k, v in parse_qsl(parts.query) if SECRET_PROPERTY.fullmatch(k))
    except ValueError:  # not parseable as a URI: the pattern-based pass below still applies
        pass
    found.extend(m["secret"] for m in _USERINFO.finditer(uri))
    found.extend(str(v) for k, v in (properties or {}).items() if SECRET_PROPERTY.fullmatch(k) and v)
    values = {v for s in found for v in (s, unquote(s)) if v}
    return sorted(values, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """:func:`redact` ``text`` and also replace each bare value in ``secrets``."""
    text = redact(text)
    for value in secrets:
        if value:
            text = text.replace(value, MASK)
    return text


def redact_properties(properties: dict[str, str]) -> dict[str, str]:
    """A copy of catalog/FileIO properties with secret-named values masked and URIs redacted."""
    return {k: MASK if SECRET_PROPERTY.fullmatch(k) else redact(v) for k, v in properties.items()}
