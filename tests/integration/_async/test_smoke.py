"""The round trip, and a consumer woken by an earlier task, on each front end."""

from __future__ import annotations

import time

from delayq import AsyncDelayQueue

from .flavor import sleep, spawn


async def test_offer_take_ack_roundtrip(make_async_queue) -> None:
    q: AsyncDelayQueue = make_async_queue()
    task_id = await q.offer({"order_id": 42}, delay=0.2)
    started = time.monotonic()
    task = await q.poll(timeout=5)
    assert task is not None and task.id == task_id
    assert task.payload == {"order_id": 42}
    assert time.monotonic() - started >= 0.15
    assert task.delivered_ms >= task.due_ms
    await task.ack()
    assert await q.get(task_id) is None
    assert (await q.stats()).counters["acked"] == 1


async def test_an_earlier_task_wakes_a_sleeping_consumer(make_async_queue) -> None:
    """Only the pub/sub hint can wake this consumer in time: its safety re-check is 30 s away
    and the task it sleeps for is due in 20 s."""
    q: AsyncDelayQueue = make_async_queue(safety_interval=30)
    producer: AsyncDelayQueue = make_async_queue()
    await producer.offer("later", delay=20)
    started = time.monotonic()
    assert await q.poll(timeout=0) is None
    assert time.monotonic() - started < 0.5, "subscribing must not stall a poll"
    waiting = spawn(q.poll, timeout=10)
    try:
        await sleep(0.3)  # let the consumer fall asleep on the 20 s task (not a correctness wait)
        offered = time.monotonic()
        task_id = await producer.offer("sooner", delay=0.2)
        task = await waiting.result(15)
        assert task is not None and task.id == task_id
        assert 0.15 <= time.monotonic() - offered < 2.0
    finally:
        await waiting.cancel()
