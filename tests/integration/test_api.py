"""The public API against real Redis (7 and 6.2, via the ``redis_server`` fixture).

Most tests are written once, with ``await``, and run on both front ends: the ``queue``
factory gives an ``AsyncDelayQueue`` or a sync ``DelayQueue`` behind a thin adapter that runs
each call in a worker thread (so a blocking ``poll`` never blocks the event loop, and a
background consumer can wait while the test produces). Nothing about the database is mocked.

Timing rules: "not early" is asserted strictly on the server's clock (the one delayq uses);
"not late" with generous bounds; waiting is on conditions, never on bare sleeps.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pydantic
import pytest
import redis
import redis.asyncio as aioredis

import delayq
from delayq import (
    AsyncDelayQueue,
    AsyncTask,
    Backoff,
    ConfigError,
    DeadTask,
    DelayQueue,
    EncodeError,
    InvalidDelay,
    InvalidTaskError,
    LeaseLost,
    Offer,
    PayloadTooLarge,
    QueueClosed,
    Task,
    TaskInfo,
    TaskState,
)

# -- adapters and helpers ---------------------------------------------------------------------


class Threaded:
    """Runs a sync DelayQueue (or Task) in a worker thread behind an awaitable interface."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not inspect.ismethod(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            result = await asyncio.to_thread(attr, *map(_unwrap, args), **kwargs)
            return _wrap(result)

        return call

    def __repr__(self) -> str:
        return f"Threaded({self._target!r})"


def _wrap(value: Any) -> Any:
    if isinstance(value, Task):
        return Threaded(value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    return value


def _unwrap(value: Any) -> Any:
    if isinstance(value, Threaded):
        return value._target
    if isinstance(value, list):
        return [_unwrap(v) for v in value]
    return value


@pytest.fixture(params=["sync", "async"])
def flavor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def queue(flavor: str, make_queue: Any, make_async_queue: Any) -> Callable[..., Any]:
    """Factory of queues of the test's flavor, on the test's server and key prefix."""
    if flavor == "async":
        return make_async_queue  # type: ignore[no-any-return]

    def make(name: str = "q", **options: Any) -> Threaded:
        return Threaded(make_queue(name, **options))

    return make


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout: float = 10.0, interval: float = 0.01
) -> Any:
    """Await ``check()`` until it is truthy (the async twin of helpers.wait_until)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


def server_ms(client: redis.Redis) -> int:
    """The Redis server's clock (the one delayq schedules by), in epoch ms."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def ms(dt: datetime | None) -> int:
    assert dt is not None
    return round(dt.timestamp() * 1000)


def stored_keys(client: redis.Redis, prefix: str) -> list[bytes]:
    return sorted(client.keys(f"{prefix}*"))  # a private test server: KEYS is fine


async def counts(q: Any) -> tuple[int, int, int, int]:
    s = await q.stats()
    return s.delayed, s.ready, s.inflight, s.dead


FAST = Backoff(base=0.05, max=0.2)
FAST_EXACT = Backoff(base=0.02, max=0.05, jitter=0)


# -- offer / get / states ---------------------------------------------------------------------


async def test_task_info_follows_the_task_through_its_states(queue, client) -> None:
    q = queue(visibility_timeout=5)
    before = server_ms(client)
    task_id = await q.offer({"order": 1}, 0.2, priority=3, headers={"trace": "t-1"}, key="order:1")
    after = server_ms(client)
    assert isinstance(task_id, str) and len(task_id) == 14

    info = await q.get(task_id)
    assert isinstance(info, TaskInfo)
    assert info.id == task_id
    assert info.state is TaskState.DELAYED
    assert info.payload == {"order": 1}
    assert info.attempts == 0
    assert info.priority == 3
    assert dict(info.headers) == {"trace": "t-1"}
    assert info.key == "order:1"
    assert before + 200 <= ms(info.due_at) <= after + 200 + 1  # +1: from the next whole ms
    assert info.due_at.tzinfo is not None
    assert info.lease_expires_at is None and info.dead_at is None
    assert info.expires_at is None and info.last_error is None

    ready = await eventually(
        lambda: _state_is(q, task_id, TaskState.READY), timeout=5, interval=0.02
    )
    assert server_ms(client) >= before + 200  # never reported ready early
    assert ready.due_at == info.due_at

    task = await q.poll(timeout=5)
    assert task.id == task_id and task.attempts == 1
    assert task.payload == {"order": 1} and task.priority == 3 and task.key == "order:1"
    assert dict(task.headers) == {"trace": "t-1"}
    assert task.due_ms == ms(info.due_at)
    assert task.delivered_ms >= task.due_ms
    assert task.due_at == info.due_at
    assert task.lateness_ms == task.delivered_ms - task.due_ms >= 0
    assert task.lease_token

    inflight = await q.get(task_id)
    assert inflight.state is TaskState.INFLIGHT
    assert inflight.attempts == 1
    assert inflight.due_at is None
    assert ms(inflight.lease_expires_at) == task.delivered_ms + 5000
    assert inflight.payload == {"order": 1}

    await task.ack()
    assert await q.get(task_id) is None
    stats = await q.stats()
    assert stats.total == 0
    assert stats.counters["offered"] == 1
    assert stats.counters["delivered"] == 1
    assert stats.counters["acked"] == 1


async def _state_is(q: Any, task_id: str, state: TaskState) -> TaskInfo | None:
    info = await q.get(task_id)
    return info if info is not None and info.state is state else None


async def test_get_unknown_task_is_none(queue) -> None:
    q = queue()
    assert await q.get("no-such-task") is None


async def test_dead_task_info(queue, client) -> None:
    q = queue()
    task_id = await q.offer("p")
    task = await q.poll(timeout=5)
    before = server_ms(client)
    await q.reject(task, "not today")
    info = await q.get(task_id)
    assert info.state is TaskState.DEAD
    assert info.last_error == "not today"
    assert info.attempts == 1
    assert info.payload == "p"
    assert before <= ms(info.dead_at) <= server_ms(client)
    assert info.due_at is None and info.lease_expires_at is None


async def test_offer_at_datetime_and_epoch_seconds(queue, client) -> None:
    q = queue()
    now = server_ms(client)
    when = datetime.fromtimestamp((now + 60_000) / 1000, UTC)
    a = await q.offer("dt", at=when)
    b = await q.offer("epoch", at=(now + 120_000) / 1000)
    c = await q.offer("td", timedelta(minutes=3))
    assert ms((await q.get(a)).due_at) == now + 60_000
    assert ms((await q.get(b)).due_at) == now + 120_000
    assert abs(ms((await q.get(c)).due_at) - (now + 180_000)) < 2000
    past = await q.offer("past", at=now / 1000 - 10)
    task = await q.poll(timeout=5)
    assert task.id == past
    assert task.due_ms == now - 10_000


async def test_take_waits_for_a_due_task(queue) -> None:
    q = queue()
    task_id = await q.offer("x", 0.05)
    task = await asyncio.wait_for(q.take(), 10)
    assert task.id == task_id
    assert task.delivered_ms >= task.due_ms
    await task.ack()


async def test_poll_times_out_with_none(queue) -> None:
    q = queue()
    await q.offer("later", 60)
    started = time.monotonic()
    assert await q.poll(timeout=0.1) is None
    elapsed = time.monotonic() - started
    assert 0.1 <= elapsed < 2
    assert await q.poll() is None  # timeout 0: one look
    assert await q.poll_many(10) == []


async def test_poll_many_returns_due_tasks_in_due_order(queue, client) -> None:
    q = queue()
    now = server_ms(client) / 1000
    ids = [await q.offer(i, at=now - 10 + i) for i in range(5)]
    await q.offer("not yet", 60)
    tasks = await q.poll_many(10, timeout=5)
    assert [t.id for t in tasks] == ids
    assert len({t.lease_token for t in tasks}) == 5
    assert await q.ack_many(tasks) == [True] * 5
    assert await counts(q) == (1, 0, 0, 0)


