"""Signed S3 requests pyarrow's Python API cannot make: batched deletes, one-GET reads, one-PUT writes.

*Batched deletes*: one ``POST ?delete`` (DeleteObjects) for up to 1,000 keys.

pyarrow's ``S3FileSystem.delete_file`` costs three requests per file on an
object store (a HEAD to check the key, the DELETE, and a PUT that recreates
the parent "folder" marker), so garbage collection of N files cost 3N
requests. S3's DeleteObjects deletes up to 1,000 *explicitly named* keys in
one request; nothing is deleted by prefix, so the safety of deleting exactly
the listed garbage is unchanged.

*One-GET reads*: pyarrow opens an S3 file with a HEAD (for its size) before
any read, even where the size is known from a manifest or the platform state
(the C++ ``OpenInputFile(FileInfo)`` that skips it is not reachable from
Python for a raw file). A small file whose size is known is fetched here with
one signed GET, so its footer and columns cost one request, not two or three.

*One-PUT writes*: pyarrow's output stream uploads a file larger than one
part (5-10 MiB) as a multipart upload: CreateMultipartUpload, a PUT per part
and CompleteMultipartUpload, at least four requests where S3 takes a single
PUT of up to 5 GiB. A file already encoded in memory (a data file of up to
``storage.SINGLE_PUT_BYTES``, a large update file) is stored here with one
signed PUT whose signature covers the body's SHA-256, so the store verifies
every byte; S3 never shows a partly written object.

boto3/botocore are not dependencies, so the request is signed here with AWS
Signature Version 4 (stdlib ``hmac``/``hashlib``). Its configuration is the
one of the pyarrow filesystem the table's FileIO built (endpoint, region,
credentials, addressing style; read back from the filesystem itself), so
there is no second configuration path. Where that filesystem's credentials
are not explicit (default provider chain, an assumed role, anonymous access),
a proxy or a custom CA is configured, or the store refuses the request,
:func:`delete_objects` reports the keys as not done and the caller deletes
them one by one as before, :func:`get_object` returns None so the caller
reads through pyarrow, and :func:`put_object` returns False so the caller
writes through pyarrow. No error or log line carries a credential.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import http.client
import re
import threading
import urllib.parse
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterable
from xml.sax.saxutils import escape

import pyarrow.fs as pafs

MAX_KEYS = 1000  # S3's limit per DeleteObjects request
TIMEOUT_S = 60.0
_XML_SAFE = re.compile(r"^[^\x00-\x08\x0b\x0c\x0e-\x1f]*$")  # keys XML 1.0 can carry


@dataclass(frozen=True)
class _Endpoint:
    scheme: str
    host: str  # host[:port]
    region: str
    access_key: str
    secret_key: str = field(repr=False)  # never in a repr, a log or an error
    session_token: str = field(repr=False)
    virtual: bool = False


def _endpoint(fs: pafs.FileSystem) -> _Endpoint | None:
    """How to reach and sign for ``fs``'s store, or None when a batch cannot be signed here."""
    if not isinstance(fs, pafs.S3FileSystem):
        return None
    try:
        _, (o,) = fs.__reduce__()
    except (TypeError, ValueError):
        return None
    if o.get("anonymous") or not o.get("access_key") or not o.get("secret_key") or o.get("role_arn"):
        return None
    if (o.get("proxy_options") or {}).get("host") or o.get("tls_ca_file_path"):
        return None
    scheme = o.get("scheme") or "https"
    region = o.get("region") or fs.region or "us-east-1"
    override = o.get("endpoint_override") or ""
    if override:
        parsed = urllib.parse.urlsplit(override if "://" in override else f"{scheme}://{override}")
        scheme, host = parsed.scheme or scheme, parsed.netloc
        if parsed.path not in ("", "/"):
            return None  # an endpoint with a path prefix: leave it to pyarrow
    else:
        host = f"s3.{region}.amazonaws.com"
    if scheme not in ("http", "https") or not host:
        return None
    return _Endpoint(scheme, host, region, o["access_key"], o["secret_key"], o.get("session_token") or "",
                     bool(o.get("force_virtual_addressing")))


