"""Worker options that override the queue's lease and retry policy."""

from __future__ import annotations

import asyncio
import threading

import pytest

from delayq import AsyncDelayQueue, AsyncWorker, Backoff, ConfigError, DelayQueue, Worker

from ..helpers import wait_until


def test_worker_overrides_visibility_timeout_and_attempts(make_queue) -> None:
    q: DelayQueue = make_queue(visibility_timeout=60, max_attempts=10)
    leases: list[float] = []

    def handler(task) -> None:  # type: ignore[no-untyped-def]
        info = q.get(task.id)
        assert info is not None and info.lease_expires_at is not None
        leases.append((info.lease_expires_at - task.delivered_at).total_seconds())
        raise RuntimeError("always fails")

    worker = Worker(
        q,
        handler,
        handle_signals=False,
        visibility_timeout=2,
        max_attempts=2,
        retry_backoff=Backoff(base=0.05, max=0.05),
    )
    runner = threading.Thread(target=worker.run)
    runner.start()
    q.offer("job")
    try:
        wait_until(lambda: q.stats().dead == 1, timeout=10)
    finally:
        worker.stop()
        runner.join(10)
    assert len(leases) == 2 and all(1.5 <= lease <= 2.5 for lease in leases), leases
    assert q.dead()[0].attempts == 2


def test_worker_refuses_a_lease_for_an_at_most_once_queue(make_queue) -> None:
    q: DelayQueue = make_queue(ack=False)
    with pytest.raises(ConfigError, match="at-most-once"):
        Worker(q, lambda task: None, visibility_timeout=5)


def test_concurrency_is_split_across_queues_whatever_divides(make_queue) -> None:
    """concurrency=3 on two queues runs three handlers at once (two on the first queue, one
    on the second); it ran two, one per queue, leaving the third unused."""
    queues = [make_queue(f"split{i}") for i in range(2)]
    for q in queues:
        q.offer_many([(n, 0) for n in range(4)])
    lock, release, running = threading.Lock(), threading.Event(), [0]

    def handler(task: object) -> None:
        with lock:
            running[0] += 1
        release.wait(10)
        with lock:
            running[0] -= 1

    handle = Worker(queues, handler, concurrency=3).start_background()
    try:
        wait_until(lambda: running[0] == 3, timeout=10)
        assert not release.wait(0.3) and running[0] == 3  # and no fourth
    finally:
        release.set()
        handle.stop()


async def test_an_async_worker_splits_concurrency_across_queues(redis_url, prefix) -> None:
    queues = [AsyncDelayQueue(f"asplit{i}", redis_url, prefix=prefix) for i in range(2)]
    for q in queues:
        await q.offer_many([(n, 0) for n in range(4)])
    release, running, three = asyncio.Event(), [0], asyncio.Event()

    async def handler(task: object) -> None:
        running[0] += 1
        if running[0] == 3:
            three.set()
        await release.wait()
        running[0] -= 1

    handle = AsyncWorker(queues, handler, concurrency=3).start_background()
    try:
        await asyncio.wait_for(three.wait(), 10)
        await asyncio.sleep(0.3)  # a fourth would have started by now
        assert running[0] == 3
    finally:
        release.set()
        await handle.stop()
        for q in queues:
            await q.close()
