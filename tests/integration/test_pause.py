"""Pausing a queue (issue #20): nothing is handed out, leases in flight finish, consumers
sleep on the channel until resume() wakes them or a timed pause ends, and the pause lives in
Redis (every client sees it; it survives a restart with AOF)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import redis

from delayq import AsyncDelayQueue, ConfigError, DelayQueue, PauseInfo
from delayq.embedded import EmbeddedRedis

from ..conftest import BINARIES


def _fetches(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


@pytest.fixture
def private_server() -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(BINARIES[0][1]).start()  # alone on it: its command counts are ours
    yield server
    server.stop()


def test_a_paused_queue_hands_out_nothing_and_accepts_acks(make_queue) -> None:
    q = make_queue("p", visibility_timeout=30)
    q.offer_many([(i, 0) for i in range(3)])
    held = q.poll(timeout=5)
    assert held is not None
    info = q.pause(note="deploying the provider")
    assert info.paused and info.until is None and info.note == "deploying the provider"
    assert info.since is not None
    assert q.poll(timeout=0.3) is None
    assert q.poll_many(10, timeout=0) == []
    held.ack()  # a lease in flight finishes: its ack lands
    stats = q.stats()
    assert stats.paused and stats.paused_until is None
    assert stats.ready == 2 and stats.inflight == 0
    q.offer("new", 0)  # producers keep offering
    assert q.stats().ready == 3
    assert q.resume() is True
    assert q.resume() is False
    assert not q.stats().paused
    got: list[object] = []
    while len(got) < 3:
        batch = q.poll_many(10, timeout=5)
        assert batch, f"only {got} came after resume"
        got += [t.payload for t in batch]
    assert sorted(got, key=str) == [1, 2, "new"]


def test_resume_wakes_a_sleeping_consumer_at_once(private_server: EmbeddedRedis, prefix) -> None:
    """The consumer sleeps on the channel (its safety look is 30 s away and it makes no
    script call while paused); resume's message wakes it."""
    client = redis.Redis.from_url(private_server.url)
    url = private_server.url
    with (
        DelayQueue("w", url, prefix=prefix, safety_interval=30) as consumer,
        DelayQueue("w", url, prefix=prefix) as admin,
    ):
        admin.pause()
        admin.offer("x", 0)
        got: list[object] = []
        thread = threading.Thread(target=lambda: got.append(consumer.poll(timeout=20)))
        thread.start()
        time.sleep(0.3)  # let it look once and go to sleep
        before = _fetches(client)
        time.sleep(1.0)
        assert _fetches(client) == before, "a paused consumer made script calls: polling"
        resumed_at = time.monotonic()
        admin.resume()
        thread.join(10)
        assert got and got[0] is not None and got[0].payload == "x"  # type: ignore[attr-defined]
        assert time.monotonic() - resumed_at < 2.0, "woken by the safety look, not by resume"
    client.close()


def test_a_timed_pause_ends_by_itself(make_queue) -> None:
    q = make_queue("t", safety_interval=30)
    q.offer("x", 0)
    info = q.pause(until=timedelta(seconds=0.6))
    assert info.paused and info.until is not None
    started = time.monotonic()
    task = q.poll(timeout=10)
    waited = time.monotonic() - started
    assert task is not None and task.payload == "x"
    assert task.delivered_at >= info.until, "handed out before the pause's end"
    assert waited < 3.0, "the pause's end is in the wake plan: no wait for the safety look"
    assert not q.stats().paused


def test_pause_until_an_absolute_time_and_its_refusals(make_queue) -> None:
    q = make_queue("a")
    end = datetime.now(UTC) + timedelta(hours=1)
    info = q.pause(until=end)
    assert info.until is not None and abs((info.until - end).total_seconds()) < 0.01
    stats = q.stats()
    assert stats.paused and stats.paused_until == info.until
    again = q.pause(until=end + timedelta(hours=1), note="longer")  # replaces end and note
    assert again.until == info.until + timedelta(hours=1) and again.note == "longer"
    assert again.since == info.since
    with pytest.raises(ConfigError, match="not after the server's now"):
        q.pause(until=time.time() - 10)
    with pytest.raises(ConfigError, match="timezone-aware"):
        q.pause(until=datetime(2030, 1, 1))  # naive on purpose
    with pytest.raises(ConfigError):
        q.pause(until="tomorrow")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        q.pause(note=5)  # type: ignore[arg-type]
    assert q.stats().paused_until == again.until, "a refused call changed the pause"


def test_every_client_sees_the_pause(make_queue) -> None:
    one, other = make_queue("shared"), make_queue("shared")
    one.offer("x", 0)
    one.pause()
    assert other.poll(timeout=0.2) is None
    assert other.stats().paused


def test_a_sharded_queue_pauses_every_shard(make_queue) -> None:
    q = make_queue("s", shards=4)
    q.offer_many([(i, 0) for i in range(20)])
    q.pause()
    assert q.poll_many(20, timeout=0.2) == []
    stats = q.stats()
    assert stats.paused and all(part.paused for part in stats.shards)
    assert q.resume()
    seen: list[int] = []
    while len(seen) < 20:
        batch = q.poll_many(20, timeout=5)
        assert batch, f"missing {set(range(20)) - set(seen)}"
        for task in batch:
            seen.append(task.payload)
            task.ack()
    assert sorted(seen) == list(range(20))


@pytest.fixture(params=[b for _, b in BINARIES], ids=[n for n, _ in BINARIES])
def aof_server(request: pytest.FixtureRequest) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(request.param, aof=True).start()
    yield server
    server.stop()


def test_the_pause_survives_a_redis_restart(aof_server: EmbeddedRedis, prefix) -> None:
    with DelayQueue("r", aof_server.url, prefix=prefix, reconnect_timeout=20) as q:
        q.offer("x", 0)
        q.pause(note="maintenance")
        aof_server.kill()
        aof_server.start()
        assert q.poll(timeout=0.3) is None
        stats = q.stats()
        assert stats.paused and stats.ready == 1
        assert q.resume()
        task = q.poll(timeout=5)
        assert task is not None and task.payload == "x"


async def test_async_pause_and_resume(make_async_queue) -> None:
    q = make_async_queue("ap")
    await q.offer("x", 0)
    info = await q.pause(until=timedelta(minutes=5))
    assert isinstance(info, PauseInfo) and info.paused
    assert await q.poll(timeout=0.2) is None
    assert (await q.stats()).paused_until == info.until
    assert await q.resume()
    task = await q.poll(timeout=5)
    assert task is not None and task.payload == "x"
    await task.ack()


async def test_async_consumer_sleeps_through_a_pause(make_async_queue) -> None:
    consumer, admin = make_async_queue("aw", safety_interval=30), make_async_queue("aw")
    await admin.pause()
    await admin.offer("x", 0)
    assert await consumer.poll(timeout=0.2) is None
    started = time.monotonic()
    await admin.pause(until=timedelta(seconds=0.5))
    task = await consumer.poll(timeout=10)
    assert task is not None and time.monotonic() - started < 3.0
    assert isinstance(admin, AsyncDelayQueue)
