"""A small thread pool that runs the most urgent work first.

Why: the training reader has two kinds of CPU work in flight at once, decoding
ahead (needed by a later window) and permuting collected windows (needed by
the consumer next). On a machine with few cores, running both on their own
threads oversubscribes the cores: the permutation the consumer waits for gets
a third of a core while decodes for windows far ahead run. Here every call
carries a priority (the window that needs it; lower runs first, ties in
submission order) and at most ``threads`` calls run at once, so the cores go
to the work needed soonest and no more heavy threads run than there are cores.

The interface is the part of ``concurrent.futures.ThreadPoolExecutor`` the
reader uses (``submit`` returns a ``Future``; ``shutdown``). Threads stop when
the pool is shut down or garbage-collected.
"""
from __future__ import annotations

import itertools
import os
import queue
import threading
import weakref
from concurrent.futures import Future
from typing import Any, Callable

_STOP = float("inf")  # the priority of the sentinels that stop the threads: after all real work


class PriorityPool:
    """``threads`` worker threads running submitted calls lowest ``priority`` first."""

    def __init__(self, threads: int, name: str = "featurelake-work") -> None:
        if threads < 1:
            raise ValueError("a PriorityPool needs at least one thread")
        self._queue: queue.PriorityQueue = queue.PriorityQueue()
        self._order = itertools.count()
        self._shutdown = False
        # not daemons: at exit they finish the call they run (a daemon killed inside Arrow aborts the process)
        self._threads = [threading.Thread(target=_work, args=(self._queue,), name=f"{name}_{i}") for i in range(threads)]
        for t in self._threads:
            t.start()
        # collected without shutdown (a reader dropped mid-epoch): its threads still stop
        self._finalizer = weakref.finalize(self, _stop, self._queue, threads)
        _LIVE.add(self)

    def submit(self, fn: Callable[..., Any], *args: Any, priority: float = 0) -> Future:
        """Run ``fn(*args)`` when no more urgent call is waiting; its result or exception lands in the future."""
        if self._shutdown:
            raise RuntimeError("cannot submit to a pool that was shut down")
        f: Future = Future()
        self._queue.put((priority, next(self._order), f, fn, args))
        return f

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Stop the threads after the calls queued (``cancel_futures``: drop those not started)."""
        self._shutdown = True
        if cancel_futures:
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item[2] is not None:
                    item[2].cancel()
        self._finalizer()
        if wait:
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join()


_LIVE: "weakref.WeakSet[PriorityPool]" = weakref.WeakSet()


def _at_exit() -> None:
    """Before the interpreter joins its threads: drop queued work and stop every pool's threads."""
    for pool in list(_LIVE):
        pool.shutdown(wait=False, cancel_futures=True)


# A forked child has none of the parent's threads, and its copies of their queues may be locked: forget them.
os.register_at_fork(after_in_child=_LIVE.clear)
# Runs before threads are joined at exit, as concurrent.futures' pools do (atexit would run after: a hang).
getattr(threading, "_register_atexit", lambda fn: None)(_at_exit)


def _stop(q: queue.PriorityQueue, threads: int) -> None:
    for _ in range(threads):
        q.put((_STOP, 0, None, None, ()))


def _work(q: queue.PriorityQueue) -> None:
    while True:
        _, _, f, fn, args = q.get()
        if f is None:
            return
        if not f.set_running_or_notify_cancel():
            continue
        try:
            f.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - handed to the waiter
            f.set_exception(e)
