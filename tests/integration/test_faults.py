"""Fault tolerance against real redis-server processes: crashes and restarts, outages, frozen
servers, lost wake-up messages, tasks falling due while nobody runs, and skewed client clocks.

Tests that kill, freeze or restart a server make their own :class:`EmbeddedRedis` (AOF with
``appendfsync always``); the shared session servers are only used by tests that leave them be.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import redis

from delayq import AsyncDelayQueue, Backoff, DelayQueue, RedisUnavailable
from delayq._core import protocol
from delayq.embedded import EmbeddedRedis
from tests.conftest import BINARIES
from tests.helpers import delayq_threads, wait_until

# -- helpers --------------------------------------------------------------------------------


@pytest.fixture(params=[b for _, b in BINARIES], ids=[n for n, _ in BINARIES])
def own_server(request: pytest.FixtureRequest) -> Iterator[EmbeddedRedis]:
    """A private AOF server this test may kill, freeze and restart (each Redis version)."""
    server = EmbeddedRedis(request.param, aof=True).start()
    yield server
    server.stop()  # SIGKILL works on a frozen server too


@pytest.fixture
def own_server7() -> Iterator[EmbeddedRedis]:
    """A private AOF server of the newest version only, where the version does not matter."""
    server = EmbeddedRedis(BINARIES[0][1], aof=True).start()
    yield server
    server.stop()


@pytest.fixture
def raw_factory() -> Iterator[Callable[[str], redis.Redis]]:
    """Plain clients for looking at a server (TIME, CLIENT LIST, PUBSUB); closed at the end."""
    made: list[redis.Redis] = []

    def make(url: str) -> redis.Redis:
        made.append(redis.Redis.from_url(url))
        return made[-1]

    yield make
    for c in made:
        c.close()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="delayq")
    return caplog


def logged(caplog: pytest.LogCaptureFixture, *parts: str) -> bool:
    """True once a delayq log record contains every one of ``parts``."""
    return any(
        all(p in r.getMessage() for p in parts) for r in caplog.records if r.name == "delayq"
    )


async def eventually(predicate: Callable[[], Any], timeout: float = 10.0) -> None:
    """``wait_until`` for coroutines: lets the event loop run while waiting."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.01)


def in_thread(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run a blocking call in its own thread; the result is waited on with a timeout."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-consumer")
    future = executor.submit(fn, *args)
    executor.shutdown(wait=False)
    return future


def server_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def subscribers(client: redis.Redis, channel: str) -> int:
    [(_, count)] = client.pubsub_numsub(channel)
    return int(count)


def freeze(server: EmbeddedRedis) -> None:
    """SIGSTOP: the server keeps its sockets but answers nothing (a hung host)."""
    assert server._proc is not None
    os.kill(server._proc.pid, signal.SIGSTOP)


def thaw(server: EmbeddedRedis) -> None:
    if server._proc is not None and server._proc.poll() is None:
        os.kill(server._proc.pid, signal.SIGCONT)


def empty_counts(stats: Any) -> tuple[int, ...]:
    return (stats.delayed, stats.ready, stats.inflight, stats.dead, stats.overdue)


def _lost_reply_call(
    server: EmbeddedRedis, logs: pytest.LogCaptureFixture, call: Callable[[], Any]
) -> Future[Any]:
    """Run ``call`` against a frozen server until its first try timed out, then thaw: the
    server runs the command it had buffered, but that reply goes to a closed connection and
    the call is sent again (by delayq's retry loop, or by redis-py's own Retry)."""
    logs.set_level(logging.DEBUG, logger="redis.client")
    freeze(server)
    try:
        pending = in_thread(call)
        wait_until(
            lambda: (
                logged(logs, "Redis call failed", "imeout")
                or any("Operation failed" in r.getMessage() for r in logs.records)
            ),
            timeout=5,
        )
    finally:
        thaw(server)
    return pending


# -- 1. crash and restart with AOF ----------------------------------------------------------


