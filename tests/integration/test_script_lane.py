"""The queue's own script connection (the runner's kept connection): shared by threads, safe
across a fork, dropped when a call is cancelled mid-reply, never used on a client passed in."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from delayq import DelayQueue


def test_threads_offering_at_once_each_get_their_own_task(make_queue) -> None:
    q = make_queue()
    q.stats()
    ids: list[list[str]] = [[] for _ in range(8)]

    def produce(k: int) -> None:
        for n in range(150):
            ids[k].append(q.offer({"thread": k, "n": n}, 60))

    threads = [threading.Thread(target=produce, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    flat = [i for part in ids for i in part]
    assert len(flat) == len(set(flat)) == 1200
    assert q.stats().delayed == 1200
    for k in (0, 7):
        info = q.get(ids[k][-1])
        assert info is not None and info.payload == {"thread": k, "n": 149}


def _offer_in_child(q: DelayQueue, out: Any) -> None:
    out.put(q.offer("from the child", 60))


def test_a_forked_child_uses_a_connection_of_its_own(make_queue) -> None:
    q = make_queue()
    first = q.offer("before the fork", 60)  # the parent's lane is connected now
    out = multiprocessing.get_context("fork").Queue()
    child = multiprocessing.get_context("fork").Process(target=_offer_in_child, args=(q, out))
    child.start()
    from_child = out.get(timeout=20)
    child.join(20)
    assert child.exitcode == 0
    after = q.offer("after the fork", 60)  # the parent's connection was not disturbed
    payloads = {i: q.get(i).payload for i in (first, from_child, after)}  # type: ignore[union-attr]
    assert payloads == {
        first: "before the fork",
        from_child: "from the child",
        after: "after the fork",
    }


async def test_a_call_cancelled_mid_reply_does_not_leave_its_reply_behind(
    make_async_queue, redis_url
) -> None:
    q = make_async_queue()
    await q.offer("warm", 60)
    admin = aioredis.Redis.from_url(redis_url)
    try:
        await admin.client_pause(400)  # every other client's command waits 0.4 s
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(q.offer("cancelled", 60), 0.05)
        await asyncio.sleep(0.5)
        # A reused connection would hand this call the cancelled offer's reply (an integer).
        stats = await q.stats()
        assert stats.delayed in (1, 2)
        task_id = await q.offer("next", 60)
        info = await q.get(task_id)
        assert info is not None and info.payload == "next"
    finally:
        await admin.aclose()


class CountingRedis(redis.Redis):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[str] = []

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.seen.append(str(args[0]))
        return super().execute_command(*args, **options)


def test_a_client_passed_in_runs_every_call_through_its_own_methods(redis_url, prefix) -> None:
    client = CountingRedis.from_url(redis_url)
    q = DelayQueue("q", client, prefix=prefix)
    try:
        q.offer("hooked", 60)
        assert q.stats().delayed == 1
    finally:
        q.close()
        client.close()
    assert client.seen.count("EVALSHA") >= 2  # the offer and the stats, both seen by the hook


async def test_async_queues_on_one_loop_share_nothing_but_the_pool(make_async_queue) -> None:
    q = make_async_queue()
    ids = await asyncio.gather(*(q.offer(n, 60) for n in range(200)))
    assert len(set(ids)) == 200 and (await q.stats()).delayed == 200
    infos = await asyncio.gather(*(q.get(i) for i in ids[:20]))
    assert [info.payload for info in infos if info] == list(range(20))
