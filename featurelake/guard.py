"""Turning raw storage and catalog failures into featurelake errors, and knowing what a call wrote.

Invariant 7 says bad input and bad storage give a clear error from
``featurelake.errors`` and leave nothing behind. Two things stand between a
raw failure and that promise:

* the error itself: a read-only warehouse or a full disk surfaces as a bare
  ``OSError`` from pyarrow, a damaged ``catalog.db`` as an SQLAlchemy error.
  :func:`storage_errors` translates them at the public API boundary into
  :class:`~featurelake.errors.StorageError` or
  :class:`~featurelake.errors.CorruptFileError`, which the CLI prints as one
  line;
* the files: a write that fails half-way (disk full while pyiceberg writes a
  manifest, or while Parquet is flushed) leaves files no code path has named
  yet. :func:`recording` collects every file created through the FileIO of
  tables loaded during the call, so the caller can delete them when its
  commit did not land. Each catalog load makes a fresh FileIO, so the files
  recorded are this call's own, also when pyiceberg writes from its thread
  pool.
"""
from __future__ import annotations

import contextvars
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from featurelake.errors import CorruptFileError, FeatureLakeError, StorageError

_SESSIONS: contextvars.ContextVar[tuple["_Recording", ...]] = contextvars.ContextVar("featurelake_recording", default=())
_CREATED_ATTR = "_featurelake_created"


class _Recording:
    """The FileIO objects adopted during one call; files they created since then are the call's."""

    def __init__(self) -> None:
        self.ios: list[tuple[Any, int]] = []

    def adopt(self, io: Any) -> None:
        if not any(existing is io for existing, _ in self.ios):
            self.ios.append((io, len(getattr(io, _CREATED_ATTR))))

    def created(self) -> list[str]:
        out: list[str] = []
        for io, start in self.ios:
            out.extend(getattr(io, _CREATED_ATTR)[start:])
        return list(dict.fromkeys(out))


def track(io: Any) -> Any:
    """Make ``io`` remember every path it creates, and let the running :func:`recording` adopt it.

    Call it only for a FileIO this call loaded itself (each catalog load makes
    a fresh one): a FileIO shared with another thread would record that
    thread's files too.
    """
    if io is None:
        return io
    if not hasattr(io, _CREATED_ATTR):
        created: list[str] = []
        lock = threading.Lock()
        original = io.new_output

        def new_output(location: str):
            out = original(location)
            create = out.create

            def recorded_create(*args: Any, **kwargs: Any):
                with lock:  # named before the bytes exist: a failed create still leaves a named file
                    created.append(location)
                return create(*args, **kwargs)

            out.create = recorded_create
            return out

        try:
            io.new_output = new_output
            setattr(io, _CREATED_ATTR, created)
        except (AttributeError, TypeError):  # a FileIO that refuses attributes: nothing recorded
            return io
    for session in _SESSIONS.get():
        session.adopt(io)
    return io


def note_created(io: Any, location: str) -> None:
    """Record ``location`` as created through ``io`` when ``io`` is tracked (for writes that bypass
    ``io.new_output``, such as the storage layer's streams)."""
    created = getattr(io, _CREATED_ATTR, None)
    if created is not None:
        created.append(location)


@contextmanager
def recording() -> Iterator[_Recording]:
    """Collect the files created through FileIOs tracked inside the block (see :func:`track`)."""
    session = _Recording()
    token = _SESSIONS.set(_SESSIONS.get() + (session,))
    try:
        yield session
    finally:
        _SESSIONS.reset(token)


def delete_quietly_io(io: Any, paths: list[str]) -> None:
    """Best-effort removal of files no commit references (garbage collection gets any left)."""
    for path in paths:
        try:
            io.delete(path)
        except Exception:  # noqa: BLE001 - unreferenced either way
            pass


def translate(e: BaseException, what: str) -> FeatureLakeError | None:
    """The featurelake error for a raw storage or catalog failure, or None to let it pass."""
    if isinstance(e, FeatureLakeError):
        return None
    if isinstance(e, OSError):
        path = getattr(e, "filename", None)
        return StorageError(f"{what}: the warehouse refused it ({e}); nothing was committed", path)
    name = type(e).__name__
    module = type(e).__module__ or ""
    if module.startswith(("sqlalchemy", "sqlite3")) and "database or disk is full" in str(e):
        return StorageError(f"{what}: the catalog database's disk is full; nothing was committed")
    if module.startswith(("sqlalchemy", "sqlite3")) and name in ("DatabaseError", "OperationalError") and (
        "not a database" in str(e) or "malformed" in str(e) or "no such table" in str(e) or "disk I/O" in str(e)
    ):
        return CorruptFileError(f"{what}: the catalog database is unreadable ({str(e).splitlines()[0]})")
    return None


@contextmanager
def storage_errors(what: str) -> Iterator[None]:
    """Re-raise raw OSErrors and catalog-database errors of the block as featurelake errors."""
    try:
        yield
    except Exception as e:
        clear = translate(e, what)
        if clear is None:
            raise
        raise clear from e


def unreadable_manifest(io: Any, snapshot: Any) -> str | None:
    """The path of the first manifest list or manifest of ``snapshot`` that cannot be read, else None."""
    try:
        manifests = snapshot.manifests(io)
    except Exception:  # noqa: BLE001 - any failure to read it means it is damaged or gone
        return snapshot.manifest_list
    for manifest in manifests:
        try:
            for _ in manifest.fetch_manifest_entry(io, discard_deleted=True):
                pass
        except Exception:  # noqa: BLE001
            return manifest.manifest_path
    return None


@contextmanager
def manifest_errors(io: Any, snapshot: Any) -> Iterator[None]:
    """Re-raise a failure to plan ``snapshot`` as CorruptFileError when one of its manifests is unreadable."""
    try:
        yield
    except FeatureLakeError:
        raise
    except Exception as e:
        bad = unreadable_manifest(io, snapshot) if snapshot is not None else None
        if bad is None:
            raise
        raise CorruptFileError(
            f"Iceberg manifest {bad} of snapshot {snapshot.snapshot_id} is missing or unreadable "
            f"({type(e).__name__}: {e})",
            bad,
        ) from e


__all__ = ["delete_quietly_io", "note_created", "track", "recording", "translate", "storage_errors", "manifest_errors", "unreadable_manifest"]