def test_aof_restart_between_offer_and_due_delivers_each_task_once(
    own_server: EmbeddedRedis, raw_factory: Callable[[str], redis.Redis], prefix: str
) -> None:
    """Tasks offered, then Redis SIGKILLed and started again (same port and directory) before
    they are due: every one is delivered exactly once, none early, by the same queue object."""
    n = 300
    raw = raw_factory(own_server.url)
    with DelayQueue("crash", own_server.url, prefix=prefix) as q:
        ids = q.offer_many([(i, 2.0) for i in range(n)])
        own_server.kill()
        own_server.start()
        stats = q.stats()
        assert stats.delayed == n, "tasks acknowledged by offer() did not survive the crash"
        assert stats.next_due_at is not None
        due_ms = round(stats.next_due_at.timestamp() * 1000)
        assert server_ms(raw) < due_ms, "the restart took longer than the delay"

        got: dict[str, Any] = {}
        deadline = time.monotonic() + 15
        while len(got) < n and time.monotonic() < deadline:
            tasks = q.poll_many(100, timeout=1)
            for t in tasks:
                assert t.id not in got, f"task {t.id} delivered twice"
                assert t.delivered_ms >= t.due_ms, "task delivered before its due time"
                got[t.id] = t
            assert all(q.ack_many(tasks))
        assert set(got) == set(ids)
        assert sorted(t.payload for t in got.values()) == list(range(n))
        stats = q.stats()
        assert empty_counts(stats) == (0, 0, 0, 0, 0)
        assert stats.counters["delivered"] == stats.counters["acked"] == n


@pytest.mark.parametrize("method", ["take", "poll"])
def test_sync_consumer_blocked_across_restart_resumes(
    own_server: EmbeddedRedis,
    raw_factory: Callable[[str], redis.Redis],
    prefix: str,
    logs: pytest.LogCaptureFixture,
    method: str,
) -> None:
    """A consumer blocked in take() / poll(timeout) while Redis crashes and comes back rides the
    outage out on its own, resubscribes, and gets a task offered after the restart."""
    raw = raw_factory(own_server.url)
    consumer = DelayQueue("blocked", own_server.url, prefix=prefix)
    producer = DelayQueue("blocked", own_server.url, prefix=prefix)
    try:
        channel = consumer.keys.channel
        call = consumer.take if method == "take" else lambda: consumer.poll(timeout=20)
        pending = in_thread(call)
        wait_until(lambda: subscribers(raw, channel) == 1)

        own_server.kill()
        wait_until(lambda: logged(logs, "listener on", "lost Redis"))
        wait_until(lambda: logged(logs, "blocked: Redis call failed"))
        own_server.start()
        wait_until(lambda: subscribers(raw, channel) == 1, timeout=5)  # resubscribed by itself

        task_id = producer.offer("after restart", delay=0.2)
        task = pending.result(timeout=10)
        assert task is not None and task.id == task_id
        assert task.delivered_ms >= task.due_ms
        assert task.lateness_ms < 1500
        task.ack()
    finally:
        producer.close()
        consumer.close()


@pytest.mark.parametrize("method", ["take", "poll"])
async def test_async_consumer_blocked_across_restart_resumes(
    own_server: EmbeddedRedis,
    raw_factory: Callable[[str], redis.Redis],
    prefix: str,
    logs: pytest.LogCaptureFixture,
    method: str,
) -> None:
    """The asyncio twin of the test above."""
    raw = raw_factory(own_server.url)
    consumer = AsyncDelayQueue("blocked", own_server.url, prefix=prefix)
    producer = AsyncDelayQueue("blocked", own_server.url, prefix=prefix)
    pending = asyncio.create_task(
        consumer.take() if method == "take" else consumer.poll(timeout=20)
    )
    try:
        channel = consumer.keys.channel
        await eventually(lambda: subscribers(raw, channel) == 1)

        await asyncio.to_thread(own_server.kill)
        await eventually(lambda: logged(logs, "listener on", "lost Redis"))
        await eventually(lambda: logged(logs, "blocked: Redis call failed"))
        await asyncio.to_thread(own_server.start)
        await eventually(lambda: subscribers(raw, channel) == 1, timeout=5)

        task_id = await producer.offer("after restart", delay=0.2)
        task = await asyncio.wait_for(pending, 10)
        assert task is not None and task.id == task_id
        assert task.delivered_ms >= task.due_ms
        assert task.lateness_ms < 1500
        await task.ack()
    finally:
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)
        await producer.close()
        await consumer.close()


# -- 2. outages seen by producers -----------------------------------------------------------


