"""A handler's ``RateLimited(retry_after)`` (issue #20): the task's limit key (or, without one,
the whole queue) starts nothing for that long, the task comes back first, and the attempt is
not counted — in both worker kinds and in ``consume()``."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from delayq import AsyncWorker, Offer, RateLimited, Worker


def test_consume_loop_rate_limited_holds_only_its_key(make_queue) -> None:
    q = make_queue("c", safety_interval=30)
    q.offer_many([Offer("a1", 0, limit_key="a"), Offer("a2", 0, limit_key="a")])
    q.offer_many([Offer("b1", 0.05, limit_key="b")])
    seen: list[tuple[str, int, float]] = []
    started = time.monotonic()
    thrown = False
    with q.consume(timeout=3) as tasks:
        for task in tasks:
            seen.append((task.payload, task.attempts, time.monotonic() - started))
            if task.payload == "a1" and not thrown:
                thrown = True
                raise_in_loop(task)
            if len(seen) == 4:
                break
    order = [p for p, _, _ in seen]
    assert order[:2] == ["a1", "b1"], order  # b is not held by a's 429
    assert order[2:] == ["a1", "a2"], "the throttled task did not come back first"
    a1_again = seen[2]
    assert a1_again[1] == 1, "RateLimited counted an attempt"
    assert a1_again[2] >= 0.5, "the key started again before its retry_after"
    assert a1_again[2] < 2.5, "the key waited past its retry_after"
    assert q.stats().counters.get("throttled:ratelimited") == 1


def raise_in_loop(task: Any) -> None:
    task.throttle(0.5)  # what the consume() loop does for a RateLimited raised in its block


def test_consume_block_turns_rate_limited_into_a_hold(make_queue) -> None:
    q = make_queue("blk")
    q.offer("x", 0, limit_key="k")
    started = time.monotonic()
    try:
        with q.consume(timeout=3) as tasks:
            for _task in tasks:
                raise RateLimited(0.4)
    except RateLimited:
        pass
    task = q.poll(timeout=5)
    assert task is not None and task.attempts == 1
    assert time.monotonic() - started >= 0.4


def test_thread_worker_rate_limited_without_a_key_holds_the_queue(make_queue) -> None:
    q = make_queue("tw", safety_interval=30)
    q.offer_many([("first", 0), ("second", 0.01)])
    starts: list[tuple[str, int, float]] = []
    done = threading.Event()
    begun = time.monotonic()

    def handler(task: Any) -> None:
        starts.append((task.payload, task.attempts, time.monotonic() - begun))
        if task.payload == "first" and task.attempts == 1 and len(starts) == 1:
            raise RateLimited(0.6)
        if len(starts) >= 3:
            done.set()

    worker = Worker(q, handler, concurrency=1)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert done.wait(10), starts
    finally:
        worker.stop()
        thread.join(10)
    again = [s for s in starts if s[0] == "first"]
    assert len(again) == 2 and again[1][1] == 1, starts  # the attempt was not counted
    assert again[1][2] >= 0.6, "the queue started again before its retry_after"
    second = next(s for s in starts if s[0] == "second")  # fetched ahead before the 429 or held
    assert second[2] < 0.3 or second[2] >= 0.6, starts
    assert worker.health().failed == 0, "a throttle counted as a failure"


async def test_async_worker_rate_limited(make_async_queue) -> None:
    q = make_async_queue("aw", safety_interval=30)
    await q.offer_many([Offer(i, 0, limit_key="api") for i in range(3)])
    starts: list[tuple[int, int, float]] = []
    done = asyncio.Event()
    begun = time.monotonic()

    async def handler(task: Any) -> None:
        starts.append((task.payload, task.attempts, time.monotonic() - begun))
        if task.payload == 0 and len(starts) == 1:
            raise RateLimited(0.5)
        if len(starts) >= 4:
            done.set()

    worker = AsyncWorker(q, handler, concurrency=1, prefetch=0)  # nothing leased ahead
    running = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(done.wait(), 10)
    finally:
        worker.stop()
        await asyncio.wait_for(running, 10)
    again = [s for s in starts if s[0] == 0]
    assert len(again) == 2 and again[1][1] == 1 and again[1][2] >= 0.5, starts
    assert [s[0] for s in starts] == [0, 0, 1, 2], "the throttled task lost its place"
