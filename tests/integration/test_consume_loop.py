"""The plain consumer path (issue #12): take()/poll() + ack() costs one round trip per task,
the ack fetching the next due tasks ahead, under the usual guarantees: fenced leases, lost
replies, a consumer killed while it holds tasks fetched ahead, close(), Redis restarts; and
the consume() iterator."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from delayq import AsyncDelayQueue, DelayQueue, LeaseLost, Limit, Reject, Retry
from delayq._core.keys import QueueKeys
from delayq._core.scripts import Op
from delayq._sync.shard import Ahead
from delayq.embedded import EmbeddedCluster, EmbeddedRedis
from tests.conftest import BINARIES
from tests.helpers import wait_until

from . import test_review
from .test_review import DropReplyProxy

proxy = test_review.proxy  # the lost-reply proxy fixture, shared

ROOT = Path(__file__).resolve().parents[2]


def script_calls(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def lease_left(q: DelayQueue, task_id: str) -> float:
    info = q.get(task_id)
    assert info is not None and info.lease_expires_at is not None, info
    return (info.lease_expires_at - datetime.now(UTC)).total_seconds()


# -- one round trip per task ----------------------------------------------------------------


def test_take_ack_loop_costs_one_script_call_per_task(
    make_queue: Callable[..., DelayQueue], client: redis.Redis
) -> None:
    n = 400
    q = make_queue("loop")
    q.offer_many([(i, 0) for i in range(n)])
    before = script_calls(client)
    seen = []
    for _ in range(n):
        task = q.take()
        seen.append(task.payload)
        task.ack()
    calls = script_calls(client) - before
    assert sorted(seen) == list(range(n)), "each task once"
    # Two per task (fetch, then ack) without the fetch-ahead; one per task, plus a fetch per
    # batch fetched ahead, with it.
    assert calls <= n + n // 4, f"{calls} script calls for {n} tasks"
    stats = q.stats()
    assert (stats.ready, stats.inflight, stats.counters["acked"]) == (0, 0, n)


def test_poll_loop_costs_one_script_call_per_task_and_nothing_more_once_idle(
    make_queue: Callable[..., DelayQueue], client: redis.Redis
) -> None:
    n = 200
    q = make_queue("polls", safety_interval=30)
    q.offer_many([(i, 0) for i in range(n)])
    before = script_calls(client)
    seen = []
    while (task := q.poll(timeout=0.5)) is not None:
        seen.append(task.payload)
        task.ack()
    assert sorted(seen) == list(range(n))
    assert script_calls(client) - before <= n + n // 4 + 2
    # Idle: the last ack's empty look planned the next one, so polling on costs nothing.
    idle_from = script_calls(client)
    assert q.poll(timeout=1.0) is None
    assert script_calls(client) - idle_from <= 1


def test_an_at_most_once_take_loop_fetches_ahead_and_close_puts_the_rest_back(
    make_queue: Callable[..., DelayQueue], client: redis.Redis
) -> None:
    """ack=False: take() fetches a few tasks per round trip (nothing acks to do it), each
    handed out once; close() offers the ones fetched but not handed out again."""
    n = 400
    q = make_queue("amo", ack=False)
    q.offer_many([(i, 0) for i in range(n)])
    before = script_calls(client)
    seen = [q.take().payload for _ in range(n - 50)]
    calls = script_calls(client) - before
    assert calls <= (n - 50) // 2, f"{calls} script calls for {n - 50} tasks"
    q.close()  # with tasks fetched ahead: they go back, due now
    again = make_queue("amo", ack=False, fetch_ahead=0)
    rest = []
    while (task := again.poll(timeout=0.5)) is not None:
        rest.append(task.payload)
    assert sorted(seen + rest) == list(range(n)), "each task handed out once, none lost"
    assert again.stats().total == 0


def test_at_most_once_tasks_put_back_by_close_keep_what_their_offers_gave(
    make_queue: Callable[..., DelayQueue],
    monkeypatch: pytest.MonkeyPatch,
    client: redis.Redis,
    prefix: str,
) -> None:
    """A task fetched ahead at most once left Redis; close() offers it again with its key_ttl
    (a finished task's key stays taken), its limit key (it still runs under its limit) and
    what was left of its ttl. Before, all three were dropped: the key was free again once
    the task ran (a second run of the same event), the task ran outside its limit."""
    # The first take() fetches as many as fetch_ahead allows (else its loop's pace decides).
    monkeypatch.setattr(Ahead, "want_unleased", lambda self, fetch_ahead: max(1, fetch_ahead))
    q = make_queue("amo-kept", ack=False, fetch_ahead=8)
    q.limits.set("tenant", Limit(concurrency=5))
    now = time.time()  # one limit key's line: handed out by due time
    q.offer("first", at=now - 3, limit_key="tenant")
    keyed = q.offer("keyed", at=now - 2, key="close:1", key_ttl=3600, limit_key="tenant")
    expiring = q.offer("expiring", at=now - 1, ttl=60, limit_key="tenant")
    assert q.take().payload == "first"
    assert q.stats().total == 0  # the other two left Redis, fetched ahead
    q.close()
    again = make_queue("amo-kept", ack=False, fetch_ahead=0)
    info = again.get(expiring)
    assert info is not None and info.expires_at is not None
    assert 50 < (info.expires_at - datetime.now(UTC)).total_seconds() <= 60
    lines = client.hmget(QueueKeys(prefix, "amo-kept").key("lim:task"), [keyed, expiring])
    assert lines == [b"tenant", b"tenant"]  # they run under their key's limit again
    assert [again.take().id for _ in range(2)] == [keyed, expiring]
    repeat = again.offer("keyed", 0, key="close:1", key_ttl=3600, limit_key="tenant")
    assert repeat == keyed and repeat.outcome == "existing"


def test_at_most_once_a_key_ttl_survives_close_on_a_queue_without_limits(
    make_queue: Callable[..., DelayQueue], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same through the plain fetch (a queue with no limits, pause or histories)."""
    monkeypatch.setattr(Ahead, "want_unleased", lambda self, fetch_ahead: max(1, fetch_ahead))
    q = make_queue("amo-plain", ack=False, fetch_ahead=8)
    q.offer("first", at=time.time() - 1)
    keyed = q.offer("keyed", 0, key="close:1", key_ttl=3600)
    assert q.take().payload == "first" and q.stats().total == 0
    q.close()
    again = make_queue("amo-plain", ack=False, fetch_ahead=0)
    assert again.take().id == keyed
    repeat = again.offer("keyed", 0, key="close:1", key_ttl=3600)
    assert repeat == keyed and repeat.outcome == "existing"


def test_an_at_most_once_loop_with_fetch_ahead_zero_takes_one_at_a_time(
    make_queue: Callable[..., DelayQueue], client: redis.Redis
) -> None:
    q = make_queue("amo0", ack=False, fetch_ahead=0)
    q.offer_many([(i, 0) for i in range(30)])
    before = script_calls(client)
    for _ in range(10):
        q.take()
    assert script_calls(client) - before == 10
    assert q.stats().ready == 20  # nothing left Redis but what was handed out


def test_prefetch_zero_keeps_two_round_trips_and_acks_work(
    make_queue: Callable[..., DelayQueue], client: redis.Redis
) -> None:
    q = make_queue("plain", fetch_ahead=0)
    q.offer_many([(i, 0) for i in range(50)])
    before = script_calls(client)
    for _ in range(50):
        q.take().ack()
    calls = script_calls(client) - before
    assert 100 <= calls <= 105, calls  # a fetch and an ack per task (and a stray look or two)
    assert q.stats().counters["acked"] == 50


def test_take_loops_with_slow_handlers_share_a_burst(
    make_queue: Callable[..., DelayQueue],
) -> None:
    """Two consumers whose handler takes 0.3 s, 12 tasks due at once: an ack of a loop that
    slow fetches just the next task, so the two share the burst (before: a loop's second ack
    leased 8 ahead at its pace, which waited in that loop, up to 2.4 s, while the other
    consumer had nothing to do)."""
    n = 12
    producer = make_queue("fair")
    consumers = [make_queue("fair", create=True) for _ in range(2)]
    handled: list[list[int]] = [[], []]
    all_done = threading.Event()

    def loop(k: int) -> None:
        q = consumers[k]
        while not all_done.is_set():
            task = q.poll(timeout=0.2)
            if task is None:
                continue
            time.sleep(0.3)  # the handler's work
            handled[k].append(task.payload)
            task.ack()
            if len(handled[0]) + len(handled[1]) == n:
                all_done.set()

    threads = [threading.Thread(target=loop, args=(k,), daemon=True) for k in (0, 1)]
    for thread in threads:
        thread.start()
    producer.offer_many([(i, 0.5) for i in range(n)])
    assert all_done.wait(30), handled
    for thread in threads:
        thread.join(5)
    assert sorted(handled[0] + handled[1]) == list(range(n)), "each task once"
    assert min(len(handled[0]), len(handled[1])) >= n // 2 - 2, handled


def test_bad_fetch_ahead_is_refused(make_queue: Callable[..., DelayQueue]) -> None:
    from delayq import ConfigError

    for bad in (-1, 101, 1.5, True, "8"):
        with pytest.raises(ConfigError, match="fetch_ahead"):
            make_queue("bad", fetch_ahead=bad)


async def test_async_take_ack_loop_costs_one_script_call_per_task(
    make_async_queue: Callable[..., AsyncDelayQueue], client: redis.Redis
) -> None:
    n = 400
    q = make_async_queue("aloop")
    await q.offer_many([(i, 0) for i in range(n)])
    before = script_calls(client)
    seen = []
    for _ in range(n):
        task = await q.take()
        seen.append(task.payload)
        await task.ack()
    assert sorted(seen) == list(range(n))
    assert script_calls(client) - before <= n + n // 4
    stats = await q.stats()
    assert (stats.ready, stats.inflight, stats.counters["acked"]) == (0, 0, n)


def test_only_a_take_loop_fetches_ahead(
    make_queue: Callable[..., DelayQueue], client: redis.Redis
) -> None:
    """Tasks from poll_many (a batch consumer, a worker) acked one by one lease nothing more."""
    q = make_queue("batch")
    q.offer_many([(i, 0) for i in range(20)])
    tasks = q.poll_many(5)
    for task in tasks:
        task.ack()
    stats = q.stats()
    assert (stats.inflight, stats.ready) == (0, 15)


# -- leases of tasks fetched ahead ----------------------------------------------------------


def test_a_task_fetched_ahead_is_handed_out_with_at_least_half_its_lease(
    make_queue: Callable[..., DelayQueue],
) -> None:
    q = make_queue("half", visibility_timeout=1.0)
    q.offer_many([("a", 0), ("b", 0)])
    q.take().ack()  # fetches "b" ahead
    assert q.stats().inflight == 1
    time.sleep(0.6)  # the point of the test: the lease of "b" ages past half in the buffer
    task = q.take()
    assert task.payload == "b"
    assert lease_left(q, task.id) > 0.5, "handed out with less than half its lease"
    task.ack()


def test_a_task_fetched_ahead_whose_lease_moved_on_is_never_handed_out(
    make_queue: Callable[..., DelayQueue],
) -> None:
    """Fenced leases: the lease of a task waiting in the buffer ran out and another consumer
    took the task; this consumer must not hand it out (its token is stale)."""
    opts: dict[str, Any] = {"visibility_timeout": 0.3, "retry_backoff": None}
    q = make_queue("fenced", **opts)
    other = make_queue("fenced", **opts)
    q.offer_many([("a", 0), ("b", 0)])
    q.take().ack()  # "b" is fetched ahead, leased to q
    stolen = wait_until(lambda: other.poll(timeout=0.2), timeout=10)
    assert stolen.payload == "b" and stolen.attempts == 2
    assert q.poll(timeout=0) is None, "a task whose lease moved on was handed out"
    stolen.ack()
    assert q.stats().counters["acked"] == 2


def test_close_hands_back_the_tasks_fetched_ahead_at_once(
    make_queue: Callable[..., DelayQueue],
) -> None:
    q = make_queue("closing", visibility_timeout=60)
    watcher = make_queue("closing")
    q.offer_many([(i, 0) for i in range(10)])
    q.take().ack()
    q.take().ack()  # its pace known, this ack fetches a batch ahead
    assert watcher.stats().inflight > 1
    q.close()
    stats = watcher.stats()
    assert (stats.inflight, stats.ready) == (0, 8), "fetched-ahead tasks left to their lease"
    assert stats.counters.get("retried", 0) == 0 and stats.counters["acked"] == 2
    assert sorted(t.payload for t in watcher.poll_many(10)) == list(range(2, 10))


async def test_async_close_hands_back_the_tasks_fetched_ahead_at_once(
    make_async_queue: Callable[..., AsyncDelayQueue],
) -> None:
    q = make_async_queue("aclosing", visibility_timeout=60)
    watcher = make_async_queue("aclosing")
    await q.offer_many([(i, 0) for i in range(10)])
    await (await q.take()).ack()
    await (await q.take()).ack()
    assert (await watcher.stats()).inflight > 1
    await q.close()
    stats = await watcher.stats()
    assert (stats.inflight, stats.ready) == (0, 8)


# -- lost replies ---------------------------------------------------------------------------


def test_lost_reply_of_an_ack_that_fetches_is_resent_and_loses_nothing(
    make_queue: Callable[..., DelayQueue], proxy: DropReplyProxy, client: redis.Redis
) -> None:
    """The reply of the combined ack + fetch call is lost; the call is resent with the same
    nonce and answered from its receipt: the ack counts once and succeeds, the task it fetched
    ahead is the one handed out next, and nothing more was leased."""
    producer = make_queue("lost")
    q = make_queue("lost", redis=proxy.url)
    producer.offer_many([("a", 0), ("b", 0), ("c", 0)])
    first = q.take()
    proxy.arm(Op.FETCH, client)
    first.ack()  # no LeaseLost: the resend found the first call's ack statuses
    assert proxy.dropped.is_set()
    stats = producer.stats()
    assert (stats.counters["acked"], stats.inflight, stats.ready) == (1, 1, 1)
    second = q.take()
    assert second.payload == "b"
    assert producer.stats().inflight == 1, "the resend leased more tasks"
    second.ack()
    third = q.take()
    assert third.payload == "c"
    third.ack()
    assert producer.stats().counters["acked"] == 3


async def test_async_lost_reply_of_an_ack_that_fetches(
    make_async_queue: Callable[..., AsyncDelayQueue], proxy: DropReplyProxy, client: redis.Redis
) -> None:
    producer = make_async_queue("alost")
    q = make_async_queue("alost", redis=proxy.url)
    await producer.offer_many([("a", 0), ("b", 0)])
    first = await q.take()
    proxy.arm(Op.FETCH, client)
    await first.ack()
    assert proxy.dropped.is_set()
    second = await q.take()
    assert second.payload == "b"
    await second.ack()
    stats = await producer.stats()
    assert (stats.counters["acked"], stats.inflight, stats.ready) == (2, 0, 0)


def test_lost_reply_of_a_plain_ack_is_answered_from_its_receipt(
    make_queue: Callable[..., DelayQueue], proxy: DropReplyProxy, client: redis.Redis
) -> None:
    """ack.lua finishes first and reads its receipt only when a lease is not held: a resend
    of an ack whose reply was lost (one lease of three lost before it) answers as the first
    call did, counting each ack once."""
    producer = make_queue("lostack", visibility_timeout=30)
    q = make_queue("lostack", redis=proxy.url, fetch_ahead=0)
    producer.offer_many([(i, 0) for i in range(3)])
    tasks = q.poll_many(3, timeout=1)
    q.release(tasks[1])  # its lease is gone before the ack
    proxy.arm(Op.ACK, client)
    assert q.ack_many(tasks) == [True, False, True]
    assert proxy.dropped.is_set()
    stats = producer.stats()
    assert (stats.counters["acked"], stats.inflight, stats.ready) == (2, 0, 1)


def test_an_ack_whose_lease_was_lost_still_raises(make_queue: Callable[..., DelayQueue]) -> None:
    q = make_queue("gone", visibility_timeout=0.2)
    other = make_queue("gone", visibility_timeout=30)
    q.offer("a", delay=0)
    task = q.take()
    stolen = wait_until(lambda: other.poll(timeout=0.2), timeout=10)
    assert stolen.id == task.id
    q.offer("b", delay=0)  # due: the ack fetches ahead, and still reports the lost lease
    with pytest.raises(LeaseLost):
        task.ack()
    stolen.ack()


# -- crashes and restarts -------------------------------------------------------------------

CONSUMER = """
import sys, redis
from delayq import DelayQueue
url, prefix, stop_after = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = DelayQueue("killed", url, prefix=prefix, visibility_timeout=1.5)
seen = redis.Redis.from_url(url)
for n in range(stop_after):
    task = q.take()
    seen.rpush(prefix + ":seen", task.payload)
    task.ack()
print("holding", flush=True)
sys.stdin.read()  # holds the tasks its last ack fetched ahead until it is killed
"""


def test_sigkill_of_a_consumer_holding_tasks_fetched_ahead_loses_none(
    redis7_server: EmbeddedRedis, prefix: str
) -> None:
    n = 40
    url = redis7_server.url
    with DelayQueue("killed", url, prefix=prefix, visibility_timeout=1.5) as producer:
        producer.offer_many([(i, 0) for i in range(n)])
        proc = subprocess.Popen(
            [sys.executable, "-c", CONSUMER, url, prefix, "10"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "holding"
            held = producer.stats().inflight
            assert held >= 1, "the last ack fetched nothing ahead"
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        finally:
            proc.kill()
            proc.communicate()  # closes its pipes
        client = redis.Redis.from_url(url)
        first = [int(x) for x in client.lrange(f"{prefix}:seen", 0, -1)]
        assert len(first) == 10
        rest = []
        while len(first) + len(rest) < n:
            task = producer.poll(timeout=10)  # the held ones come back after their lease
            assert task is not None, f"lost: {set(range(n)) - set(first) - set(rest)}"
            rest.append(task.payload)
            task.ack()
        assert sorted(first + rest) == list(range(n)), "a task lost or handled twice"
        client.close()


@pytest.fixture(params=[b for _, b in BINARIES], ids=[n for n, _ in BINARIES])
def own_server(request: pytest.FixtureRequest) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(request.param, aof=True).start()
    yield server
    server.stop()


def test_redis_restart_mid_loop_loses_nothing(own_server: EmbeddedRedis, prefix: str) -> None:
    """A take/ack loop rides out a crash and restart of its (AOF) Redis: every task is handled,
    none lost; one whose ack was lost with the crash may come again (at-least-once)."""
    n = 60
    url = own_server.url
    producer = DelayQueue("restart", url, prefix=prefix, visibility_timeout=2)
    q = DelayQueue("restart", url, prefix=prefix, visibility_timeout=2, reconnect_timeout=20)
    try:
        producer.offer_many([(i, 0) for i in range(n)])
        seen: list[int] = []
        while len(set(seen)) < n:
            if len(seen) == n // 2:
                own_server.kill()
                own_server.start()
            task = q.poll(timeout=15)
            assert task is not None, f"missing {set(range(n)) - set(seen)}"
            seen.append(task.payload)
            with contextlib.suppress(LeaseLost):  # lost with the crash: it comes again
                task.ack()
        assert set(seen) == set(range(n))
        assert len(seen) - n <= 10, "more redeliveries than the tasks held at the crash"
    finally:
        q.close()
        producer.close()


async def test_async_redis_restart_mid_loop_loses_nothing(
    own_server: EmbeddedRedis, prefix: str
) -> None:
    n = 60
    url = own_server.url
    producer = AsyncDelayQueue("arestart", url, prefix=prefix, visibility_timeout=2)
    q = AsyncDelayQueue("arestart", url, prefix=prefix, visibility_timeout=2, reconnect_timeout=20)
    try:
        await producer.offer_many([(i, 0) for i in range(n)])
        seen: list[int] = []
        while len(set(seen)) < n:
            if len(seen) == n // 2:
                own_server.kill()
                own_server.start()
            task = await q.poll(timeout=15)
            assert task is not None, f"missing {set(range(n)) - set(seen)}"
            seen.append(task.payload)
            with contextlib.suppress(LeaseLost):  # lost with the crash: it comes again
                await task.ack()
        assert set(seen) == set(range(n))
        assert len(seen) - n <= 10
    finally:
        await q.close()
        await producer.close()


# -- sharded queues -------------------------------------------------------------------------


def test_sharded_take_ack_loop_fetches_ahead_per_shard(
    redis_server: EmbeddedRedis, prefix: str, client: redis.Redis
) -> None:
    n = 300
    with DelayQueue("sh", redis_server.url, prefix=prefix, shards=4) as q:
        q.offer_many([(i, 0) for i in range(n)])
        before = script_calls(client)
        seen = []
        for _ in range(n):
            task = q.take()
            seen.append(task.payload)
            task.ack()
        assert sorted(seen) == list(range(n))
        assert script_calls(client) - before <= n + n // 3
        assert q.stats().counters["acked"] == n
    with DelayQueue("sh", redis_server.url, prefix=prefix, shards=4) as q:
        stats = q.stats()
        assert (stats.inflight, stats.ready) == (0, 0)


def test_sharded_consume_fetches_ahead_and_hands_back_on_exit(
    redis_server: EmbeddedRedis, prefix: str, client: redis.Redis
) -> None:
    with DelayQueue("shc", redis_server.url, prefix=prefix, shards=3) as q:
        q.offer_many([(i, 0) for i in range(90)])
        before = script_calls(client)
        with q.consume() as tasks:
            for n, _task in enumerate(tasks):
                if n == 59:
                    break
        assert script_calls(client) - before <= 60 + 60 // 3 + 12  # + the hand-backs
        stats = q.stats()
        assert (stats.counters["acked"], stats.inflight, stats.ready) == (60, 0, 30)


def test_sharded_ack_many_across_shards_reports_each_lease(
    redis_server: EmbeddedRedis, prefix: str
) -> None:
    """One ack_many over tasks of every shard (sent together, one round trip per node):
    each status is its own task's, a lost lease among them included."""
    with (
        DelayQueue("acks", redis_server.url, prefix=prefix, shards=4, visibility_timeout=30) as q,
        DelayQueue("acks", redis_server.url, prefix=prefix, shards=4) as other,
    ):
        q.offer_many([(i, 0) for i in range(40)])
        tasks = []
        while len(tasks) < 40:
            tasks += q.poll_many(40, timeout=1)
        assert len({t._shard.name for t in tasks if t._shard}) == 4, "not spread over the shards"
        lost = tasks[7]
        lost.nack()  # its lease is gone: the batch must report it, and only it
        again = wait_until(lambda: other.poll(timeout=0.2), timeout=10)
        assert again.id == lost.id
        statuses = q.ack_many(tasks)
        assert statuses == [i != 7 for i in range(40)]
        again.ack()
        stats = q.stats()
        assert (stats.counters["acked"], stats.inflight, stats.ready) == (40, 0, 0)


# -- consume() ------------------------------------------------------------------------------


def test_consume_acks_each_task_when_the_next_is_asked_for(
    make_queue: Callable[..., DelayQueue],
) -> None:
    q = make_queue("iter")
    q.offer_many([(i, 0) for i in range(30)])
    seen = [task.payload for task in q.consume(timeout=0.5)]
    assert sorted(seen) == list(range(30))
    stats = q.stats()
    assert (stats.counters["acked"], stats.inflight, stats.ready) == (30, 0, 0)


def test_consume_in_with_acks_on_break_and_hands_back_the_rest(
    make_queue: Callable[..., DelayQueue],
) -> None:
    q = make_queue("brk", visibility_timeout=60)
    q.offer_many([(i, 0) for i in range(10)])
    with q.consume() as tasks:
        for n, _ in enumerate(tasks):
            if n == 3:
                break
    stats = q.stats()
    assert (stats.counters["acked"], stats.inflight, stats.ready) == (4, 0, 6)


def test_consume_in_with_retries_on_an_exception_and_rejects_on_reject(
    make_queue: Callable[..., DelayQueue],
) -> None:
    from delayq import Backoff

    q = make_queue("fail", visibility_timeout=60, retry_backoff=Backoff(base=30, max=30))
    q.offer_many([("boom", 0), ("bad", 0.05)])
    with pytest.raises(RuntimeError), q.consume() as tasks:
        for _task in tasks:
            raise RuntimeError("handler failed")
    info = [i for i in q.tasks("delayed") if i.payload == "boom"]
    assert info and "handler failed" in (info[0].last_error or ""), "not retried with the error"
    assert q.stats().inflight == 0
    with pytest.raises(Reject), q.consume() as tasks:
        for task in tasks:
            assert task.payload == "bad"
            raise Reject("poison")
    (dead,) = q.dead()
    assert dead.payload == "bad" and "poison" in dead.error
    q.offer("again", delay=0)
    with pytest.raises(Retry), q.consume(timeout=5) as tasks:
        for _task in tasks:
            raise Retry(delay=0)
    assert q.stats().counters.get("acked", 0) == 0 and q.stats().counters["retried"] == 2


def test_consume_leaves_a_task_the_loop_settled_itself(
    make_queue: Callable[..., DelayQueue], caplog: pytest.LogCaptureFixture
) -> None:
    q = make_queue("own")
    q.offer_many([(i, 0) for i in range(6)])
    for task in q.consume(timeout=0.3):
        if task.payload % 2:
            task.nack(60)  # given back by the loop: consume must not ack it
        else:
            task.ack()
    assert not [r for r in caplog.records if "was lost" in r.getMessage()]
    stats = q.stats()
    assert (stats.counters["acked"], stats.delayed) == (3, 3)


async def test_async_consume(make_async_queue: Callable[..., AsyncDelayQueue]) -> None:
    q = make_async_queue("aiter", visibility_timeout=60)
    await q.offer_many([(i, 0) for i in range(20)])
    seen = []
    async with q.consume() as tasks:
        async for task in tasks:
            seen.append(task.payload)
            if len(seen) == 12:
                break
    stats = await q.stats()
    assert (stats.counters["acked"], stats.inflight, stats.ready) == (12, 0, 8)
    rest = [task.payload async for task in q.consume(timeout=0.3)]
    assert sorted(seen + rest) == list(range(20))


async def test_async_consume_is_cancel_safe(
    make_async_queue: Callable[..., AsyncDelayQueue],
) -> None:
    """A loop cancelled mid-task (a shutdown) hands the task back without counting an
    attempt, and the tasks fetched ahead too."""
    q = make_async_queue("acancel", visibility_timeout=60)
    await q.offer_many([(i, 0) for i in range(5)])
    started = asyncio.Event()

    async def loop() -> None:
        async with q.consume() as tasks:
            async for n, _task in _enumerate(tasks):
                if n == 1:
                    started.set()
                    await asyncio.sleep(60)

    runner = asyncio.create_task(loop())
    await asyncio.wait_for(started.wait(), 10)
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    stats = await q.stats()
    assert (stats.counters["acked"], stats.inflight, stats.ready) == (1, 0, 4)
    assert stats.counters.get("retried", 0) == 0


async def _enumerate(items: Any) -> Any:
    n = 0
    async for item in items:
        yield n, item
        n += 1


# -- consume() writes each ack and reads its reply on a later round trip ---------------------


def _paused_writes(server: EmbeddedRedis, seconds: float) -> redis.Redis:
    admin = redis.Redis.from_url(server.url)
    admin.execute_command("CLIENT", "PAUSE", int(seconds * 1000), "WRITE")
    return admin


def test_consume_hands_out_the_next_task_without_waiting_for_the_ack_before(
    own_server: EmbeddedRedis, prefix: str
) -> None:
    """With the next task fetched ahead, the ack of the one before is written and the loop
    goes on: Redis runs the ack while the handler works. Writes paused for 3 s, the next task
    still comes at once; every ack lands once the pause ends."""
    with DelayQueue("posted", own_server.url, prefix=prefix, visibility_timeout=60) as q:
        _next_task_comes_while_writes_are_paused(q, own_server)


def _next_task_comes_while_writes_are_paused(q: DelayQueue, node: EmbeddedRedis) -> None:
    """30 tasks through ``q.consume()``; once one is fetched ahead, ``node``'s writes are
    paused for 3 s and the next task must come at once; then every task is acked."""
    q.offer_many([(i, 0) for i in range(30)])
    seen, paused_at, handed_in = [], None, None
    with q.consume(timeout=10) as tasks:
        for task in tasks:
            seen.append(task.payload)
            if paused_at is not None:
                handed_in = time.monotonic() - paused_at
                break
            if q.stats().inflight >= 2:  # this task and one fetched ahead
                admin = _paused_writes(node, 3.0)
                paused_at = time.monotonic()
    assert handed_in is not None, "no task was ever fetched ahead"
    assert handed_in < 1.5, f"the next task waited {handed_in:.2f}s for the ack before it"
    admin.execute_command("CLIENT", "UNPAUSE")
    admin.close()
    rest = [task.payload for task in q.consume(timeout=0.5)]
    assert sorted(seen + rest) == list(range(30))
    stats = q.stats()
    assert (stats.counters["acked"], stats.inflight, stats.ready) == (30, 0, 0)


async def test_async_consume_hands_out_the_next_task_without_waiting_for_the_ack_before(
    own_server: EmbeddedRedis, prefix: str
) -> None:
    q = AsyncDelayQueue("aposted", own_server.url, prefix=prefix, visibility_timeout=60)
    await q.offer_many([(i, 0) for i in range(30)])
    seen, paused_at, handed_in = [], None, None
    async with q.consume(timeout=10) as tasks:
        async for task in tasks:
            seen.append(task.payload)
            if paused_at is not None:
                handed_in = time.monotonic() - paused_at
                break
            if (await q.stats()).inflight >= 2:
                admin = _paused_writes(own_server, 3.0)
                paused_at = time.monotonic()
    assert handed_in is not None, "no task was ever fetched ahead"
    assert handed_in < 1.5, f"the next task waited {handed_in:.2f}s for the ack before it"
    admin.execute_command("CLIENT", "UNPAUSE")
    async with q.consume(timeout=0.5) as tasks:
        rest = [task.payload async for task in tasks]
    assert sorted(seen + rest) == list(range(30))
    stats = await q.stats()
    assert (stats.counters["acked"], stats.inflight, stats.ready) == (30, 0, 0)
    await q.close()


def test_consume_resends_a_written_ack_whose_reply_was_lost(
    make_queue: Callable[..., DelayQueue],
    proxy: DropReplyProxy,
    client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The connection that carried a written ack is cut before its reply is read: the ack is
    sent again and answered from its receipt. Each task acked once, none delivered again, no
    lease reported lost."""
    producer = make_queue("postlost")
    q = make_queue("postlost", redis=proxy.url, visibility_timeout=60)
    producer.offer_many([(i, 0) for i in range(5)])
    seen = []
    for task in q.consume(timeout=1):
        seen.append(task.payload)
        if len(seen) == 2:  # the next ack is written, its reply dropped and the line cut
            proxy.arm(Op.ACK, client)
    assert proxy.dropped.is_set()
    assert sorted(seen) == list(range(5))
    assert not [r for r in caplog.records if "was lost" in r.getMessage()]
    stats = producer.stats()
    assert (stats.counters["acked"], stats.inflight, stats.ready) == (5, 0, 0)


def test_consume_warns_when_a_written_ack_finds_its_lease_lost(
    make_queue: Callable[..., DelayQueue], caplog: pytest.LogCaptureFixture
) -> None:
    q = make_queue("postexp", visibility_timeout=1)
    q.offer_many([(i, 0) for i in range(4)])
    with q.consume(timeout=5) as tasks:
        for n, task in enumerate(tasks):
            if n == 2:  # fetched ahead: its lease ends while the loop holds it
                expires = q.get(task.id).lease_expires_at
                assert expires is not None
                while datetime.now(UTC) <= expires:
                    time.sleep(0.05)
                lost = task.id
            if n == 3:
                break
    warned = [r.getMessage() for r in caplog.records if "was lost" in r.getMessage()]
    assert any(lost in message for message in warned), warned


def test_consume_resends_written_acks_that_met_a_script_flush(
    make_queue: Callable[..., DelayQueue], client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Acks written after Redis lost its scripts come back NOSCRIPT: each is run again (the
    script loaded first), once."""
    q = make_queue("postflush", visibility_timeout=60)
    q.offer_many([(i, 0) for i in range(40)])
    seen = []
    for task in q.consume(timeout=1):
        seen.append(task.payload)
        if len(seen) in (5, 20):
            client.script_flush()
    assert sorted(seen) == list(range(40))
    assert not [r for r in caplog.records if "was lost" in r.getMessage()]
    stats = q.stats()
    assert (stats.counters["acked"], stats.inflight, stats.ready) == (40, 0, 0)


def test_consume_rides_out_a_redis_restart_while_it_writes_acks(
    own_server: EmbeddedRedis, prefix: str
) -> None:
    """Redis (AOF) is killed while the loop holds tasks fetched ahead, and comes back a
    second later: the acks written meanwhile fail or are lost with it and the loop goes on
    (no connection error reaches it); every task is handled, none lost."""
    n = 60
    url = own_server.url
    producer = DelayQueue("prestart", url, prefix=prefix, visibility_timeout=2)
    q = DelayQueue("prestart", url, prefix=prefix, visibility_timeout=2, reconnect_timeout=20)
    restart = threading.Timer(1.0, own_server.start)
    try:
        producer.offer_many([(i, 0) for i in range(n)])
        seen: list[int] = []
        with q.consume(timeout=15) as tasks:
            for task in tasks:
                seen.append(task.payload)
                if len(seen) == n // 2:
                    own_server.kill()
                    restart.start()
                if len(set(seen)) == n:
                    break
        assert set(seen) == set(range(n)), f"missing {set(range(n)) - set(seen)}"
    finally:
        restart.join()
        q.close()
        producer.close()


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    c = EmbeddedCluster(3, BINARIES[0][1]).start()
    yield c
    c.stop()


def test_consume_on_a_cluster_hands_out_the_next_task_without_waiting_for_the_ack_before(
    cluster: EmbeddedCluster, prefix: str
) -> None:
    """As on one server: the ack goes on a connection to the node of its slot, kept for
    acks, and the loop goes on while that node's writes are paused."""
    url = f"redis+cluster://127.0.0.1:{cluster.nodes[0].port}"
    with DelayQueue("cposted", url, prefix=prefix, visibility_timeout=60) as q:
        owner = next(n for n in cluster.nodes if _serves(n, q.keys.key("tasks")))
        _next_task_comes_while_writes_are_paused(q, owner)


def _serves(node: EmbeddedRedis, key: str) -> bool:
    """Whether ``node`` serves ``key``'s slot (another node answers MOVED)."""
    client = redis.Redis(port=node.port)
    try:
        client.exists(key)
        return True
    except redis.ResponseError:
        return False
    finally:
        client.close()


def test_consume_sends_each_ack_at_once_while_the_loop_handles_the_next_task(
    make_queue: Callable[..., DelayQueue],
) -> None:
    """The ack of a task is in Redis while the handler of the next one runs: not held back
    until the loop's next round trip (where it could outlive its lease)."""
    _ack_lands_while_next_is_handled(
        make_queue("atonce", visibility_timeout=60), make_queue("atonce")
    )


def test_consume_on_a_cluster_sends_each_ack_at_once(cluster: EmbeddedCluster, prefix: str) -> None:
    url = f"redis+cluster://127.0.0.1:{cluster.nodes[0].port}"
    with (
        DelayQueue("catonce", url, prefix=prefix, visibility_timeout=60) as q,
        DelayQueue("catonce", url, prefix=prefix) as watcher,
    ):
        _ack_lands_while_next_is_handled(q, watcher)


def _ack_lands_while_next_is_handled(q: DelayQueue, watcher: DelayQueue) -> None:
    q.offer_many([(i, 0) for i in range(30)])
    previous: str | None = None
    checked = False
    with q.consume(timeout=5) as tasks:
        for task in tasks:
            if previous is not None:  # handed out from the tasks fetched ahead
                wait_until(lambda gone=previous: watcher.get(gone) is None, timeout=5)
                checked = True
                break
            if watcher.stats().inflight >= 2:  # this task and one fetched ahead
                previous = task.id
    assert checked, "no task was ever fetched ahead"