def test_offer_while_down_past_reconnect_timeout_raises(
    own_server7: EmbeddedRedis, prefix: str
) -> None:
    """Redis down for longer than reconnect_timeout: offer() raises RedisUnavailable (also a
    ConnectionError) after about reconnect_timeout, naming the queue; nothing was written."""
    with DelayQueue("down", own_server7.url, prefix=prefix, reconnect_timeout=0.5) as q:
        q.offer("warm-up")  # connections in the pool, script cached: all lost in the crash
        q.poll(timeout=0).ack()  # type: ignore[union-attr]
        own_server7.kill()
        started = time.monotonic()
        with pytest.raises(RedisUnavailable) as caught:
            q.offer("lost")
        elapsed = time.monotonic() - started
        assert isinstance(caught.value, ConnectionError)
        message = str(caught.value)
        assert "'down'" in message and "unreachable" in message.lower(), message
        assert 0.4 <= elapsed < 2.5, f"raised after {elapsed:.2f}s with reconnect_timeout=0.5"

        own_server7.start()
        assert empty_counts(q.stats()) == (0, 0, 0, 0, 0)  # the failed offer wrote nothing
        q.offer("works again")
        assert q.stats().delayed + q.stats().ready == 1


async def test_async_offer_while_down_past_reconnect_timeout_raises(
    own_server7: EmbeddedRedis, prefix: str
) -> None:
    async with AsyncDelayQueue("down", own_server7.url, prefix=prefix, reconnect_timeout=0.5) as q:
        await q.offer("warm-up")
        await asyncio.to_thread(own_server7.kill)
        started = time.monotonic()
        with pytest.raises(RedisUnavailable) as caught:
            await q.offer("lost")
        elapsed = time.monotonic() - started
        assert isinstance(caught.value, ConnectionError)
        assert "'down'" in str(caught.value) and "unreachable" in str(caught.value).lower()
        assert 0.4 <= elapsed < 2.5, f"raised after {elapsed:.2f}s with reconnect_timeout=0.5"
        await asyncio.to_thread(own_server7.start)
        stats = await q.stats()
        assert stats.delayed + stats.ready == 1  # only the warm-up task
        assert stats.counters["offered"] == 1


def test_offer_during_short_crash_is_retried_into_one_task(
    own_server: EmbeddedRedis, prefix: str, logs: pytest.LogCaptureFixture
) -> None:
    """offer() started while Redis is down keeps retrying; once Redis is back it returns and
    exactly one task exists."""
    with DelayQueue("retry", own_server.url, prefix=prefix, reconnect_timeout=15) as q:
        q.offer("warm-up")
        q.poll(timeout=0).ack()  # type: ignore[union-attr]
        own_server.kill()
        pending = in_thread(q.offer, "during outage")
        wait_until(lambda: logged(logs, "retry: Redis call failed"))
        assert not pending.done()
        own_server.start()
        task_id = pending.result(timeout=15)
        assert logged(logs, "retry: Redis reachable again")
        stats = q.stats()
        assert stats.delayed + stats.ready == 1
        assert stats.counters["offered"] == 2  # warm-up + this one, once
        info = q.get(task_id)
        assert info is not None and info.payload == "during outage"


def test_offer_whose_reply_is_lost_is_retried_into_one_task(
    own_server7: EmbeddedRedis,
    raw_factory: Callable[[str], redis.Redis],
    prefix: str,
    logs: pytest.LogCaptureFixture,
) -> None:
    """Redis hangs with an offer unread in its socket; the call times out and is sent again,
    then Redis wakes up and runs both copies: the task id makes the repeat a no-op."""
    raw = raw_factory(own_server7.url)
    client = redis.Redis.from_url(own_server7.url, socket_timeout=0.3)
    try:
        with DelayQueue("lostreply", client, prefix=prefix, reconnect_timeout=15) as q:
            q.offer("warm-up")
            q.poll(timeout=0).ack()  # type: ignore[union-attr]
            raw.config_resetstat()
            pending = _lost_reply_call(own_server7, logs, lambda: q.offer("once"))
            task_id = pending.result(timeout=15)
            calls = int(raw.info("commandstats")["cmdstat_evalsha"]["calls"])
            assert calls >= 2, "the offer was not sent twice: the reply was not lost"
            stats = q.stats()
            assert stats.delayed + stats.ready == 1, stats
            assert stats.counters["offered"] == 2, stats.counters  # warm-up + "once"
            info = q.get(task_id)
            assert info is not None and info.payload == "once"
            task = q.poll(timeout=1)
            assert task is not None and task.id == task_id
            task.ack()
            assert q.poll(timeout=0.2) is None
    finally:
        client.close()


