"""Limits across worker processes (issue #20): a rate is kept over sliding windows and a
key's concurrency is never exceeded, whatever the worker kind; a SIGKILLed worker's slots
come back with its leases. The workers are ``procs/limited_worker.py``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from delayq import DelayQueue, Limit, Offer
from delayq.embedded import EmbeddedRedis
from tests.helpers import wait_until

WORKER = Path(__file__).parent / "procs" / "limited_worker.py"


class Workers:
    def __init__(self, url: str, prefix: str, queue: str) -> None:
        self.url, self.prefix, self.queue = url, prefix, queue
        self.procs: list[subprocess.Popen[str]] = []

    def start(self, *args: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-u", str(WORKER), self.url, self.prefix, self.queue, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # bounded by the worker's own watchdog
        assert line.startswith("ready"), line
        self.procs.append(proc)
        return proc

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            if proc.stdout is not None:
                proc.stdout.close()


@pytest.fixture
def workers(redis7_server: EmbeddedRedis, prefix: str) -> Iterator[Workers]:
    made = Workers(redis7_server.url, prefix, "lp")
    yield made
    made.stop()


def handled(client: redis.Redis, prefix: str) -> list[dict]:
    return [json.loads(raw) for raw in client.lrange(f"{prefix}:handled", 0, -1)]


def most_at_once(records: list[dict]) -> int:
    events = sorted(
        [(r["start_ms"], 1) for r in records] + [(r["end_ms"], -1) for r in records],
        key=lambda e: (e[0], e[1]),  # an end at the same ms as a start counts first
    )
    level = peak = 0
    for _, step in events:
        level += step
        peak = max(peak, level)
    return peak


@pytest.mark.parametrize("kind", ["thread", "async"])
def test_rate_across_processes_over_sliding_windows(
    workers: Workers, redis7_server: EmbeddedRedis, prefix: str, kind: str
) -> None:
    rate, burst, n = 40, 5, 125
    for _ in range(3):
        workers.start("--kind", kind, "--concurrency", "4")
    client = redis.Redis.from_url(redis7_server.url)
    with DelayQueue("lp", redis7_server.url, prefix=prefix) as q:
        q.limits.set("api", Limit(rate=rate, burst=burst))
        q.offer_many([Offer(i, 0, limit_key="api") for i in range(n)])
        wait_until(lambda: client.llen(f"{prefix}:handled") >= n, timeout=30)
    records = handled(client, prefix)
    assert sorted(r["payload"] for r in records) == list(range(n)), "lost or twice"
    assert all(r["attempts"] == 1 for r in records), "a limit counted an attempt"
    assert len({r["pid"] for r in records}) > 1, "one process did all the work"
    starts = sorted(r["start_ms"] for r in records)
    for i, t in enumerate(starts):  # every 1 s window: at most rate + burst starts
        assert sum(1 for u in starts[i:] if u < t + 1000) <= rate + burst, (i, t)
    span = (starts[-1] - starts[0]) / 1000
    ideal = (n - burst) / rate  # 3.0 s
    assert ideal - 0.01 <= span < ideal + 1.5, f"{span:.2f}s for an ideal {ideal:.2f}s"
    client.close()


@pytest.mark.parametrize("kind", ["thread", "async"])
def test_concurrency_is_never_exceeded_across_processes(
    workers: Workers, redis7_server: EmbeddedRedis, prefix: str, kind: str
) -> None:
    n = 40
    for _ in range(3):
        workers.start("--kind", kind, "--concurrency", "4", "--sleep", "0.05")
    client = redis.Redis.from_url(redis7_server.url)
    with DelayQueue("lp", redis7_server.url, prefix=prefix) as q:
        q.limits.set("shop", Limit(concurrency=3))
        q.offer_many([Offer(i, 0, limit_key="shop") for i in range(n)])
        wait_until(lambda: client.llen(f"{prefix}:handled") >= n, timeout=30)
        records = handled(client, prefix)
        assert sorted(r["payload"] for r in records) == list(range(n))
        # start: the server's hand-out; end: after the handler, before the ack: a superset
        # of each lease's span (the two clocks are this machine's, within a ms)
        assert most_at_once(records) <= 3, "more than 3 of the key's tasks ran at once"
        assert most_at_once(records) == 3, "the limit was never reached: the test tests nothing"
        wait_until(lambda: q.limits.get("shop").running == 0, timeout=5)
    client.close()


def test_a_sigkilled_workers_slots_come_back_after_its_lease(
    workers: Workers, redis7_server: EmbeddedRedis, prefix: str
) -> None:
    client = redis.Redis.from_url(redis7_server.url)
    with DelayQueue("lp", redis7_server.url, prefix=prefix) as q:
        q.limits.set("shop", Limit(concurrency=2))
        doomed = workers.start("--concurrency", "4", "--sleep", "60", "--visibility", "1.5")
        q.offer_many([Offer(i, 0, limit_key="shop") for i in range(5)])
        wait_until(lambda: q.limits.get("shop").running == 2, timeout=10)
        assert q.limits.get("shop").waiting == 3
        doomed.kill()  # SIGKILL: no ack, no hand-back
        doomed.wait(10)
        killed_at = time.monotonic()
        workers.start("--concurrency", "4")
        wait_until(lambda: client.llen(f"{prefix}:handled") >= 5, timeout=60)
        took = time.monotonic() - killed_at
        records = handled(client, prefix)
        assert sorted(r["payload"] for r in records) == list(range(5))
        # the lease (1.5 s), a new process's start and the retry's backoff: generous, for a
        # loaded machine; what matters is that the slots come back at all, with no lock TTL
        assert took < 55, f"the slots came back {took:.1f}s after the kill"
        assert max(r["attempts"] for r in records) == 2  # the two killed ones, once more
        wait_until(lambda: q.limits.get("shop").running == 0, timeout=5)
    client.close()