def _body(keys: list[str]) -> bytes:
    objects = "".join(f"<Object><Key>{escape(k)}</Key></Object>" for k in keys)
    return (f'<?xml version="1.0" encoding="UTF-8"?><Delete xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
            f"<Quiet>true</Quiet>{objects}</Delete>").encode()


def _sign(ep: _Endpoint, host: str, path: str, body: "bytes | memoryview", now: datetime, method: str = "POST",
          query: str = "delete=", extra: dict[str, str] | None = None) -> dict[str, str]:
    """Headers of a SigV4-signed request (by default ``POST path?delete`` with ``body``)."""
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    day = amz_date[:8]
    payload = hashlib.sha256(body).hexdigest()
    headers = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date, **(extra or {})}
    if method == "POST":
        headers["content-md5"] = base64.b64encode(hashlib.md5(body).digest()).decode()  # noqa: S324 - required by S3
        headers["content-type"] = "application/xml"
    if ep.session_token:
        headers["x-amz-security-token"] = ep.session_token
    signed = ";".join(sorted(headers))
    canonical = "\n".join([
        method, urllib.parse.quote(path, safe="/~"), query,
        "".join(f"{k}:{headers[k].strip()}\n" for k in sorted(headers)), signed, payload,
    ])
    scope = f"{day}/{ep.region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + ep.secret_key).encode()
    for part in (day, ep.region, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={ep.access_key}/{scope}, "
                                f"SignedHeaders={signed}, Signature={signature}")
    return headers


def _post(ep: _Endpoint, bucket: str, keys: list[str]) -> set[str]:
    """Delete ``keys`` of ``bucket`` in one request; the keys the store reported not deleted."""
    body = _body(keys)
    host, path = (f"{bucket}.{ep.host}", "/") if ep.virtual else (ep.host, f"/{bucket}")
    headers = _sign(ep, host, path, body, datetime.now(timezone.utc))
    conn_cls = http.client.HTTPSConnection if ep.scheme == "https" else http.client.HTTPConnection
    conn = conn_cls(host, timeout=TIMEOUT_S)
    try:
        conn.request("POST", urllib.parse.quote(path, safe="/~") + "?delete", body=body, headers=headers)
        response = conn.getresponse()
        text = response.read().decode("utf-8", errors="replace")
    finally:
        conn.close()
    if response.status != 200 or "<DeleteResult" not in text:
        return set(keys)
    failed = set()
    for error in re.findall(r"<Error>(.*?)</Error>", text, re.S):
        key = re.search(r"<Key>(.*?)</Key>", error, re.S)
        code = re.search(r"<Code>(.*?)</Code>", error, re.S)
        if key is not None and (code is None or code.group(1) != "NoSuchKey"):
            failed.add(_unescape(key.group(1)))
    return failed


_LOCAL = threading.local()


def _connection(ep: _Endpoint, host: str, fresh: bool = False) -> http.client.HTTPConnection:
    """A kept-alive connection to ``host`` for this thread (a TLS handshake costs as much as a request)."""
    conns = getattr(_LOCAL, "conns", None)
    if conns is None:
        conns = _LOCAL.conns = {}
    key = (ep.scheme, host)
    conn = conns.get(key)
    if conn is None or fresh:
        if conn is not None:
            conn.close()
        cls = http.client.HTTPSConnection if ep.scheme == "https" else http.client.HTTPConnection
        conn = conns[key] = cls(host, timeout=TIMEOUT_S)
    return conn