async def test_sleeping_consumer_is_woken_by_an_earlier_offer(queue, client) -> None:
    consumer = queue(safety_interval=30)
    producer = queue()
    await producer.offer("far", 60)
    waiting = asyncio.create_task(consumer.poll(timeout=8))
    channel = consumer.keys.channel
    await eventually(lambda: _subscribed(client, channel), timeout=5)
    before = server_ms(client)
    task_id = await producer.offer("soon", 0.1)
    task = await asyncio.wait_for(waiting, 10)
    assert task is not None and task.id == task_id
    assert task.due_ms >= before + 100
    assert task.delivered_ms >= task.due_ms
    assert task.lateness_ms < 1000  # woken by the announcement, not by the 8 s timeout


async def _subscribed(client: redis.Redis, channel: str) -> bool:
    return bool(client.pubsub_numsub(channel)[0][1])


# -- cancel / reschedule ----------------------------------------------------------------------


async def test_cancel_waiting_task(queue) -> None:
    q = queue()
    delayed = await q.offer("a", 60)
    ready = await q.offer("b")
    assert await q.cancel(delayed) is True
    assert await q.cancel(delayed) is False
    assert await q.cancel(ready) is True
    assert await q.get(delayed) is None and await q.get(ready) is None
    assert await q.poll() is None
    stats = await q.stats()
    assert stats.total == 0
    assert stats.counters["cancelled"] == 2
    assert await q.cancel("unknown-id") is False


async def test_cannot_cancel_in_flight_or_dead_task(queue) -> None:
    q = queue()
    task_id = await q.offer("a")
    task = await q.poll(timeout=5)
    assert await q.cancel(task_id) is False
    assert (await q.get(task_id)).state is TaskState.INFLIGHT
    await q.reject(task, "x")
    assert await q.cancel(task_id) is False
    assert (await q.get(task_id)).state is TaskState.DEAD


async def test_reschedule_earlier_is_delivered_at_the_new_time(queue, client) -> None:
    consumer = queue(safety_interval=30)
    q = queue()
    task_id = await q.offer("x", 60)
    waiting = asyncio.create_task(consumer.poll(timeout=8))
    await eventually(lambda: _subscribed(client, consumer.keys.channel), timeout=5)
    before = server_ms(client)
    assert await q.reschedule(task_id, 0.15) is True
    after = server_ms(client)
    info = await q.get(task_id)
    assert before + 150 <= ms(info.due_at) <= after + 150 + 1
    task = await asyncio.wait_for(waiting, 10)
    assert task is not None and task.id == task_id
    assert task.due_ms == ms(info.due_at)
    assert task.delivered_ms >= task.due_ms  # not early
    assert task.lateness_ms < 1000  # not late


async def test_reschedule_later_and_to_an_absolute_time(queue, client) -> None:
    q = queue()
    task_id = await q.offer("x", 0.1)
    now = server_ms(client)
    assert await q.reschedule(task_id, timedelta(seconds=60)) is True
    assert abs(ms((await q.get(task_id)).due_at) - (now + 60_000)) < 2000
    assert await q.poll(timeout=0.15) is None
    when = datetime.fromtimestamp((now + 90_000) / 1000, UTC)
    assert await q.reschedule(task_id, at=when) is True
    info = await q.get(task_id)
    assert ms(info.due_at) == now + 90_000 and info.state is TaskState.DELAYED
    assert await q.reschedule(task_id, at=(now - 1000) / 1000) is True
    task = await q.poll(timeout=5)
    assert task.id == task_id and task.due_ms == now - 1000


async def test_reschedule_keeps_priority_and_ttl_span(queue, client) -> None:
    q = queue()
    task_id = await q.offer("x", 60, priority=7, ttl=30)
    info = await q.get(task_id)
    span = ms(info.expires_at) - ms(info.due_at)
    assert span == 30_000
    assert await q.reschedule(task_id, 120) is True
    moved = await q.get(task_id)
    assert moved.priority == 7
    assert ms(moved.expires_at) - ms(moved.due_at) == span


async def test_reschedule_unknown_in_flight_or_dead_is_false(queue) -> None:
    q = queue()
    assert await q.reschedule("unknown-id", 1) is False
    task_id = await q.offer("x")
    task = await q.poll(timeout=5)
    assert await q.reschedule(task_id, 1) is False
    assert (await q.get(task_id)).state is TaskState.INFLIGHT
    await q.reject(task, "x")
    assert await q.reschedule(task_id, 1) is False
    assert (await q.get(task_id)).state is TaskState.DEAD


# -- ids and dedup keys -----------------------------------------------------------------------


async def test_caller_chosen_id_makes_a_repeated_offer_a_no_op(queue) -> None:
    q = queue()
    assert await q.offer("first", 60, id="job-1") == "job-1"
    assert await q.offer("first", 1, id="job-1") == "job-1"  # the same task again: kept
    with pytest.raises(delayq.TaskIdConflict):  # another task under that id: reported
        await q.offer("second", 1, id="job-1")
    info = await q.get("job-1")
    assert info.payload == "first"
    assert await counts(q) == (1, 0, 0, 0)
    assert (await q.stats()).counters["offered"] == 1
    # also while the task is in flight: no second copy appears
    await q.reschedule("job-1", 0)
    task = await q.poll(timeout=5)
    assert await q.offer("first", id="job-1") == "job-1"
    assert await counts(q) == (0, 0, 1, 0)
    await task.ack()


async def test_dedup_keep_returns_the_existing_task(queue) -> None:
    q = queue()
    first = await q.offer({"v": 1}, 60, key="user:7")
    again = await q.offer({"v": 2}, 1, key="user:7")
    assert again == first
    info = await q.get(first)
    assert info.payload == {"v": 1} and info.key == "user:7"
    assert await counts(q) == (1, 0, 0, 0)
    # in flight, the key is still held
    await q.reschedule(first, 0)
    task = await q.poll(timeout=5)
    assert await q.offer({"v": 3}, key="user:7") == first
    assert await counts(q) == (0, 0, 1, 0)
    await task.ack()


async def test_dedup_replace_updates_a_pending_task(queue, client) -> None:
    q = queue()
    kw = {"dedup": "replace"}
    first = await q.offer({"v": 1}, 60, key="user:7", **kw)
    before = server_ms(client)
    again = await q.offer({"v": 2}, 0.1, key="user:7", priority=4, headers={"h": "2"}, **kw)
    after = server_ms(client)
    assert again == first
    info = await q.get(first)
    assert info.payload == {"v": 2}
    assert info.priority == 4 and dict(info.headers) == {"h": "2"}
    assert before + 100 <= ms(info.due_at) <= after + 100 + 1
    stats = await q.stats()
    assert (stats.total, stats.inflight) == (1, 0)
    task = await q.poll(timeout=5)
    assert task.id == first and task.payload == {"v": 2}
    assert task.delivered_ms >= task.due_ms >= before + 100
    # an in-flight task is not replaced
    assert await q.offer({"v": 3}, key="user:7", **kw) == first
    assert (await q.get(first)).payload == {"v": 2}
    assert await counts(q) == (0, 0, 1, 0)
    await task.ack()


async def test_dedup_mode_set_on_the_queue_and_overridden_per_call(queue, client) -> None:
    q = queue(dedup="replace")
    first = await q.offer("a", 60, key="k")
    now = server_ms(client)
    assert await q.offer("b", at=(now + 90_000) / 1000, key="k") == first  # replaced
    info = await q.get(first)
    assert info.payload == "b" and ms(info.due_at) == now + 90_000
    assert await q.offer("c", 1, key="k", dedup="keep") == first  # kept
    info = await q.get(first)
    assert info.payload == "b" and ms(info.due_at) == now + 90_000
    assert (await q.stats()).total == 1


