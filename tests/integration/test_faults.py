"""Fault tolerance against real redis-server processes: crashes and restarts, calls whose
reply is lost, frozen servers. The faults both front ends meet the same way (a consumer
blocked across a restart, outages, lost wake-up messages, tasks falling due while nobody
runs, skewed clocks) are in _async/test_faults.py, with the sync twin generated from it.

Tests that kill, freeze or restart a server make their own :class:`EmbeddedRedis` (AOF with
``appendfsync always``); the shared session servers are only used by tests that leave them be.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest
import redis

from delayq import AsyncDelayQueue, Backoff, DelayQueue
from delayq.embedded import EmbeddedRedis
from tests.faults_support import empty_counts, freeze, logged, server_ms, subscribers, thaw
from tests.helpers import delayq_threads, wait_until

pytest_plugins = ["tests.faults_support"]

# -- helpers --------------------------------------------------------------------------------


def in_thread(fn: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run a blocking call in its own thread; the result is waited on with a timeout."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-consumer")
    future = executor.submit(fn, *args)
    executor.shutdown(wait=False)
    return future


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
                logged(logs, "unavailable", "imeout")
                # redis-py's Retry logs a failed try: "Operation failed" up to 8.1, then
                # "TimeoutError received for command ..."
                or any(
                    "Operation failed" in r.getMessage() or "received for command" in r.getMessage()
                    for r in logs.records
                )
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
        wait_until(lambda: logged(logs, f"Redis at {own_server.url} unavailable"))
        assert not pending.done()
        own_server.start()
        task_id = pending.result(timeout=15)
        assert logged(logs, f"Redis at {own_server.url} available again")
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


# -- 2. a frozen server ----------------------------------------------------------------------


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
