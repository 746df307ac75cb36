"""Volume and churn: 100,000 tasks due at one instant, and 1,000 queues made and closed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from delayq import AsyncDelayQueue, DelayQueue, Offer
from delayq.embedded import EmbeddedRedis
from tests.helpers import delayq_threads, wait_until


@pytest.fixture
def raw(redis7_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis7_server.url)
    yield client
    client.close()


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def clients_named(client: redis.Redis, name: str) -> int:
    return sum(1 for c in client.client_list() if c.get("name") == name)


def settles(predicate: Callable[[], bool], timeout: float = 2.0) -> bool:
    """True once ``predicate`` holds (the server notices closed sockets a moment later)."""
    try:
        wait_until(predicate, timeout=timeout)
    except AssertionError:
        return False
    return True


def subscribers(client: redis.Redis, channel: str) -> int:
    [(_, count)] = client.pubsub_numsub(channel)
    return int(count)


@pytest.mark.slow
def test_hundred_thousand_tasks_due_at_one_instant(
    redis7_server: EmbeddedRedis, raw: redis.Redis, prefix: str
) -> None:
    """100,000 tasks due in the same millisecond, drained by one consumer with poll_many(500)
    and ack_many: each delivered once, none lost, never early, every count back to zero."""
    n = 100_000
    started = time.monotonic()
    with DelayQueue("bulk", redis7_server.url, prefix=prefix, visibility_timeout=120) as q:
        due_ms = server_ms(raw) + 1000  # one instant, a moment ahead
        ids = q.offer_many(Offer(i, at=due_ms / 1000) for i in range(n))
        assert len(set(ids)) == n
        stats = q.stats()
        assert stats.delayed + stats.ready == n

        seen: set[str] = set()
        payloads: set[int] = set()
        dues: set[int] = set()
        duplicates: list[str] = []
        early = lost_acks = 0
        for _ in range(n // 500 + 50):  # bounded: a few empty polls at most
            tasks = q.poll_many(500, timeout=2)
            if not tasks:
                break
            for task in tasks:
                if task.id in seen:
                    duplicates.append(task.id)
                seen.add(task.id)
                payloads.add(task.payload)
                dues.add(task.due_ms)
                early += task.lateness_ms < 0
            lost_acks += q.ack_many(tasks).count(False)
        assert duplicates == []
        assert seen == set(ids), f"{len(set(ids) - seen)} tasks lost"
        assert payloads == set(range(n))
        assert len(dues) == 1 and abs(dues.pop() - due_ms) <= 1, "not all due at one instant"
        assert early == 0, f"{early} tasks delivered early"
        assert lost_acks == 0
        assert q.poll(timeout=0) is None
        stats = q.stats()
        assert (stats.delayed, stats.ready, stats.inflight, stats.dead, stats.overdue) == (
            0,
            0,
            0,
            0,
            0,
        )
        assert stats.counters["offered"] == stats.counters["delivered"] == n
        assert stats.counters["acked"] == n
    assert time.monotonic() - started < 60


CHURN = 1000


@pytest.mark.slow
def test_sync_queue_churn_leaks_nothing(
    redis7_server: EmbeddedRedis, raw: redis.Redis, prefix: str
) -> None:
    """1,000 sync queues, each offering, polling (so its listener thread subscribes) and
    closing: no thread, connection or subscription outlives its queue."""
    name, channel = "churn-sync", ""
    threads_before = len(delayq_threads())
    started = time.monotonic()
    for i in range(CHURN):
        q = DelayQueue(name, redis7_server.url, prefix=prefix)
        channel = q.keys.channel
        try:
            q.offer(i)
            task = q.poll(timeout=5)
            assert task is not None and task.payload == i
            task.ack()
        finally:
            q.close()
        if i % 100 == 99:  # leaks show up as growth long before the end
            assert len(delayq_threads()) == threads_before, f"threads leak after {i + 1}"
            assert settles(lambda: clients_named(raw, f"delayq:{name}") == 0), (
                f"connections leak after {i + 1} queues"
            )
    elapsed = time.monotonic() - started
    assert len(delayq_threads()) == threads_before
    wait_until(lambda: clients_named(raw, f"delayq:{name}") == 0, timeout=5)
    wait_until(lambda: subscribers(raw, channel) == 0, timeout=5)
    assert elapsed < 60, f"{CHURN} queue lifecycles took {elapsed:.1f}s"


@pytest.mark.slow
async def test_async_queue_churn_leaks_nothing(
    redis7_server: EmbeddedRedis, raw: redis.Redis, prefix: str
) -> None:
    """1,000 asyncio queues, each offering, polling (so its listener task subscribes) and
    closing: no task, thread, connection or subscription outlives its queue."""
    name, channel = "churn-async", ""
    tasks_before = len(asyncio.all_tasks())
    started = time.monotonic()
    for i in range(CHURN):
        q = AsyncDelayQueue(name, redis7_server.url, prefix=prefix)
        channel = q.keys.channel
        try:
            await q.offer(i)
            task = await q.poll(timeout=5)
            assert task is not None and task.payload == i
            await task.ack()
        finally:
            await q.close()
        if i % 100 == 99:
            assert len(asyncio.all_tasks()) == tasks_before, f"tasks leak after {i + 1}"
            assert settles(lambda: clients_named(raw, f"delayq:{name}") == 0), (
                f"connections leak after {i + 1} queues"
            )
    elapsed = time.monotonic() - started
    assert len(asyncio.all_tasks()) == tasks_before
    assert delayq_threads() == []
    wait_until(lambda: clients_named(raw, f"delayq:{name}") == 0, timeout=5)
    wait_until(lambda: subscribers(raw, channel) == 0, timeout=5)
    assert elapsed < 60, f"{CHURN} queue lifecycles took {elapsed:.1f}s"