@pytest.mark.parametrize("how", ["ack", "cancel", "dead", "max_attempts"])
async def test_dedup_key_is_released_when_the_task_ends(queue, how: str) -> None:
    q = queue(max_attempts=1)
    first = await q.offer("a", key="k")
    if how == "cancel":
        assert await q.cancel(first)
    else:
        task = await q.poll(timeout=5)
        if how == "ack":
            await task.ack()
        elif how == "dead":
            await q.reject(task, "bad")
        else:
            await task.retry(error="fails")
            assert (await q.get(first)).state is TaskState.DEAD
    second = await q.offer("b", 60, key="k")
    assert second != first
    assert (await q.get(second)).payload == "b"
    assert await q.offer("c", key="k") == second


async def test_key_ttl_keeps_the_key_blocked_after_ack(queue, client) -> None:
    q = queue()
    first = await q.offer("a", key="k", key_ttl=0.3)
    task = await q.poll(timeout=5)
    acked_at = server_ms(client)
    await task.ack()
    assert await q.get(first) is None
    assert await q.offer("b", key="k") == first  # still blocked: nothing scheduled
    assert await counts(q) == (0, 0, 0, 0)

    async def offered_anew() -> str | None:
        task_id = await q.offer("c", 60, key="k")
        return task_id if task_id != first else None

    second = await eventually(offered_anew, timeout=5, interval=0.02)
    assert server_ms(client) >= acked_at + 300  # the window did not close early
    assert (await q.get(second)).payload == "c"
    assert await counts(q) == (1, 0, 0, 0)


async def test_the_same_offer_with_its_own_id_after_the_task_finished_is_existing(
    queue,
) -> None:
    """A producer's late retry of an offer with its own id and a key kept after the task
    finished (what key_ttl is for) finds the task done, not a conflict (before:
    TaskIdConflict, "held by a task with other content", though no task held it)."""
    q = queue()
    first = await q.offer({"n": 1}, id="order-1", key="order-1", key_ttl=60)
    task = await q.poll(timeout=5)
    assert task is not None and task.id == "order-1"
    await task.ack()
    again = await q.offer({"n": 1}, id="order-1", key="order-1", key_ttl=60)
    assert again == first and again.outcome == "existing"
    assert await counts(q) == (0, 0, 0, 0)  # not run twice


async def test_at_most_once_keyed_tasks_fetched_ahead_go_back_on_close(queue) -> None:
    """At-most-once, a take() loop fetches ahead; close() puts back what it never handed
    out. Tasks with a key kept after them (key_ttl: their fetch finished them) are put back
    too, their keys theirs again (before: deduplicated away, lost without a word)."""
    producer = queue()
    await producer.offer_many([Offer(i, 0, key=f"k{i}", key_ttl=300) for i in range(20)])
    consumer = queue(ack=False)
    handed = [(await consumer.take()).payload for _ in range(4)]  # the rest fetched ahead
    await consumer.close()
    drainer = queue(ack=False)
    rest = []
    while (task := await drainer.poll(timeout=3)) is not None:
        rest.append(task.payload)
    assert sorted(handed + rest) == list(range(20))


async def test_key_ttl_does_not_block_after_cancel(queue) -> None:
    q = queue()
    first = await q.offer("a", 60, key="k", key_ttl=60)
    assert await q.cancel(first)
    assert await q.offer("b", 60, key="k") != first


async def test_dedup_key_within_one_batch(queue) -> None:
    q = queue()
    ids = await q.offer_many([Offer("a", 60, key="k"), Offer("b", 60, key="k"), ("c", 60)])
    assert ids[0] == ids[1] != ids[2]
    assert await counts(q) == (2, 0, 0, 0)


async def test_requeued_task_holds_its_dedup_key_again(queue) -> None:
    q = queue()
    first = await q.offer("a", key="k")
    task = await q.poll(timeout=5)
    await q.reject(task, "oops")
    assert await q.requeue_dead(first) == 1
    assert (await q.get(first)).key == "k"
    assert await q.offer("b", key="k") == first  # at most one live task holds the key
    assert (await q.stats()).total == 1


async def test_requeue_leaves_a_task_dead_while_another_holds_its_key(queue) -> None:
    q = queue()
    first = await q.offer("a", key="k")
    await q.reject(await q.poll(timeout=5), "oops")
    second = await q.offer("b", key="k")  # the dead task no longer holds the key
    assert second != first
    assert await q.requeue_dead(first) == 0
    assert await q.requeue_dead() == 0
    assert (await q.get(first)).state is TaskState.DEAD
    await (await q.poll(timeout=5)).ack()  # the second one finishes: the key is free
    assert await q.requeue_dead() == 1
    assert (await q.get(first)).state is TaskState.READY
    assert await q.offer("c", key="k") == first


async def test_requeue_leaves_a_task_dead_while_a_finished_task_keeps_its_key(queue) -> None:
    """key_ttl: a finished task keeps its key that long (an offer of the key is answered as
    that task), so a dead task of the same key stays dead meanwhile, as it does beside a live
    holder (before: requeued, it ran the business event the other task had done)."""
    q = queue()
    first = await q.offer("a", key="k")
    await q.reject(await q.poll(timeout=5), "oops")
    second = await q.offer("b", key="k", key_ttl=3)
    await (await q.poll(timeout=5)).ack()
    assert await q.offer("c", key="k") == second  # kept: answered as the finished task
    assert await q.requeue_dead(first) == 0
    assert await q.requeue_dead() == 0
    assert (await q.get(first)).state is TaskState.DEAD
    deadline = time.monotonic() + 15
    while await q.requeue_dead(first) == 0:  # the keep-window closes: the key is free
        assert time.monotonic() < deadline, "still not requeued after the key_ttl"
        await asyncio.sleep(0.1)
    assert (await q.get(first)).state is TaskState.READY
    assert await q.offer("d", key="k") == first


# -- priority, headers, ttl -------------------------------------------------------------------


async def test_priority_orders_tasks_due_at_the_same_time(queue, client) -> None:
    q = queue()
    at = (server_ms(client) + 100) / 1000
    order = [3, 9, 0, 5, 9, 1, 7, 0]
    ids = [await q.offer(f"p{p}-{i}", at=at, priority=p) for i, p in enumerate(order)]
    tasks = await q.poll_many(20, timeout=5)
    if len(tasks) < len(ids):  # (all are due in the same ms, but be lenient on batching)
        tasks += await q.poll_many(20, timeout=5)
    assert len(tasks) == len(ids)
    assert [t.priority for t in tasks] == sorted(order, reverse=True)
    # equal priority and due time: first offered, first out
    nines = [t.id for t in tasks if t.priority == 9]
    assert nines == [ids[1], ids[4]]
    zeros = [t.id for t in tasks if t.priority == 0]
    assert zeros == [ids[2], ids[7]]
    for t in tasks:
        assert t.due_ms == round(at * 1000)
        assert t.delivered_ms >= t.due_ms


async def test_priority_does_not_beat_an_earlier_due_time(queue, client) -> None:
    q = queue()
    now = server_ms(client) / 1000
    low = await q.offer("low", at=now - 2, priority=0)
    high = await q.offer("high", at=now - 1, priority=9)
    assert [t.id for t in await q.poll_many(2, timeout=5)] == [low, high]


