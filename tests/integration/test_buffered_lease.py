"""A task waiting in a worker's buffer whose lease ran out is not begun (issue #21): Redis
refused the heartbeat's extensions (``maxmemory`` reached: every write refused) while the
one handler slot was busy, so by the time the slot freed, the lease of the task behind it
had lapsed, and another consumer may have had it. Before, the worker began it anyway: the
soak's "fencing tokens out of order" in ``maxmemory`` windows."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from delayq import AsyncDelayQueue, AsyncWorker, DelayQueue, Worker
from delayq.embedded import EmbeddedRedis
from tests.helpers import wait_until

LEASE_S = 2.0


@pytest.fixture
def server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as srv:  # its own: the test fills it up
        yield srv


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


@pytest.mark.parametrize("kind", ["thread", "async"])
def test_a_buffered_task_whose_lease_lapsed_is_dropped_and_comes_back(
    kind: str, server: EmbeddedRedis, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="delayq.worker")
    client = redis.Redis(port=server.port)
    q = DelayQueue("buf", server.url, prefix=prefix, visibility_timeout=LEASE_S)
    started, release = threading.Event(), threading.Event()
    calls: list[tuple[Any, int]] = []

    def record(task: Any) -> bool:
        calls.append((task.payload, task.attempts))
        return task.payload == "slow" and task.attempts == 1

    def handle(task: Any) -> None:
        if record(task):
            started.set()
            release.wait(30)

    async def ahandle(task: Any) -> None:
        if record(task):
            started.set()
            await asyncio.to_thread(release.wait, 30)

    q.offer("slow")
    q.offer("waiting", 0.01)
    wait_until(lambda: q.stats().overdue == 2, timeout=5)  # both due: fetched together
    if kind == "thread":
        worker: Any = Worker(q, handle, concurrency=1)
        background: Any = worker.start_background()
        stop = background.stop
    else:
        loop_box: list[asyncio.AbstractEventLoop] = []
        made: list[AsyncWorker] = []

        async def main() -> None:
            loop_box.append(asyncio.get_running_loop())
            aq = AsyncDelayQueue("buf", server.url, prefix=prefix, visibility_timeout=LEASE_S)
            made.append(AsyncWorker(aq, ahandle, concurrency=1, handle_signals=False))
            try:
                await made[0].run()
            finally:
                await aq.close()

        runner = threading.Thread(target=asyncio.run, args=(main(),), name="test-async-worker")
        runner.start()
        wait_until(lambda: made, timeout=5)

        def stop() -> None:
            loop_box[0].call_soon_threadsafe(made[0].stop)
            runner.join(15)

    try:
        assert started.wait(10)
        inflight = q.keys.key("inflight")
        wait_until(lambda: client.zcard(inflight) == 2, timeout=5)  # both leased, one buffered
        client.config_set("maxmemory", 1)  # every write refused: no extension gets through
        lapses_ms = max(int(s) // 10 for _, s in client.zrange(inflight, 0, -1, withscores=True))
        wait_until(lambda: server_ms(client) > lapses_ms + 20, timeout=10)
        release.set()  # the slot frees after the waiting task's lease ran out
        # Dropped when the slot freed, or by the heartbeat's look if that came first.
        dropped = ("ran out while it waited in the buffer", "expired while held")
        wait_until(lambda: any(m in caplog.text for m in dropped), timeout=10)
        assert ("waiting", 1) not in calls
        client.config_set("maxmemory", 0)
        wait_until(lambda: ("waiting", 2) in calls and ("slow", 2) in calls, timeout=30)
        assert [a for p, a in calls if p == "waiting"] == [2]  # begun once, on a live lease
    finally:
        release.set()
        client.config_set("maxmemory", 0)
        stop()
        q.close()
        client.close()
