"""listen() and start_background(): Redisson's listener style, a worker in the background."""

from __future__ import annotations

import asyncio
import threading
import time

from delayq import AsyncDelayQueue, Backoff, DelayQueue, listen

from ..helpers import wait_until


def test_listener_handles_tasks_in_a_thread_and_stops(make_queue) -> None:
    q: DelayQueue = make_queue(retry_backoff=Backoff(base=0.05, max=0.05))
    seen: list[object] = []
    calls = {"flaky": 0}

    def handler(task) -> None:  # type: ignore[no-untyped-def]
        if task.payload == "flaky" and calls["flaky"] == 0:
            calls["flaky"] += 1
            raise RuntimeError("first try fails")
        seen.append(task.payload)

    listener = listen(q, handler, concurrency=2)
    q.offer_many([("a", 0.1), ("b", 0.2), ("flaky", 0)])
    wait_until(lambda: sorted(map(str, seen)) == ["a", "b", "flaky"], timeout=10)
    listener.stop()
    assert listener.worker.health().state == "stopped"
    stats = q.stats()
    assert stats.counters["acked"] == 3 and stats.counters["retried"] == 1
    assert stats.delayed + stats.ready + stats.inflight == 0
    wait_until(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("delayq-")], timeout=5
    )


async def test_async_listener_runs_as_a_task_and_stops(make_async_queue) -> None:
    q: AsyncDelayQueue = make_async_queue()
    seen: list[object] = []

    async def handler(task) -> None:  # type: ignore[no-untyped-def]
        seen.append(task.payload)

    listener = listen(q, handler)
    await q.offer({"n": 1}, delay=0.1)
    started = time.monotonic()
    while not seen and time.monotonic() - started < 10:
        await asyncio.sleep(0.01)
    await listener.stop()
    assert seen == [{"n": 1}]
    assert (await q.stats()).counters["acked"] == 1
