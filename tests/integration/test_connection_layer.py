"""The connection layer against real servers: every URL form, fast failures, cluster routing."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster

from delayq import AsyncDelayQueue, ConfigError, DelayQueue, RedisUnavailable
from delayq.embedded import EmbeddedCluster, EmbeddedRedis
from delayq.metrics import QueueCollector

from ..conftest import BINARIES

NAMES = ["orders", "stock", "mail", "receipts", "reminders"]


@pytest.fixture(scope="module")
def cluster() -> Iterator[EmbeddedCluster]:
    c = EmbeddedCluster(3, BINARIES[0][1]).start()
    yield c
    c.stop()


def cluster_url(cluster: EmbeddedCluster) -> str:
    return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in cluster.nodes[:2])


def test_library_default_url_is_redis_url(
    monkeypatch: pytest.MonkeyPatch, redis_server: EmbeddedRedis, prefix: str
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    with DelayQueue("env", prefix=prefix) as q:
        task_id = q.offer("from the environment", delay=0)
        task = q.poll(timeout=5)
        assert task is not None and task.id == task_id
        task.ack()


async def test_async_default_url_is_redis_url(
    monkeypatch: pytest.MonkeyPatch, redis_server: EmbeddedRedis, prefix: str
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    async with AsyncDelayQueue("env", prefix=prefix) as q:
        await q.offer("from the environment", delay=0)
        task = await q.poll(timeout=5)
        assert task is not None
        await task.ack()


def test_wrong_scheme_is_a_config_error_naming_the_forms() -> None:
    with pytest.raises(ConfigError, match="redis\\+sentinel://") as caught:
        DelayQueue("q", "http://127.0.0.1:6379")
    assert "redis+cluster://" in str(caught.value)
    with pytest.raises(ConfigError):
        AsyncDelayQueue("q", "mysql://h/db")


def test_unknown_host_fails_fast_with_its_cause(prefix: str) -> None:
    q = DelayQueue("q", "redis://no-such-host.invalid:6379/0", prefix=prefix)
    started = time.monotonic()
    with pytest.raises(RedisUnavailable, match=r"no-such-host\.invalid") as caught:
        q.offer("x", delay=1)
    assert time.monotonic() - started < 5  # not the 10 s a refused connection is retried
    assert caught.value.__cause__ is not None
    q.close()


def test_a_refused_connection_is_retried_until_the_reconnect_timeout(prefix: str) -> None:
    with EmbeddedRedis(BINARIES[0][1]) as server:
        url = server.url
    q = DelayQueue("q", url, prefix=prefix, reconnect_timeout=0.6)
    started = time.monotonic()
    with pytest.raises(RedisUnavailable, match="unreachable after"):
        q.offer("x", delay=1)
    assert 0.5 <= time.monotonic() - started < 5
    q.close()


def test_plain_url_to_a_cluster_node_says_what_to_use(
    cluster: EmbeddedCluster, prefix: str
) -> None:
    errors = []
    for name in NAMES:  # some land on this node's slots, others get MOVED
        with DelayQueue(name, f"redis://127.0.0.1:{cluster.nodes[0].port}/0", prefix=prefix) as q:
            try:
                q.stats()
            except ConfigError as exc:
                errors.append(str(exc))
    assert errors, "test names should land on several nodes"
    assert all("redis+cluster://" in e for e in errors)


def test_cluster_url_full_lifecycle_on_every_node(cluster: EmbeddedCluster, prefix: str) -> None:
    url = cluster_url(cluster)
    for name in NAMES:
        with DelayQueue(name, url, prefix=prefix, visibility_timeout=5) as q:
            first = q.offer({"queue": name}, delay=0.2, key="once")
            assert q.offer({"queue": name}, delay=0.2, key="once") == first
            ids = q.offer_many([(n, 60) for n in range(2500)])  # several chunks, one node
            assert len(set(ids)) == 2500
            task = q.poll(timeout=5)
            assert task is not None and task.id == first
            task.ack()
            stats = q.stats()
            assert (stats.delayed, stats.inflight, stats.counters["acked"]) == (2500, 0, 1)


async def test_async_cluster_url(cluster: EmbeddedCluster, prefix: str) -> None:
    async with AsyncDelayQueue("orders", cluster_url(cluster), prefix=prefix) as q:
        await q.offer_many([(n, 0) for n in range(1500)])
        got = await q.poll_many(100, timeout=5)
        assert len(got) == 100
        assert all(await q.ack_many(got))


def test_cluster_scripts_reload_after_a_flush(cluster: EmbeddedCluster, prefix: str) -> None:
    with DelayQueue("stock", cluster_url(cluster), prefix=prefix) as q:
        q.offer(1, delay=60)
        for node in cluster.nodes:
            redis.Redis(port=node.port).script_flush()
        q.offer(2, delay=60)
        assert q.stats().delayed == 2


def test_exporter_reads_queues_on_every_node_in_one_round_each(
    cluster: EmbeddedCluster, prefix: str
) -> None:
    client = RedisCluster(host="127.0.0.1", port=cluster.nodes[0].port)
    nodes = {client.get_node_from_key(f"{prefix}:{{{name}}}:delayed").name for name in NAMES}
    client.close()
    assert len(nodes) >= 2
    for name in NAMES:
        with DelayQueue(name, cluster_url(cluster), prefix=prefix) as q:
            q.offer(name, delay=60)
    collector = QueueCollector(cluster_url(cluster), prefix=prefix)
    try:
        stats = collector.read()
    finally:
        collector.close()
    assert sorted(s.queue for s in stats) == sorted(NAMES)
    assert all(s.delayed == 1 for s in stats)