def _lossy_client(server: EmbeddedRedis, kind: str) -> redis.Redis:
    """A client with a short socket timeout, so a frozen server makes calls time out."""
    if kind == "from-url":  # like the queue's own client: redis-py does not retry by itself
        return redis.Redis.from_url(server.url, socket_timeout=0.3)
    # what a user typically passes: redis-py's default Retry, which resends the same command
    return redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=0.3)


@pytest.mark.parametrize("client_kind", ["from-url", "user-client"])
def test_ack_whose_reply_is_lost_succeeds(
    own_server7: EmbeddedRedis,
    raw_factory: Callable[[str], redis.Redis],
    prefix: str,
    logs: pytest.LogCaptureFixture,
    client_kind: str,
) -> None:
    """The ack runs but its reply is lost and the very same call is sent again (by delayq's
    retry loop, or by redis-py's own Retry): ack() succeeds, it does not raise LeaseLost."""
    raw = raw_factory(own_server7.url)
    client = _lossy_client(own_server7, client_kind)
    try:
        with DelayQueue("ackloss", client, prefix=prefix, reconnect_timeout=15) as q:
            q.offer_many([("warm-up", 0), ("job", 0)])
            q.poll(timeout=0).ack()  # type: ignore[union-attr]  # ack script now cached
            task = q.poll(timeout=1)
            assert task is not None
            raw.config_resetstat()
            pending = _lost_reply_call(own_server7, logs, task.ack)
            pending.result(timeout=15)  # LeaseLost here: the resend was taken as a lost lease
            assert int(raw.info("commandstats")["cmdstat_evalsha"]["calls"]) >= 2, (
                "the ack was not sent twice: the reply was not lost"
            )
            stats = q.stats()
            assert empty_counts(stats) == (0, 0, 0, 0, 0)
            assert stats.counters["acked"] == 2
    finally:
        client.close()


@pytest.mark.parametrize("client_kind", ["from-url", "user-client"])
def test_retry_whose_reply_is_lost_succeeds(
    own_server7: EmbeddedRedis,
    raw_factory: Callable[[str], redis.Redis],
    prefix: str,
    logs: pytest.LogCaptureFixture,
    client_kind: str,
) -> None:
    """task.retry() runs but its reply is lost and the call is sent again: the caller is not
    told LeaseLost, the task is given back once and delivered again as attempt 2."""
    raw = raw_factory(own_server7.url)
    client = _lossy_client(own_server7, client_kind)
    try:
        with DelayQueue("nackloss", client, prefix=prefix, reconnect_timeout=15) as q:
            q.offer_many([("warm-up", 0), ("job", 0)])
            q.poll(timeout=0).retry(0)  # type: ignore[union-attr]  # nack script now cached
            first = q.poll(timeout=1)
            assert first is not None and first.attempts == 1
            raw.config_resetstat()
            pending = _lost_reply_call(own_server7, logs, lambda: first.retry(0.2))
            pending.result(timeout=15)
            assert int(raw.info("commandstats")["cmdstat_evalsha"]["calls"]) >= 2
            assert q.stats().counters["retried"] == 2  # warm-up + this one, once
            again: dict[str, Any] = {}
            deadline = time.monotonic() + 5
            while first.id not in again and time.monotonic() < deadline:
                tasks = q.poll_many(10, timeout=1)
                again.update((t.id, t) for t in tasks)
                assert all(q.ack_many(tasks))
            assert first.id in again and again[first.id].attempts == 2
            assert empty_counts(q.stats()) == (0, 0, 0, 0, 0)
    finally:
        client.close()