async def test_headers_round_trip(queue) -> None:
    q = queue()
    headers = {"trace-id": "abc123", "ü": "✓", "empty": ""}
    task_id = await q.offer(None, headers=headers)
    assert dict((await q.get(task_id)).headers) == headers
    task = await q.poll(timeout=5)
    assert dict(task.headers) == headers
    assert task.payload is None
    no_headers = await q.offer(1)
    assert dict((await q.get(no_headers)).headers) == {}


async def test_ttl_drops_a_task_not_delivered_in_time(queue, client) -> None:
    q = queue()
    now = server_ms(client)
    stale = await q.offer("stale", at=(now - 5000) / 1000, ttl=1, key="k")
    info = await q.get(stale)
    assert ms(info.expires_at) == now - 4000
    fresh = await q.offer("fresh", at=(now - 4000) / 1000, ttl=60)
    task = await q.poll(timeout=5)
    assert task.id == fresh
    assert await q.poll() is None
    assert await q.get(stale) is None
    stats = await q.stats()
    assert stats.counters["expired"] == 1
    assert stats.total == 1  # the fresh one, in flight
    assert await q.offer("again", 60, key="k") != stale  # the key went with it
    await task.ack()


async def test_ttl_is_dropped_once_delivered(queue) -> None:
    q = queue()
    task_id = await q.offer("x", ttl=60)
    assert (await q.get(task_id)).expires_at is not None
    task = await q.poll(timeout=5)
    assert (await q.get(task_id)).expires_at is None
    await task.ack()
    assert "expired" not in (await q.stats()).counters


# -- offer_many -------------------------------------------------------------------------------


async def test_offer_many_tuples_and_offer_objects(queue, client) -> None:
    q = queue()
    now = server_ms(client)
    ids = await q.offer_many(
        [
            ("plain", 60),
            ("now", None),
            Offer("obj", at=(now + 90_000) / 1000, priority=2, headers={"a": "b"}, id="mine"),
            Offer({"k": 1}, timedelta(seconds=30), key="dk", ttl=100),
        ]
    )
    assert len(ids) == 4 and ids[2] == "mine" and len(set(ids)) == 4
    infos = [await q.get(i) for i in ids]
    assert [i.payload for i in infos] == ["plain", "now", "obj", {"k": 1}]
    assert infos[1].state is TaskState.READY
    assert ms(infos[2].due_at) == now + 90_000
    assert infos[2].priority == 2 and dict(infos[2].headers) == {"a": "b"}
    assert infos[3].key == "dk" and infos[3].expires_at is not None
    assert await q.offer_many([]) == []
    assert await counts(q) == (3, 1, 0, 0)


async def test_offer_many_spanning_chunks(queue) -> None:
    q = queue()
    n = 2500
    mixed: list[Any] = []
    for i in range(n):
        mixed.append((i, 60) if i % 2 else Offer(i, 60, id=f"id-{i:05d}"))
    ids = await q.offer_many(mixed)
    assert len(ids) == n and len(set(ids)) == n
    assert all(ids[i] == f"id-{i:05d}" for i in range(0, n, 2))
    stats = await q.stats()
    assert stats.delayed == n
    assert stats.counters["offered"] == n
    for i in (0, 999, 1000, 1001, 1999, 2000, 2499):
        assert (await q.get(ids[i])).payload == i


async def test_offer_many_applies_its_chunks_in_order(queue) -> None:
    q = queue()
    bulky = [("x" * 4000, 60)] * 999  # a large first chunk, a one-item second chunk
    for attempt in range(4):
        key = f"k{attempt}"
        ids = await q.offer_many([Offer("first", 60, key=key), *bulky, Offer("last", 60, key=key)])
        assert ids[1000] == ids[0]
        assert (await q.get(ids[0])).payload == "first", f"attempt {attempt}"


async def test_offer_many_validates_everything_before_writing(queue, client, prefix) -> None:
    q = queue(max_payload_bytes=1000)
    for bad, error in [
        (("x", -1), InvalidDelay),
        (Offer("x", priority=10), InvalidTaskError),
        (Offer({1, 2}), EncodeError),
        (Offer("y" * 5000), PayloadTooLarge),
        (Offer("x", headers={"a": 1}), InvalidTaskError),  # type: ignore[dict-item]
    ]:
        items: list[Any] = [(i, 60) for i in range(2001)]
        items[2000] = bad  # in the third chunk: the first two must not have been written
        with pytest.raises(error):
            await q.offer_many(items)
        assert (await q.stats()).total == 0, bad
        assert stored_keys(client, prefix) == [], bad


async def test_offer_many_bad_dedup_mode_writes_nothing(queue, client, prefix) -> None:
    q = queue()
    with pytest.raises(ConfigError):
        await q.offer_many([("a", 1)], dedup="sometimes")
    assert stored_keys(client, prefix) == []


# -- at-most-once -----------------------------------------------------------------------------


async def test_at_most_once_take_removes_the_task(queue) -> None:
    q = queue(ack=False)
    task_id = await q.offer("once", key="k", key_ttl=60)
    task = await q.poll(timeout=5)
    assert task.id == task_id and task.payload == "once"
    assert task.lease_token is None and task.attempts == 1
    assert await q.get(task_id) is None
    assert await counts(q) == (0, 0, 0, 0)
    await task.ack()  # no-op
    await task.nack()  # no-op
    await task.retry(error="x")  # no-op
    await q.release(task)  # no-op
    await q.reject(task, "x")  # no-op
    assert await q.ack_many([task]) == [True]
    with pytest.raises(LeaseLost):
        await task.extend(5)
    assert await q.poll() is None  # never delivered again
    stats = await q.stats()
    assert stats.total == 0
    assert stats.counters["delivered"] == 1 and "acked" not in stats.counters
    assert await q.offer("twice", key="k") == task_id  # key_ttl still applies


# -- leases -----------------------------------------------------------------------------------


async def test_ack_after_lease_expiry_raises_lease_lost(queue, client) -> None:
    q = queue(visibility_timeout=0.1, retry_backoff=FAST)
    task_id = await q.offer("x")
    task = await q.poll(timeout=5)
    expiry = ms((await q.get(task_id)).lease_expires_at)
    assert expiry == task.delivered_ms + 100
    await eventually(lambda: _after(client, expiry))
    with pytest.raises(LeaseLost):
        await task.ack()
    again = await q.poll(timeout=5)  # the task was not lost: it comes back
    assert again.id == task_id and again.attempts == 2
    assert again.due_ms > expiry
    await again.ack()
    assert (await q.stats()).counters["lease_expired"] == 1


async def _after(client: redis.Redis, when_ms: int) -> bool:
    return server_ms(client) > when_ms


async def test_expired_lease_is_redelivered_to_another_consumer(queue) -> None:
    first = queue(visibility_timeout=0.1, retry_backoff=FAST)
    second = queue(visibility_timeout=5, retry_backoff=FAST)
    task_id = await first.offer({"n": 1})
    other_id = await first.offer({"n": 2}, 60)
    mine = await first.poll(timeout=5)
    assert mine.id == task_id and mine.attempts == 1
    theirs = await second.poll(timeout=5)
    assert theirs is not None
    assert theirs.id == task_id and theirs.attempts == 2
    assert theirs.payload == {"n": 1}
    assert theirs.lease_token != mine.lease_token
    info = await second.get(task_id)
    assert info.state is TaskState.INFLIGHT and info.attempts == 2
    assert info.last_error == "lease expired on attempt 1"

    with pytest.raises(LeaseLost):
        await mine.ack()
    with pytest.raises(LeaseLost):
        await mine.nack()
    with pytest.raises(LeaseLost):
        await mine.retry(error="late")
    with pytest.raises(LeaseLost):
        await mine.extend(10)
    with pytest.raises(LeaseLost):
        await first.release(mine)
    with pytest.raises(LeaseLost):
        await first.reject(mine, "late")
    assert await first.ack_many([mine]) == [False]
    # the stale consumer changed nothing
    info = await second.get(task_id)
    assert info.state is TaskState.INFLIGHT and info.attempts == 2
    assert info.last_error == "lease expired on attempt 1"

    await second.reschedule(other_id, 0)
    other = await second.poll(timeout=5)
    assert await second.ack_many([mine, theirs, other]) == [False, True, True]
    assert await second.get(task_id) is None
    assert (await second.stats()).total == 0
    with pytest.raises(LeaseLost):  # finished by the other consumer: still not ours to ack
        await mine.ack()
    with pytest.raises(LeaseLost):
        await mine.extend(1)


