"""The errors featurelake raises.

Every bad input is rejected with one of these before anything is written, so a
caller can catch ``FeatureLakeError`` and know the lake is unchanged.
"""
from __future__ import annotations

from typing import Any, Iterable


def _preview(values: Iterable[Any], limit: int = 5) -> str:
    values = list(values)
    shown = ", ".join(repr(v) for v in values[:limit])
    more = len(values) - limit
    return shown + (f" (and {more} more)" if more > 0 else "")


class FeatureLakeError(Exception):
    """Base class of every error featurelake raises on purpose."""


class SchemaMismatchError(FeatureLakeError):
    """Data does not fit the table's schema; ``fields`` names the offending fields."""

    def __init__(self, message: str, fields: Iterable[str] = ()) -> None:
        self.fields = list(fields)
        super().__init__(message)


class PrimaryKeyError(FeatureLakeError):
    """Common base of the primary-key errors; ``keys`` holds a few example keys."""

    def __init__(self, message: str, keys: Iterable[Any] = (), count: int | None = None) -> None:
        self.keys = list(keys)
        self.count = len(self.keys) if count is None else count
        super().__init__(message)


class NullKeyError(PrimaryKeyError):
    """A primary-key column holds nulls."""


class DuplicateKeyError(PrimaryKeyError):
    """A key appears twice in the input, or already exists in the table."""


class UnknownKeyError(PrimaryKeyError):
    """A key to update is not in the table."""


class BranchNotFoundError(FeatureLakeError):
    """The branch, tag or snapshot named does not exist."""


class TableNotFoundError(FeatureLakeError):
    """No table of that name exists in the catalog."""


class LakeNotFoundError(FeatureLakeError):
    """No lake exists at the home folder given (and the operation would not create one)."""


class TableExistsError(FeatureLakeError):
    """A table of that name already exists."""


class CatalogUnavailableError(FeatureLakeError):
    """The catalog cannot be opened or reached; the message names it without its credentials."""


class InvalidNameError(FeatureLakeError):
    """A table, branch, tag or column name is not allowed."""


class InvalidArgumentError(FeatureLakeError, ValueError):
    """An option or argument has a value the operation cannot use (e.g. ``batch_size=0``)."""


class StorageError(FeatureLakeError, OSError):
    """The warehouse refused a read or write (read-only, full disk, gone); ``path`` names the file."""

    def __init__(self, message: str, path: str | None = None) -> None:
        self.path = path
        super().__init__(message)


class MergeConflictError(FeatureLakeError):
    """Both sides of a merge changed the same data file and column, or inserted the same key.

    ``conflicts`` is a list of (data file, column, reason) triples; ``keys``
    holds example primary keys both sides inserted (empty for column conflicts).
    """

    def __init__(self, message: str, conflicts: Iterable[tuple[str, str, str]] = (), keys: Iterable[Any] = ()) -> None:
        self.conflicts = list(conflicts)
        self.keys = list(keys)
        super().__init__(message)


class CommitConflictError(FeatureLakeError):
    """A concurrent writer changed what this commit depends on."""


class SnapshotMovedError(CommitConflictError):
    """Values given in a snapshot's scan order, but the branch has moved past that snapshot.

    ``expected`` is the snapshot the values refer to, ``actual`` the branch head now.
    """

    def __init__(self, message: str, expected: int | None = None, actual: int | None = None) -> None:
        self.expected = expected
        self.actual = actual
        super().__init__(message)


class CommitStateUnknownError(FeatureLakeError):
    """The catalog could not say whether a commit landed (e.g. the connection dropped during it).

    Nothing was deleted: the commit's files stay, and garbage collection
    removes them later if the commit did not land. Re-read the table before
    retrying: ``snapshot_id`` is the snapshot the commit would have made.
    """

    def __init__(self, message: str, snapshot_id: int | None = None) -> None:
        self.snapshot_id = snapshot_id
        super().__init__(message)


class HistoryExpiredError(FeatureLakeError):
    """The operation needs a snapshot that snapshot expiry removed; nothing was changed."""


class QualityGateError(FeatureLakeError):
    """A data-quality check failed, so the change was not merged."""


class CatalogConfigError(FeatureLakeError):
    """The catalog the configuration names cannot be found or opened."""


class GarbageCollectionError(FeatureLakeError):
    """Garbage collection was asked for something unsafe (a negative grace period); nothing was deleted."""


class ClusterError(FeatureLakeError):
    """A distributed task was lost (its worker died and Ray's retries ran out); nothing was committed."""


class CorruptFileError(FeatureLakeError):
    """A data or update file is missing or unreadable; ``path`` names it."""

    def __init__(self, message: str, path: str | None = None) -> None:
        self.path = path
        super().__init__(message)


class UnsupportedFormatError(FeatureLakeError):
    """A file written by a newer featurelake in a format this one does not read: upgrade to read it."""


__all__ = [
    "FeatureLakeError",
    "UnsupportedFormatError",
    "SnapshotMovedError",
    "SchemaMismatchError",
    "PrimaryKeyError",
    "NullKeyError",
    "DuplicateKeyError",
    "UnknownKeyError",
    "BranchNotFoundError",
    "TableNotFoundError",
    "TableExistsError",
    "LakeNotFoundError",
    "InvalidNameError",
    "InvalidArgumentError",
    "StorageError",
    "CatalogUnavailableError",
    "MergeConflictError",
    "CommitConflictError",
    "CommitStateUnknownError",
    "HistoryExpiredError",
    "QualityGateError",
    "CorruptFileError",
    "ClusterError",
    "GarbageCollectionError",
    "CatalogConfigError",
]
