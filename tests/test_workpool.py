"""The priority thread pool of the training reader: order, results, errors, cancellation and shutdown."""
from __future__ import annotations

import threading
import time

import pytest

from featurelake.workpool import PriorityPool


def test_runs_the_most_urgent_first_ties_in_submission_order():
    pool = PriorityPool(1, name="test-work")
    gate = threading.Event()
    ran: list[tuple[float, int]] = []
    blocker = pool.submit(gate.wait)  # holds the only thread while the rest queue up
    items = [(5, 0), (1, 1), (3, 2), (1, 3), (0, 4), (5, 5)]
    futures = [pool.submit(ran.append, item, priority=item[0]) for item in items]
    gate.set()
    for f in futures:
        f.result(timeout=5)
    assert blocker.result() is True
    assert ran == sorted(items, key=lambda it: (it[0], it[1]))  # the oracle: a stable sort by priority
    pool.shutdown()


def test_a_worker_takes_its_own_kind_first_then_the_other():
    """One worker preferring kind 0: all kind-0 calls (by priority) run before any kind-1 call, even more urgent ones."""
    pool = PriorityPool(1, name="test-kinds", kinds=2)
    gate = threading.Event()
    ran: list[tuple[int, float, int]] = []
    blocker = pool.submit(gate.wait)
    items = [(1, 0.0, 0), (0, 9.0, 1), (1, -5.0, 2), (0, 2.0, 3), (0, 9.0, 4), (1, 3.0, 5)]  # (kind, priority, seq)
    futures = [pool.submit(ran.append, it, priority=it[1], kind=it[0]) for it in items]
    gate.set()
    for f in futures:
        f.result(timeout=5)
    assert blocker.result() is True
    assert ran == sorted(items, key=lambda it: (it[0] != 0, it[1], it[2]))
    pool.shutdown()


def test_two_workers_run_both_kinds_at_once():
    """With a call of each kind waiting, the two workers (one preferring each) run them concurrently."""
    pool = PriorityPool(2, name="test-both", kinds=2)
    barrier = threading.Barrier(2, timeout=5)
    a = pool.submit(barrier.wait, kind=0, priority=5)
    b = pool.submit(barrier.wait, kind=1, priority=0)
    assert {a.result(timeout=5), b.result(timeout=5)} == {0, 1}  # both reached the barrier together
    pool.shutdown()


def test_results_errors_and_cancelled_calls():
    pool = PriorityPool(2)
    assert [pool.submit(pow, i, 2).result(timeout=5) for i in range(5)] == [i * i for i in range(5)]
    with pytest.raises(ZeroDivisionError):
        pool.submit(lambda: 1 / 0).result(timeout=5)
    gate = threading.Event()
    busy = [pool.submit(gate.wait) for _ in range(2)]
    ran = []
    dropped = pool.submit(ran.append, 1)
    assert dropped.cancel()
    gate.set()
    assert all(f.result(timeout=5) for f in busy)
    assert pool.submit(lambda: 7).result(timeout=5) == 7
    assert ran == []  # the cancelled call never ran
    pool.shutdown()


def test_shutdown_stops_the_threads_and_drops_queued_work():
    pool = PriorityPool(1, name="test-stop")
    gate, started = threading.Event(), threading.Event()
    running = pool.submit(lambda: started.set() or gate.wait())
    assert started.wait(5)
    queued = pool.submit(time.sleep, 0)
    threading.Timer(0.05, gate.set).start()
    pool.shutdown(wait=True, cancel_futures=True)
    assert running.result() is True and queued.cancelled()
    assert not any(t.name.startswith("test-stop") for t in threading.enumerate())
    with pytest.raises(RuntimeError):
        pool.submit(time.sleep, 0)


def test_threads_stop_when_the_pool_is_collected():
    import gc

    pool = PriorityPool(2, name="test-gc")
    assert pool.submit(lambda: 3).result(timeout=5) == 3
    threads = list(pool._threads)
    del pool
    gc.collect()
    for t in threads:
        t.join(timeout=5)
        assert not t.is_alive()
