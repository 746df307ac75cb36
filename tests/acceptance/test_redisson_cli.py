"""``delayq redisson migrate`` as a user runs it: a subprocess against the test's own server,
Java's side played by tests/redisson_emulation.py. A run SIGKILLed mid-move and started
again delivers every task once, on both move paths."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import redis

from delayq import DelayQueue
from delayq._core.redisson import MemberFormat, RedissonKeys
from delayq.embedded import EmbeddedRedis
from tests.helpers import wait_until
from tests.redisson_emulation import RedissonClient


@pytest.fixture
def server(redis7_server: EmbeddedRedis) -> EmbeddedRedis:
    return redis7_server


@pytest.fixture
def client(server: EmbeddedRedis) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(server.url)
    yield c
    c.close()


def cli(server: EmbeddedRedis, *args: str) -> list[str]:
    return [sys.executable, "-m", "delayq.cli", "redisson", "migrate", *args]


def env(server: EmbeddedRedis) -> dict[str, str]:
    return {**os.environ, "REDIS_URL": server.url, "COLUMNS": "200"}


def run(server: EmbeddedRedis, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli(server, *args), env=env(server), capture_output=True, text=True, timeout=120
    )


def test_dry_run_counts_shows_and_changes_nothing(
    server: EmbeddedRedis, client: redis.Redis, prefix: str
) -> None:
    name = f"orders-{prefix}"
    java = RedissonClient(client, name)
    for i in range(3):
        java.offer(b'{"@class":"com.shop.OrderTimeout","orderId":%d}' % i, 60_000)
    RedissonClient(client, name, MemberFormat.LEGACY).offer(b'{"orderId":-1}', 60_000)
    java.offer(b"{broken", 60_000)
    before = client.dump(RedissonKeys(name).timeouts)
    done = run(server, name, "--to", name, "--codec", "json-jackson", "--dry-run",
               "--prefix", prefix)  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "(nothing changed)" in out and "delayed         5 (list: 5)" in out
    assert "formats         3.21.1+: 3, pre-3.21.1: 1" in out
    assert "undecodable     1" in out
    assert """{"orderId": 0}  headers {'redisson-class': 'com.shop.OrderTimeout'}""" in out
    assert "DEAD-LETTER" in out
    assert client.dump(RedissonKeys(name).timeouts) == before
    assert not client.exists(f"{prefix}:{{{name}}}:delayed")


def test_migrate_prints_a_summary_for_the_ticket(
    server: EmbeddedRedis, client: redis.Redis, prefix: str
) -> None:
    name = f"orders-{prefix}"
    java = RedissonClient(client, name)
    for i in range(250):
        java.offer(b"order-%d" % i, 60_000)
    done = run(server, name, "--to", name, "--prefix", prefix)
    assert done.returncode == 0, done.stderr
    assert f"Redisson RDelayedQueue {name!r} -> delayq queue {name!r}" in done.stdout
    assert "moved           250 tasks (3.21.1+: 250)" in done.stdout
    assert "left            0 delayed, 0 ready, 0 claims" in done.stdout
    with DelayQueue(name, server.url, prefix=prefix) as queue:
        assert queue.stats().delayed == 250


def test_bad_arguments_are_one_line_errors(server: EmbeddedRedis, prefix: str) -> None:
    done = run(server, "orders", "--to", "orders", "--codec", "fst", "--prefix", prefix)
    assert done.returncode == 2 and "unknown Redisson codec 'fst'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("path", ["atomic", "claims"])
def test_a_migration_killed_mid_move_finishes_once_when_run_again(
    server: EmbeddedRedis, client: redis.Redis, prefix: str, path: str
) -> None:
    name = f"orders-{prefix}"
    java = RedissonClient(client, name)
    count = 20_000
    pipe = client.pipeline(transaction=False)
    for i in range(count):  # the emulation's offer script, pipelined
        java.client = pipe
        java.offer(b"order-%d" % i, 600_000 + i)
    pipe.execute()
    java.client = client
    keys = RedissonKeys(name)
    delayed = f"{prefix}:{{{name}}}:delayed"
    process = subprocess.Popen(
        cli(server, name, "--to", name, "--prefix", prefix, "--batch", "20", "--path", path),
        env=env(server),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: client.zcard(delayed) > 2_000, timeout=60, interval=0.001)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(10)
    left = client.zcard(keys.timeouts)
    assert 0 < left < count, "the kill should land mid-move"
    done = run(server, name, "--to", name, "--prefix", prefix, "--path", path)
    assert done.returncode == 0, done.stderr
    assert client.zcard(keys.timeouts) == client.llen(keys.members) == 0
    assert client.hlen(keys.claims) == 0
    with DelayQueue(name, server.url, prefix=prefix) as queue:
        assert queue.stats().delayed == count
        payloads = [
            info.payload
            for offset in range(0, count, 1000)
            for info in queue.tasks("delayed", limit=1000, offset=offset)
        ]
    assert sorted(payloads) == sorted(f"order-{i}" for i in range(count))


def test_follow_until_ctrl_c(server: EmbeddedRedis, client: redis.Redis, prefix: str) -> None:
    name = f"orders-{prefix}"
    java = RedissonClient(client, name)
    process = subprocess.Popen(
        cli(server, name, "--to", name, "--prefix", prefix, "--follow"),
        env=env(server),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    delayed = f"{prefix}:{{{name}}}:delayed"
    try:
        wait_until(lambda: client.pubsub_numsub(RedissonKeys(name).channel)[0][1] == 1)
        for i in range(50):
            java.offer(b"live-%d" % i, 60_000)
            time.sleep(0.01)
        wait_until(lambda: client.zcard(delayed) == 50)
    finally:
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    assert process.returncode == 0, err
    assert "moved           50 tasks" in out


def test_the_migration_bench_runs_at_tiny_size() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.redisson_migrate", "--tasks", "500", "--span", "8",
         "--rate", "20"],
        capture_output=True, text=True, timeout=120, cwd=os.path.dirname(os.path.dirname(
            os.path.dirname(os.path.abspath(__file__)))),
    )  # fmt: skip
    assert "lost 0, twice 0, early 0" in done.stdout, done.stdout + done.stderr
    assert "tasks/s (atomic batches of 100)" in done.stdout