async def test_extend_keeps_a_task_from_redelivery(queue, client) -> None:
    q = queue(visibility_timeout=0.15, retry_backoff=FAST)
    other = queue(visibility_timeout=5)
    task_id = await q.offer("x")
    task = await q.poll(timeout=5)
    before = server_ms(client)
    new_expiry = await task.extend(5)
    after = server_ms(client)
    assert before + 5000 <= ms(new_expiry) <= after + 5000
    assert (await q.get(task_id)).lease_expires_at == new_expiry
    assert await other.poll(timeout=0.3) is None  # well past the original 0.15 s lease
    await task.ack()
    assert (await q.stats()).counters.get("lease_expired", 0) == 0
    with pytest.raises(LeaseLost):
        await task.extend(1)  # acked: no lease left


async def test_nack_without_delay_redelivers_at_once(queue, client) -> None:
    q = queue()
    task_id = await q.offer("x")
    task = await q.poll(timeout=5)
    before = server_ms(client)
    await task.nack()
    after = server_ms(client)
    again = await q.poll(timeout=5)
    assert again.id == task_id and again.attempts == 2
    assert before <= again.due_ms <= after
    assert (await q.stats()).counters["retried"] == 1
    await again.ack()


async def test_nack_with_delay(queue, client) -> None:
    q = queue()
    await q.offer("x")
    task = await q.poll(timeout=5)
    before = server_ms(client)
    await q.nack(task, 0.15)
    after = server_ms(client)
    again = await q.poll(timeout=5)
    assert before + 150 <= again.due_ms <= after + 150
    assert again.delivered_ms >= again.due_ms
    assert again.attempts == 2


async def test_giving_back_twice_counts_once(queue) -> None:
    q = queue(retry_backoff=Backoff(base=60, max=60))
    task_id = await q.offer("x")
    task = await q.poll(timeout=5)
    await task.retry(error="first")
    await task.retry(error="first")  # a resent call: recognised, not a lost lease
    info = await q.get(task_id)
    assert info.state is TaskState.DELAYED and info.attempts == 1
    assert (await q.stats()).counters["retried"] == 1
    with pytest.raises(LeaseLost):
        await task.ack()  # given back: no longer ours


async def test_release_does_not_count_an_attempt(queue) -> None:
    q = queue()
    task_id = await q.offer("x")
    task = await q.poll(timeout=5)
    await q.release(task)
    again = await q.poll(timeout=5)
    assert again.id == task_id and again.attempts == 1
    await again.ack()


async def test_retry_uses_the_backoff_policy(queue, client) -> None:
    q = queue(retry_backoff=FAST_EXACT, max_attempts=10)
    task_id = await q.offer("x")
    task = await q.poll(timeout=5)
    for attempt, expected in enumerate([20, 40, 50, 50], start=1):
        assert task.attempts == attempt
        before = server_ms(client)
        await task.retry(error=f"failure {attempt}")
        after = server_ms(client)
        info = await q.get(task_id)
        assert info.last_error == f"failure {attempt}"
        assert before + expected <= ms(info.due_at) <= after + expected
        task = await q.poll(timeout=5)
        assert task.id == task_id
        assert before + expected <= task.due_ms <= after + expected
        assert task.delivered_ms >= task.due_ms
    await task.ack()


async def test_retry_backoff_jitter_stays_within_bounds(queue, client) -> None:
    q = queue(retry_backoff=FAST)  # jitter 0.5: between half and all of the delay
    await q.offer("x")
    task = await q.poll(timeout=5)
    before = server_ms(client)
    await task.retry()
    after = server_ms(client)
    task = await q.poll(timeout=5)
    assert before + 25 <= task.due_ms <= after + 50


async def test_retry_with_explicit_delay(queue, client) -> None:
    q = queue(retry_backoff=Backoff(base=100, max=100))
    await q.offer("x")
    task = await q.poll(timeout=5)
    before = server_ms(client)
    await task.retry(0.05, error="soon")
    again = await q.poll(timeout=5)
    assert again.due_ms >= before + 50
    assert again.due_ms <= server_ms(client)


async def test_max_attempts_dead_letters_with_the_last_error(queue, client) -> None:
    q = queue(max_attempts=2, retry_backoff=FAST)
    task_id = await q.offer({"job": 1})
    task = await q.poll(timeout=5)
    await task.retry(error="boom 1")
    task = await q.poll(timeout=5)
    assert task.attempts == 2
    before = server_ms(client)
    await task.retry(error="boom 2")
    info = await q.get(task_id)
    assert info.state is TaskState.DEAD
    assert info.last_error == "boom 2" and info.attempts == 2
    assert await q.poll() is None
    dead = await q.dead()
    assert len(dead) == 1
    assert isinstance(dead[0], DeadTask)
    assert dead[0].id == task_id and dead[0].payload == {"job": 1}
    assert dead[0].attempts == 2 and dead[0].error == "boom 2"
    assert before <= ms(dead[0].dead_at) <= server_ms(client)
    stats = await q.stats()
    assert (stats.dead, stats.counters["dead_lettered"]) == (1, 1)


async def test_nack_counts_towards_max_attempts(queue) -> None:
    q = queue(max_attempts=2)
    task_id = await q.offer("x")
    await (await q.poll(timeout=5)).nack()
    await (await q.poll(timeout=5)).nack()
    assert (await q.get(task_id)).state is TaskState.DEAD


async def test_lease_expiring_on_the_last_attempt_dead_letters(queue, client) -> None:
    q = queue(max_attempts=1, visibility_timeout=0.1)
    task_id = await q.offer("x")
    task = await q.poll(timeout=5)
    await eventually(lambda: _after(client, task.delivered_ms + 100))
    assert await q.poll() is None  # this look collects the expired lease
    info = await q.get(task_id)
    assert info.state is TaskState.DEAD
    assert info.last_error == "lease expired on attempt 1"
    with pytest.raises(LeaseLost):
        await task.ack()


async def test_reject_dead_letters_at_once(queue) -> None:
    q = queue(max_attempts=10)
    task_id = await q.offer("x", priority=6)
    task = await q.poll(timeout=5)
    await q.reject(task, "invalid")
    info = await q.get(task_id)
    assert info.state is TaskState.DEAD and info.last_error == "invalid"
    assert info.attempts == 1 and info.priority == 6
    with pytest.raises(LeaseLost):
        await task.ack()


async def test_dead_lists_oldest_first_with_paging(queue) -> None:
    q = queue()
    ids = []
    for i in range(3):
        ids.append(await q.offer(i))
        await q.reject(await q.poll(timeout=5), f"e{i}")
    dead = await q.dead()
    assert [d.id for d in dead] == ids
    assert [d.error for d in dead] == ["e0", "e1", "e2"]
    assert [d.payload for d in dead] == [0, 1, 2]
    assert [d.id for d in await q.dead(limit=1, offset=1)] == [ids[1]]
    assert [d.id for d in await q.dead(limit=5, offset=2)] == [ids[2]]
    assert await q.dead(offset=3) == []


