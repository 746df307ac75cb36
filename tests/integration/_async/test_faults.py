"""Faults seen the same way by both front ends: a consumer blocked across a Redis restart,
producers facing an outage or a frozen server, lost wake-up messages, tasks falling due while
nobody runs, and skewed client clocks. (tests/integration/test_faults.py has the rest.)

Tests that kill, freeze or restart a server make their own :class:`EmbeddedRedis` (AOF with
``appendfsync always``); the shared session servers are only used by tests that leave them be.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from delayq import AsyncDelayQueue, Offer, RedisUnavailable
from delayq.embedded import EmbeddedRedis
from tests.faults_support import (
    empty_counts,
    freeze,
    hide_announcements,
    logged,
    messages,
    server_ms,
    skew_clock,
    subscribers,
    thaw,
)

from .flavor import blocking, eventually, spawn

pytest_plugins = ["tests.faults_support"]


# -- 1. a crash and restart ------------------------------------------------------------------


@pytest.mark.parametrize("method", ["take", "poll"])
async def test_consumer_blocked_across_restart_resumes(
    own_server: EmbeddedRedis,
    raw_factory: Callable[[str], redis.Redis],
    prefix: str,
    logs: pytest.LogCaptureFixture,
    method: str,
) -> None:
    """A consumer blocked in take() / poll(timeout) while Redis crashes and comes back rides the
    outage out on its own, resubscribes, and gets a task offered after the restart."""
    raw = raw_factory(own_server.url)
    consumer = AsyncDelayQueue("blocked", own_server.url, prefix=prefix)
    producer = AsyncDelayQueue("blocked", own_server.url, prefix=prefix)
    pending = spawn(consumer.take) if method == "take" else spawn(consumer.poll, timeout=20)
    try:
        channel = consumer.keys.channel
        await eventually(lambda: subscribers(raw, channel) == 1)

        await blocking(own_server.kill)
        # One line for the outage, whichever part saw it first (the pub/sub connection).
        await eventually(lambda: logged(logs, f"Redis at {own_server.url} unavailable"))
        await blocking(own_server.start)
        await eventually(lambda: subscribers(raw, channel) == 1, timeout=5)  # resubscribed

        task_id = await producer.offer("after restart", delay=0.2)
        task = await pending.result(10)
        assert task is not None and task.id == task_id
        assert task.delivered_ms >= task.due_ms
        assert task.lateness_ms < 1500
        await task.ack()
    finally:
        await pending.cancel()
        await producer.close()
        await consumer.close()


# -- 2. outages seen by producers -------------------------------------------------------------


async def test_offer_while_down_past_reconnect_timeout_raises(
    own_server7: EmbeddedRedis, prefix: str
) -> None:
    """Redis down for longer than reconnect_timeout: offer() raises RedisUnavailable (also a
    ConnectionError) after about reconnect_timeout, naming the queue; nothing was written."""
    async with AsyncDelayQueue("down", own_server7.url, prefix=prefix, reconnect_timeout=0.5) as q:
        await q.offer("warm-up")  # connections in the pool, script cached: all lost in the crash
        warm = await q.poll(timeout=0)
        assert warm is not None
        await warm.ack()
        await blocking(own_server7.kill)
        started = time.monotonic()
        with pytest.raises(RedisUnavailable) as caught:
            await q.offer("lost")
        elapsed = time.monotonic() - started
        assert isinstance(caught.value, ConnectionError)
        message = str(caught.value)
        assert "'down'" in message and "unreachable" in message.lower(), message
        assert 0.4 <= elapsed < 2.5, f"raised after {elapsed:.2f}s with reconnect_timeout=0.5"

        await blocking(own_server7.start)
        assert empty_counts(await q.stats()) == (0, 0, 0, 0, 0)  # the failed offer wrote nothing
        await q.offer("works again")
        stats = await q.stats()
        assert stats.delayed + stats.ready == 1


@pytest.mark.parametrize("operation", ["offer", "poll"])
async def test_frozen_server_call_gives_up_within_its_timeout(
    own_server7: EmbeddedRedis, prefix: str, operation: str
) -> None:
    """Redis hangs (SIGSTOP: sockets open, no answer): offer() raises RedisUnavailable about
    reconnect_timeout (0.5 s) later, and poll(timeout=0.5) gives up about 0.5 s later."""
    async with AsyncDelayQueue(
        "frozen", own_server7.url, prefix=prefix, reconnect_timeout=0.5
    ) as q:
        await q.offer("warm-up")
        warm = await q.poll(timeout=0)
        assert warm is not None
        await warm.ack()
        freeze(own_server7)
        started = time.monotonic()
        try:
            if operation == "offer":
                with pytest.raises(RedisUnavailable):
                    await q.offer("x")
            else:
                with contextlib.suppress(RedisUnavailable):  # giving up loudly is fine too
                    assert await q.poll(timeout=0.5) is None
        finally:
            elapsed = time.monotonic() - started
            thaw(own_server7)
        assert elapsed < 2.0, f"{operation} blocked {elapsed:.1f}s against a frozen server"


async def test_write_beyond_socket_buffers_to_frozen_server_gives_up_and_recovers(
    own_server7: EmbeddedRedis, prefix: str
) -> None:
    """A call whose write the kernel cannot take whole (16 MB to a frozen server) waits for
    the socket under the socket timeout and gives up about reconnect_timeout later; the
    connection it half-wrote is dropped, so after the thaw the same offers, resent under their
    ids, make each task exactly once."""
    offers = [Offer("x" * 4000, 60, id=f"big-{i}") for i in range(4000)]
    async with AsyncDelayQueue(
        "bigwrite", own_server7.url, prefix=prefix, reconnect_timeout=0.5
    ) as q:
        await q.offer("warm-up", 60)  # connected, the offer script loaded
        freeze(own_server7)
        started = time.monotonic()
        try:
            with pytest.raises(RedisUnavailable):
                await q.offer_many(offers)
        finally:
            elapsed = time.monotonic() - started
            thaw(own_server7)
        assert elapsed < 5.0, f"offer_many blocked {elapsed:.1f}s against a frozen server"
        ids = await q.offer_many(offers)
        assert sorted(ids) == sorted(o.id for o in offers)
        stats = await q.stats()
        assert stats.delayed == len(offers) + 1


# -- 3. lost wake-up messages -----------------------------------------------------------------


@pytest.mark.parametrize("how", ["message-bypassed", "pubsub-killed"])
async def test_lost_notification_caught_by_safety_interval(
    make_async_queue: Callable[..., AsyncDelayQueue],
    client: redis.Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """The sleeping consumer never hears of the new task; it still gets it no earlier than due
    and at most about one safety_interval (0.5 s) late."""
    consumer = make_async_queue(f"lost-{prefix}", safety_interval=0.5)
    producer = make_async_queue(f"lost-{prefix}")
    channel = consumer.keys.channel
    pending = spawn(consumer.poll, timeout=10)
    spy = client.pubsub()
    try:
        await eventually(lambda: subscribers(client, channel) == 1)
        if how == "message-bypassed":
            elsewhere = hide_announcements(monkeypatch, producer, prefix)
            spy.subscribe(channel, elsewhere)
        else:
            [listener] = [
                c
                for c in client.client_list()
                if c["name"] == f"delayq:lost-{prefix}" and int(c.get("sub", 0)) > 0
            ]
            assert client.client_kill_filter(_id=listener["id"], _type="pubsub") == 1
        task_id = await producer.offer("quiet", delay=0.3)

        task = await pending.result(10)
        assert task is not None and task.id == task_id
        assert task.lateness_ms >= 0, "delivered before its due time"
        assert task.lateness_ms <= 1500, f"{task.lateness_ms} ms late"
        await task.ack()
        if how == "message-bypassed":
            heard = messages(spy, timeout=0.3)
            assert [ch for ch, _ in heard] == [elsewhere], "the message was not diverted"
        else:  # resubscribed
            await eventually(lambda: subscribers(client, channel) == 1, timeout=5)
    finally:
        spy.close()
        await pending.cancel()


# -- 4. catching up after nobody ran ----------------------------------------------------------


async def test_tasks_due_while_no_client_runs_are_caught_up(
    redis_server: EmbeddedRedis, client: redis.Redis, prefix: str
) -> None:
    """Tasks fall due while every queue is closed; a consumer started later gets them all
    at once, without waiting: a batch by poll_many, the rest one at a time by take()."""
    n = 100
    async with AsyncDelayQueue("offline", redis_server.url, prefix=prefix) as producer:
        ids = await producer.offer_many([(i, 0.3) for i in range(n)])
        stats = await producer.stats()
        assert stats.next_due_at is not None
        due_ms = round(stats.next_due_at.timestamp() * 1000)
    await eventually(lambda: server_ms(client) > due_ms + 300, timeout=5)

    async with AsyncDelayQueue("offline", redis_server.url, prefix=prefix) as consumer:
        assert (await consumer.stats()).ready == n
        started = time.monotonic()
        got: list[Any] = await consumer.poll_many(n // 2, timeout=5)
        while len(got) < n:
            got.append(await consumer.take())
        # No wait for a wake-up: a missed one would cost the safety interval (10 s); a
        # loaded machine has taken 1.007 s for the 51 round trips.
        assert time.monotonic() - started < 3.0
        assert {t.id for t in got} == set(ids)
        assert all(t.lateness_ms >= 300 for t in got)
        assert all(await consumer.ack_many(got))
        assert empty_counts(await consumer.stats()) == (0, 0, 0, 0, 0)


# -- 5. skewed client clocks ------------------------------------------------------------------


@pytest.mark.parametrize("skew", [5.0, -5.0], ids=["ahead-5s", "behind-5s"])
async def test_skewed_client_clock_changes_nothing(
    redis7_server: EmbeddedRedis,
    raw_factory: Callable[[str], redis.Redis],
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    skew: float,
) -> None:
    """A client whose clock is 5 s off: delay=1 still means 1 s on the server's clock, so the
    task is delivered neither early nor late. (Only the client's clock matters here, so one
    server version is enough.)"""
    client = raw_factory(redis7_server.url)
    skew_clock(monkeypatch, skew)
    assert abs(time.time() * 1000 - server_ms(client) - skew * 1000) < 500
    async with AsyncDelayQueue("skew", redis7_server.url, prefix=prefix) as q:
        await q.poll(timeout=0)  # listener up before the clock starts
        before = server_ms(client)
        task_id = await q.offer({"skew": skew}, delay=1)
        offered = time.monotonic()
        after = server_ms(client)
        task = await q.poll(timeout=5)
        waited = time.monotonic() - offered
        assert task is not None and task.id == task_id
        assert before + 1000 <= task.due_ms <= after + 1001, "due time not from the server clock"
        assert task.delivered_ms >= task.due_ms, "delivered early"
        assert task.lateness_ms < 1000, f"{task.lateness_ms} ms late"
        assert 0.9 <= waited < 2.0, f"delivered {waited:.2f}s after offer(delay=1)"
        await task.ack()
