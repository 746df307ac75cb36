"""A handler that ends just as its worker is stopped: its ack must still go out (it used to be
lost when the shutdown cancelled the ack loop in the middle of the ack call)."""

from __future__ import annotations

import asyncio

import pytest

from delayq import AsyncDelayQueue, AsyncWorker
from delayq.embedded import EmbeddedRedis


@pytest.mark.parametrize("prefetch", [0, None])
async def test_a_handler_ending_as_the_worker_stops_is_acked(
    redis7_server: EmbeddedRedis, prefix: str, prefetch: int | None
) -> None:
    left = []
    for n in range(12):
        q = AsyncDelayQueue(f"stop{n}", redis7_server.url, prefix=prefix)
        busy, release = asyncio.Event(), asyncio.Event()

        async def handle(
            task: object, busy: asyncio.Event = busy, release: asyncio.Event = release
        ) -> None:
            busy.set()
            await release.wait()

        async with AsyncWorker(q, handle, concurrency=1, prefetch=prefetch).start_background():
            await q.offer("x")
            await asyncio.wait_for(busy.wait(), 10)
            release.set()  # the handler ends within the grace of the stop that follows
        stats = await q.stats()
        await q.close()
        if stats.counters.get("acked") != 1 or stats.inflight:
            left.append(n)
    assert not left, f"{len(left)} of 12 stops left the task leased, not acked"