async def test_dead_with_limit_zero_lists_nothing(queue) -> None:
    q = queue()
    for i in range(2):
        await q.offer(i)
        await q.reject(await q.poll(timeout=5), "x")
    assert await q.dead(limit=0) == []


async def test_requeue_dead_one_and_all(queue) -> None:
    q = queue(max_attempts=2, retry_backoff=FAST)
    ids = []
    for i in range(3):
        task_id = await q.offer(i, priority=i)
        ids.append(task_id)
        task = await q.poll(timeout=5)
        await task.retry(error="fail")
        task = await q.poll(timeout=5)
        await task.retry(error="fail")
        assert (await q.get(task_id)).attempts == 2
    assert (await q.stats()).dead == 3

    assert await q.requeue_dead(ids[0]) == 1
    assert await q.requeue_dead(ids[0]) == 0  # no longer dead
    assert await q.requeue_dead("unknown-id") == 0
    info = await q.get(ids[0])
    assert info.state is TaskState.READY and info.attempts == 0
    task = await q.poll(timeout=5)
    assert task.id == ids[0] and task.attempts == 1 and task.payload == 0
    await task.ack()

    assert await q.requeue_dead() == 2
    assert await q.requeue_dead() == 0
    tasks = await q.poll_many(10, timeout=5)
    assert {t.id for t in tasks} == set(ids[1:])
    assert all(t.attempts == 1 for t in tasks)
    assert [t.priority for t in tasks] == [2, 1]  # priority survives the dead-letter queue
    stats = await q.stats()
    assert stats.dead == 0 and stats.counters["requeued"] == 3


# -- undecodable tasks ------------------------------------------------------------------------

GARBAGE = {
    "bytes": b"\xff\x00 not an envelope",
    "json": b'{"some": "other app"}',
    "version": b'{"v": 99, "p": 1}',
    "pickle": json.dumps({"v": 1, "c": "pickle", "p": "gARLAS4="}).encode(),
}


def _plant(client: redis.Redis, q: Any, task_id: str, envelope: bytes, due_ms: int) -> None:
    """Write a task straight into the queue's keys, as another program might have."""
    client.hset(q.keys.key("tasks"), task_id, envelope)
    client.zadd(q.keys.key("delayed"), {task_id: due_ms * 10 + 9})  # priority 0 slot


@pytest.mark.parametrize("ack", [True, False], ids=["leased", "at-most-once"])
@pytest.mark.parametrize("kind", sorted(GARBAGE))
async def test_undecodable_task_is_dead_lettered_and_consuming_goes_on(
    queue, client, ack: bool, kind: str
) -> None:
    q = queue(ack=ack)
    now = server_ms(client)
    _plant(client, q, "bad-1", GARBAGE[kind], now - 1000)
    good = await q.offer({"ok": True})
    task = await q.poll(timeout=5)
    assert task is not None and task.id == good and task.payload == {"ok": True}
    await task.ack()

    dead = await q.dead()
    assert [d.id for d in dead] == ["bad-1"]
    assert dead[0].error is not None and dead[0].error.startswith("undecodable")
    assert dead[0].payload == GARBAGE[kind]  # the raw bytes stay visible
    info = await q.get("bad-1")
    assert info.state is TaskState.DEAD and info.payload is None
    assert info.last_error.startswith("undecodable")
    stats = await q.stats()
    assert stats.counters["decode_failures"] == 1
    assert (stats.delayed, stats.ready, stats.inflight, stats.dead) == (0, 0, 0, 1)


@pytest.mark.parametrize("ack", [True, False], ids=["leased", "at-most-once"])
async def test_deeply_nested_task_is_dead_lettered(queue, client, ack: bool) -> None:
    q = queue(ack=ack)
    depth = 100_000
    _plant(client, q, "deep", b'{"v":1,"p":' + b"[" * depth + b"]" * depth + b"}", 0)
    good = await q.offer("ok")
    task = await q.poll(timeout=5)
    assert task.id == good
    dead = await q.dead()
    assert [d.id for d in dead] == ["deep"]
    assert dead[0].error.startswith("undecodable")


# -- codecs and typed payloads ---------------------------------------------------------------


@dataclass
class Reminder:
    user_id: int
    text: str
    when: datetime


class Refund(pydantic.BaseModel):
    order_id: int
    amount_cents: int


TYPED = {
    "dataclass": (Reminder, Reminder(7, "call back", datetime(2024, 1, 2, 3, 4, tzinfo=UTC))),
    "pydantic": (Refund, Refund(order_id=7, amount_cents=1250)),
}


@pytest.mark.parametrize("kind", sorted(TYPED))
async def test_typed_payloads_round_trip(queue, kind: str) -> None:
    cls, payload = TYPED[kind]
    q = queue(payload_type=cls)
    task_id = await q.offer(payload)
    assert (await q.get(task_id)).payload == payload
    task = await q.poll(timeout=5)
    assert type(task.payload) is cls and task.payload == payload
    await task.ack()
    with pytest.raises(EncodeError):
        await q.offer({"order_id": 7, "amount_cents": 1})  # plain data is not the type
    assert (await q.stats()).total == 0


async def test_typed_queue_dead_letters_a_task_of_another_shape(queue, client) -> None:
    plain = queue()
    typed = queue(payload_type=Reminder)  # the same queue, read as Reminders
    bad = await plain.offer({"unrelated": True}, at=server_ms(client) / 1000 - 5)
    good = await typed.offer(TYPED["dataclass"][1])
    task = await typed.poll(timeout=5)
    assert task.id == good
    dead = await typed.dead()
    assert [d.id for d in dead] == [bad]
    assert "does not fit" in dead[0].error and dead[0].error.startswith("undecodable")
    info = await typed.get(bad)
    assert info.state is TaskState.DEAD and info.payload is None
    assert (await plain.get(bad)).payload == {"unrelated": True}  # plain readers still can


async def test_msgpack_and_pickle_queues_round_trip(queue) -> None:
    packed = queue("packed", codec="msgpack")
    payload = {"blob": b"\x00\xff", 1: "int key", "n": [1.5, None]}
    await packed.offer(payload)
    assert (await packed.poll(timeout=5)).payload == payload
    pickled = queue("pickled", codec="pickle")
    payload = {"set": {1, 2}, "when": datetime(2024, 1, 2, tzinfo=UTC), "tuple": (1, 2)}
    task_id = await pickled.offer(payload)
    assert (await pickled.get(task_id)).payload == payload
    assert (await pickled.poll(timeout=5)).payload == payload


async def test_json_queue_reads_msgpack_tasks_but_refuses_pickled_ones(queue, client) -> None:
    reader = queue()
    packed = await queue(codec="msgpack").offer({"m": b"\x01"})
    pickled = await queue(codec="pickle").offer({1, 2}, at=server_ms(client) / 1000 - 5)
    task = await reader.poll(timeout=5)  # buries the pickled task on the way
    assert task.id == packed and task.payload == {"m": b"\x01"}
    assert await reader.poll() is None
    dead = await reader.dead()
    assert [d.id for d in dead] == [pickled]
    assert "pickle" in dead[0].error


# -- stats ------------------------------------------------------------------------------------


async def test_stats_of_an_empty_queue(queue) -> None:
    s = await queue("empty").stats()
    assert s.queue == "empty"
    assert (s.delayed, s.ready, s.inflight, s.dead, s.overdue, s.total) == (0, 0, 0, 0, 0, 0)
    assert s.oldest_overdue_age == 0.0 and s.next_due_at is None
    assert dict(s.counters) == {}