def test_fetch_whose_reply_is_lost_hands_out_the_same_lease(
    own_server7: EmbeddedRedis,
    raw_factory: Callable[[str], redis.Redis],
    prefix: str,
    logs: pytest.LogCaptureFixture,
) -> None:
    """A fetch that leased a task but whose reply was lost: the resend (same nonce) returns
    that very lease from the call's receipt, as attempt 1, instead of orphaning it."""
    raw = raw_factory(own_server7.url)
    client = redis.Redis.from_url(own_server7.url, socket_timeout=0.3)
    try:
        with DelayQueue(
            "fetchloss",
            client,
            prefix=prefix,
            reconnect_timeout=15,
            visibility_timeout=1,
            retry_backoff=Backoff(base=0.1, max=0.1, jitter=0),
        ) as q:
            assert q.poll(timeout=0) is None  # fetch script cached, listener up
            task_id = q.offer("job")
            raw.config_resetstat()
            pending = _lost_reply_call(own_server7, logs, lambda: q.poll(timeout=10))
            task = pending.result(timeout=15)
            assert int(raw.info("commandstats")["cmdstat_evalsha"]["calls"]) >= 2
            assert task is not None and task.id == task_id
            assert task.attempts == 1, "the resend leased the task again instead of recovering"
            info = q.get(task_id)
            assert info is not None and info.last_error is None
            task.ack()
            assert empty_counts(q.stats()) == (0, 0, 0, 0, 0)
    finally:
        client.close()


@pytest.mark.parametrize("operation", ["offer", "poll"])
def test_frozen_server_call_gives_up_within_its_timeout(
    own_server7: EmbeddedRedis, prefix: str, operation: str
) -> None:
    """Redis hangs (SIGSTOP: sockets open, no answer): offer() raises RedisUnavailable about
    reconnect_timeout (0.5 s) later, and poll(timeout=0.5) gives up about 0.5 s later."""
    with DelayQueue("frozen", own_server7.url, prefix=prefix, reconnect_timeout=0.5) as q:
        q.offer("warm-up")
        q.poll(timeout=0).ack()  # type: ignore[union-attr]
        freeze(own_server7)
        started = time.monotonic()
        try:
            if operation == "offer":
                with pytest.raises(RedisUnavailable):
                    q.offer("x")
            else:
                with contextlib.suppress(RedisUnavailable):  # giving up loudly is fine too
                    assert q.poll(timeout=0.5) is None
        finally:
            elapsed = time.monotonic() - started
            thaw(own_server7)
        assert elapsed < 2.0, f"{operation} blocked {elapsed:.1f}s against a frozen server"


async def test_async_frozen_server_offer_gives_up_within_reconnect_timeout(
    own_server7: EmbeddedRedis, prefix: str
) -> None:
    async with AsyncDelayQueue(
        "frozen", own_server7.url, prefix=prefix, reconnect_timeout=0.5
    ) as q:
        await q.offer("warm-up")
        freeze(own_server7)
        started = time.monotonic()
        try:
            with pytest.raises(RedisUnavailable):
                await q.offer("x")
        finally:
            elapsed = time.monotonic() - started
            thaw(own_server7)
        assert elapsed < 2.0, f"offer blocked {elapsed:.1f}s against a frozen server"


class Misbehaved(AssertionError):
    """The specific misbehaviour a BUG xfail documents (so no other failure passes as it)."""


