"""Optimistic commits that re-validate against what landed meanwhile.

pyiceberg retries a failed commit by replaying the snapshot producer on the
new head. That is right for a plain append but wrong for a platform commit
whose state (live update files, key checks) was computed from the old head:
the replay would silently drop the other writer's update files. So platform
commits are made as a single attempt, and on a conflict the whole operation
(validate, compute state, stage) runs again on the refreshed table.

A commit can also fail *ambiguously*: the catalog's COMMIT ran, then the
connection dropped before the acknowledgement arrived. ``commit`` then
re-reads the table and looks for what it staged: found, the commit landed and
the operation succeeds; absent, it is an ordinary failed attempt (retried);
unreadable, it raises CommitStateUnknownError and no file is deleted (garbage
collection removes them later if they turn out unreferenced).
"""
from __future__ import annotations

import logging
import random
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

from pyiceberg.exceptions import CommitFailedException, ValidationException
from pyiceberg.table import Table as IcebergTable
from pyiceberg.table import Transaction
from pyiceberg.table.update import AddSnapshotUpdate, RemoveSnapshotRefUpdate, SetSnapshotRefUpdate
from pyiceberg.table.update.snapshot import ManageSnapshots

from featurelake import manifest_cache
from featurelake.errors import CommitConflictError, CommitStateUnknownError
from featurelake.guard import delete_quietly_io, recording, track

manifest_cache.install()  # keeps a rebased commit's window short (see featurelake.manifest_cache)

log = logging.getLogger(__name__)
T = TypeVar("T")
DEFAULT_ATTEMPTS = 12
CONFIRM_AFTER_S = 0.5


def single_attempt(ice: IcebergTable) -> IcebergTable:
    """The same table, but its transactions do not replay themselves on conflict."""
    props = dict(ice.metadata.properties)
    props["commit.retry.num-retries"] = "0"
    meta = ice.metadata.model_copy(update={"properties": props})
    return IcebergTable(ice.name(), meta, ice.metadata_location, ice.io, ice.catalog)


def _is_stale_sequence(e: ValueError) -> bool:
    return "sequence number" in str(e)


def _refused_as_stale(e: BaseException) -> bool:
    """A REST catalog's refusal (HTTP 400) of a snapshot numbered from metadata another commit has
    since moved on: refused, so nothing was applied (the attempt is retried on a fresh load)."""
    return type(e).__name__ == "BadRequestError" and "sequence number" in str(e)


def is_busy(e: BaseException) -> bool:
    """An embedded SQLite catalog busy with another process's write (nothing was changed)."""
    return type(e).__name__ == "OperationalError" and "locked" in str(e)


def optimistic(
    load: Callable[[], IcebergTable], attempt: Callable[[IcebergTable], T], what: str, attempts: int = DEFAULT_ATTEMPTS, max_wait: float = 2.0
) -> T:
    """Run ``attempt`` on a freshly loaded table until its commit lands.

    ``attempt`` validates, stages and commits (with ``commit``) using the
    single-attempt table it is given. A concurrent commit, or a catalog busy
    with another process, makes it run again from a fresh load; after
    ``attempts`` tries a CommitConflictError is raised and nothing is written.
    """
    for i in range(attempts):
        try:
            return attempt(single_attempt(load()))
        except CommitFailedException as e:
            reason: Exception = e
        except ValueError as e:  # pyiceberg's stale-table error, not retried by pyiceberg itself
            if not _is_stale_sequence(e):
                raise
            reason = e
        except Exception as e:
            if not is_busy(e):
                raise
            reason = e
        wait = min(max_wait, 0.02 * 2**i) * (0.5 + random.random())
        log.info("%s: concurrent commit (%s), retrying in %.2fs", what, reason, wait)
        time.sleep(wait)
    raise CommitConflictError(f"{what}: gave up after {attempts} attempts against concurrent writers")


def commit(tx: Transaction, branch: str | None = None) -> int | None:
    """Commit ``tx`` once; return the snapshot ``branch`` points at afterwards (None without ``branch``).

    A definite failure (a concurrent commit, pyiceberg's validation or
    stale-table errors, a busy SQLite catalog) is raised as is. Any other failure may have happened after the catalog applied the
    commit, so the table is re-read: if what ``tx`` staged is there, the commit
    landed and this returns normally; if not, CommitFailedException is raised
    (the caller retries); if the catalog cannot be read, CommitStateUnknownError.
    """
    updates = list(tx._updates)  # noqa: SLF001 - what this transaction stages, to look for it afterwards
    snapshots = [u.snapshot.snapshot_id for u in updates if isinstance(u, AddSnapshotUpdate)]
    moves = {u.ref_name: u.snapshot_id for u in updates if isinstance(u, SetSnapshotRefUpdate)}
    removed = [u.ref_name for u in updates if isinstance(u, RemoveSnapshotRefUpdate)]
    table = tx._table  # noqa: SLF001
    try:
        new = tx.commit_transaction()
    except (CommitFailedException, ValidationException, ValueError):  # raised before the catalog writes
        raise
    except Exception as e:
        if is_busy(e):
            raise
        if _refused_as_stale(e):
            raise CommitFailedException(f"commit to {'.'.join(table.name())} refused: {e}") from e
        outcome = _landed(table, snapshots, moves, removed)
        if outcome is False:  # confirm after a pause: a COMMIT still finishing on the server shows up
            time.sleep(CONFIRM_AFTER_S)
            outcome = _landed(table, snapshots, moves, removed)
        what = f"commit to {'.'.join(table.name())}" + (f"@{branch}" if branch else "")
        if outcome is None:
            raise CommitStateUnknownError(
                f"{what}: the catalog failed during the commit ({type(e).__name__}: {e}) and could not be read "
                "back to tell whether it landed; its files were kept (garbage collection removes them if it did not)",
                snapshots[-1] if snapshots else None,
            ) from e
        if not outcome:
            raise CommitFailedException(f"{what} did not land ({type(e).__name__}: {e})") from e
        log.warning("%s: the catalog failed after applying the commit (%s); it landed", what, e)
        return moves.get(branch) if branch else None
    if branch is None:
        return None
    ref = new.metadata.refs.get(branch)
    return moves.get(branch, ref.snapshot_id if ref else None)