async def test_stats_counts_every_state(queue, client) -> None:
    q = queue(overdue_after=5)
    await q.offer("inflight")
    inflight = await q.poll(timeout=5)
    await q.offer("dead")
    await q.reject(await q.poll(timeout=5), "x")
    now = server_ms(client)
    await q.offer("delayed 1", at=(now + 60_000) / 1000)
    await q.offer("delayed 2", 120)
    await q.offer("ready", at=(now - 100) / 1000)
    await q.offer("overdue", at=(now - 10_000) / 1000)
    s = await q.stats()
    assert (s.delayed, s.ready, s.inflight, s.dead) == (2, 2, 1, 1)
    assert s.total == 6
    assert s.overdue == 1
    assert 10.0 <= s.oldest_overdue_age < 20.0
    assert ms(s.next_due_at) == now + 60_000
    assert s.counters["offered"] == 6
    assert s.counters["delivered"] == 2
    assert s.counters["dead_lettered"] == 1
    await inflight.ack()
    assert (await q.stats()).counters["acked"] == 1


async def test_stats_overdue_grows_with_waiting(queue, client) -> None:
    q = queue(overdue_after=0.1)
    due = server_ms(client)  # the task's due time is at or after this
    await q.offer("x")
    first = await q.stats()
    assert first.ready == 1 and first.overdue == 0

    async def overdue() -> Any:
        s = await q.stats()
        return s if s.overdue == 1 else None

    s = await eventually(overdue, timeout=5)
    assert server_ms(client) >= due + 100  # counted only after overdue_after
    assert s.oldest_overdue_age >= 0.1


# -- bad inputs -------------------------------------------------------------------------------

BAD_OFFERS: list[tuple[str, tuple[Any, ...], dict[str, Any], type[Exception]]] = [
    ("negative-delay", ("x", -1), {}, InvalidDelay),
    ("nan-delay", ("x", math.nan), {}, InvalidDelay),
    ("inf-delay", ("x", math.inf), {}, InvalidDelay),
    ("str-delay", ("x", "5"), {}, InvalidDelay),
    ("bool-delay", ("x", True), {}, InvalidDelay),
    ("century", ("x", 200 * 365 * 86400), {}, InvalidDelay),
    ("naive-at", ("x",), {"at": datetime(2030, 1, 1)}, InvalidDelay),
    ("delay-and-at", ("x", 1), {"at": 2e9}, InvalidDelay),
    ("negative-at", ("x",), {"at": -1}, InvalidDelay),
    ("priority-10", ("x",), {"priority": 10}, InvalidTaskError),
    ("priority-bool", ("x",), {"priority": True}, InvalidTaskError),
    ("headers", ("x",), {"headers": {"a": 1}}, InvalidTaskError),
    ("empty-id", ("x",), {"id": ""}, InvalidTaskError),
    ("long-id", ("x",), {"id": "i" * 257}, InvalidTaskError),
    ("empty-key", ("x",), {"key": ""}, InvalidTaskError),
    ("zero-ttl", ("x",), {"ttl": 0}, InvalidDelay),
    ("negative-ttl", ("x",), {"ttl": -1}, InvalidDelay),
    ("negative-key-ttl", ("x",), {"key": "k", "key_ttl": -1}, InvalidDelay),
    ("unencodable", ({1, 2},), {}, EncodeError),
    ("nan-payload", (math.nan,), {}, EncodeError),
    ("too-large", ("y" * 2000,), {}, PayloadTooLarge),
    ("dedup-mode", ("x",), {"dedup": "sometimes"}, ConfigError),
]


async def test_bad_offers_raise_and_write_nothing(queue, client, prefix) -> None:
    q = queue(max_payload_bytes=1000)
    for case, args, kwargs, error in BAD_OFFERS:
        with pytest.raises(error):
            await q.offer(*args, **kwargs)
        assert (await q.stats()).total == 0, case
        assert stored_keys(client, prefix) == [], case
    # the same checks hold once the queue has written something
    keep = await q.offer("keep", 60)
    snapshot = {k: client.dump(k) for k in stored_keys(client, prefix)}
    for case, args, kwargs, error in BAD_OFFERS:
        with pytest.raises(error):
            await q.offer(*args, **{**kwargs, "key": kwargs.get("key", "k")})
        assert {k: client.dump(k) for k in stored_keys(client, prefix)} == snapshot, case
    assert (await q.get(keep)).payload == "keep"


async def test_unencodable_id_is_an_invalid_task_and_writes_nothing(queue, client, prefix) -> None:
    q = queue()
    with pytest.raises(InvalidTaskError):
        await q.offer("x", id="\ud800")
    assert stored_keys(client, prefix) == []


async def test_bad_arguments_to_other_operations_change_nothing(queue, client, prefix) -> None:
    q = queue()
    task_id = await q.offer("waiting", 60)
    await q.offer("x")
    task = await q.poll(timeout=5)
    snapshot = {k: client.dump(k) for k in stored_keys(client, prefix)}

    for call, error in [
        (lambda: q.get(""), InvalidTaskError),
        (lambda: q.get(None), InvalidTaskError),
        (lambda: q.cancel(""), InvalidTaskError),
        (lambda: q.cancel(42), InvalidTaskError),
        (lambda: q.reschedule(task_id, -1), InvalidDelay),
        (lambda: q.reschedule(task_id, at=datetime(2030, 1, 1)), InvalidDelay),
        (lambda: q.reschedule(task_id, 1, at=2e9), InvalidDelay),
        (lambda: q.reschedule("", 1), InvalidTaskError),
        (lambda: q.requeue_dead(""), InvalidTaskError),
        (lambda: q.poll(timeout=-1), InvalidDelay),
        (lambda: q.poll(timeout=math.nan), InvalidDelay),
        (lambda: q.poll_many(0), ConfigError),
        (lambda: q.poll_many(10_001), ConfigError),
        (lambda: q.poll_many(2, timeout=-1), InvalidDelay),
        (lambda: task.extend(0), InvalidDelay),
        (lambda: task.extend(-1), InvalidDelay),
        (lambda: task.nack(-1), InvalidDelay),
        (lambda: task.retry(math.inf), InvalidDelay),
        (lambda: q.offer_many([("a", 1), ("b", -1)]), InvalidDelay),
    ]:
        with pytest.raises(error):
            await call()
    assert {k: client.dump(k) for k in stored_keys(client, prefix)} == snapshot
    await task.ack()  # the lease was untouched


async def test_config_errors(flavor, redis_server) -> None:
    cls = DelayQueue if flavor == "sync" else AsyncDelayQueue
    url = redis_server.url
    for kwargs in [
        {"codec": "xml"},
        {"codec": "JSON"},
        {"max_attempts": 0},
        {"max_attempts": True},
        {"max_attempts": 1.5},
        {"max_payload_bytes": 0},
        {"ack": "yes"},
        {"dedup": "sometimes"},
        {"visibility_timeout": 0},
        {"visibility_timeout": -1},
        {"safety_interval": 0},
        {"overdue_after": math.nan},
        {"reconnect_timeout": "10"},
        {"payload_type": "Order"},
        {"prefix": "has space"},
    ]:
        with pytest.raises(ConfigError):
            cls("q", url, **kwargs)
    for name in ["", "a b", "{q}", "x" * 201]:
        with pytest.raises(ConfigError):
            cls(name, url)
    with pytest.raises(ConfigError):
        Backoff(base=0)


async def test_decode_responses_client_is_rejected(flavor, redis_server) -> None:
    if flavor == "sync":
        sync_client = redis.Redis.from_url(redis_server.url, decode_responses=True)
        try:
            with pytest.raises(ConfigError, match="decode_responses"):
                DelayQueue("q", sync_client)
        finally:
            sync_client.close()
        async_client = aioredis.Redis.from_url(redis_server.url)
        try:
            with pytest.raises(ConfigError):
                DelayQueue("q", async_client)  # the wrong kind of client
        finally:
            await async_client.aclose()
    else:
        async_client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        try:
            with pytest.raises(ConfigError, match="decode_responses"):
                AsyncDelayQueue("q", async_client)
        finally:
            await async_client.aclose()
        sync_client = redis.Redis.from_url(redis_server.url)
        try:
            with pytest.raises(ConfigError):
                AsyncDelayQueue("q", sync_client)
        finally:
            sync_client.close()


