"""Administration API: ``tasks()`` (paged listing by state) and ``purge()``, on both front ends
and every Redis version of the ``redis_server`` fixture."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from delayq import ConfigError, LeaseLost, Offer, TaskState


class Threaded:
    """A sync queue (or task) behind an awaitable interface, each call in a worker thread."""

    def __init__(self, target: Any) -> None:
        self._target = target

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if not inspect.ismethod(attr):
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            result = await asyncio.to_thread(attr, *args, **kwargs)
            return Threaded(result) if type(result).__name__ == "Task" else result

        return call


@pytest.fixture(params=["sync", "async"])
def queue(
    request: pytest.FixtureRequest, make_queue: Any, make_async_queue: Any
) -> Callable[..., Any]:
    if request.param == "async":
        return make_async_queue  # type: ignore[no-any-return]
    return lambda name="q", **options: Threaded(make_queue(name, **options))


def now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def ms(dt: Any) -> int:
    assert dt is not None
    return round(dt.timestamp() * 1000)


async def test_tasks_lists_each_state_with_its_data(queue: Any, client: redis.Redis) -> None:
    q = queue("states", max_attempts=1, visibility_timeout=60)
    t0 = now_ms(client)
    past = (t0 - 1000) / 1000  # one due time: priority decides the order
    doomed = await q.offer({"n": "doomed"}, at=past, priority=9)
    ready_low = await q.offer({"n": "low"}, at=past, key="k-low", headers={"h": "v"}, ttl=600)
    ready_high = await q.offer({"n": "high"}, at=past, priority=7)
    later = await q.offer({"n": "later"}, 120)
    soon = await q.offer({"n": "soon"}, 60, priority=2)

    task = await q.poll(1)  # priority 9 first
    assert task.id == doomed
    await task.retry(error="boom")  # max_attempts=1: dead
    taken = await q.poll(1)  # then priority 7
    assert taken.id == ready_high

    ready = await q.tasks("ready")
    assert [t.id for t in ready] == [ready_low]
    info = ready[0]
    assert info.state is TaskState.READY and info.payload == {"n": "low"}
    assert info.key == "k-low" and dict(info.headers) == {"h": "v"} and info.attempts == 0
    assert ms(info.due_at) == t0 - 1000
    assert ms(info.expires_at) == ms(info.due_at) + 600_000
    assert info.lease_expires_at is None and info.dead_at is None

    delayed = await q.tasks(TaskState.DELAYED)
    assert [t.id for t in delayed] == [soon, later]  # by due time
    assert delayed[0].priority == 2 and ms(delayed[0].due_at) >= t0 + 60_000

    inflight = await q.tasks("inflight")
    assert [t.id for t in inflight] == [ready_high]
    assert inflight[0].attempts == 1 and inflight[0].due_at is None
    assert ms(inflight[0].lease_expires_at) >= t0 + 60_000

    dead = await q.tasks("dead")
    assert [(t.id, t.last_error, t.attempts) for t in dead] == [(doomed, "boom", 1)]
    assert t0 - 5 <= ms(dead[0].dead_at) <= now_ms(client) and dead[0].payload == {"n": "doomed"}

    # Each listed task agrees with get().
    for t in [*ready, *delayed, *inflight, *dead]:
        assert await q.get(t.id) == t
    await taken.ack()


async def test_tasks_pages_by_rank_and_splits_ready_from_delayed(queue: Any) -> None:
    q = queue("pages")
    ready_ids = await q.offer_many([Offer(i, 0) for i in range(7)])
    delayed_ids = await q.offer_many([Offer(i, 100 + i) for i in range(23)])

    async def all_pages(state: str, size: int) -> list[str]:
        ids: list[str] = []
        for offset in range(0, 40, size):
            ids += [t.id for t in await q.tasks(state, limit=size, offset=offset)]
        return ids

    assert await all_pages("ready", 3) == ready_ids
    assert await all_pages("delayed", 10) == delayed_ids
    assert [t.payload for t in await q.tasks("delayed", limit=2, offset=21)] == [21, 22]
    assert await q.tasks("ready", limit=5, offset=7) == []  # never spills into delayed
    assert await q.tasks("delayed", limit=5, offset=23) == []
    assert await q.tasks("ready", limit=0) == []
    assert await q.tasks("dead") == [] and await q.tasks("inflight") == []


async def test_tasks_rejects_bad_arguments(queue: Any) -> None:
    q = queue()
    for state, limit, offset in [
        ("waiting", 10, 0),
        ("READY", 10, 0),
        ("ready", -1, 0),
        ("ready", 10_001, 0),
        ("ready", True, 0),
        ("ready", 10, -1),
        ("ready", 1.5, 0),
    ]:
        with pytest.raises(ConfigError):
            await q.tasks(state, limit=limit, offset=offset)


async def test_tasks_shows_an_undecodable_task_instead_of_failing(
    queue: Any, client: redis.Redis, prefix: str
) -> None:
    q = queue("bad")
    good = await q.offer({"ok": 1}, 30)
    bad = await q.offer({"ok": 2}, 31)
    client.hset(f"{prefix}:{{bad}}:tasks", bad, b"\xff\x00 not an envelope")
    rows = await q.tasks("delayed")
    assert [t.id for t in rows] == [good, bad]
    assert rows[0].payload == {"ok": 1} and rows[0].last_error is None
    assert rows[1].payload is None and rows[1].last_error.startswith("undecodable")


async def test_purge_deletes_dead_by_default_and_releases_their_keys(
    queue: Any, client: redis.Redis
) -> None:
    q = queue("purge", max_attempts=1)
    first = await q.offer({"n": 1}, 0, key="order-1")
    waiting = await q.offer({"n": 2}, 60, key="order-2")
    task = await q.poll(1)
    await task.retry(error="boom")
    assert (await q.stats()).dead == 1

    assert await q.purge() == 1
    stats = await q.stats()
    assert (stats.dead, stats.delayed) == (0, 1) and stats.counters["purged"] == 1
    assert await q.get(first) is None
    again = await q.offer({"n": 1}, 0, key="order-1")  # the key is free: a new task
    assert again != first
    assert await q.offer({"n": 2}, 0, key="order-2") == waiting  # untouched, still holds it
    assert await q.purge("dead") == 0


async def test_purge_by_state(queue: Any, client: redis.Redis, prefix: str) -> None:
    q = queue("mixed", visibility_timeout=60)
    await q.offer_many([Offer(i, 0) for i in range(3)])
    await q.offer_many([Offer(i, 60, key=f"k{i}", ttl=5) for i in range(4)])
    taken = await q.poll(1)
    await q.offer("dup", 60, key="k0")

    assert await q.purge(["ready"]) == 2
    assert await q.tasks("ready") == [] and len(await q.tasks("delayed")) == 4
    assert await q.purge([TaskState.INFLIGHT]) == 1
    with pytest.raises(LeaseLost):
        await taken.ack()
    assert await q.purge(("delayed", "ready", "dead", "inflight")) == 4
    stats = await q.stats()
    assert stats.total == 0 and stats.counters["purged"] == 7
    # Nothing but the counters is left of the queue (short-lived call receipts expire).
    keys = client.scan_iter(match=f"{prefix}:{{mixed}}:*")
    left = {k.decode() for k in keys if client.ttl(k) == -1}
    assert left == {f"{prefix}:{{mixed}}:counters"}
    assert await q.offer("fresh", 0, key="k0") != "dup"


async def test_purge_works_in_batches(queue: Any) -> None:
    q = queue("big")
    await q.offer_many([Offer(i, 60 + i % 7) for i in range(2500)])
    await q.offer_many([Offer(i, 0) for i in range(10)])
    started = time.monotonic()
    assert await q.purge(["delayed"]) == 2500
    assert time.monotonic() - started < 10
    stats = await q.stats()
    assert (stats.delayed, stats.ready) == (0, 10)


async def test_purge_rejects_bad_states(queue: Any) -> None:
    q = queue()
    for states in (["gone"], [], "everything", 5, [None]):
        with pytest.raises(ConfigError):
            await q.purge(states)
