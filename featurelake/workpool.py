"""A small thread pool for two kinds of work, each worker preferring one kind, the most urgent first.

Why: the training reader has two kinds of CPU work in flight at once: decoding
ahead (needed by a later window) and permuting collected windows (needed by
the consumer next). On a machine with few cores, a thread per task kind
oversubscribes the cores; one first-in-first-out pool lets either kind starve
the other; and strict earliest-deadline-first starves the decodes (a window's
permutation is always "needed sooner" than the decodes of the windows after
it, so those start only when the consumer is already waiting on them). Here
each worker has a kind it prefers (worker ``i`` prefers kind ``i % kinds``) and
takes the other kind's work only when none of its own waits, so decoding and
permuting overlap on a two-core machine; within a kind, calls run lowest
``priority`` first (the window that needs them), ties in submission order. At
most ``threads`` calls run at once.

The interface is the part of ``concurrent.futures.ThreadPoolExecutor`` the
reader uses (``submit`` returns a ``Future``; ``shutdown``). Threads stop when
the pool is shut down or garbage-collected, and at interpreter exit.
"""
from __future__ import annotations

import heapq
import itertools
import os
import threading
import weakref
from concurrent.futures import Future
from typing import Any, Callable


class _Queues:
    """The waiting calls of one pool, a heap per kind (shared with its threads, which must not hold the pool)."""

    def __init__(self, kinds: int) -> None:
        self.heaps: list[list[tuple[float, int, Future, Callable[..., Any], tuple]]] = [[] for _ in range(kinds)]
        self.cond = threading.Condition()
        self.stopped = False

    def take(self, prefer: int) -> tuple[Future, Callable[..., Any], tuple] | None:
        """The next call for a worker preferring kind ``prefer`` (None: the pool stopped)."""
        with self.cond:
            while True:
                if self.stopped:
                    return None
                order = [prefer] + [k for k in range(len(self.heaps)) if k != prefer]
                for k in order:
                    if self.heaps[k]:
                        _, _, f, fn, args = heapq.heappop(self.heaps[k])
                        return f, fn, args
                self.cond.wait()

    def stop(self, cancel: bool) -> None:
        with self.cond:
            self.stopped = True
            if cancel:
                for heap in self.heaps:
                    for item in heap:
                        item[2].cancel()
                    heap.clear()
            self.cond.notify_all()


class PriorityPool:
    """``threads`` workers for ``kinds`` kinds of calls: each prefers its own kind, lowest ``priority`` first."""

    def __init__(self, threads: int, name: str = "featurelake-work", kinds: int = 2) -> None:
        if threads < 1 or kinds < 1:
            raise ValueError("a PriorityPool needs at least one thread and one kind")
        self._queues = _Queues(kinds)
        self._order = itertools.count()
        self._shutdown = False
        # not daemons: at exit they finish the call they run (a daemon killed inside Arrow aborts the process)
        self._threads = [threading.Thread(target=_work, args=(self._queues, i % kinds), name=f"{name}_{i}")
                         for i in range(threads)]
        for t in self._threads:
            t.start()
        # collected without shutdown (a reader dropped mid-epoch): its threads still stop; in a forked child
        # (no threads, locks maybe held at the fork) nothing is done
        self._pid = os.getpid()
        self._finalizer = weakref.finalize(self, _stop_in, self._queues, self._pid)
        _LIVE.add(self)

    def submit(self, fn: Callable[..., Any], *args: Any, priority: float = 0, kind: int = 0) -> Future:
        """Run ``fn(*args)`` (a call of kind ``kind``); its result or exception lands in the future."""
        if self._shutdown:
            raise RuntimeError("cannot submit to a pool that was shut down")
        f: Future = Future()
        q = self._queues
        with q.cond:
            heapq.heappush(q.heaps[kind % len(q.heaps)], (priority, next(self._order), f, fn, args))
            q.cond.notify()
        return f

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Stop the threads: they finish the call they run; queued calls are cancelled (``cancel_futures``) or run first."""
        self._shutdown = True
        if self._pid != os.getpid():  # a forked child's copy: its threads are not here
            return
        if not cancel_futures:
            self._drain()
        self._queues.stop(cancel=True)
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()

    def _drain(self) -> None:
        """Wait until nothing is queued (the calls already submitted run)."""
        q = self._queues
        while True:
            with q.cond:
                pending = [item[2] for heap in q.heaps for item in heap]
            if not pending:
                return
            for f in pending:
                try:
                    f.result()
                except BaseException:  # noqa: BLE001 - the submitter sees it
                    pass


_LIVE: "weakref.WeakSet[PriorityPool]" = weakref.WeakSet()


def _at_exit() -> None:
    """Before the interpreter joins its threads: drop queued work and stop every pool's threads."""
    for pool in list(_LIVE):
        pool.shutdown(wait=False, cancel_futures=True)


# A forked child has none of the parent's threads, and its copies of their locks may be held: forget them.
os.register_at_fork(after_in_child=_LIVE.clear)
# Runs before threads are joined at exit, as concurrent.futures' pools do (atexit would run after: a hang).
getattr(threading, "_register_atexit", lambda fn: None)(_at_exit)


def _stop_in(queues: _Queues, pid: int) -> None:
    if os.getpid() == pid:
        queues.stop(cancel=True)


def _work(queues: _Queues, prefer: int) -> None:
    while True:
        item = queues.take(prefer)
        if item is None:
            return
        f, fn, args = item
        if not f.set_running_or_notify_cancel():
            continue
        try:
            f.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the waiter
            f.set_exception(e)
