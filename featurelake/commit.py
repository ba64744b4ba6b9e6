"""Optimistic commits that re-validate against what landed meanwhile.

pyiceberg retries a failed commit by replaying the snapshot producer on the
new head. That is right for a plain append but wrong for a platform commit
whose state (live update files, key checks) was computed from the old head:
the replay would silently drop the other writer's update files. So platform
commits are made as a single attempt, and on a conflict the whole operation
(validate, compute state, stage) runs again on the refreshed table.
"""
from __future__ import annotations

import logging
import random
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

from pyiceberg.exceptions import CommitFailedException
from pyiceberg.table import Table as IcebergTable

from featurelake.errors import CommitConflictError
from featurelake.guard import delete_quietly_io, recording

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_ATTEMPTS = 12


def single_attempt(ice: IcebergTable) -> IcebergTable:
    """The same table, but its transactions do not replay themselves on conflict."""
    props = dict(ice.metadata.properties)
    props["commit.retry.num-retries"] = "0"
    meta = ice.metadata.model_copy(update={"properties": props})
    return IcebergTable(ice.name(), meta, ice.metadata_location, ice.io, ice.catalog)


def _is_stale_sequence(e: ValueError) -> bool:
    return "sequence number" in str(e)


def optimistic(load: Callable[[], IcebergTable], attempt: Callable[[IcebergTable], T], what: str, attempts: int = DEFAULT_ATTEMPTS) -> T:
    """Run ``attempt`` on a freshly loaded table until its commit lands.

    ``attempt`` validates, stages and commits using the single-attempt table it
    is given. A concurrent commit makes it run again from a fresh load; after
    ``attempts`` tries a CommitConflictError is raised and nothing is written.
    """
    for i in range(attempts):
        ice = single_attempt(load())
        try:
            return attempt(ice)
        except CommitFailedException as e:
            reason = e
        except ValueError as e:  # pyiceberg's stale-table error, not retried by pyiceberg itself
            if not _is_stale_sequence(e):
                raise
            reason = e
        except Exception as e:  # an embedded SQLite catalog busy with another process's commit
            if type(e).__name__ != "OperationalError" or "locked" not in str(e):
                raise
            reason = e
        wait = min(2.0, 0.02 * 2**i) * (0.5 + random.random())
        log.info("%s: concurrent commit (%s), retrying in %.2fs", what, reason, wait)
        time.sleep(wait)
    raise CommitConflictError(f"{what}: gave up after {attempts} attempts against concurrent writers")


def reuse_first(ice: IcebergTable, load: Callable[[], IcebergTable]) -> Callable[[], IcebergTable]:
    """A loader for :func:`optimistic` that hands out ``ice`` (just loaded by the caller) first
    and loads afresh only for a retry: commit metadata is not read twice in one operation."""
    pending = [ice]

    def first_then_load() -> IcebergTable:
        return pending.pop() if pending else load()

    return first_then_load


def delete_quietly(ice: IcebergTable, paths: Iterable[str]) -> None:
    """Best-effort removal of files no commit references (garbage collection gets any left)."""
    delete_quietly_io(ice.io, list(paths))


@contextmanager
def cleanup_on_failure(ice: IcebergTable, written: list[str], landed: Callable[[], bool]) -> Iterator[None]:
    """Delete the files in ``written`` if the block fails before its commit ``landed``.

    Files of a commit whose outcome is known to have landed are never touched.
    Files created through tables loaded inside the block (partial ones too,
    e.g. on a full disk) are deleted with them (see featurelake.guard).
    """
    with recording() as session:
        try:
            yield
        except BaseException:
            if not landed():
                delete_quietly(ice, [*written, *session.created()])
            raise