def get_object(fs: pafs.FileSystem, path: str, size: int | None, offset: int = 0) -> bytes | None:
    """The ``size`` bytes of ``path`` (``bucket/key``) from ``offset`` on, in one signed GET; None when not done here.

    ``size=None`` reads a whole object of unknown size (a plain GET, no
    Range: pyarrow would HEAD for the size first). None (the caller opens the
    file with pyarrow instead) when this filesystem cannot be signed for, the
    request fails, or the store answers anything but the bytes asked for
    (for a whole read: a body of another length than its Content-Length).
    A missing object raises FileNotFoundError.
    """
    ep = _endpoint(fs)
    bucket, _, key = path.partition("/")
    if ep is None or not bucket or not key or (size is not None and size <= 0):
        return None
    host, url_path = (f"{bucket}.{ep.host}", f"/{key}") if ep.virtual else (ep.host, f"/{bucket}/{key}")
    for attempt in range(2):  # a kept-alive connection the server closed: once more on a fresh one
        headers = _sign(ep, host, url_path, b"", datetime.now(timezone.utc), method="GET", query="",
                        extra={"range": f"bytes={offset}-{offset + size - 1}"} if size is not None else None)
        conn = _connection(ep, host, fresh=attempt > 0)
        try:
            conn.request("GET", urllib.parse.quote(url_path, safe="/~"), headers=headers)
            response = conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            continue
        if response.status == 404:
            raise FileNotFoundError(path)
        if size is None:
            expected = response.getheader("content-length")
            if response.status == 200 and expected is not None and expected.isdigit() and len(data) == int(expected):
                return data
            return None
        if response.status in (200, 206) and len(data) == size:
            return data
        return None
    return None


def put_object(fs: pafs.FileSystem, path: str, data: "bytes | memoryview") -> bool:
    """Store ``data`` as ``path`` (``bucket/key``) with one signed PUT; False when not done here.

    False (the caller writes through pyarrow instead, which may then report
    the store's error) when this filesystem cannot be signed for, the request
    fails or the store answers anything but success. The payload's SHA-256 is
    signed, so a body damaged on the way is refused by the store.
    """
    ep = _endpoint(fs)
    bucket, _, key = path.partition("/")
    if ep is None or not bucket or not key:
        return False
    body = memoryview(data).cast("B")
    host, url_path = (f"{bucket}.{ep.host}", f"/{key}") if ep.virtual else (ep.host, f"/{bucket}/{key}")
    for attempt in range(2):  # a kept-alive connection the server closed: once more on a fresh one
        headers = _sign(ep, host, url_path, body, datetime.now(timezone.utc), method="PUT", query="",
                        extra={"content-length": str(len(body))})
        conn = _connection(ep, host, fresh=attempt > 0)
        try:
            conn.request("PUT", urllib.parse.quote(url_path, safe="/~"), body=body, headers=headers)
            response = conn.getresponse()
            response.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            continue
        return response.status == 200
    return False


def _unescape(text: str) -> str:
    from xml.sax.saxutils import unescape

    return unescape(text, {"&quot;": '"', "&apos;": "'"})


def delete_objects(fs: pafs.FileSystem, paths: Iterable[str]) -> list[str]:
    """Delete ``paths`` (``bucket/key``, as ``fs`` names them) in DeleteObjects batches.

    Returns the paths it did not delete (could not sign for this filesystem,
    the store refused the request or reported the key failed, the request
    failed): the caller deletes those one by one. A key already gone counts as
    deleted. Only the named keys are ever deleted.
    """
    paths = list(paths)
    ep = _endpoint(fs)
    if ep is None:
        return paths
    left: list[str] = []
    by_bucket: dict[str, list[str]] = {}
    for p in paths:
        bucket, _, key = p.partition("/")
        if not bucket or not key or not _XML_SAFE.match(key):
            left.append(p)
        else:
            by_bucket.setdefault(bucket, []).append(key)
    for bucket, keys in by_bucket.items():
        for i in range(0, len(keys), MAX_KEYS):
            batch = keys[i:i + MAX_KEYS]
            try:
                failed = _post(ep, bucket, batch)
            except (OSError, http.client.HTTPException):
                failed = set(batch)
            left.extend(f"{bucket}/{k}" for k in batch if k in failed)
    return left


__all__ = ["MAX_KEYS", "delete_objects", "get_object", "put_object"]
