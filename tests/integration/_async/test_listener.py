"""``start_background()``: Redisson's listener style, a worker running in the background of
the application (in a thread of its own, or as a task of the running event loop)."""

from __future__ import annotations

import threading

from delayq import AsyncDelayQueue, AsyncWorker, Backoff

from .flavor import eventually


async def test_listener_handles_tasks_in_the_background_and_stops(make_async_queue) -> None:
    q: AsyncDelayQueue = make_async_queue(retry_backoff=Backoff(base=0.05, max=0.05))
    seen: list[object] = []
    calls = {"flaky": 0}

    async def handler(task) -> None:  # type: ignore[no-untyped-def]
        if task.payload == "flaky" and calls["flaky"] == 0:
            calls["flaky"] += 1
            raise RuntimeError("first try fails")
        seen.append(task.payload)

    listener = AsyncWorker(q, handler, concurrency=2).start_background()
    await q.offer_many([("a", 0.1), ("b", 0.2), ("flaky", 0)])
    await eventually(lambda: sorted(map(str, seen)) == ["a", "b", "flaky"], timeout=10)
    await listener.stop()
    assert not listener.running
    assert listener.worker.health().state == "stopped"
    stats = await q.stats()
    assert stats.counters["acked"] == 3 and stats.counters["retried"] == 1
    assert stats.delayed + stats.ready + stats.inflight == 0
    await eventually(
        lambda: not [t for t in threading.enumerate() if t.name.startswith("delayq-")], timeout=5
    )
