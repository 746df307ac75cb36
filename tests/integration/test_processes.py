"""Consumers in separate processes: sharing one queue, and dying while they hold a lease.

The consumers are ``procs/consumer.py`` run with ``sys.executable``; they announce readiness
and leases on stdout and record every delivery in a Redis list under the test's prefix.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from delayq import DelayQueue, TaskState
from delayq.embedded import EmbeddedRedis
from tests.helpers import wait_until

CONSUMER = Path(__file__).parent / "procs" / "consumer.py"


class Consumer:
    """A consumer subprocess; a thread reads its output so every wait on it is bounded."""

    def __init__(self, *args: str) -> None:
        self.popen = subprocess.Popen(
            [sys.executable, "-u", str(CONSUMER), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        self.output: list[str] = []
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            self._lines.put(raw.decode(errors="replace").rstrip("\n"))

    def expect(self, prefix: str, timeout: float = 20.0) -> str:
        """The next output line starting with ``prefix``; fails after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self._lines.get(timeout=remaining)
            except queue.Empty:
                break
            self.output.append(line)
            if line.startswith(prefix):
                return line
        raise AssertionError(
            f"consumer printed no {prefix!r} line within {timeout}s "
            f"(exit code {self.popen.poll()}); output so far: {self.output}"
        )

    def wait(self, timeout: float = 15.0) -> int:
        return self.popen.wait(timeout)

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)

    def cleanup(self) -> None:
        self.kill()
        self._reader.join(5)
        if self.popen.stdout is not None:
            self.popen.stdout.close()


@pytest.fixture
def spawn() -> Iterator[Callable[..., Consumer]]:
    """Start consumer processes; every one is killed at the end of the test, whatever happens."""
    started: list[Consumer] = []

    def start(*args: str) -> Consumer:
        consumer = Consumer(*args)
        started.append(consumer)
        return consumer

    yield start
    for consumer in started:
        consumer.cleanup()


def records(client: redis.Redis, prefix: str) -> list[dict[str, Any]]:
    return [json.loads(raw) for raw in client.lrange(f"{prefix}:delivered", 0, -1)]


def assert_empty(q: DelayQueue) -> None:
    stats = q.stats()
    assert (stats.delayed, stats.ready, stats.inflight, stats.dead, stats.overdue) == (
        0,
        0,
        0,
        0,
        0,
    ), stats


@pytest.mark.slow
def test_consumer_processes_share_tasks_exactly_once(
    redis7_server: EmbeddedRedis, prefix: str, spawn: Callable[..., Consumer]
) -> None:
    """Four consumer processes drain 2,000 tasks falling due over 2 s: each one is delivered
    exactly once, never early, and the work is spread over several processes."""
    url, n = redis7_server.url, 2000
    consumers = [spawn(url, prefix, "multi", "drain", "--max-seconds", "60") for _ in range(4)]
    for consumer in consumers:
        consumer.expect("ready")
    client = redis.Redis.from_url(url)
    try:
        with DelayQueue("multi", url, prefix=prefix) as producer:
            ids = producer.offer_many([(i, i / 1000) for i in range(n)])
            assert len(set(ids)) == n
            wait_until(lambda: client.llen(f"{prefix}:delivered") >= n, timeout=30, interval=0.05)
            wait_until(lambda: producer.stats().inflight == 0, timeout=10)
            client.set(f"{prefix}:stop", 1)
            assert [c.wait() for c in consumers] == [0] * len(consumers)

            delivered = records(client, prefix)
            per_id = Counter(r["id"] for r in delivered)
            assert [i for i, k in per_id.items() if k > 1] == [], "tasks delivered twice"
            assert set(per_id) == set(ids), "tasks lost"
            assert len(delivered) == n
            assert all(r["attempts"] == 1 for r in delivered)
            assert min(r["lateness_ms"] for r in delivered) >= 0, "a task was delivered early"
            assert max(r["lateness_ms"] for r in delivered) < 1000, "a task was delivered late"
            assert len({r["pid"] for r in delivered}) >= 2, "one process took everything"
            assert int(client.get(f"{prefix}:lease_lost") or 0) == 0
            assert_empty(producer)
            counters = producer.stats().counters
            assert counters["offered"] == counters["delivered"] == counters["acked"] == n
    finally:
        client.close()


def test_killed_consumer_lease_is_redelivered_to_another(
    redis_server: EmbeddedRedis, prefix: str, spawn: Callable[..., Consumer]
) -> None:
    """A consumer process SIGKILLed while holding a 1 s lease: once the lease runs out another
    consumer process gets the task with attempts == 2 and a last error about the lease."""
    url = redis_server.url
    holder = spawn(url, prefix, "lease", "hold", "--visibility", "1", "--max-seconds", "30")
    holder.expect("ready")
    client = redis.Redis.from_url(url)
    try:
        with DelayQueue("lease", url, prefix=prefix) as q:
            task_id = q.offer({"job": 1})
            _, leased_id, attempts, leased_ms = holder.expect("leased").split()
            assert (leased_id, attempts) == (task_id, "1")
            holder.popen.send_signal(signal.SIGKILL)
            assert holder.wait() == -signal.SIGKILL
            info = q.get(task_id)
            assert info is not None and info.state is TaskState.INFLIGHT

            other = spawn(
                url, prefix, "lease", "drain", "--backoff", "0.1", "--errors", "--max-seconds", "30"
            )
            other.expect("ready")
            wait_until(lambda: client.llen(f"{prefix}:delivered") >= 1, timeout=10)
            wait_until(lambda: q.stats().inflight == 0, timeout=5)
            client.set(f"{prefix}:stop", 1)
            assert other.wait() == 0

            [again] = records(client, prefix)
            assert again["id"] == task_id
            assert again["attempts"] == 2
            assert again["delivered_ms"] >= int(leased_ms) + 1000, "redelivered before expiry"
            assert again["error"] is not None and "lease" in again["error"]
            assert_empty(q)
            counters = q.stats().counters
            assert counters["lease_expired"] == 1
            assert counters["delivered"] == 2
            assert counters["acked"] == 1
    finally:
        client.close()
