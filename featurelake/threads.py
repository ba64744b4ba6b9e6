"""One process-wide pool of writer threads, started once and reused by every write.

Writes encode and upload several files at once (Parquet encoding and I/O
release the GIL). A ``ThreadPoolExecutor`` per call starts its threads on every
commit; on a busy machine each start waits for the new thread to be
scheduled, which measured 15-20 ms of a 40 ms column write. The pool here is
started on first use and kept.

:func:`run_all` waits for *every* task before it returns or raises, so a
caller that deletes its files after a failure never races a write still in
flight. A task that itself calls :func:`run_all` runs its items inline (a
worker waiting on its own pool could deadlock), and a forked child starts a
fresh pool (the parent's threads do not exist there).
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Callable, Iterator, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")
MAX_THREADS = 8  # enough for object-store latency; CPU-bound encoding is capped by the caller's ``threads``

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()
_local = threading.local()


def _get_pool() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=MAX_THREADS, thread_name_prefix="featurelake-write",
                                       initializer=_mark_worker)
        return _pool


def _mark_worker() -> None:
    _local.worker = True


def _forget_pool() -> None:  # in a forked child: the parent's threads are not here
    global _pool, _lock
    _pool = None
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def run_all(fn: Callable[[T], R], items: Sequence[T], threads: int = MAX_THREADS) -> list[R]:
    """``[fn(x) for x in items]``, up to ``threads`` at once; results in order.

    Every call has finished before this returns or raises; if any raised,
    one of their exceptions is raised.
    """
    items = list(items)
    if len(items) <= 1 or threads <= 1:
        return [fn(x) for x in items]
    return start_all(fn, items, threads).wait()


class Pending:
    """Tasks started by :func:`start_all`; :meth:`wait` must be called before their results are relied on."""

    def __init__(self, futures: list, results: list) -> None:
        self._futures = futures
        self._results = results

    def wait(self, raise_errors: bool = True) -> list:
        """Wait for every task; raise one of their exceptions (unless ``raise_errors`` is False), else their results."""
        wait(self._futures)
        if raise_errors:
            for f in self._futures:
                if f.exception() is not None:
                    raise f.exception()  # type: ignore[misc]
        return self._results


def wait_all(pending: "Sequence[Pending]", raise_errors: bool = True) -> None:
    """Wait for every task of every handle, then raise one of their exceptions (unless ``raise_errors`` is False).

    Unlike waiting on each in turn, no upload is still running when this raises.
    """
    for p in pending:
        p.wait(raise_errors=False)
    if raise_errors:
        for p in pending:
            p.wait()


@contextmanager
def staged_uploads() -> Iterator[list[Pending]]:
    """A list for the handles of uploads (update files, the state) left running while a snapshot is staged.

    When the block ends every upload has ended: normally their errors are
    raised; on a failure in the block the uploads are waited for first, so
    the caller's cleanup never deletes a file an upload is still writing.
    """
    pending: list[Pending] = []
    try:
        yield pending
    except BaseException:
        wait_all(pending, raise_errors=False)
        raise
    wait_all(pending)  # every file is stored before a commit can name it


def start_all(fn: Callable[[T], R], items: Sequence[T], threads: int = MAX_THREADS) -> Pending:
    """Start ``[fn(x) for x in items]`` in the pool, up to ``threads`` at once, and return at once.

    The caller overlaps other work with the tasks and must call
    ``Pending.wait()`` (also on its own failure path, with
    ``raise_errors=False``) before it relies on, or deletes, what they
    write. Inside a pool worker the items run inline, before this returns.
    """
    items = list(items)
    results: list = [None] * len(items)
    if not items or getattr(_local, "worker", False):
        for i, x in enumerate(items):
            results[i] = fn(x)
        return Pending([], results)
    threads = max(1, min(threads, MAX_THREADS, len(items)))
    lock, it = threading.Lock(), iter(enumerate(items))

    def drain() -> None:
        while True:
            with lock:
                nxt = next(it, None)
            if nxt is None:
                return
            results[nxt[0]] = fn(nxt[1])

    return Pending([_get_pool().submit(drain) for _ in range(threads)], results)
