from __future__ import annotations

import time

from delayq import AsyncDelayQueue, DelayQueue


def test_offer_take_ack_roundtrip(make_queue) -> None:
    q: DelayQueue = make_queue()
    task_id = q.offer({"order_id": 42}, delay=0.2)
    started = time.monotonic()
    task = q.poll(timeout=5)
    assert task is not None and task.id == task_id
    assert task.payload == {"order_id": 42}
    assert time.monotonic() - started >= 0.15
    assert task.delivered_ms >= task.due_ms
    task.ack()
    assert q.get(task_id) is None


async def test_async_roundtrip(make_async_queue) -> None:
    q: AsyncDelayQueue = make_async_queue()
    task_id = await q.offer({"n": 1}, delay=0.1)
    task = await q.poll(timeout=5)
    assert task is not None and task.id == task_id
    await task.ack()
    assert (await q.stats()).counters["acked"] == 1