def commit_refs(ice: IcebergTable, change: Callable[[ManageSnapshots], ManageSnapshots]) -> None:
    """Commit a ref-only change (``change`` calls create_branch, create_tag, remove_tag, ...)."""
    tx = ice.transaction()
    change(ManageSnapshots(tx)).commit()
    commit(tx)


def _landed(table: IcebergTable, snapshots: list[int], moves: dict[str, int], removed: list[str], tries: int = 3) -> bool | None:
    """Whether the staged snapshots (or, for a ref-only change, the ref changes) are in the catalog; None if unreadable."""
    for i in range(tries):
        try:
            meta = table.catalog.load_table(table.name()).metadata
        except Exception:  # noqa: BLE001 - any failure to read leaves the outcome unknown
            time.sleep(0.2 * (i + 1))
            continue
        if snapshots:
            return all(meta.snapshot_by_id(s) is not None for s in snapshots)
        if moves or removed:
            moved = all(name in meta.refs and meta.refs[name].snapshot_id == sid for name, sid in moves.items())
            return moved and all(name not in meta.refs for name in removed)
        return None  # a schema or property change only: nothing to recognise it by
    return None


class CommitBase:
    """Where an operation's attempts start (a loader for :func:`optimistic`): first metadata its table
    object already holds (what its last read loaded or its own last commit returned, with no
    commit of its own since), when it has some (no catalog load), then fresh loads.

    That metadata is the branch's current state unless another writer has
    committed since; then the catalog refuses the commit (its requirements
    name the branch head and schema the attempt started from) and the next
    attempt loads afresh. An attempt on the cached metadata that fails in any
    other way, or finds nothing to commit (:meth:`confirm`), is not trusted
    either: it runs again on a fresh load (:meth:`guard`), so no error and no
    no-op ever comes from stale metadata.
    """

    def __init__(self, cached: IcebergTable | None, load: Callable[[], IcebergTable]) -> None:
        self._cached = cached
        self._load = load
        self.from_cache = False

    def __call__(self) -> IcebergTable:
        cached, self._cached = self._cached, None
        self.from_cache = cached is not None
        if cached is None:
            return self._load()
        track(cached.io)  # files written through it are this call's (featurelake.guard): a failure deletes them
        return cached

    def confirm(self, what: str) -> None:
        """Run the attempt again on a fresh load if it started from cached metadata (``what`` it found there)."""
        if self.from_cache:
            raise CommitFailedException(f"{what} on cached table metadata: confirming on a fresh load")

    def guard(self, attempt: Callable[[IcebergTable], T], landed: Callable[[], bool]) -> Callable[[IcebergTable], T]:
        """``attempt``, whose failures on cached metadata (before its commit ``landed``) are retried afresh."""

        def run(ice: IcebergTable) -> T:
            try:
                return attempt(ice)
            except (CommitFailedException, CommitStateUnknownError):
                raise
            except Exception as e:
                if self.from_cache and not landed():
                    raise CommitFailedException(f"failed on cached table metadata ({type(e).__name__}: {e}); retrying on a fresh load") from e
                raise

        return run


def committed_table(tx: Transaction, branch: str, snapshot_id: int | None) -> IcebergTable | None:
    """The table as the catalog answered ``tx``'s commit (its metadata now current), when ``branch``
    is at ``snapshot_id`` there; None after a commit confirmed by re-reading (its answer was lost)."""
    after = tx._table  # noqa: SLF001 - pyiceberg puts the catalog's answer there
    ref = after.metadata.refs.get(branch)
    return after if snapshot_id is not None and ref is not None and ref.snapshot_id == snapshot_id else None


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

    Files of a commit that landed, or whose outcome is unknown
    (CommitStateUnknownError), are never touched. Files created through tables
    loaded inside the block (partial ones too, e.g. on a full disk) are deleted
    with them (see featurelake.guard).
    """
    with recording() as session:
        try:
            yield
        except CommitStateUnknownError:
            raise
        except BaseException:
            if not landed():
                delete_quietly(ice, [*written, *session.created()])
            raise