def test_close_against_frozen_server_is_prompt_and_clean(
    own_server7: EmbeddedRedis, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() while Redis hangs returns at once, its listener thread ends without Redis
    answering again, and nothing crashes when it does answer."""
    crashes: list[Any] = []
    monkeypatch.setattr(threading, "excepthook", crashes.append)
    q = DelayQueue("frozenclose", own_server7.url, prefix=prefix)
    assert q.poll(timeout=0) is None  # listener thread subscribed
    name = f"delayq:pubsub:127.0.0.1:{own_server7.port}"  # the connection's pub/sub thread
    assert [t.name for t in delayq_threads()].count(name) == 1
    freeze(own_server7)
    try:
        started = time.monotonic()
        q.close()
        elapsed = time.monotonic() - started
        wait_until(lambda: name not in [t.name for t in delayq_threads()], timeout=3)
    finally:
        thaw(own_server7)
    client = redis.Redis.from_url(own_server7.url)
    try:
        wait_until(lambda: subscribers(client, q.keys.channel) == 0, timeout=5)
    finally:
        client.close()
    assert crashes == [], "the listener thread died of an unhandled exception"
    if elapsed >= 1.0:
        raise Misbehaved(f"close() took {elapsed:.1f}s against a frozen server")


async def test_async_close_against_frozen_server_is_prompt(
    own_server7: EmbeddedRedis, prefix: str
) -> None:
    q = AsyncDelayQueue("frozenclose", own_server7.url, prefix=prefix)
    assert await q.poll(timeout=0) is None  # listener task subscribed
    tasks_before = len(asyncio.all_tasks())
    freeze(own_server7)
    try:
        started = time.monotonic()
        await q.close()
        elapsed = time.monotonic() - started
    finally:
        thaw(own_server7)
    assert elapsed < 1.0, f"close() took {elapsed:.1f}s against a frozen server"
    assert len(asyncio.all_tasks()) == tasks_before - 1, "the listener task outlived close()"


# -- 3. lost wake-up messages ---------------------------------------------------------------


def _hide_announcements(monkeypatch: pytest.MonkeyPatch, producer: Any, prefix: str) -> str:
    """Make ``producer``'s offer script publish on a channel nobody's queue listens to: the
    task is written exactly as usual, only the wake-up message goes astray."""
    elsewhere = f"{prefix}:nobody-listens"
    keys = list(producer.keys.all)
    assert keys[-1] == producer.keys.channel
    monkeypatch.setattr(producer, "_key_list", (*keys[:-1], elsewhere))
    single = list(producer.keys.offer_one)
    assert single[-1] == producer.keys.channel
    monkeypatch.setattr(producer, "_offer_one_keys", (*single[:-1], elsewhere))
    return elsewhere


def _messages(pubsub: Any, timeout: float = 1.0) -> list[tuple[str, bytes]]:
    found = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.05)
        if message is not None:
            found.append((message["channel"].decode(), message["data"]))
    return found


@pytest.mark.parametrize("how", ["message-bypassed", "pubsub-killed"])
def test_lost_notification_caught_by_safety_interval(
    make_queue: Callable[..., DelayQueue],
    client: redis.Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """The sleeping consumer never hears of the new task; it still gets it no earlier than due
    and at most about one safety_interval (0.5 s) late."""
    consumer = make_queue(f"lost-{prefix}", safety_interval=0.5)
    producer = make_queue(f"lost-{prefix}")
    channel = consumer.keys.channel
    pending = in_thread(consumer.poll, 10)
    wait_until(lambda: subscribers(client, channel) == 1)
    spy = client.pubsub()
    try:
        if how == "message-bypassed":
            elsewhere = _hide_announcements(monkeypatch, producer, prefix)
            spy.subscribe(channel, elsewhere)
        else:
            [listener] = [
                c
                for c in client.client_list()
                if c["name"] == f"delayq:lost-{prefix}" and int(c.get("sub", 0)) > 0
            ]
            assert client.client_kill_filter(_id=listener["id"], _type="pubsub") == 1
        task_id = producer.offer("quiet", delay=0.3)

        task = pending.result(timeout=10)
        assert task is not None and task.id == task_id
        assert task.lateness_ms >= 0, "delivered before its due time"
        assert task.lateness_ms <= 1500, f"{task.lateness_ms} ms late"
        task.ack()
        if how == "message-bypassed":
            heard = _messages(spy, timeout=0.3)
            assert [ch for ch, _ in heard] == [elsewhere], "the message was not diverted"
        else:
            wait_until(lambda: subscribers(client, channel) == 1, timeout=5)  # resubscribed
    finally:
        spy.close()


async def test_async_lost_notification_caught_by_safety_interval(
    make_async_queue: Callable[..., AsyncDelayQueue],
    client: redis.Redis,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer = make_async_queue(f"lost-{prefix}", safety_interval=0.5)
    producer = make_async_queue(f"lost-{prefix}")
    _hide_announcements(monkeypatch, producer, prefix)
    pending = asyncio.create_task(consumer.poll(timeout=10))
    try:
        await eventually(lambda: subscribers(client, consumer.keys.channel) == 1)
        task_id = await producer.offer("quiet", delay=0.3)
        task = await asyncio.wait_for(pending, 10)
        assert task is not None and task.id == task_id
        assert 0 <= task.lateness_ms <= 1500, f"{task.lateness_ms} ms late"
        await task.ack()
    finally:
        pending.cancel()
        await asyncio.gather(pending, return_exceptions=True)


# -- 4. catching up after nobody ran --------------------------------------------------------


def test_tasks_due_while_no_client_runs_are_caught_up(
    redis_server: EmbeddedRedis, client: redis.Redis, prefix: str
) -> None:
    """Tasks fall due while every queue is closed; a consumer started later gets them all
    at once, without waiting."""
    n = 100
    with DelayQueue("offline", redis_server.url, prefix=prefix) as producer:
        ids = producer.offer_many([(i, 0.3) for i in range(n)])
        due_ms = round(producer.stats().next_due_at.timestamp() * 1000)  # type: ignore[union-attr]
    wait_until(lambda: server_ms(client) > due_ms + 300, timeout=5)

    with DelayQueue("offline", redis_server.url, prefix=prefix) as consumer:
        assert consumer.stats().ready == n
        started = time.monotonic()
        tasks = consumer.poll_many(1000, timeout=5)
        assert time.monotonic() - started < 1.0
        assert {t.id for t in tasks} == set(ids)
        assert all(t.lateness_ms >= 300 for t in tasks)
        assert all(consumer.ack_many(tasks))
        assert empty_counts(consumer.stats()) == (0, 0, 0, 0, 0)


async def test_async_tasks_due_while_no_client_runs_are_caught_up(
    redis_server: EmbeddedRedis, client: redis.Redis, prefix: str
) -> None:
    n = 100
    async with AsyncDelayQueue("offline", redis_server.url, prefix=prefix) as producer:
        ids = await producer.offer_many([(i, 0.3) for i in range(n)])
        stats = await producer.stats()
        due_ms = round(stats.next_due_at.timestamp() * 1000)  # type: ignore[union-attr]
    await eventually(lambda: server_ms(client) > due_ms + 300, timeout=5)

    async with AsyncDelayQueue("offline", redis_server.url, prefix=prefix) as consumer:
        started = time.monotonic()
        got = []
        for _ in range(n):  # one at a time this time: take() must not wait either
            got.append(await asyncio.wait_for(consumer.take(), 1))
        assert time.monotonic() - started < 1.0
        assert {t.id for t in got} == set(ids)
        assert all(t.lateness_ms >= 300 for t in got)
        assert all(await consumer.ack_many(got))
        assert empty_counts(await consumer.stats()) == (0, 0, 0, 0, 0)


# -- 5. skewed client clocks ----------------------------------------------------------------


def _skew_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    real_time, real_time_ns = time.time, time.time_ns
    # Ids made meanwhile carry the skewed time; forget it afterwards, or later tests' ids
    # would keep counting from there.
    monkeypatch.setattr(protocol, "_last_stamp", protocol._last_stamp)
    monkeypatch.setattr(time, "time", lambda: real_time() + seconds)
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() + int(seconds * 1e9))


@pytest.mark.parametrize("skew", [5.0, -5.0], ids=["ahead-5s", "behind-5s"])
def test_skewed_client_clock_changes_nothing(
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
    _skew_clock(monkeypatch, skew)
    assert abs(time.time() * 1000 - server_ms(client) - skew * 1000) < 500
    with DelayQueue("skew", redis7_server.url, prefix=prefix) as q:
        q.poll(timeout=0)  # listener up before the clock starts
        before = server_ms(client)
        task_id = q.offer({"skew": skew}, delay=1)
        offered = time.monotonic()
        after = server_ms(client)
        task = q.poll(timeout=5)
        waited = time.monotonic() - offered
        assert task is not None and task.id == task_id
        assert before + 1000 <= task.due_ms <= after + 1001, "due time not from the server clock"
        assert task.delivered_ms >= task.due_ms, "delivered early"
        assert task.lateness_ms < 1000, f"{task.lateness_ms} ms late"
        assert 0.9 <= waited < 2.0, f"delivered {waited:.2f}s after offer(delay=1)"
        task.ack()


@pytest.mark.parametrize("skew", [5.0, -5.0], ids=["ahead-5s", "behind-5s"])
async def test_async_skewed_client_clock_changes_nothing(
    redis7_server: EmbeddedRedis,
    raw_factory: Callable[[str], redis.Redis],
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    skew: float,
) -> None:
    client = raw_factory(redis7_server.url)
    _skew_clock(monkeypatch, skew)
    assert abs(time.time() * 1000 - server_ms(client) - skew * 1000) < 500
    async with AsyncDelayQueue("skew", redis7_server.url, prefix=prefix) as q:
        await q.poll(timeout=0)
        before = server_ms(client)
        task_id = await q.offer({"skew": skew}, delay=1)
        offered = time.monotonic()
        after = server_ms(client)
        task = await q.poll(timeout=5)
        waited = time.monotonic() - offered
        assert task is not None and task.id == task_id
        assert before + 1000 <= task.due_ms <= after + 1001
        assert 0 <= task.lateness_ms < 1000
        assert 0.9 <= waited < 2.0
        await task.ack()