async def test_a_client_passed_in_is_used_and_left_open(flavor, redis_server, prefix) -> None:
    if flavor == "sync":
        sync_client = redis.Redis.from_url(redis_server.url)
        q = DelayQueue("q", sync_client, prefix=prefix)
        await asyncio.to_thread(q.offer, "x")
        q.close()
        assert sync_client.ping()
        sync_client.close()
    else:
        async_client = aioredis.Redis.from_url(redis_server.url)
        aq = AsyncDelayQueue("q", async_client, prefix=prefix)
        await aq.offer("x")
        await aq.close()
        assert await async_client.ping()
        await async_client.aclose()


async def test_closed_queue_raises_queue_closed(queue) -> None:
    q = queue()
    task_id = await q.offer("x")
    await q.offer("y", 60)
    task = await q.poll(timeout=5)
    await q.close()
    await q.close()  # idempotent
    for call in [
        lambda: q.offer("z"),
        lambda: q.offer_many([("z", 1)]),
        lambda: q.get(task_id),
        lambda: q.cancel(task_id),
        lambda: q.reschedule(task_id, 1),
        lambda: q.stats(),
        lambda: q.dead(),
        lambda: q.requeue_dead(),
        lambda: q.poll(),
        lambda: q.poll_many(5),
        lambda: q.take(),
        lambda: task.ack(),
        lambda: task.nack(),
        lambda: task.retry(),
        lambda: task.extend(1),
        lambda: q.release(task),
        lambda: q.reject(task, "x"),
        lambda: q.ack_many([task]),
    ]:
        with pytest.raises(QueueClosed):
            await asyncio.wait_for(call(), 5)


async def test_context_managers_close(redis_server, prefix) -> None:
    with DelayQueue("q", redis_server.url, prefix=prefix) as q:
        q.offer("x")
    with pytest.raises(QueueClosed):
        q.stats()
    async with AsyncDelayQueue("q", redis_server.url, prefix=prefix) as aq:
        await aq.offer("x")
    with pytest.raises(QueueClosed):
        await aq.stats()


# -- scripts are reloaded after SCRIPT FLUSH --------------------------------------------------


async def test_every_operation_survives_a_script_flush(queue, client) -> None:
    q = queue(retry_backoff=FAST, max_attempts=5)
    results: dict[str, Any] = {}

    async def run(name: str, call: Callable[[], Awaitable[Any]]) -> Any:
        client.script_flush()
        results[name] = await call()
        return results[name]

    assert (await run("enable_history", lambda: q.enable_history(60))).max_events == 50
    a = await run("offer", lambda: q.offer("a"))
    ids = await run("offer_many", lambda: q.offer_many([("b", 60), ("c", 60)]))
    assert (await run("get", lambda: q.get(a))).payload == "a"
    assert (await run("stats", lambda: q.stats())).total == 3
    assert await run("cancel", lambda: q.cancel(ids[1])) is True
    assert await run("reschedule", lambda: q.reschedule(ids[0], 0)) is True
    tasks = await run("poll_many", lambda: q.poll_many(2, timeout=5))
    assert {t.id for t in tasks} == {a, ids[0]}
    one, two = tasks
    await run("extend", lambda: one.extend(10))
    await run("nack", lambda: one.nack())
    one = await run("poll", lambda: q.poll(timeout=5))
    await run("retry", lambda: one.retry(error="again"))
    one = await run("take", lambda: asyncio.wait_for(q.take(), 10))
    await run("release", lambda: q.release(one))
    one = await run("poll", lambda: q.poll(timeout=5))
    await run("ack", lambda: one.ack())
    await run("reject", lambda: q.reject(two, "nope"))
    assert len(await run("dead", lambda: q.dead())) == 1
    assert await run("requeue_dead", lambda: q.requeue_dead()) == 1
    two = await q.poll(timeout=5)
    await run("reject", lambda: q.reject(two, "nope"))
    assert await run("requeue_dead", lambda: q.requeue_dead(two.id)) == 1
    two = await q.poll(timeout=5)
    assert await run("ack_many", lambda: q.ack_many([two])) == [True]
    assert (await q.stats()).total == 0
    assert [e.kind for e in await run("history", lambda: q.history(a))][-1] == "acked"
    assert (await run("get ended", lambda: q.get(a))).state == "done"
    assert await run("history_settings", lambda: q.history_settings()) is not None
    assert await run("disable_history", lambda: q.disable_history()) is True


async def test_at_most_once_undecodable_survives_a_script_flush(queue, client) -> None:
    q = queue(ack=False)
    _plant(client, q, "bad", b"\xff", server_ms(client) - 10)
    await q.offer("ok")
    client.script_flush()
    task = await q.poll(timeout=5)
    assert task.payload == "ok"
    assert [d.id for d in await q.dead()] == ["bad"]


# -- API surface ------------------------------------------------------------------------------


def _public(cls: type) -> dict[str, Any]:
    return {name: getattr(cls, name) for name in dir(cls) if not name.startswith("_")}


@pytest.mark.parametrize(
    ("sync_cls", "async_cls"),
    [(DelayQueue, AsyncDelayQueue), (Task, AsyncTask), (delayq.Connection, delayq.AsyncConnection)],
)
def test_sync_and_async_expose_the_same_api(sync_cls: type, async_cls: type) -> None:
    sync_api, async_api = _public(sync_cls), _public(async_cls)
    assert sorted(sync_api) == sorted(async_api)
    for name, sync_attr in sync_api.items():
        async_attr = async_api[name]
        assert isinstance(sync_attr, property) == isinstance(async_attr, property), name
        if not callable(sync_attr):
            continue
        sync_sig, async_sig = inspect.signature(sync_attr), inspect.signature(async_attr)
        assert [(p.name, p.kind, p.default) for p in sync_sig.parameters.values()] == [
            (p.name, p.kind, p.default) for p in async_sig.parameters.values()
        ], name
        assert not inspect.iscoroutinefunction(sync_attr), name
        if name in ("consume", "with_policy", "queue"):  # an iterator, a view, a queue
            continue
        assert inspect.iscoroutinefunction(async_attr), name
    init_params = inspect.signature(sync_cls.__init__).parameters  # type: ignore[misc]
    assert list(init_params) == list(inspect.signature(async_cls.__init__).parameters)  # type: ignore[misc]


def test_sync_and_async_queues_have_context_managers() -> None:
    for sync_cls, async_cls in (
        (DelayQueue, AsyncDelayQueue),
        (delayq.Connection, delayq.AsyncConnection),
    ):
        assert hasattr(sync_cls, "__enter__") and hasattr(sync_cls, "__exit__")
        assert hasattr(async_cls, "__aenter__") and hasattr(async_cls, "__aexit__")
    connect, aconnect = inspect.signature(delayq.connect), inspect.signature(delayq.aconnect)
    assert list(connect.parameters) == list(aconnect.parameters)


def test_all_is_sorted_and_importable() -> None:
    assert delayq.__all__ == sorted(delayq.__all__)
    assert len(set(delayq.__all__)) == len(delayq.__all__)
    for name in delayq.__all__:
        assert getattr(delayq, name) is not None
    namespace: dict[str, Any] = {}
    exec("from delayq import *", namespace)
    assert set(delayq.__all__) <= set(namespace)
    assert issubclass(delayq.LeaseLost, delayq.DelayqError)
